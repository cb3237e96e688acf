"""Early termination after round 2 (converge only): accepted, declined, guarded against a rubber stamp."""

from __future__ import annotations

from typing import Any

import pytest
from test_engine_support import JUDGE_MODEL, answering, requests_with, run_consultation, script_panel, synthesis

from conclave.artifacts import schema_registry as artifacts
from conclave.engine.interaction import Interaction
from conclave.testing.fake_server import FakeProviderServer

STRONG = synthesis([("Adopt it for invoices", ["Agent A", "Agent B", "Agent C"], 0.95),
                    ("Keep the ledger", ["Agent A", "Agent B"], 0.93)],
                   [("timeline", [("Agent C", "next year"), ("Agent A", "now")])])


async def test_strong_consensus_ends_after_round_2_when_accepted(fake_provider_server: FakeProviderServer,
                                                                 conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake, confidence=0.7, synthesis=STRONG)
    run = await run_consultation(fake)
    result = run.result
    assert run.states()[-3:] == ["INDEPENDENT", "SYNTHESIS", "COMPLETE"]
    assert result.status == "complete" and result.completed_rounds == 2 and result.planned_rounds == 4
    assert not requests_with(fake, "cross_exam_reply") and len(fake.requests_for(JUDGE_MODEL)) == 1
    early = result.early_termination
    assert early is not None and early.offered and early.accepted
    assert early.reason == "high_confidence_after_synthesis" and early.rounds_skipped == 2
    assert early.confidence == pytest.approx(0.94) and early.threshold == 0.9
    (saved_rounds,) = run.of("consultation:cost_estimated")
    assert early.estimated_cost_saved is not None and 0 < early.estimated_cost_saved < saved_rounds["estimated_cost"]
    assert run.of("early_termination:decided") == [early.model_dump()]
    artifacts.check("verdict", result.verdict)
    assert result.recommendation == "Adopt it for invoices" and result.confidence == pytest.approx(0.94)
    assert result.artifacts.round_4 is None and result.artifacts.round_3 is None


async def test_declined_non_interactively_it_runs_every_round(fake_provider_server: FakeProviderServer,
                                                              conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake, confidence=0.7, synthesis=STRONG)
    run = await run_consultation(fake, "early_termination.non_interactive=decline")
    early = run.result.early_termination
    assert early is not None and early.offered and not early.accepted and early.reason == "declined_non_interactive"
    assert run.result.completed_rounds == 4 and early.rounds_skipped == 0 and early.estimated_cost_saved is None


async def test_a_terminal_user_is_asked_and_may_decline(fake_provider_server: FakeProviderServer,
                                                        conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake, confidence=0.7, synthesis=STRONG)
    asked: list[str] = []
    run = await run_consultation(fake, interaction=Interaction(True, ask=answering(asked, "n")))
    assert asked == ["Strong consensus reached (confidence 94%). Terminate early and skip Rounds 3-4? [Y/n]"]
    assert run.result.completed_rounds == 4


async def test_a_rubber_stamp_panel_is_not_offered_early_termination(fake_provider_server: FakeProviderServer,
                                                                     conclave_env: Any) -> None:
    # The groupthink detectors decide (quality.stage=on): every agent above 0.85 with no source fires early
    # convergence, an objection round runs before the synthesis, and the strong synthesis is not trusted to
    # skip cross-examination.
    fake = fake_provider_server
    no_tensions = synthesis([("Adopt it", ["Agent A", "Agent B", "Agent C"], 0.97)])
    script_panel(fake, confidence=0.9, synthesis=no_tensions)  # every agent above 0.85, nothing contested
    run = await run_consultation(fake)
    early = run.result.early_termination
    assert early is not None and not early.offered and early.reason == "groupthink_detected"
    assert len(requests_with(fake, "objection")) == 3
    assert run.result.completed_rounds == 5 and requests_with(fake, "cross_exam_reply")


async def test_in_shadow_stage_the_rubber_stamp_rule_still_guards(fake_provider_server: FakeProviderServer,
                                                                   conclave_env: Any) -> None:
    fake = fake_provider_server
    no_tensions = synthesis([("Adopt it", ["Agent A", "Agent B", "Agent C"], 0.97)])
    script_panel(fake, confidence=0.9, synthesis=no_tensions)
    run = await run_consultation(fake, "quality.stage=shadow")
    early = run.result.early_termination
    assert early is not None and not early.offered and early.reason == "rubber_stamp_guard"
    assert run.result.completed_rounds == 4 and not requests_with(fake, "objection")


async def test_below_the_threshold_nothing_is_offered(fake_provider_server: FakeProviderServer,
                                                      conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake, confidence=0.7, synthesis=STRONG)
    run = await run_consultation(fake, "early_termination.threshold=0.95", "rounds=3")
    early = run.result.early_termination
    assert early is not None and not early.offered and early.reason == "below_threshold"
    assert run.result.completed_rounds == 3


async def test_not_offered_when_no_round_after_2_is_planned(fake_provider_server: FakeProviderServer,
                                                           conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake, confidence=0.7, synthesis=STRONG)
    run = await run_consultation(fake, "quick=true")
    assert run.result.early_termination is None and not run.of("early_termination:decided")
