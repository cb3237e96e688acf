"""Selective debate: the vote gate after round 1 decides when the panel agrees and lets the debate run when it
does not; its decision is journaled (schema ``vote_gate``), indexed and reported. Aggregators are plugins."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_conclave
from test_engine_support import answering, run_consultation

import conclave
from conclave.artifacts import schema_registry as artifacts
from conclave.engine.interaction import Interaction
from conclave.events import COST_ESTIMATED, VOTE_GATE
from conclave.render.markdown import render_markdown
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o",
         "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]
QUESTION = "What is the result of 3+4*5+6-7*8? Give the final answer as a single integer."
NAMES = ("Security Expert", "Systems Architect", "Pragmatic Engineer")


async def _consult(fake: FakeProviderServer, accuracy: tuple[float, float, float], *extra: str
                   ) -> tuple[Any, list[Any]]:
    AnswerPanel(dict(zip(NAMES, accuracy, strict=True))).install(fake)
    seen: list[Any] = []
    result = await conclave.consult_async(
        QUESTION, [*fake.overrides(), *PANEL, "cost.auto_approve=true", "mode=answer", *extra],
        subscribers=[seen.append])
    return result, seen


def _judge_calls(fake: FakeProviderServer) -> int:
    return sum(1 for r in fake.requests if (r.json or {}).get("model") == "gpt-4.1")


async def test_an_agreeing_panel_is_decided_by_the_vote_after_round_1(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    result, seen = await _consult(fake_provider_server, (1.0, 1.0, 1.0))
    assert result.status == "complete" and result.completed_rounds == 1
    assert _judge_calls(fake_provider_server) == 0  # no synthesis, no verdict call: the vote decided
    gate = result.vote_gate
    assert gate["decided"] and gate["reason"] == "agreed" and gate["aggregator"] == "confidence"
    assert gate["agreement"] == 1.0 and gate["tau"] == 0.8 and len(gate["supporters"]) == 3
    assert result.verdict is not None and result.verdict["final_answer"] == "-27"
    events = [e.data for e in seen if e.type == VOTE_GATE]
    assert len(events) == 1 and artifacts.validate("vote_gate", events[0]) == []
    report = " ".join(render_markdown(result.as_dict()).split())
    assert "decided by the vote after round 1: 3 of 3 agree, weight 1.00 ≥ 0.8 (aggregator confidence)" in report


async def test_a_split_panel_is_debated_and_the_gate_says_why(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    result, _ = await _consult(fake_provider_server, (1.0, 1.0, 0.0), "quality.stage=shadow")
    gate = result.vote_gate
    assert not gate["decided"] and gate["reason"] == "below_tau" and gate["agreement"] == pytest.approx(0.6667)
    # the debate ran one cross-examination; the aggregate of the answers that count decided (no judge verdict)
    assert result.completed_rounds == 2 and result.final_aggregate is not None and result.verdict is not None
    assert "debated: the vote after round 1 did not decide (2 of 3 agree, weight 0.67 &lt; 0.8" in \
        " ".join(render_markdown(result.as_dict()).split())


async def test_tau_is_a_plain_key_and_the_gate_can_be_switched_off(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    result, _ = await _consult(fake_provider_server, (1.0, 1.0, 0.0), "selective.tau=0.6")
    assert result.vote_gate["decided"] and result.completed_rounds == 1
    assert result.verdict is not None and result.verdict["final_answer"] == "-27"
    fake_provider_server.requests.clear()
    result, _ = await _consult(fake_provider_server, (1.0, 1.0, 1.0), "selective.enabled=false",
                               "quality.stage=shadow")
    assert result.vote_gate is None and result.completed_rounds == 2


async def test_converge_mode_uses_the_similarity_of_positions_when_enabled(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    position = {"position": "Adopt event sourcing for billing with a staged migration.", "confidence": 0.9}
    fake.script("gpt-4o", lambda request: _independent(request, position))
    result = await conclave.consult_async("Should billing move to event sourcing?", [
        *fake.overrides(), *PANEL, "cost.auto_approve=true", "selective.enabled=true", "aggregator=plurality"])
    gate = result.vote_gate
    assert gate["compared"] == "position_similarity" and gate["decided"] and result.completed_rounds == 1
    assert result.verdict is not None and result.verdict["recommendation"] == position["position"]


def _independent(request: Any, fields: dict[str, Any]) -> Any:
    body = instance_for(request.schema)
    body.update(fields)
    return Reply(json=body)


async def test_the_gate_is_journaled_and_indexed(fake_provider_server: FakeProviderServer,
                                                 conclave_env: Path) -> None:
    fake = fake_provider_server
    AnswerPanel(dict(zip(NAMES, (1.0, 1.0, 1.0), strict=True))).install(fake)
    recorder = Recorder(conclave_env)
    run = await run_consultation(fake, *PANEL, "mode=answer", question=QUESTION, recorder=recorder,
                                 base=("cost.auto_approve=true",))
    recorder.close()
    cid = run.result.consultation_id
    layout = StoreLayout(conclave_env)
    assert '"vote:gate"' in layout.journal_path(cid).read_text()
    with sqlite3.connect(layout.index_path) as db:
        row = db.execute("select vote_gate_decided, vote_gate_agreement, vote_gate_tau, vote_gate_aggregator, "
                         "vote_gate_reason, rounds_completed from consultations where id = ?", (cid,)).fetchone()
    assert row == (1, 1.0, 0.8, "confidence", "agreed", 1)


@pytest.mark.parametrize(("override", "line"), [
    ("aggregator=nope", "aggregator: 'nope' is not a registered aggregator; allowed: confidence, judge_pick, "
                        "learned, plurality"),
    ("selective.tau=1.5", "selective.tau: must be a number from 0 to 1 (got 1.5)"),
    ("selective.tau=-0.1", "selective.tau: must be a number from 0 to 1 (got -0.1)"),
    ("selective.tau=high", "selective.tau: must be a number from 0 to 1 (got 'high')"),
])
def test_bad_aggregator_or_tau_is_one_line_and_exit_2(tmp_path: Path, override: str, line: str) -> None:
    done = run_conclave("What is 2+2?", "mode=answer", override, home=tmp_path, env=FAKE_KEYS)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [f"conclave: {line}"], done.stderr


async def test_the_estimate_covers_the_full_plan_and_says_the_vote_may_stop_after_round_1(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    AnswerPanel(dict(zip(NAMES, (1.0, 1.0, 1.0), strict=True))).install(fake)
    asked: list[str] = []
    run = await run_consultation(fake, *PANEL, "mode=answer", "cost.always_allow_under=0", question=QUESTION,
                                 base=(), interaction=Interaction(True, ask=answering(asked, "y")))
    estimate = run.of(COST_ESTIMATED)[-1]
    # answer mode: one cross-examination round on the peers' answers, the whole plan estimated (the aggregate
    # decides: no synthesis, no verdict call)
    assert estimate["rounds"] == [1, 2]
    assert estimate["may_stop_after_round"] == 1 and 0 < estimate["round_1_cost"] < estimate["estimated_cost"]
    assert len(asked) == 1 and "if the panel agrees after round 1 the vote decides there, for about $" in asked[0]
    assert run.result.completed_rounds == 1 and run.result.cost.estimated == estimate["estimated_cost"]


async def test_answer_mode_plays_one_cross_examination_unless_the_cap_is_raised(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    _, seen = await _consult(fake_provider_server, (1.0, 1.0, 0.0), "quality.stage=shadow")
    assert [e.data["rounds"] for e in seen if e.type == COST_ESTIMATED][-1] == [1, 2]
    # the cap counts the synthesis' and the verdict's rounds even when the aggregate decides in their place
    _, seen = await _consult(fake_provider_server, (1.0, 1.0, 0.0), "exit.round_cap=6")
    assert [e.data["rounds"] for e in seen if e.type == COST_ESTIMATED][-1] == [1, 2, 3, 4]
    _, seen = await _consult(fake_provider_server, (1.0, 1.0, 0.0), "exit.round_cap=6", "selective.judge_verdict=true")
    assert [e.data["rounds"] for e in seen if e.type == COST_ESTIMATED][-1] == [1, 2, 3, 4, 5, 6]


async def test_learned_weights_without_history_decide_with_equal_weights_and_the_report_says_so(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    result, _ = await _consult(fake_provider_server, (1.0, 1.0, 1.0), "aggregator=learned")
    gate = result.vote_gate
    assert gate["aggregator"] == "learned" and gate["basis"] == {"security": 0, "architect": 0, "pragmatist": 0}
    assert gate["decided"] and set(gate["weights"].values()) == {0.3333}
    assert "(no graded history: equal weights)" in " ".join(render_markdown(result.as_dict()).split())


async def test_judge_pick_cannot_decide_after_round_1_so_the_debate_runs(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    result, _ = await _consult(fake_provider_server, (1.0, 1.0, 1.0), "aggregator=judge_pick", "quality.stage=shadow")
    assert result.vote_gate["reason"] == "aggregator_undecided" and result.completed_rounds >= 2
