"""The final aggregate: after cross-examination the answer the user gets is decided from the answers that count
(anti-conformity) through the configured aggregator; the judge's verdict, when asked for, is kept beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import conclave
from conclave.artifacts import schema_registry as artifacts
from conclave.events import FINAL_AGGREGATE
from conclave.render.markdown import render_markdown
from conclave.testing.answer_panel import arithmetic_truth
from conclave.testing.fake_server import FakeProviderServer
from conclave.testing.panel_world import PANEL_SEATS, PanelWorld, WorldAgent, panel_overrides

QUESTION = "What is the result of 3+4*5+6-7*8? Give the final answer as a single integer."
TRUTH = arithmetic_truth(QUESTION)
LURE = str(int(TRUTH) + 1)


def _world(accuracy: tuple[float, float, float], *, supported: float, **knobs: Any) -> PanelWorld:
    """Three seats; a wrong agent gives the shared lure; in cross-examination every agent switches to the answer it
    is shown most, bringing a cited source (when it switches to the truth) with chance ``supported``."""
    agents = [WorldAgent(name=n, key=k, model=m, accuracy=a, conformity=1.0, confidence_informative=True)
              for (k, n, m), a in zip(PANEL_SEATS, accuracy, strict=True)]
    return PanelWorld(agents, shared_wrong=1.0, supported_switch=supported, **knobs)


async def _consult(fake: FakeProviderServer, world: PanelWorld, *extra: str) -> tuple[Any, list[Any]]:
    world.install(fake)
    seen: list[Any] = []
    result = await conclave.consult_async(
        QUESTION, [*fake.overrides(), *panel_overrides(world), "cost.auto_approve=true", "mode=answer",
                   "quality.stage=shadow", *extra], subscribers=[seen.append])
    return result, seen


def _user(request: Any) -> str:
    return "\n".join(str(m.get("content")) for m in (request.json or {}).get("messages", []) if m.get("role") == "user")


def _judge_titles(fake: FakeProviderServer) -> list[str]:
    return [str((r.schema or {}).get("title")) for r in fake.requests_for("gpt-4.1")]


async def test_a_supported_switch_decides_and_no_judge_verdict_is_paid_for(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    # the security expert is wrong alone; it switches to the truth with a cited re-derivation
    result, seen = await _consult(fake_provider_server, _world((0.0, 1.0, 1.0), supported=1.0),
                                  "selective.enabled=false")  # debated whatever the gate would say
    assert result.status == "complete" and result.vote_gate is None
    final = result.final_aggregate
    assert final is not None and final["answer"] == TRUTH and final["aggregator"] == "confidence"
    assert final["answers"]["security"]["answer"] == TRUTH  # the supported switch counts
    assert set(final["supporters"]) == {"security", "architect", "pragmatist"}
    assert final["judge_verdict"] is False and final["agrees_with_judge"] is None
    # cross-examination on the peers' round-1 answers: no synthesis, no cross-examination record, no verdict call
    assert _judge_titles(fake_provider_server) == [] and result.completed_rounds == 2
    assert result.prompt_versions["round_3_peers"].startswith("answer/round3_peers@")
    # each agent saw the panel's round-1 answers under neutral labels, without a persona, seat or model name
    replies = [r for r in fake_provider_server.requests if "The panel's round-1 answers" in _user(r)]
    assert len(replies) == 3
    for request in replies:
        shown = _user(request).split("The panel's round-1 answers, as JSON:", 1)[1].split("\n\n", 1)[0]
        assert f'"final_answer": "{TRUTH}"' in shown and f'"final_answer": "{LURE}"' in shown
        assert all(name not in shown for seat in PANEL_SEATS for name in seat) and '"Agent A"' in shown
    assert result.verdict is not None and result.verdict["final_answer"] == TRUTH  # derived from the aggregate
    (event,) = [e.data for e in seen if e.type == FINAL_AGGREGATE]
    assert artifacts.validate("final_aggregate", event) == [] and event == final
    report = " ".join(render_markdown(result.as_dict()).split())
    assert f"answer {TRUTH} decided by the confidence aggregator over the answers that count" in report


async def test_an_unsupported_switch_leaves_the_earlier_answer_in_the_aggregate(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    # the two wrong agents share the lure; the right one is shown it most and switches, citing nothing
    result, _ = await _consult(fake_provider_server, _world((1.0, 0.0, 0.0), supported=0.0))
    final = result.final_aggregate
    assert final is not None
    assert result.artifacts.round_3_replies["security"]["final_answer"] == LURE  # the flip is shown as given
    assert final["answers"]["security"]["answer"] == TRUTH  # ... but its round-1 answer counts
    assert final["answers"]["security"]["round"] == 1
    assert result.anti_conformity is not None and result.anti_conformity["unsupported_switches"] >= 1


async def test_asked_for_the_judge_verdict_is_kept_beside_the_aggregate_and_a_disagreement_is_said(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    # the judge always takes the first answer it is shown: it may side against the aggregate
    world = _world((0.0, 1.0, 1.0), supported=1.0, judge_position_bias=1.0)
    result, _ = await _consult(fake_provider_server, world, "selective.judge_verdict=true", "selective.enabled=false")
    titles = _judge_titles(fake_provider_server)
    assert any("Verdict" in t for t in titles) and any("Cross-exam" in t for t in titles)
    final = result.final_aggregate
    assert final is not None and final["judge_verdict"] is True and final["answer"] == TRUTH
    assert result.verdict is not None and final["judge_answer"] == result.verdict["final_answer"]
    assert final["agrees_with_judge"] is (result.verdict["final_answer"] == TRUTH)
    # the same result with the judge on the other side: the report says the two disagree and which answer is given
    data = result.as_dict()
    data["verdict"] = {**data["verdict"], "final_answer": LURE}
    data["final_aggregate"] = {**final, "judge_answer": LURE, "agrees_with_judge": False,
                               "summary": final["summary"].split("; the judge")[0]
                               + f"; the judge's verdict DISAGREES: it answered {LURE}"}
    report = " ".join(render_markdown(data).split())
    assert f"the judge's verdict DISAGREES: it answered {LURE}" in report
    assert f"The answer given is the aggregate's, {TRUTH}; the verdict above is the judge's." in report


async def test_with_anti_conformity_off_the_judge_decides_as_before(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    result, _ = await _consult(fake_provider_server, _world((0.0, 1.0, 1.0), supported=1.0), "anti_conformity=false",
                               "selective.enabled=false")
    assert result.final_aggregate is None
    assert any("Verdict" in t for t in _judge_titles(fake_provider_server))
    assert result.verdict is not None and result.artifacts.round_4 is not None


async def test_the_gate_asks_confidence_of_the_answers_backers_not_of_the_dissent(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    # informative confidence: right answers state 0.80-0.95, wrong ones 0.50-0.70; the floor sits between them
    knobs = ("aggregator=plurality", "selective.tau=0.6", "exit.min_confidence=0.75")
    result, _ = await _consult(fake_provider_server, _world((1.0, 1.0, 0.0), supported=0.0), *knobs)
    gate = result.vote_gate
    assert gate is not None and gate["decided"] and gate["low_confidence"] == []  # an unsure dissenter is outvoted
    assert result.completed_rounds == 1 and result.verdict is not None and result.verdict["final_answer"] == TRUTH
    fake_provider_server.requests.clear()
    result, _ = await _consult(fake_provider_server, _world((1.0, 0.0, 0.0), supported=0.0), *knobs)
    gate = result.vote_gate
    assert gate is not None and not gate["decided"] and gate["reason"] == "low_confidence"
    assert sorted(gate["low_confidence"]) == ["architect", "pragmatist"]  # the unsure majority is debated
