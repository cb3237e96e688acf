"""A strategy from a third-party plugin: subclass the base, ship templates in its own package, register it
through the hook, and it runs as ``mode.strategy=<name>`` with its validated options."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_engine_support import AGENT_MODELS, BASE_OVERRIDES, QUESTION, requests_with, script_panel, texts

import conclave
from conclave.engine.strategy import TEMPLATE_KEYS
from conclave.errors import ConfigError
from conclave.plugin_manager import load_plugins
from conclave.testing.fake_server import FakeProviderServer

PLUGIN = '''
from pydantic import BaseModel

import conclave
from conclave.engine.strategy import Strategy


class DevilsAdvocate(Strategy):
    """Every agent argues against the obvious answer."""

    name = "contrarian"
    prompt_package = "devils_advocate_plugin"
    prompt_dir = "prompts"

    class Options(BaseModel):
        model_config = {"extra": "forbid"}
        tone: str = "polite"

    def user_message(self, round_type, values):
        message = super().user_message(round_type, values)
        return message + f"\\nTone: {self.options.tone}." if round_type.name == "independent" else message


@conclave.hookimpl
def register_strategies(register):
    register("contrarian", DevilsAdvocate)
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    package = tmp_path / "devils_advocate_plugin"
    (package / "prompts").mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(PLUGIN))
    for name in TEMPLATE_KEYS:
        fields = {"round1": "$question", "round2": "$question $panel $absent $independents",
                  "round3_agent": "$question $label $own_position $synthesis",
                  "round3_judge": "$question $panel $absent $synthesis $replies",
                  "round4": "$question $panel $absent $independents $synthesis $cross_exam",
                  "agent_system": "$persona_name: $persona_focus", "judge_system": ""}[name]
        (package / "prompts" / f"{name}.md").write_text(f"---\nversion: v3\n---\nDEVIL {name}: argue against. {fields}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import devils_advocate_plugin

    yield load_plugins([("devils-advocate", devils_advocate_plugin)])
    sys.modules.pop("devils_advocate_plugin", None)


async def test_a_plugin_strategy_runs_as_a_mode(plugin: Any, fake_provider_server: FakeProviderServer,
                                                conclave_env: Any) -> None:
    fake = fake_provider_server
    overrides = [*fake.overrides(), "cost.auto_approve=true", "mode.strategy=contrarian", "+mode.options.tone=blunt"]
    result = await conclave.consult_async("Should we rewrite it in Rust?", overrides, plugins=plugin)
    assert result.status == "complete" and result.strategy == "contrarian"
    assert result.prompt_versions["round_1"].startswith("contrarian/round1@v3#sha256:")
    first = texts(requests_with(fake, "independent", AGENT_MODELS["architect"])[0])
    assert "DEVIL round1: argue against. Should we rewrite it in Rust?" in first and "Tone: blunt." in first
    assert "DEVIL round4" in texts(requests_with(fake, "verdict")[0])


def test_a_plugin_strategys_options_are_validated(plugin: Any, conclave_env: Any) -> None:
    with pytest.raises(ConfigError, match=r"mode\.options\.volume"):
        conclave.api.compose_settings("q", ["mode.strategy=contrarian", "+mode.options.volume=11"], plugin)


EXAMPLE_PLUGIN = Path(__file__).parent / "plugins" / "conclave_example_plugin"


@pytest.fixture
def example_plugin(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The out-of-tree example plugin, loaded through the plugin manager like an installed one."""
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGIN))
    from conclave_example_plugin import plugin as example

    # once imported, off the path again: a build there leaves an .egg-info whose entry point would load it twice
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(EXAMPLE_PLUGIN)])
    yield load_plugins([("example", example)])
    for name in [m for m in sys.modules if m.startswith("conclave_example_plugin")]:
        sys.modules.pop(name, None)


async def test_a_plugin_round_type_is_played_where_its_strategy_plans_it(
    example_plugin: Any, fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    """The example plugin's ``gauntlet`` plays a round type of its own (``rebuttal``) between the synthesis and
    cross-examination, and feeds the rebuttals to a verdict template of its own."""
    fake = fake_provider_server
    script_panel(fake)
    events: list[Any] = []
    # five rounds: from round 5 on prompts summarize older rounds; off here to see the rebuttals whole
    overrides = [*fake.overrides(), *BASE_OVERRIDES, "mode.strategy=gauntlet", "summarization.enabled=false"]
    result = await conclave.consult_async(QUESTION, overrides, plugins=example_plugin, subscribers=[events.append])
    assert result.status == "complete" and result.completed_rounds == 5
    started = [(e.data["round_number"], e.data["round_type"]) for e in events if e.type == "round:started"]
    assert started == [(1, "independent"), (2, "synthesis"), (3, "rebuttal"), (4, "cross_exam"), (5, "verdict")]
    assert [t.to for t in result.transitions] == [
        "ESTIMATING", "AWAITING_CONSENT", "INDEPENDENT", "SYNTHESIS", "REBUTTAL", "CROSS_EXAM", "VERDICT", "COMPLETE"]
    assert result.prompt_versions["rebuttal"].startswith("gauntlet/rebuttal@v1#sha256:")

    rebuttals = [r for r in fake.requests if "Rebut the synthesis" in texts(r)]
    assert sorted(r.model for r in rebuttals) == sorted(AGENT_MODELS.values())  # every agent, once
    architect = next(texts(r) for r in rebuttals if r.model == AGENT_MODELS["architect"])
    assert f"position of architect via {AGENT_MODELS['architect']}" in architect  # its own round-1 answer
    (verdict,) = requests_with(fake, "verdict")
    shown = texts(verdict)
    assert "Rebuttals of the synthesis, by agent:" in shown and '"Agent A": {' in shown
    recorded = [e.data for e in events if e.type == "consultation:round_artifact" and e.data["round_number"] == 3]
    assert {a["agent"] for a in recorded} == set(AGENT_MODELS) and {a["round_type"] for a in recorded} == {"rebuttal"}


async def test_rounds_cut_a_plugin_plan_by_stage(example_plugin: Any, fake_provider_server: FakeProviderServer,
                                                 conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    overrides = [*fake.overrides(), *BASE_OVERRIDES, "mode.strategy=gauntlet", "rounds=2"]
    result = await conclave.consult_async(QUESTION, overrides, plugins=example_plugin)
    assert result.status == "complete" and result.completed_rounds == 2
    assert not [r for r in fake.requests if "Rebut the synthesis" in texts(r)]
    assert result.verdict is not None  # derived from the synthesis


async def test_a_plugin_strategy_without_an_objection_template_objects_in_the_engines_words(
    example_plugin: Any, fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    fake = fake_provider_server
    script_panel(fake, confidence=0.95)  # every agent very sure, nobody cites a source: early convergence
    events: list[Any] = []
    overrides = [*fake.overrides(), *BASE_OVERRIDES, "mode.strategy=gauntlet", "rounds=3"]
    result = await conclave.consult_async(QUESTION, overrides, plugins=example_plugin, subscribers=[events.append])
    assert result.status == "complete"
    objections = requests_with(fake, "objection")
    assert len(objections) == 3 and "=== CRITICAL OBJECTION ROUND ===" in texts(objections[0])
    (outcome,) = [e.data for e in events if e.type == "groupthink:objection"]
    assert outcome["template"].startswith("conclave/objection@v2#sha256:")
