"""The built-in ``answer`` strategy: a real mode, registered through the plugin door, whose answer-bearing
artifacts carry a scorable ``final_answer``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from test_engine_support import AGENT_MODELS, JUDGE_MODEL, by_schema, requests_with, run_consultation, texts

import conclave
from conclave.artifacts import schema_registry as artifacts
from conclave.events import FILTER_APPLIED
from conclave.plugin_manager import get_plugins
from conclave.render.markdown import render_markdown
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer

PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o",
         "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]
QUESTION = "What is the result of 3+4*5+6-7*8? Give the final answer as a single integer."


def test_answer_is_registered_like_any_plugin_strategy() -> None:
    plugins = get_plugins()
    assert "answer" in plugins.strategies.names()
    strategy = plugins.strategies.get("answer")(None)
    assert strategy.prompt_versions()["round_1"].startswith("answer/round1@v2#sha256:")


async def test_every_round_asks_for_a_final_answer_and_the_verdict_has_one(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    AnswerPanel({"Security Expert": 1.0, "Systems Architect": 1.0, "Pragmatic Engineer": 0.0}).install(fake)
    # a confident panel citing nothing fires early convergence; this test is about the answer fields of the four
    # standard rounds, so the detectors only record (the objection round has its own tests)
    overrides = [*fake.overrides(), *PANEL, "cost.auto_approve=true", "mode=answer", "quality.stage=shadow",
                 "selective.judge_verdict=true"]  # the judge's verdict round too, beside the final aggregate
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


# ------------------------------------------------------------------------------------------ the quality layer

def _answer(final: str, claims: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"position": f"The answer is {final}.", "final_answer": final, "key_points": ["4*5 is 20", "7*8 is 56"],
            "rationale": "Products first, then left to right.", "confidence": 0.8, "prose_excerpt": "",
            "claims": claims, "references": [], **extra}


def _script_quality_panel(fake: FakeProviderServer) -> None:
    precedence = {"id": "1", "text": "Multiplication binds tighter than addition.", "label": "FACT",
                  "citations": [1]}
    source = [{"id": 1, "title": "Order of operations", "url": "https://example.com/pemdas"}]
    first = {
        "architect": _answer("-27", [precedence, {"id": "2", "text": "3+20+6-56 is -27.", "label": "INFER",
                                                  "citations": []}], references=source,
                             uncertainties=["whether 7*8 was read right"]),
        "pragmatist": _answer("-26", [{"id": "1", "text": "The sum is -26.", "label": "INFER", "citations": []}]),
        "security": _answer("-27", [{"id": "1", "text": "Left to right after the products.", "label": "FACT",
                                     "citations": []}]),  # an uncited FACT: a counted rule violation
    }
    reply = {"critique": "", "challenges": [], "defense": "", "revised_position": "-27 stands", "vote": "ACCEPT",
             "confidence": 0.9, "final_answer": "-27", "references": [],
             "claims": [{"id": "1", "text": "3+20 is 23, not 22.", "label": "INFER", "citations": [],
                         "opposes": ["C3"]}]}
    for name, model in AGENT_MODELS.items():
        fake.script(model, by_schema(independent_answer=first[name], cross_exam_reply_answer=reply))
    synthesis = {
        "consensus_points": [{"point": "The answer is -27.", "supporting_agents": ["Agent A", "Agent B"],
                              "confidence": 0.7, "claim_ids": ["C1", "C2", "C4"]}],
        "tensions": [{"topic": "the sum", "viewpoints": [{"agent": "Agent A", "viewpoint": "-27"},
                                                        {"agent": "Agent C", "viewpoint": "-26"}],
                      "claim_ids": ["C3"]}],
        "priority_order": ["3+20"], "final_answer": "-27",
        "partial_coverage": [], "unique_insights": [], "blind_spots": [],
        "verification": [{"agent": "Agent A", "question_id": "AN1", "passed": True, "reason": "each step shown"},
                         {"agent": "Agent B", "question_id": "AN2", "passed": False, "reason": "adds a unit"}],
    }
    verdict = {"recommendation": "The answer is -27: products first.", "final_answer": "-27", "confidence": 0.9,
               "evidence": ["Multiplication binds tighter than addition."], "dissent": [],
               "evidence_claims": [{"evidence": "Multiplication binds tighter than addition.", "claim_ids": ["C1"]}]}
    cross_exam = {"challenges": [], "rebuttals": [], "unresolved": [],
                  "claim_statuses": [{"claim_id": "C3", "status": "retracted", "reason": "3+20 is 23"}]}
    fake.script(JUDGE_MODEL, by_schema(synthesis_answer=synthesis, cross_exam=cross_exam, verdict_answer=verdict))


async def test_an_answer_consultation_labels_numbers_checks_and_indexes_claims(
        fake_provider_server: FakeProviderServer, conclave_env: Path, tmp_path: Path) -> None:
    fake = fake_provider_server
    _script_quality_panel(fake)
    recorder = Recorder(tmp_path)
    run = await run_consultation(fake, "mode=answer", "quality.stage=shadow", "selective.judge_verdict=true",
                                 recorder=recorder)
    recorder.close()
    result, quality = run.result, run.result.quality
    assert result.status == "complete" and result.strategy == "answer" and quality is not None
    # round 1 carried the labelling rules; round 3 the DEBATE STATE with the engine's ids, and the ask to cite them
    assert "=== EPISTEMIC LABELING ===" in texts(requests_with(fake, "independent_answer", AGENT_MODELS["security"])[0])
    for name, model in AGENT_MODELS.items():
        shown = texts(requests_with(fake, "cross_exam_reply_answer", model)[0])
        assert "=== DEBATE STATE ===" in shown and "Challenging C2" in shown
        own = (result.peer_labels or {})[name][name]  # each agent sees the panel under labels of its own
        assert f"{own} (you):" in shown  # each agent's own claims, under its label
        # the architect's C1 in full to the architect, by id to the others (the judge's statements give its gist)
        c1 = "- C1 [FACT]: Multiplication binds tighter than addition." if name == "architect" else "C1 FACT"
        assert c1 in shown, shown
    # the synthesis judge was asked answer mode's own two questions; the verdict judge the claim ids
    judge_saw = texts(requests_with(fake, "synthesis_answer", JUDGE_MODEL)[0])
    assert "- AN1: Does the working shown derive the final_answer" in judge_saw and "- AN2: " in judge_saw
    assert "evidence_claims" in texts(requests_with(fake, "verdict_answer", JUDGE_MODEL)[0])
    # engine ids: claims in agent-name order (architect, pragmatist, security), then round 3's
    claims = {c["id"]: c for c in quality["state"]["claims"]}
    assert [(i, c["agent"]) for i, c in claims.items()][:4] == [
        ("C1", "architect"), ("C2", "architect"), ("C3", "pragmatist"), ("C4", "security")]
    assert claims["C3"]["status"] == "retracted" and len(claims) > 4
    assert [e["id"] for e in quality["state"]["evidence"]] == ["E1"]
    # checks: U3/U4 declared not applicable (never silently failed), U5 read from uncertainties, U2 broken once
    assert set(quality["not_applicable"]) == {"U3", "U4"}
    round_1 = quality["checks"]["1"]
    asked = {r["question_id"] for r in round_1["architect"]["verification"]}
    assert {"U1", "U2", "U5", "AN1", "AN2"} <= asked and not asked & {"U3", "U4"}
    assert {r["question_id"]: r["passed"] for r in round_1["architect"]["verification"]}["U5"] is True
    assert [v["rule"] for v in round_1["security"]["rules"]] == ["fact_uncited"]
    assert quality["coverage"]["2"] == []  # every round-1 claim and position accounted for
    assert quality["metrics"]["label_adoption"] == 1.0 and quality["metrics"]["pass_rate"]["AN2"] == 0.0
    assert result.verdict is not None and result.verdict["evidence_claims"][0]["claim_ids"] == ["C1"]
    assert quality["grounding"]["4"] and all(s["grounded"] for s in quality["grounding"]["4"])
    with sqlite3.connect(StoreLayout(tmp_path).index_path) as db:
        cid = result.consultation_id
        indexed = db.execute("select claim_id, agent from claims where consultation_id = ? "
                             "order by length(claim_id), claim_id",
                             (cid,)).fetchall()
        judged = db.execute("select question_id, passed from verification where consultation_id = ? and "
                            "answered_by = 'judge' and passed is not null order by question_id", (cid,)).fetchall()
        adoption = db.execute("select label_adoption from consultations where id = ?", (cid,)).fetchone()[0]
    assert indexed[:4] == [("C1", "architect"), ("C2", "architect"), ("C3", "pragmatist"), ("C4", "security")]
    assert judged == [("AN1", 1), ("AN2", 0)] and adoption == 1.0
    report = render_markdown(result.as_dict())
    assert "Verification questions this mode does not ask:" in report and "U4: an answer is not a plan" in report


def test_a_derived_answer_verdict_ties_its_evidence_to_the_synthesis_claim_ids() -> None:
    strategy = get_plugins().strategies.get("answer")(None)
    verdict = strategy.verdict_from_synthesis({
        "consensus_points": [{"point": "The answer is -27.", "supporting_agents": ["a", "b"], "confidence": 0.9,
                              "claim_ids": ["C1", "C4"]}],
        "tensions": [], "final_answer": "-27"})
    assert verdict["final_answer"] == "-27"
    assert verdict["evidence_claims"] == [{"evidence": "The answer is -27.", "claim_ids": ["C1", "C4"]}]
    header = {"artifact_type": "verdict", "schema_version": artifacts.current_version(), "round_number": 4,
              "created_at": artifacts.now_iso()}
    assert artifacts.validate("verdict_answer", {**header, **verdict}) == []
