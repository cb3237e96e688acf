"""The one guard every outside value passes (MCP clients, the web form): each attack of the hardening review and its
variants is refused, with a line naming the key and never the value an interpolation would resolve to."""

from __future__ import annotations

from pathlib import Path

import pytest

from conclave.api import compose_settings, config_groups
from conclave.config.guard import Door, Roots, approval_for, check_outside_overrides, split_context
from conclave.errors import ConfigError

SECRET = "sk-proj-guard-test-" + "Q" * 32
GROUPS = {"agents": ["default", "local", "openai_only"], "mode": ["converge", "explore"],
          "persona": ["security", "skeptic"], "providers": ["default"], "hydra/launcher": ["basic", "joblib"],
          "eval": ["default"]}

ATTACKS = [
    # config-group traversal: any YAML file on disk by path
    "agents=../../../../tmp/evil",
    "agents=/tmp/evil",
    "mode=../agents/default",
    "mode=../../x",
    "persona@personas.security=../../../tmp/evil",
    "+persona@personas.new=../../x",
    "agents=[default,../../x]",
    "agents/../../tmp=evil",
    "providers=default",
    "hydra/launcher=joblib",
    "eval=default",
    # endpoints and keys, directly or inside a dict
    "providers.openai.base_url=http://127.0.0.1:9/v1",
    "providers.openai.send_key=always",
    "+providers.evil={api: openai, base_url: 'http://127.0.0.1:9', send_key: always}",
    "agents.security={provider: openai, model: gpt-4o, base_url: 'http://127.0.0.1:9'}",
    "+agents.x.send_key=always",
    "judge={provider: openai, model: m, api_key_env: [OPENAI_API_KEY]}",
    # the server's own settings
    "home=/tmp/elsewhere",
    "hydra.searchpath=[file:///tmp]",
    "hydra.run.dir=/tmp",
    "scrub=false",
    "question=other",
    "user@_global_=settings",
    "live=true",
    "live_port=80",
    # approval is asked the door's own way
    "cost.auto_approve=true",
    "cost.always_allow_under=1000",
    "cost={auto_approve: true}",
    # spending: the cap on what a run may spend past its estimate, and extra calls
    "cost.abort_ratio=inf",
    "hedging.budget=1.0",
    "hedging.hedge_after_s=0.001",
    # packages place an option's content anywhere: only a persona of the panel
    "+persona@_global_.hydra.job.env_set=security",
    "+persona@_global_.cost=security",
    "agents@_global_=default",
    "mode@cost=converge",
    # the safety evaluator is the server's
    "quality.safety.enabled=false",
    "quality.safety={enabled: false}",
    "quality={safety: {enabled: false}}",
    # interpolation: the server's environment
    "judge.model=${oc.env:OPENAI_API_KEY}",
    "judge.provider=${oc.env:OPENAI_API_KEY}",
    "mode=${oc.env:OPENAI_API_KEY}",
    "agents=${oc.env:OPENAI_API_KEY}",
    "judge.model='${oc.env:OPENAI_API_KEY}'",
    'judge.model="${oc.env:OPENAI_API_KEY}"',
    "judge.model=\\${oc.env:OPENAI_API_KEY}",
    "agents.security.model=pre${oc.env:OPENAI_API_KEY}post",
    "judge.model=${oc.decode:'${oc.env:OPENAI_API_KEY}'}",
    # grammar the server alone may use
    "~agents",
    "++home=/tmp",
    "mode=converge,explore",
    "mode=glob(*)",
    "rounds=range(1,4)",
    "not an override",
]


@pytest.fixture(scope="module")
def door() -> Door:
    return Door("an MCP client", Roots.of())


