"""Zero-config panel: the keys present pick the panel, and every panel file matches the rule that selects it."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from conclave.api import compose_settings
from conclave.cli.panel import CORE_PROVIDERS, LOCAL_PANEL_NOTICE, PANELS, SECONDARY_PANELS, choose_panel

KEYS = {
    "openai": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "grok": "XAI_API_KEY",
    "mistral": "MISTRAL_API_KEY",
}


def env(*providers: str) -> dict[str, str]:
    return {KEYS[p]: f"test-{p}" for p in providers}


def panel_file(option: str) -> str:
    return resources.files("conclave.conf").joinpath(f"agents/{option}.yaml").read_text(encoding="utf-8")


def providers_of(option: str) -> set[str]:
    data = yaml.safe_load(panel_file(option))
    return {agent["provider"] for agent in data["agents"].values()} | {data["judge"]["provider"]}


def test_no_key_runs_the_local_panel() -> None:
    assert choose_panel({}) == "local"


def test_empty_key_counts_as_missing() -> None:
    assert choose_panel({"OPENAI_API_KEY": "", "PATH": "/usr/bin"}) == "local"


@pytest.mark.parametrize(
    ("providers", "expected"),
    [
        (("openai",), "openai_only"),
        (("anthropic",), "anthropic_only"),
        (("gemini",), "gemini_only"),
        (("grok",), "grok_only"),
        (("mistral",), "mistral_only"),
    ],
)
def test_one_provider_gets_a_panel_of_its_own(providers: tuple[str, ...], expected: str) -> None:
    assert choose_panel(env(*providers)) == expected


def test_google_api_key_counts_for_gemini() -> None:
    assert choose_panel({"GOOGLE_API_KEY": "g"}) == "gemini_only"


@pytest.mark.parametrize(
    ("providers", "expected"),
    [
        (("anthropic", "openai"), "mixed_anthropic_openai"),
        (("anthropic", "gemini"), "mixed_anthropic_gemini"),
        (("openai", "gemini"), "mixed_gemini_openai"),
        (("openai", "grok"), "openai_only"),  # grok and mistral join only when no default provider has a key
        (("grok", "mistral"), "grok_only"),
    ],
)
def test_several_providers_are_mixed(providers: tuple[str, ...], expected: str) -> None:
    assert choose_panel(env(*providers)) == expected


def test_all_default_providers_keep_the_default_panel() -> None:
    assert choose_panel(env("openai", "anthropic", "gemini", "grok", "mistral")) is None


@pytest.mark.parametrize(("keyed", "option"), sorted(PANELS.items(), key=lambda item: sorted(item[0])),
                         ids=lambda value: "+".join(sorted(value)) if isinstance(value, frozenset) else str(value))
def test_each_mixed_panel_uses_exactly_the_keyed_providers(keyed: frozenset[str], option: str | None) -> None:
    if option is None:  # agents=default is what no override composes
        settings = compose_settings("q", ["agents=default"])
        used = {a.provider for a in settings.agents.values()} | {settings.judge.provider}
    else:
        used = providers_of(option)
    assert used == set(keyed)


@pytest.mark.parametrize(("provider", "option"), SECONDARY_PANELS)
def test_secondary_panels_use_their_provider(provider: str, option: str) -> None:
    assert providers_of(option) == {provider}


@pytest.mark.parametrize("option", sorted({o for o in PANELS.values() if o} | {o for _, o in SECONDARY_PANELS}))
def test_panel_files_compose_into_the_default_perspectives(option: str) -> None:
    assert panel_file(option).splitlines()[0] == "# @package _global_"
    settings = compose_settings("q", [f"agents={option}"])
    assert {a.persona for a in settings.agents.values()} == {"security", "architecture", "pragmatic"}
    assert settings.judge.provider in providers_of(option)


def test_core_providers_are_the_default_panel() -> None:
    settings = compose_settings("q", ["agents=default"])
    assert {a.provider for a in settings.agents.values()} == set(CORE_PROVIDERS)


def test_local_notice_is_honest_and_says_how_to_set_keys() -> None:
    assert "not for decisions" in LOCAL_PANEL_NOTICE
    for var in KEYS.values():
        assert var in LOCAL_PANEL_NOTICE
    assert "agents=local" in LOCAL_PANEL_NOTICE
    assert "\n" not in LOCAL_PANEL_NOTICE
