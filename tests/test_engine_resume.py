"""Resuming from stored round artifacts: restored rounds make no provider calls, and the judge still sees
labels only, with the same mapping as the first run."""

from __future__ import annotations

from typing import Any

from test_engine_support import AGENT_MODELS, JUDGE_MODEL, requests_with, run_consultation, script_panel, texts

from conclave import artifacts
from conclave.testing.fake_server import FakeProviderServer

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
    reply_request = requests_with(fake, "cross_exam_reply", AGENT_MODELS["architect"])[0]
    assert "Agent B and Agent C want an outbox" in texts(reply_request)
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
