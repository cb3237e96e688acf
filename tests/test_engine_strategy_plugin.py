"""A strategy from a third-party plugin: subclass the base, ship templates in its own package, register it
through the hook, and it runs as ``mode.strategy=<name>`` with its validated options."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_engine_support import AGENT_MODELS, requests_with, texts

import conclave
from conclave.engine.strategy import TEMPLATE_KEYS
from conclave.errors import ConfigError
from conclave.plugins import load_plugins
from conclave.testing.fake_server import FakeProviderServer

PLUGIN = '''
from pydantic import BaseModel

import conclave
from conclave.engine.strategy import Strategy


class DevilsAdvocate(Strategy):
    """Every agent argues against the obvious answer."""

    name = "devils_advocate"
    prompt_package = "devils_advocate_plugin"
    prompt_dir = "prompts"

    class Options(BaseModel):
        model_config = {"extra": "forbid"}
        tone: str = "polite"

    def independent(self, *, question: str) -> str:
        return super().independent(question=question) + f"\\nTone: {self.options.tone}."


@conclave.hookimpl
def register_strategies(register):
    register("devils_advocate", DevilsAdvocate)
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
    overrides = [*fake.overrides(), "cost.auto_approve=true", "mode.strategy=devils_advocate", "+mode.options.tone=blunt"]
    result = await conclave.consult_async("Should we rewrite it in Rust?", overrides, plugins=plugin)
    assert result.status == "complete" and result.strategy == "devils_advocate"
    assert result.prompt_versions["round_1"].startswith("devils_advocate/round1@v3#sha256:")
    first = texts(requests_with(fake, "independent", AGENT_MODELS["architect"])[0])
    assert "DEVIL round1: argue against. Should we rewrite it in Rust?" in first and "Tone: blunt." in first
    assert "DEVIL round4" in texts(requests_with(fake, "verdict")[0])


def test_a_plugin_strategys_options_are_validated(plugin: Any, conclave_env: Any) -> None:
    with pytest.raises(ConfigError, match=r"mode\.options\.volume"):
        conclave.api.compose_settings("q", ["mode.strategy=devils_advocate", "+mode.options.volume=11"], plugin)
