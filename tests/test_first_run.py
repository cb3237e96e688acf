"""What a new user meets first: Hydra's flags, mistyped options and keys, no API keys, big questions, pipes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cli_helpers import clean_env, run_conclave

from conclave import __version__


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
    assert line.startswith("conclave: banana: unknown key; known keys: agents, context, cost,")
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
    from conclave.config import settings_from_container

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
    from conclave.store.synthetic import consultation_id, synthetic_events

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
