"""Bad configuration: exit 2, one line on stderr naming the key and what is allowed, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run_conclave

from conclave.config.settings import Settings, settings_from_container
from conclave.errors import ConfigError

# keys for the default panel's providers, so the default (not the offline) panel is composed
KEYS = {"OPENAI_API_KEY": "sk-test", "ANTHROPIC_API_KEY": "sk-ant-test", "GEMINI_API_KEY": "test"}
SIX_AGENTS = [f"+agents.extra{i}={{persona:skeptic,provider:openai,model:gpt-4o}}" for i in range(3)]

CASES = [
    (["early_termination.threshold=1.5"], "early_termination.threshold: input should be less than or equal to 1 (got 1.5)"),
    (["filtering.round3.tensions=-1"], "filtering.round3.tensions: input should be greater than or equal to 0 (got -1)"),
    (["mode=banana"], "mode: 'banana' is not one of: adversarial, answer, converge, devils_advocate, explore"),
    (["banana=1"], "banana: unknown key; known keys: agents, "),  # the list goes on alphabetically
    (["+banana=1"], "banana: unknown key (check the spelling"),
    (["filtering.round3.tension=1"], "filtering.round3.tension: unknown key; known keys under filtering.round3: consensus_points, tensions"),
    (["~agents.architect", "~agents.pragmatist"], "agents: a panel needs 2 to 5 agents, got 1 (security)"),
    (SIX_AGENTS, "agents: a panel needs 2 to 5 agents, got 6"),
    (["rounds=7"], "rounds: input should be less than or equal to 4 (got 7)"),
    (["rounds=0"], "rounds: input should be greater than or equal to 1 (got 0)"),
    (["early_termination.non_interactive=maybe"], "early_termination.non_interactive: input should be 'accept' or 'decline' (got 'maybe')"),
    (["output.format=pdf"], "output.format: input should be 'markdown', 'json', 'both' or 'html' (got 'pdf')"),
    (["cost.abort_ratio=0.5"], "cost.abort_ratio: input should be greater than or equal to 1 (got 0.5)"),
    (["agents.security.persona=wizard"], "agents.security.persona: unknown persona 'wizard'; allowed: accessibility, architecture,"),
    (["agents=nobody"], "agents: 'nobody' is not one of: anthropic_only, default, gemini_only, grok_only, local,"),
    (["rounds=[1"], "cannot parse override:"),
    (["providers.local.model_path=/nonexistent/model.gguf"], "providers.local.model_path: no such model file: /nonexistent/model.gguf"),
    (["judge.model=a,b"], "Ambiguous value for argument 'judge.model=a,b': a comma makes a list or a sweep"),
]


@pytest.mark.parametrize(("overrides", "expected"), CASES, ids=[" ".join(c[0])[:40] for c in CASES])
def test_bad_value_exits_2_with_one_line(tmp_path: Path, overrides: list[str], expected: str) -> None:
    proc = run_conclave("Should we?", *overrides, home=tmp_path, env=KEYS)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("conclave: " + expected), lines[0]
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def _valid() -> dict:
    agent = {"persona": "security", "provider": "openai", "model": "gpt-4o"}
    return {
        "question": "q",
        "agents": {"a": agent, "b": agent},
        "judge": {"provider": "openai", "model": "gpt-4o"},
        "personas": {"security": {"name": "Security Expert", "focus": "threats"}},
        "providers": {"openai": {"api": "openai", "api_key_env": "OPENAI_API_KEY"}},
        "mode": {"strategy": "converge"},
    }


def test_defaults_fill_every_group() -> None:
    settings = settings_from_container(_valid())
    assert settings.filtering.round4.challenges == 5
    assert settings.filtering.replies.challenges == 1
    assert settings.early_termination.threshold == 0.90
    assert settings.cost.always_allow_under == 0.50
    assert settings.providers["openai"].api_key_env == ["OPENAI_API_KEY"]  # a single name becomes a list
    assert settings.planned_rounds == 4


def test_quick_means_two_rounds_unless_fewer_asked() -> None:
    assert settings_from_container({**_valid(), "quick": True}).planned_rounds == 2
    assert settings_from_container({**_valid(), "quick": True, "rounds": 1}).planned_rounds == 1


def test_home_defaults_to_conclave_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path))
    assert settings_from_container(_valid()).home == tmp_path


def test_every_problem_is_reported_on_its_own_line() -> None:
    data = {**_valid(), "rounds": 9, "output": {"format": "pdf"}}
    with pytest.raises(ConfigError) as err:
        settings_from_container(data)
    assert len(err.value.problems) == 2
    assert err.value.problems[0].startswith("rounds:")
    assert err.value.problems[1].startswith("output.format:")


def test_settings_are_immutable() -> None:
    settings = settings_from_container(_valid())
    with pytest.raises(Exception, match="frozen"):
        settings.rounds = 2  # type: ignore[misc]
    assert isinstance(settings, Settings)


def test_a_password_in_a_base_url_is_refused_without_being_echoed() -> None:
    # the configuration is journaled and indexed, so a credential in a URL would be stored verbatim
    data = _valid()
    data["providers"]["openai"]["base_url"] = "https://user:S3cretPw9@proxy.example/v1"
    with pytest.raises(ConfigError) as exc:
        settings_from_container(data)
    line = str(exc.value)
    assert line.startswith("providers.openai.base_url: must not carry user info"), line
    assert "S3cretPw9" not in line and "https://***@proxy.example/v1" in line
    data["providers"]["openai"]["base_url"] = "https://api.openai.com@127.0.0.1/v1"  # user info that fakes a host
    with pytest.raises(ConfigError, match="must not carry user info"):
        settings_from_container(data)
    data["providers"]["openai"]["base_url"] = "https://proxy.example/v1?next=a@b"  # an @ after the host is fine
    assert settings_from_container(data).providers["openai"].base_url == "https://proxy.example/v1?next=a@b"
