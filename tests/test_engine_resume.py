"""Resuming from stored round artifacts: restored rounds make no provider calls, and the judge still sees
labels only, with the same mapping as the first run. How a round's end is journaled (what resume trusts), and
the cost a resumed run reports (every run's billed calls)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from test_engine_support import (
    AGENT_MODELS,
    BASE_OVERRIDES,
    JUDGE_MODEL,
    QUESTION,
    requests_with,
    run_consultation,
    script_panel,
    texts,
)

from conclave.api import compose_settings
from conclave.artifacts import schema_registry as artifacts
from conclave.engine.run import Consultation
from conclave.events import ROUND_ARTIFACT, ROUND_COMPLETED, ROUND_INTERRUPTED, Event
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.resume_points import load_resume_point
from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest

JUDGED = {
    "consensus_points": [{"point": "Agent B and Agent C want an outbox", "supporting_agents": ["Agent B", "Agent C"],
                          "confidence": 0.7}],
    "tensions": [{"topic": "scope", "viewpoints": [{"agent": "Agent A", "viewpoint": "all services"},
                                                   {"agent": "Agent B", "viewpoint": "billing only"}]}],
    "priority_order": ["correctness"],
}


async def test_resume_after_round_2_calls_no_round_1_or_2_provider(fake_provider_server: FakeProviderServer,
                                                                   conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake, synthesis=JUDGED)
    first = (await run_consultation(fake, "rounds=2")).result
    fake.reset()
    script_panel(fake)
    stored = first.as_dict()
    resume_from = {
        "round_1": stored["artifacts"]["round_1"],
        "round_2": stored["artifacts"]["round_2"],
        "labels": stored["judge_labels"],
        "shuffle_seed": stored["shuffle_seed"],
    }
    run = await run_consultation(fake, resume_from=resume_from)
    result = run.result
    assert not requests_with(fake, "independent") and not requests_with(fake, "synthesis")
    assert result.status == "complete" and result.completed_rounds == 4
    assert result.artifacts.round_1 == first.artifacts.round_1 and result.artifacts.round_2 == first.artifacts.round_2
    assert result.judge_labels == first.judge_labels and result.shuffle_seed == first.shuffle_seed
    assert [t.reason for t in result.transitions][2:4] == ["restored round 1", "restored round 2"]
    assert [e["round_number"] for e in run.of("round:started")] == [3, 4]
    assert run.of("consultation:cost_estimated")[0]["rounds"] == [3, 4]
    assert run.of("consultation:started")[0]["resumed_rounds"] == ["round_1", "round_2"]
    artifacts.check("verdict", result.verdict)

    # what the round-3 agents and the round-4 judge saw of the restored synthesis is the judge's own wording
    names = {label: name for name, label in first.judge_labels.items()}
    assert first.artifacts.round_2 is not None
    assert first.artifacts.round_2["consensus_points"][0]["point"] == \
        f"{names['Agent B']} (Agent B) and {names['Agent C']} (Agent C) want an outbox"
    # the architect reads it under its own labels, the same after the resume as before
    assert result.peer_labels == first.peer_labels
    view = (result.peer_labels or {})["architect"]
    reply_request = requests_with(fake, "cross_exam_reply", AGENT_MODELS["architect"])[0]
    assert f"{view[names['Agent B']]} and {view[names['Agent C']]} want an outbox" in texts(reply_request)
    verdict_text = texts(requests_with(fake, "verdict", JUDGE_MODEL)[0])
    assert "Agent B and Agent C want an outbox" in verdict_text
    assert not any(f'"{name}"' in verdict_text for name in AGENT_MODELS)


async def test_resume_keeps_round_1_absences(fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    first = (await run_consultation(fake, "rounds=1")).result
    fake.reset()
    kept = {k: v for k, v in first.artifacts.round_1.items() if k != "pragmatist"}
    run = await run_consultation(fake, "rounds=2", resume_from={"round_1": kept, "shuffle_seed": first.shuffle_seed})
    assert not requests_with(fake, "independent")
    assert run.result.absent_agents == ["pragmatist"] and run.result.status == "completed_degraded"
    label = run.result.judge_labels["pragmatist"]
    assert f"Absent: {label}" in texts(requests_with(fake, "synthesis")[0])


# ------------------------------------------------------------------ how a round ends, as resume will read it


async def _cancelled_in_round_1(fake: FakeProviderServer, home: Path) -> tuple[Consultation, list[Event]]:
    """A journaled consultation cancelled (as by Ctrl-C) in round 1 once the architect has answered and the two
    other agents hang."""
    script_panel(fake)
    asked: set[str] = set()

    def hang(request: RecordedRequest) -> Fault:
        asked.add(request.model or "")
        return Fault.hang()

    for name in ("security", "pragmatist"):  # two of three agents never answer round 1
        fake.script(AGENT_MODELS[name], hang)
    settings = compose_settings(QUESTION, [*fake.overrides(), *BASE_OVERRIDES, "hedging.enabled=false"])
    events: list[Event] = []
    recorder = Recorder(home, index=False)
    consultation = Consultation(settings, subscribers=[events.append], recorder=recorder)
    task = asyncio.create_task(consultation.run())
    for _ in range(3000):
        if len(asked) == 2 and any(e.type == ROUND_ARTIFACT for e in events):
            break
        await asyncio.sleep(0.01)
    assert len(asked) == 2 and [e.data["agent"] for e in events if e.type == ROUND_ARTIFACT] == ["architect"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    recorder.close()
    return consultation, events


async def test_a_round_cancelled_mid_flight_is_journaled_as_interrupted_and_not_restored(
    fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path
) -> None:
    consultation, events = await _cancelled_in_round_1(fake_provider_server, tmp_path)

    ends = [(e.type, e.data["round_number"]) for e in events if e.type in (ROUND_COMPLETED, ROUND_INTERRUPTED)]
    assert ends == [(ROUND_INTERRUPTED, 1)]
    (interrupted,) = [e.data for e in events if e.type == ROUND_INTERRUPTED]
    assert interrupted["reason"] == "cancelled" and interrupted["detail"] == "interrupted by the user"
    assert interrupted["cost"] > 0  # the architect's answer was billed
    assert consultation.result is not None and consultation.result.status == "partial"
    point = load_resume_point(StoreLayout(tmp_path), consultation.id)
    assert point.restored_rounds == [] and point.resume_from["round_1"] == {}
    assert point.resume_from["spent"]["cost"] == pytest.approx(interrupted["cost"], abs=1e-6)


async def test_resume_does_not_ask_again_an_agent_that_answered_inside_the_interrupted_round(
    fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path
) -> None:
    """Interrupted in round 1 after the architect answered: the resumed run reuses that (paid) answer and asks
    only the two agents that had not answered; the journal still holds all three answers for round 1."""
    fake = fake_provider_server
    consultation, events = await _cancelled_in_round_1(fake, tmp_path)
    architect_answer = next(e.data["artifact"] for e in events if e.type == ROUND_ARTIFACT)

    fake.reset()
    script_panel(fake)
    point = load_resume_point(StoreLayout(tmp_path), consultation.id)
    assert point.resume_from["interrupted"]["round_number"] == 1
    recorder = Recorder(tmp_path, index=False)
    resumed: list[Event] = []
    again = Consultation(point.settings, subscribers=[resumed.append], recorder=recorder,
                         resume_from=point.resume_from, consultation_id=consultation.id, first_seq=point.next_seq)
    result = await again.run()
    recorder.close()
    assert result.status == "complete"
    assert not requests_with(fake, "independent", AGENT_MODELS["architect"])  # not paid for twice
    assert requests_with(fake, "independent", AGENT_MODELS["security"])
    assert result.artifacts.round_1["architect"] == architect_answer
    round_1 = [e.data for e in resumed if e.type == ROUND_ARTIFACT and e.data["round_number"] == 1]
    assert {a["agent"]: a["status"] for a in round_1}["architect"] == "restored" and len(round_1) == 3


async def test_round_completed_says_whether_the_round_can_be_built_on(fake_provider_server: FakeProviderServer,
                                                                      conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    ok = await run_consultation(fake)
    assert [(e["round_number"], e["ok"]) for e in ok.of(ROUND_COMPLETED)] == [(1, True), (2, True), (3, True),
                                                                               (4, True)]
    fake.reset()
    script_panel(fake)
    for name in ("security", "pragmatist"):
        fake.script(AGENT_MODELS[name], Fault.auth_rejected())
    failed = await run_consultation(fake)
    assert failed.result.status == "partial"
    assert [(e["round_number"], e["ok"]) for e in failed.of(ROUND_COMPLETED)] == [(1, False)]
    assert not failed.of(ROUND_INTERRUPTED)


# ------------------------------------------------------------------ cost across runs


async def test_the_result_counts_what_earlier_runs_spent(fake_provider_server: FakeProviderServer,
                                                         conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    first = (await run_consultation(fake, "rounds=1")).result
    earlier = {"cost": 0.25, "input_tokens": 1000, "output_tokens": 300, "cached_input_tokens": 50,
               "by_provider": {"openai": 0.2, "mistral": 0.05}, "unknown_prices": ["mistral/house-model"]}
    resume_from = {"round_1": first.artifacts.round_1, "shuffle_seed": first.shuffle_seed}

    fake.reset()
    script_panel(fake)
    alone = await run_consultation(fake, resume_from=resume_from)  # the same continuation, nothing spent before
    fake.reset()
    script_panel(fake)
    resumed = await run_consultation(fake, resume_from={**resume_from, "spent": earlier})

    own, result = alone.result, resumed.result
    assert result.status == "complete" and own.status == "complete"
    attempts = resumed.of("provider:attempt")
    assert result.cost.actual == pytest.approx(0.25 + sum(a["cost"] for a in attempts), abs=1e-6)
    assert result.cost.actual == pytest.approx(own.cost.actual + 0.25, abs=1e-6)
    assert result.cost.by_provider == pytest.approx(
        {**own.cost.by_provider, "openai": own.cost.by_provider["openai"] + 0.2, "mistral": 0.05}, abs=1e-6)
    assert result.cost.unknown_prices == ["mistral/house-model"]
    assert (result.tokens.input, result.tokens.output, result.tokens.cached_input) == (
        own.tokens.input + 1000, own.tokens.output + 300, own.tokens.cached_input + 50)
    assert result.tokens.total == own.tokens.total + 1300
    # the estimate it is held against covers every planned round, the restored round 1 included
    (estimated,) = resumed.of("consultation:cost_estimated")
    assert estimated["rounds"] == [2, 3, 4]
    assert result.cost.estimated is not None and estimated["estimated_cost"] is not None
    assert result.cost.estimated > estimated["estimated_cost"]
    # only the aggregate known (an older caller): it still counts in the total
    fake.reset()
    script_panel(fake)
    bare = await run_consultation(fake, resume_from={**resume_from, "spent": {"cost": 0.25}})
    assert bare.result.cost.actual == pytest.approx(own.cost.actual + 0.25, abs=1e-6)
    assert bare.result.cost.by_provider == own.cost.by_provider