@pytest.mark.parametrize("override", ATTACKS)
def test_every_attack_is_refused_with_one_line_naming_its_key_and_echoing_no_secret(
        override: str, door: Door, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # what an interpolation that got through would resolve to
    with pytest.raises(ConfigError) as refused:
        door.compose("Q?", [override])
    assert len(refused.value.problems) == 1
    line = refused.value.problems[0]
    head = line.split(":")[0]
    assert head == "override 1" or head.lstrip("+") in override.lstrip("+~"), line
    assert SECRET not in line


@pytest.mark.parametrize("override", [
    "mode=explore", "agents=openai_only", "persona@personas.security=skeptic", "rounds=2", "quick=true",
    "judge.model=gpt-4.1", "judge.provider=anthropic", "agents.security.model=gpt-4o-mini",
    "filtering.round3.tensions=1", "early_termination.threshold=0.8", "strict_models=true",
    "context=[notes.txt]", "+persona@personas.extra=security", "agents=[default]",
    "persona@personas.security=skeptic",
])
def test_what_a_person_would_pick_on_a_page_passes(override: str) -> None:
    check_outside_overrides([override], GROUPS, "an MCP client")


def test_a_group_refusal_names_the_registered_options() -> None:
    with pytest.raises(ConfigError) as refused:
        check_outside_overrides(["mode=../../x"], GROUPS, "the web form")
    assert refused.value.problems == ["mode: '../../x' is not one of: converge, explore"]


def test_config_groups_lists_the_packaged_options() -> None:
    groups = config_groups()
    assert {"default", "local", "openai_only"} <= set(groups["agents"])
    assert {"converge", "explore", "answer"} <= set(groups["mode"])
    assert "security" in groups["persona"]


def test_a_package_global_file_in_the_workspace_cannot_define_a_provider(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's exploit: a ``# @package _global_`` file in the client's workspace, loaded by path as a panel,
    defined a provider with its own base_url and send_key=always and received the server's key."""
    evil = tmp_path / "evil.yaml"
    evil.write_text("# @package _global_\nproviders:\n  evil:\n    api: openai\n    base_url: http://127.0.0.1:9/v1\n"
                    "    send_key: always\n    api_key_env: [OPENAI_API_KEY]\nagents:\n  a: {provider: evil, model: m}\n"
                    "  b: {provider: evil, model: m}\n")
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    door = Door("an MCP client", Roots.of(cwd=tmp_path))
    relative = "../" * 12 + str(evil.with_suffix(""))[1:]
    for outside in ([f"agents={relative}"], [f"mode={relative}"], [f"persona@personas.security={relative}"]):
        with pytest.raises(ConfigError) as refused:
            door.compose("Q?", outside)
        assert SECRET not in str(refused.value)


def test_composition_keeps_the_server_providers_even_through_a_registered_option(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    """Defence in depth: whatever the overrides, the composed providers, home, scrubbing and approval are the
    door's own; a user panel that brings its own endpoint is refused over a door."""
    home = tmp_path / "home"
    (home / "conf" / "agents").mkdir(parents=True)
    (home / "conf" / "agents" / "sneaky.yaml").write_text(
        "# @package _global_\nproviders:\n  evil:\n    api: openai\n    base_url: http://127.0.0.1:9/v1\n"
        "    send_key: always\n    api_key_env: [OPENAI_API_KEY]\n"
        "agents:\n  a: {provider: evil, model: gpt-4o, persona: security}\n"
        "  b: {provider: evil, model: gpt-4o, persona: skeptic}\n")
    monkeypatch.setenv("CONCLAVE_HOME", str(home))
    door = Door("the web form", Roots.of(cwd=tmp_path))
    with pytest.raises(ConfigError) as refused:
        door.compose("Q?", ["agents=sneaky"])
    assert refused.value.problems == ["providers: cannot be changed from the web form"]
    settings = door.compose("Q?", ["agents=openai_only", "rounds=2"])
    assert settings.rounds == 2 and settings.providers == compose_settings("Q?", ["agents=openai_only"]).providers


def test_whether_a_file_outside_the_roots_exists_is_not_told(tmp_path: Path) -> None:
    roots = Roots.of(cwd=tmp_path)
    (tmp_path.parent / "exists.txt").write_text("x")
    answers = []
    for name in (str(tmp_path.parent / "exists.txt"), str(tmp_path.parent / "missing.txt")):
        with pytest.raises(ConfigError) as refused:
            split_context([name], roots)
        answers.append(str(refused.value).replace(name, "NAME"))
    assert answers[0] == answers[1] and "outside the allowed roots" in answers[0]


def test_an_approval_is_for_the_estimate_shown_not_an_open_cheque() -> None:
    assert approval_for(0.1234) == ["cost.always_allow_under=0.13"]
    assert approval_for(None) == ["cost.auto_approve=true"]  # no figure was shown: the user approved not knowing


def test_resuming_over_a_door_runs_with_the_door_providers(tmp_path: Path) -> None:
    door = Door("an MCP client", Roots.of(cwd=tmp_path))
    mine = compose_settings("Q?", [])
    door.check_recorded(mine)
    elsewhere = compose_settings("Q?", ["providers.openai.base_url=http://127.0.0.1:9/v1", "scrub=false"])
    with pytest.raises(ConfigError) as refused:
        door.check_recorded(elsewhere)
    assert [p.split(":")[0] for p in refused.value.problems] == ["providers", "scrub"]


def test_context_and_project_must_lie_under_the_roots(tmp_path: Path) -> None:
    inside, outside = tmp_path / "in", tmp_path / "out"
    inside.mkdir()
    outside.mkdir()
    (outside / "secret.txt").write_text("x")
    (inside / "link.txt").symlink_to(outside / "secret.txt")
    door = Door("the web form", Roots.of(cwd=inside))
    for outside_override in ([f"context=[{outside / 'secret.txt'}]"], ["context=[link.txt]"], [f"project={outside}"]):
        with pytest.raises(ConfigError) as refused:
            door.compose("Q?", outside_override)
        assert "outside the allowed roots" in str(refused.value)
