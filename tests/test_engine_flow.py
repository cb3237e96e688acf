"""End-to-end consultations on the fake provider server: the rounds, what each participant received, modes,
round limits, fair judging, events and the recorder's flushes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_engine_support import (
    AGENT_MODELS,
    JUDGE_MODEL,
    requests_with,
    run_consultation,
    schema_of,
    script_panel,
    synthesis,
    texts,
)

from conclave.artifacts import schema_registry as artifacts
from conclave.events import ROUND_ARTIFACT
from conclave.testing.fake_server import FakeProviderServer
from conclave.tokens import count_tokens

FULL_PATH = ["IDLE", "ESTIMATING", "AWAITING_CONSENT", "INDEPENDENT", "SYNTHESIS", "CROSS_EXAM", "VERDICT", "COMPLETE"]

# Five consensus points and three tensions, written by the judge with labels; filtering keeps 3 and 2.
POINTS = [(f"point {i} (confidence {c})", ["Agent A", "Agent B"], c) for i, c in
          enumerate([0.55, 0.95, 0.65, 0.85, 0.75])]
TENSIONS = [
    ("two-sided", [("Agent A", "yes"), ("Agent C", "no")]),
    ("three-sided", [("Agent A", "yes"), ("Agent B", "no"), ("Agent C", "maybe")]),
    ("also two-sided", [("Agent B", "later"), ("Agent C", "never")]),
]
CROSS_EXAM = {
    "challenges": [{"challenger": "Agent A", "target_agent": "Agent B", "challenge": "Agent B ignores replay cost",
                    "evidence": ["replays take hours"]}],
    "rebuttals": [{"agent": "Agent B", "rebuttal": "snapshots bound replay time"}],
    "unresolved": ["how long to keep events"],
}
VERDICT = {"recommendation": "Adopt event sourcing for invoices only", "confidence": 0.8,
           "evidence": ["Agent A: audit trail"], "dissent": [{"agent": "Agent C", "concern": "cost",
                                                               "severity": "medium"}]}


def _judge(fake: FakeProviderServer, **answers: Any) -> None:
    script_panel(fake, synthesis=synthesis(POINTS, TENSIONS), cross_exam=CROSS_EXAM, verdict=VERDICT, **answers)


async def test_a_full_converge_consultation(fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    _judge(fake)
    run = await run_consultation(fake)
    result = run.result
    assert run.states() == FULL_PATH
    assert result.status == "complete" and result.completed_rounds == 4 and result.abort_reason is None

    # every stored artifact validates against its schema
    for name, artifact in result.artifacts.round_1.items():
        assert artifacts.validate("independent", artifact) == [] and artifact["agent_id"] == name
    artifacts.check("synthesis", result.artifacts.round_2)
    for reply in result.artifacts.round_3_replies.values():
        artifacts.check("cross_exam_reply", reply)
    artifacts.check("cross_exam", result.artifacts.round_3)
    artifacts.check("verdict", result.artifacts.round_4)
    assert result.verdict == result.artifacts.round_4
    assert result.recommendation == VERDICT["recommendation"] and result.confidence == 0.8
    assert result.concerns == ["how long to keep events"]

    # the judge wrote labels; the record names agents
    assert result.artifacts.round_2 is not None and result.artifacts.round_3 is not None
    labels = result.judge_labels
    name_of = {label: name for name, label in labels.items()}
    assert result.artifacts.round_2["consensus_points"][0]["supporting_agents"] == [name_of["Agent A"],
                                                                                   name_of["Agent B"]]
    assert result.dissent == [{"agent": name_of["Agent C"], "concern": "cost", "severity": "medium"}]
    challenge = result.artifacts.round_3["challenges"][0]
    assert challenge["challenge"] == f"{name_of['Agent B']} (Agent B) ignores replay cost"
    assert {a.name: a.label for a in result.agents} == labels
    assert sorted(labels.values()) == ["Agent A", "Agent B", "Agent C"]

    # round 3: each agent got its own round-1 position, the filtered synthesis and the adversarial instruction
    for name, model in AGENT_MODELS.items():
        (reply_request,) = requests_with(fake, "cross_exam_reply", model)
        shown = texts(reply_request)
        assert f"position of {name} via {model}" in shown
        assert not any(f"position of {other}" in shown for other in AGENT_MODELS if other != name)
        assert "Challenge the consensus or defend your position" in shown
        assert f"you appear as {(result.peer_labels or {})[name][name]}" in shown  # its own view of the panel
        kept = [p for p, _, c in POINTS if c >= 0.75]
        assert all(p in shown for p in kept) and not any(p in shown for p, _, c in POINTS if c < 0.75)
        assert "three-sided" in shown and "two-sided" in shown and "also two-sided" not in shown

    # round 4: the judge saw every round-1 position, labels only, and the filtered round 2 and 3
    (verdict_request,) = requests_with(fake, "verdict", JUDGE_MODEL)
    shown = texts(verdict_request)
    assert all(f"position of {name}" in shown for name in AGENT_MODELS)
    for name in AGENT_MODELS:
        assert f'"agent_id": "{name}"' not in shown and f'"{name}"' not in shown
    assert '"agent_id": "Agent A"' in shown and "how long to keep events" in shown
    assert "point 0 (confidence 0.55)" not in shown
    # the round-3 judge records the cross-examination against the synthesis the agents were shown
    (judge_request,) = requests_with(fake, "cross_exam", JUDGE_MODEL)
    assert "point 1 (confidence 0.95)" in texts(judge_request) and "point 0 (confidence 0.55)" not in texts(
        judge_request)

    # filtering was applied and measured
    applied = run.of("filter:applied")
    assert [(a["round_number"], a["artifact_type"]) for a in applied] == [(3, "synthesis"), (3, "synthesis"),
                                                                          (4, "synthesis"), (4, "cross_exam")]
    assert applied[0]["tokens_after"] < applied[0]["tokens_before"] and applied[0]["recipients"] == 3
    stats = result.token_efficiency_stats
    assert stats is not None and stats["filtered_rounds"] == [3, 4]
    saved, used = stats["tokens_saved_via_filtering"], stats["tokens_used"]
    assert saved >= 3 * (applied[0]["tokens_before"] - applied[0]["tokens_after"]) > 0
    assert stats["efficiency_percentage"] == round(saved / (used + saved) * 100, 1)
    # "used" is the input the round-3 and round-4 calls were sent, counted on the prompts as the server got them
    later = [r for r in fake.requests if schema_of(r) in ("cross_exam_reply", "cross_exam", "verdict")]
    received = sum(count_tokens(_prompt_text(r)) for r in later)
    assert abs(used - received) <= 2 * len(later)  # separators between the parts: a token or two per call

    # cost and tokens come from every call the providers answered
    assert result.tokens.total == sum(a["input_tokens"] + a["output_tokens"] for a in run.of("provider:attempt"))
    assert result.cost.actual > 0 and set(result.cost.by_provider) == {"openai", "anthropic", "gemini"}
    assert result.cost.estimated is not None and result.cost.estimated >= result.cost.actual


async def test_the_judge_sees_a_shuffled_order_recorded_by_seed(fake_provider_server: FakeProviderServer,
                                                                conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    run = await run_consultation(fake, "rounds=2")
    (synthesis_request,) = requests_with(fake, "synthesis", JUDGE_MODEL)
    shown = texts(synthesis_request)
    order = sorted(run.result.judge_labels, key=run.result.judge_labels.__getitem__)  # label order A, B, C
    positions = [shown.index(f"position of {name}") for name in order]
    assert positions == sorted(positions)
    started = run.of("consultation:started")[0]
    assert started["shuffle_seed"] == run.result.shuffle_seed and started["judge_labels"] == run.result.judge_labels
    from conclave.engine.labels import JudgeLabels

    assert JudgeLabels(list(AGENT_MODELS), run.result.shuffle_seed).by_name == run.result.judge_labels


async def test_explore_mode_uses_its_own_prompts_and_schemas(fake_provider_server: FakeProviderServer,
                                                             conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake, confidence=0.5, synthesis=synthesis([("shared", ["Agent A", "Agent B"], 0.99)]))
    run = await run_consultation(fake, "mode=explore")
    result = run.result
    assert run.states() == FULL_PATH and result.strategy == "explore"
    assert result.verdict is not None and result.early_termination is not None
    assert all(requests_with(fake, "cross_exam_reply_explore", m) for m in AGENT_MODELS.values())
    assert not requests_with(fake, "cross_exam_reply")
    artifacts.check("verdict_explore", result.verdict)
    assert result.recommendation == result.verdict["summary"]
    decided = run.of("early_termination:decided")
    assert decided == [result.early_termination.model_dump() | {"notice": "Explore mode: all rounds will execute"}]
    assert not decided[0]["offered"]  # confidence 0.99 would have offered it in converge mode
    assert all(v.startswith("explore/") for v in result.prompt_versions.values())
    shown = texts(requests_with(fake, "cross_exam_reply_explore", AGENT_MODELS["architect"])[0])
    assert "Yes, and" in shown


@pytest.mark.parametrize(
    ("overrides", "rounds", "states", "judge_calls"),
    [
        (["rounds=1"], 1, [*FULL_PATH[:4], "COMPLETE"], 0),
        (["rounds=2"], 2, [*FULL_PATH[:5], "COMPLETE"], 1),
        (["quick=true"], 2, [*FULL_PATH[:5], "COMPLETE"], 1),
        (["rounds=3"], 3, [*FULL_PATH[:6], "COMPLETE"], 2),
    ],
)
async def test_round_limits(fake_provider_server: FakeProviderServer, conclave_env: Any, overrides: list[str],
                            rounds: int, states: list[str], judge_calls: int) -> None:
    fake = fake_provider_server
    _judge(fake)
    run = await run_consultation(fake, *overrides)
    result = run.result
    assert run.states() == states
    assert result.status == "complete" and result.planned_rounds == rounds == result.completed_rounds
    assert len(fake.requests_for(JUDGE_MODEL)) == judge_calls
    assert len(requests_with(fake, "cross_exam_reply")) == (3 if rounds >= 3 else 0)
    assert result.artifacts.round_4 is None
    if rounds == 1:
        assert result.verdict is None and result.recommendation is None and result.confidence is None
    else:  # derived from the synthesis: the top consensus point, the mean confidence
        artifacts.check("verdict", result.verdict)
        assert result.recommendation == "point 1 (confidence 0.95)"
        assert result.confidence == pytest.approx(0.75)
    assert result.concerns == (["how long to keep events"] if rounds == 3 else [])
    assert [e["round_number"] for e in run.of("round:completed")] == list(range(1, rounds + 1))


async def test_events_follow_the_contract_and_the_recorder_flushes_between_rounds(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    fake = fake_provider_server
    _judge(fake)
    log: list[tuple[str, str]] = []

    class Recorder:
        def __call__(self, event: Any) -> None:
            log.append(("event", event.type))

        def flush(self) -> None:
            log.append(("flush", ""))

    run = await run_consultation(fake, recorder=Recorder())
    types = [t for kind, t in log if kind == "event"]
    assert types == [e.type for e in run.events]
    assert [e.seq for e in run.events] == list(range(len(run.events)))
    assert types[0] == "consultation:started" and types[-1] == "consultation:completed"
    for index, (_kind, t) in enumerate(log):
        if t == "round:started" and any(x == "round:completed" for _, x in log[:index]):
            previous = max(i for i, (_, x) in enumerate(log[:index]) if x == "round:completed")
            assert ("flush", "") in log[previous:index], "the round's events must be durable before the next"
    assert log[-1] == ("flush", "")
    artifacts_events = [e for e in run.events if e.type == ROUND_ARTIFACT]
    assert [(e.data["round_number"], e.data["agent"] is None) for e in artifacts_events].count((3, True)) == 1
    assert all(e.data["status"] == "valid" and e.data["raw_text"] for e in artifacts_events)
    completed = run.of("consultation:completed")[0]
    assert completed["status"] == "complete" and completed["result"] == run.result.as_dict()
    json.dumps([e.as_dict() for e in run.events])  # every payload is JSON


async def test_filtering_off_sends_full_artifacts_and_reports_no_filtering(fake_provider_server: FakeProviderServer,
                                                                          conclave_env: Any) -> None:
    fake = fake_provider_server
    _judge(fake)
    run = await run_consultation(fake, "filtering.enabled=false")
    assert run.result.status == "complete" and not run.of("filter:applied")
    assert run.result.token_efficiency_stats is None
    shown = texts(requests_with(fake, "cross_exam_reply", AGENT_MODELS["architect"])[0])
    assert all(point in shown for point, _, _ in POINTS) and "also two-sided" in shown
    assert run.of("consultation:started")[0]["filtering"] is False


async def test_verbose_is_display_only_and_still_filters(fake_provider_server: FakeProviderServer,
                                                         conclave_env: Any) -> None:
    fake = fake_provider_server
    _judge(fake)
    run = await run_consultation(fake, "verbose=true")
    assert run.result.status == "complete" and run.of("filter:applied")
    assert run.result.token_efficiency_stats is not None
    shown = texts(requests_with(fake, "cross_exam_reply", AGENT_MODELS["architect"])[0])
    assert not all(point in shown for point, _, _ in POINTS)  # the synthesis was cut to filtering.round3
    assert run.of("consultation:started")[0]["verbose"] is True


def _prompt_text(request: Any) -> str:
    """The system prompt and user turn of a recorded request, whatever the wire format."""
    body = request.json
    if "messages" in body and "contents" not in body:
        parts = [body.get("system")] if isinstance(body.get("system"), str) else []
        parts += [m["content"] for m in body["messages"] if m["role"] in ("system", "user")
                  and isinstance(m["content"], str)]
        return "\n".join(p for p in parts if p)
    system = " ".join(p.get("text", "") for p in (body.get("systemInstruction") or {}).get("parts", []))
    user = " ".join(p.get("text", "") for c in body.get("contents", []) for p in c.get("parts", []))
    return f"{system}\n{user}"
