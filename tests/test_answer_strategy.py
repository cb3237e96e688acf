"""The built-in ``answer`` strategy: a real mode, registered through the plugin door, whose answer-bearing
artifacts carry a scorable ``final_answer``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import conclave
from conclave.events import FILTER_APPLIED
from conclave.plugins import get_plugins
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer

PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o",
         "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]
QUESTION = "What is the result of 3+4*5+6-7*8? Give the final answer as a single integer."


def test_answer_is_registered_like_any_plugin_strategy() -> None:
    plugins = get_plugins()
    assert "answer" in plugins.strategies.names()
    strategy = plugins.strategies.get("answer")(None)
    assert strategy.prompt_versions()["round_1"].startswith("answer/round1@v1#sha256:")


async def test_every_round_asks_for_a_final_answer_and_the_verdict_has_one(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    AnswerPanel({"Security Expert": 1.0, "Systems Architect": 1.0, "Pragmatic Engineer": 0.0}).install(fake)
    # a confident panel citing nothing fires early convergence; this test is about the answer fields of the four
    # standard rounds, so the detectors only record (the objection round has its own tests)
    overrides = [*fake.overrides(), *PANEL, "cost.auto_approve=true", "mode=answer", "quality.stage=shadow"]
    seen: list[Any] = []
    result = await conclave.consult_async(QUESTION, overrides, subscribers=[seen.append])
    filtered = [e.data for e in seen if e.type == FILTER_APPLIED]
    assert filtered and all(f["error"] is None for f in filtered)  # the synthesis' final_answer does not break it
    assert result.status == "complete" and result.strategy == "answer"
    assert result.verdict is not None and result.verdict["final_answer"] == "-27"
    assert {a["final_answer"] for a in result.artifacts.round_1.values()} == {"-27", "-26"}
    titles = {r.schema.get("title") for r in fake.requests if isinstance(r.schema, dict)}
    for title in ("Round 1 · Independent answer (answer mode)", "Round 2 · Synthesis with the judge's answer "
                  "(answer mode)", "Round 3 · Agent reply with its answer now (answer mode)",
                  "Round 4 · Verdict with the final answer (answer mode)"):
        assert title in titles
    asked = [r for r in fake.requests if isinstance(r.schema, dict) and "final_answer" in r.schema.get("required", [])]
    assert len(asked) == 3 + 1 + 3 + 1  # every round but the cross-examination record


async def test_a_two_round_run_answers_with_the_synthesis_final_answer(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    AnswerPanel({"Security Expert": 0.0, "Systems Architect": 0.0, "Pragmatic Engineer": 1.0}).install(fake)
    result = await conclave.consult_async(QUESTION, [*fake.overrides(), *PANEL, "cost.auto_approve=true",
                                                     "mode=answer", "rounds=2"])
    assert result.status == "complete" and result.verdict is not None
    assert result.verdict["final_answer"] == result.artifacts.round_2["final_answer"] == "-26"  # the majority
