"""The command line: verbatim questions, Hydra's flags, no stdout noise, no output directories."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_conclave
from hypothesis import given, settings
from hypothesis import strategies as st

from conclave.cli.main import _split_question, hydra_quote

AWKWARD_QUESTIONS = [
    "Should we use X, or Y?",
    "What's best for 'billing'?",
    'He said "ship it"',
    "ratio a=b, c == d",
    "lists [a, b] and maps {k: v}",
    "x # not a comment",
    "time 10:30, key: value",
    "first line\nsecond line\n\tindented",
    "ends with a backslash \\",
    "C:\\path\\to\\",
    "use ${oc.env:HOME} and ${oc.env:OPENAI_API_KEY}",
    "shell-escaped \\${oc.env:HOME} and \\\\${oc.env:HOME}",
    "nested ${a.${b}} and $HOME and `cmd` ; | &",
    "42",
    "true",
    "null",
    "  padded with spaces  ",
]


@pytest.mark.parametrize("question", AWKWARD_QUESTIONS)
def test_question_reaches_config_verbatim(tmp_path: Path, question: str) -> None:
    proc = run_conclave(question, "--cfg", "job", "--resolve", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    composed = yaml.safe_load(proc.stdout)
    assert composed["question"] == question
    assert isinstance(composed["question"], str)


def test_interpolation_in_question_is_not_expanded(tmp_path: Path) -> None:
    proc = run_conclave("leak ${oc.env:SECRET_FOR_TEST}?", "--cfg", "job", "--resolve", home=tmp_path,
                        env={"SECRET_FOR_TEST": "hunter2-value"})
    assert proc.returncode == 0, proc.stderr
    assert "hunter2-value" not in proc.stdout + proc.stderr
    assert yaml.safe_load(proc.stdout)["question"] == "leak ${oc.env:SECRET_FOR_TEST}?"


def test_question_from_stdin(tmp_path: Path) -> None:
    proc = run_conclave("-", "--cfg", "job", "--resolve", home=tmp_path, stdin="Piped, with 'quotes' = ok\n")
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["question"] == "Piped, with 'quotes' = ok"


def test_question_after_double_dash_may_look_like_a_subcommand(tmp_path: Path) -> None:
    proc = run_conclave("--", "plugins", "--cfg", "job", "--resolve", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["question"] == "plugins"


def test_split_question_keeps_flag_values_with_their_flags() -> None:
    flags, overrides, question = _split_question(
        ["-cd", "/tmp/x", "Q?", "mode=explore", "-p", "agents", "--cfg", "job", "rounds=2"]
    )
    assert question == "Q?"
    assert flags == ["-cd", "/tmp/x", "-p", "agents", "--cfg", "job"]
    assert overrides == ["mode=explore", "rounds=2"]


def test_flags_may_follow_the_question_and_overrides(tmp_path: Path) -> None:
    proc = run_conclave("Q?", "mode=explore", "--cfg", "job", "agents=default", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    composed = yaml.safe_load(proc.stdout)
    assert composed["mode"]["strategy"] == "explore" and composed["question"] == "Q?"


_ESCAPE_ALPHABET = "\\$${}\"',=[]#: ab\n"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_ESCAPE_ALPHABET, max_size=24))
def test_hydra_quote_round_trips_any_text_without_interpolating(text: str) -> None:
    """Whatever the user types — backslashes before ${, quotes, trailing backslashes — the question Hydra and
    OmegaConf hand back is exactly that text, never an interpolation's value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    value = OverridesParser.create().parse_override("question=" + hydra_quote(text)).value()
    assert OmegaConf.to_container(OmegaConf.create({"question": value}), resolve=True)["question"] == text


def test_escaped_interpolation_in_question_cannot_leak_a_variable(tmp_path: Path) -> None:
    question = 'echo "\\${oc.env:DB_PASSWORD}" and \\\\${oc.env:DB_PASSWORD}'
    proc = run_conclave(question, "--cfg", "job", "--resolve", "agents=default", home=tmp_path,
                        env={"DB_PASSWORD": "hunter2-prod-Secret"})
    assert proc.returncode == 0, proc.stderr
    assert "hunter2" not in proc.stdout
    assert yaml.safe_load(proc.stdout)["question"] == question


def test_hydra_quote_escapes_interpolation_and_quotes() -> None:
    assert hydra_quote('a "b" ${c}') == '"a \\"b\\" \\${c}"'
    assert hydra_quote("trail\\") == '"trail\\\\"'


def test_cfg_job_prints_composed_config_with_overrides(tmp_path: Path) -> None:
    proc = run_conclave("--cfg", "job", "mode=explore", "filtering.round3.tensions=1",
                        "agents.security.model=gpt-4o-mini", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    composed = yaml.safe_load(proc.stdout)
    assert composed["mode"]["strategy"] == "explore"
    assert composed["filtering"]["round3"] == {"consensus_points": 3, "tensions": 1}
    assert composed["agents"]["security"]["model"] == "gpt-4o-mini"
    assert composed["early_termination"] == {"threshold": 0.9, "non_interactive": "accept"}


def test_help_is_ours_and_lists_groups(tmp_path: Path) -> None:
    proc = run_conclave("--help", home=tmp_path)
    assert proc.returncode == 0
    assert proc.stdout.startswith("conclave — put a question to a panel of LLMs")
    assert "mode: adversarial, answer, converge, devils_advocate, explore" in proc.stdout
    agents_line = next(line for line in proc.stdout.splitlines() if line.startswith("agents: "))
    assert {"default", "local", "openai_only", "mixed_anthropic_openai"} <= set(agents_line[8:].split(", "))
    assert "early_termination.threshold" in proc.stdout


def test_help_still_composes_its_overrides(tmp_path: Path) -> None:
    """--help is printed without Hydra's app help, but a bad override still fails as one line, exit 2."""
    proc = run_conclave("--help", "mode=nope", home=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "conclave: mode: 'nope' is not one of: adversarial, answer, converge, devils_advocate, explore"]


def test_info_searchpath_shows_packaged_config(tmp_path: Path) -> None:
    proc = run_conclave("--info", "searchpath", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "pkg://conclave.conf" in proc.stdout


def test_package_flag_prints_one_node(tmp_path: Path) -> None:
    proc = run_conclave("--cfg", "job", "-p", "judge", "agents=default", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout) == {"provider": "openai", "model": "gpt-4o"}


def test_config_dir_flag_adds_user_groups(tmp_path: Path) -> None:
    conf = tmp_path / "myconf" / "agents"
    conf.mkdir(parents=True)
    (conf / "duo.yaml").write_text(
        "alice: {persona: skeptic, provider: openai, model: gpt-4o-mini}\n"
        "bob: {persona: creative, provider: mistral, model: mistral-large-latest}\n"
    )
    proc = run_conclave("-cd", str(tmp_path / "myconf"), "--cfg", "job", "agents=duo", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert set(yaml.safe_load(proc.stdout)["agents"]) == {"alice", "bob"}


def test_config_name_flag_selects_primary_config(tmp_path: Path) -> None:
    confdir = tmp_path / "alt"
    confdir.mkdir()
    (confdir / "tiny.yaml").write_text("defaults:\n  - config\n  - _self_\nrounds: 2\n")
    proc = run_conclave("-cd", str(confdir), "-cn", "tiny", "--cfg", "job", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["rounds"] == 2


def test_user_settings_under_home_override_defaults(tmp_path: Path) -> None:
    user = tmp_path / "conf" / "user"
    user.mkdir(parents=True)
    (user / "settings.yaml").write_text("cost:\n  always_allow_under: 2.0\n")
    proc = run_conclave("--cfg", "job", "--resolve", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["cost"]["always_allow_under"] == 2.0
    # and the command line still wins over the user file
    proc = run_conclave("--cfg", "job", "cost.always_allow_under=0.1", home=tmp_path)
    assert yaml.safe_load(proc.stdout)["cost"]["always_allow_under"] == 0.1


def test_single_run_creates_no_outputs_dir_and_keeps_stdout_clean(tmp_path: Path) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    proc = run_conclave("Is this clean?", "rounds=7", home=tmp_path, cwd=work)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert list(work.iterdir()) == []


def test_empty_question_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_conclave("-", home=tmp_path, stdin="   \n")
    assert proc.returncode == 2
    assert "the question is empty" in proc.stderr


def test_missing_question_names_the_fix(tmp_path: Path) -> None:
    proc = run_conclave("mode=explore", "agents=default", home=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        'conclave: question: missing — pass the question as the first argument, e.g. conclave "Should we …?"'
    ]


def test_a_panel_file_brings_its_own_judge(tmp_path: Path) -> None:
    proc = run_conclave("--cfg", "job", "agents=local", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    composed = yaml.safe_load(proc.stdout)
    assert composed["judge"] == {"provider": "local", "model": "gemma-3-270m"}
    assert {a["provider"] for a in composed["agents"].values()} == {"local"}
    # and the command line still overrides the panel's judge
    proc = run_conclave("--cfg", "job", "agents=local", "judge.model=other", home=tmp_path)
    assert yaml.safe_load(proc.stdout)["judge"]["model"] == "other"


def test_zero_config_panel_follows_the_keys_present(tmp_path: Path) -> None:
    def panel(env: dict[str, str], *extra: str) -> dict:
        proc = run_conclave("--cfg", "job", *extra, home=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        return yaml.safe_load(proc.stdout)

    no_keys = panel({})
    assert {a["provider"] for a in no_keys["agents"].values()} == {"local"}
    only_openai = panel({"OPENAI_API_KEY": "sk-test"})
    assert {a["provider"] for a in only_openai["agents"].values()} == {"openai"}
    assert only_openai["judge"]["provider"] == "openai"
    every_key = panel({"OPENAI_API_KEY": "a", "ANTHROPIC_API_KEY": "b", "GEMINI_API_KEY": "c"})
    assert {a["provider"] for a in every_key["agents"].values()} == {"openai", "anthropic", "gemini"}
    # a panel named on the command line always wins
    assert {a["provider"] for a in panel({}, "agents=default")["agents"].values()} == {"openai", "anthropic", "gemini"}


def test_offline_panel_notice_is_printed_once_for_a_valid_run(tmp_path: Path) -> None:
    from conclave.cli.panel import LOCAL_PANEL_NOTICE

    invalid = run_conclave("Q?", "rounds=9", home=tmp_path)  # a config error stays one line, notice or not
    assert invalid.stderr.splitlines() == ["conclave: rounds: input should be less than or equal to 4 (got 9)"]
    # a valid config whose model file is not a GGUF: the run starts (notice once), then fails fast at load
    not_a_model = tmp_path / "not-a-model.gguf"
    not_a_model.write_text("this is not a GGUF file")
    valid = run_conclave("Q?", "rounds=1", f"providers.local.model_path={not_a_model}", home=tmp_path)
    assert valid.returncode == 1
    assert valid.stderr.count(LOCAL_PANEL_NOTICE) == 1, valid.stderr
    inspect = run_conclave("--cfg", "job", home=tmp_path)
    assert LOCAL_PANEL_NOTICE not in inspect.stderr


@pytest.mark.parametrize("text", ["\\\n", "a\\\n", "\\\\\n", "${x}\\\n"])
def test_backslash_before_a_final_newline_round_trips(text: str) -> None:
    """Regression: Python's ``$`` matches before a trailing newline, which once doubled this backslash."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    value = OverridesParser.create().parse_override("question=" + hydra_quote(text)).value()
    assert OmegaConf.to_container(OmegaConf.create({"question": value}), resolve=True)["question"] == text


@pytest.mark.parametrize(("word", "meant"), [("consult-stats", "conclave stats"), ("sessions", "conclave logs list"),
                                             ("continue", "conclave resume"), ("stat", "conclave stats"),
                                             ("show_prompt", "conclave show-prompt")])
def test_a_command_name_is_not_taken_for_a_question(tmp_path: Path, word: str, meant: str) -> None:
    # a predecessor's command, or a near miss of ours, must not start a (possibly auto-approved) consultation
    proc = run_conclave(word, "--cfg", "job", home=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"conclave: {word!r} is not a conclave command (did you mean {meant}?); to ask it as a question: "
        f"conclave -- {word}"]


def test_a_one_word_question_is_asked_after_double_dash_or_as_an_override(tmp_path: Path) -> None:
    for args in (["--", "sessions"], ["question=sessions"]):
        proc = run_conclave(*args, "--cfg", "job", "--resolve", home=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert yaml.safe_load(proc.stdout)["question"] == "sessions"
    proc = run_conclave("Why", "--cfg", "job", "--resolve", home=tmp_path)  # an ordinary word is still a question
    assert proc.returncode == 0 and yaml.safe_load(proc.stdout)["question"] == "Why"


README = Path(__file__).resolve().parent.parent / "README.md"
DOCS = sorted((README.parent / "docs").glob("*.md"))  # the README's reference pages


def readme_commands() -> list[str]:
    """Every `conclave …` command in the code blocks of the README and its docs/ pages, continuation lines joined."""
    text = "\n".join(f.read_text(encoding="utf-8") for f in [README, *DOCS])
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("conclave "):
                commands.append(line.split("  #")[0].strip())
    return commands


def test_readme_examples_name_only_seats_of_the_offline_default_panel() -> None:
    # with no key the default panel is the offline one: an example that names a seat must work there too
    seats = set(yaml.safe_load((README.parent / "conf" / "agents" / "local.yaml").read_text())["agents"])
    commands = readme_commands()
    assert len(commands) > 10
    named = {(c, m) for c in commands if "agents=" not in c
             for m in re.findall(r"(?:agents\.|--agent )([A-Za-z_]+)", c)}
    assert [(c, m) for c, m in named if m not in seats] == []


def test_readme_show_prompt_examples_run_on_the_offline_panel(tmp_path: Path) -> None:
    examples = [c for c in readme_commands() if c.startswith("conclave show-prompt") and "<" not in c]
    assert examples
    for command in examples:
        proc = run_conclave(*shlex.split(command)[1:], home=tmp_path)
        assert proc.returncode == 0, (command, proc.stderr)
        assert proc.stdout.startswith("# "), command


def test_no_install_hint_names_the_unrelated_package_of_the_same_name() -> None:
    # `pip install 'conclave[mcp]'` fetches someone else's project from the package index
    root = README.parent
    files = [README, *DOCS, *root.glob("conclave/**/*.py"), *root.glob("plugins/**/*.py"), *root.glob("conf/**/*.yaml")]
    found = [str(f.relative_to(root)) for f in files if f.name != "extras.py"
             and re.search(r"pip install '?conclave\[", f.read_text(encoding="utf-8"))]
    assert found == []
