"""A round type names its filter section: a plugin's round type may filter its inputs with a ``filtering.<section>``
of its own, which the user sets like the built-in ones; a section no round type of the plan names is an error."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from test_engine_support import AGENT_MODELS, JUDGE_MODEL, requests_with, script_panel, synthesis, texts

import conclave
from conclave.api import compose_settings
from conclave.engine.rounds import CROSS_EXAM, CROSS_EXAM_REPLIES, INDEPENDENT, SYNTHESIS, VERDICT, Input
from conclave.engine.strategy import Strategy
from conclave.errors import ConfigError
from conclave.plugin_manager import load_plugins
from conclave.testing.fake_server import FakeProviderServer

POINTS = [(f"point {i}", ["Agent A", "Agent B"], c) for i, c in enumerate([0.55, 0.95, 0.65])]


class Sectioned(Strategy):
    """Converge, whose cross-examining agents see the synthesis through their own ``filtering.replies_view``."""

    name = "sectioned"
    prompt_package = "conclave_plugins"
    prompt_dir = "prompts/converge"
    plan = (INDEPENDENT, SYNTHESIS,
            replace(CROSS_EXAM_REPLIES, inputs={**CROSS_EXAM_REPLIES.inputs,
                                                "synthesis": Input("synthesis", "judge", filtered="replies_view")}),
            CROSS_EXAM, VERDICT)


class SectionedPlugin:
    @conclave.hookimpl
    def register_strategies(self, register: Any) -> None:
        register("sectioned", Sectioned)


@pytest.fixture
def plugins() -> Any:
    return load_plugins([("sectioned", SectionedPlugin())])


async def test_a_plugin_round_filters_with_its_own_section(plugins: Any, fake_provider_server: FakeProviderServer,
                                                           conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake, synthesis=synthesis(POINTS))
    overrides = [*fake.overrides(), "cost.auto_approve=true", f"judge.model={JUDGE_MODEL}", "rounds=4",
                 "mode.strategy=sectioned", "+filtering.replies_view.consensus_points=1"]
    result = await conclave.consult_async("Should we shard?", overrides, plugins=plugins)
    assert result.status == "complete", result.abort_reason
    shown = texts(requests_with(fake, "cross_exam_reply", AGENT_MODELS["architect"])[0])
    assert "point 1" in shown and "point 0" not in shown and "point 2" not in shown  # the top point only
    verdict = texts(requests_with(fake, "verdict", JUDGE_MODEL)[0])
    assert all(f"point {i}" in verdict for i in range(3))  # filtering.round4 (3 points) is untouched


def test_a_section_no_round_names_is_an_error_naming_the_sections(plugins: Any, conclave_env: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        compose_settings("Q?", ["agents=openai_only", "mode.strategy=sectioned",
                                         "+filtering.replies_veiw.consensus_points=1"], plugins)
    assert caught.value.problems == [
        "filtering.replies_veiw: unknown section; allowed: replies, replies_view, round3, round4"]


def test_a_section_holds_limits_only(conclave_env: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        compose_settings("Q?", ["agents=openai_only", "+filtering.replies_view=3"])
    assert any(p.startswith("filtering.replies_view: a filter section maps array fields to limits")
               for p in caught.value.problems)
