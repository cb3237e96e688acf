"""The debate-quality layer end to end on the fake provider server: what the agents and the judge were shown
(anchors, the DEBATE STATE block, the verification questions), the ids and statuses the engine kept, the checks
it recorded, and that a resumed run rebuilds the same state."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from test_engine_support import (
    AGENT_MODELS,
    JUDGE_MODEL,
    by_schema,
    independent,
    requests_with,
    run_consultation,
    synthesis,
    texts,
)

from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.resume_points import load_resume_point
from conclave.testing.fake_server import FakeProviderServer

# agents in name order: architect, pragmatist, security — the order their claims are numbered in
ROUND_1 = {
    "architect": independent(
        "outbox first", claims=[
            {"id": "1", "text": "An outbox keeps writes atomic.", "label": "FACT", "citations": []},
            {"id": "2", "text": "The team values auditability.", "label": "ASSUME", "citations": []}],
        alternatives=[{"option": "CDC", "rejected_because": "rows, not intent"},
                      {"option": "dual writes", "rejected_because": "not atomic"}]),
    "pragmatist": independent("ship billing only", prose_excerpt="Replays are cheap at our volume.[INFER][1]\n"
                              "References:\n[1] Billing dashboard https://example.com/dash"),
    "security": independent(
        "event sourcing with signed events", claims=[
            {"id": "a", "text": "Signed events make tampering evident.", "label": "FACT", "citations": [1]}],
        references=[{"id": 1, "title": "NIST SP 800-92", "url": "https://example.com/nist"},
                    {"id": 2, "title": "Unused source"}],
        failure_modes=[{"failure": f"failure {n}", "mitigation": f"mitigation {n}"} for n in range(3)],
        uncertainties=["key rotation cost"]),
}
_SYNTHESIS = synthesis([("An outbox is needed", ["Agent A", "Agent B"], 0.6)],
                       [("scope", [("Agent A", "all services"), ("Agent C", "billing only")])])
_SYNTHESIS["consensus_points"][0]["claim_ids"] = ["C1", "C3"]
_SYNTHESIS["tensions"][0]["claim_ids"] = ["C4"]  # C2 (the architect's ASSUME) is accounted for nowhere
SYNTHESIS = {
    **_SYNTHESIS,
    "verification": [{"agent": "Agent A", "question_id": "U6", "passed": True, "reason": "consistent"},
                     {"agent": "Agent B", "question_id": "U7", "passed": False, "reason": "skips key handling"}],
}


def reply(claims: list[dict[str, Any]], retracts: list[str] | None = None) -> dict[str, Any]:
    return {"critique": "", "challenges": [], "defense": "", "revised_position": "unchanged", "vote": "MINOR",
            "confidence": 0.75, "claims": claims,
            "references": [], "retracts": retracts or []}


def script(fake: FakeProviderServer) -> None:
    replies = {
        "architect": reply([], retracts=["C2"]),
        "pragmatist": reply([{"id": "1", "text": "Atomic writes matter less than scope.", "label": "INFER",
                              "citations": [], "opposes": ["C1"]}]),
        "security": reply([{"id": "C3", "text": "Replays are cheap.", "label": "INFER", "citations": [],
                            "supports": ["C3"]}]),
    }
    for name, model in AGENT_MODELS.items():
        fake.script(model, by_schema(independent=ROUND_1[name], cross_exam_reply=replies[name]))
    judged = {"challenges": [], "rebuttals": [], "unresolved": [],
              "claim_statuses": [{"claim_id": "C4", "status": "accepted", "reason": "sourced"},
                                 {"claim_id": "C99", "status": "accepted", "reason": "no such claim"}]}
    fake.script(JUDGE_MODEL, by_schema(synthesis=SYNTHESIS, cross_exam=judged))


async def test_round_3_agents_see_the_debate_state_and_their_anchor(fake_provider_server: FakeProviderServer,
                                                                     conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake)
    run = await run_consultation(fake)
    assert run.result.status == "complete"
    anchors = run.result.quality["anchors"]  # type: ignore[index]
    # round-robin in configuration order
    assert anchors == {"security": "Risk-Attentive", "architect": "Implementation-Focused",
                       "pragmatist": "Evidence-Calibrated"}
    views = run.result.peer_labels or {}  # each agent sees the panel under labels of its own
    texts_of = {"architect": ["- C1 [FACT]: An outbox keeps writes atomic.", "- C2 [ASSUME]: The team values auditability."],
                "pragmatist": ["- C3 [INFER]: Replays are cheap at our volume."],
                "security": ["- C4 [FACT]: Signed events make tampering evident."]}
    ids_of = {"architect": "C1 FACT", "pragmatist": "C3 INFER", "security": "C4 FACT"}
    for name, model in AGENT_MODELS.items():
        request = requests_with(fake, "cross_exam_reply", model)[0]
        shown = texts(request)
        assert "=== DEBATE STATE ===" in shown
        labels = views[name]
        # its own claims with their text, under its label (it restates or retracts them by id)
        assert "\n".join([f"{labels[name]} (you):", *texts_of[name]]) in shown
        # the others' claims the synthesis shown above rests on (C1, C3, C4), by id and label: the synthesis'
        # statements naming them give their gist
        for other in set(AGENT_MODELS) - {name}:
            assert f"{labels[other]}:\n- open, by id: {ids_of[other]}" in shown
            assert texts_of[other][0] not in shown
        assert "claims by id only are summed up where the judge's statements above name them" in shown
        # the architect's own ASSUME, named by nobody, only the architect sees; sources are listed to judges only
        assert ("C2 [ASSUME]" in shown) == (name == "architect")
        assert "EVIDENCE" not in shown
        assert "Challenging C2" in shown  # asked to cite ids
        assert f"=== PERSPECTIVE ANCHOR: {anchors[name]} ===" in shown
        for other in set(anchors.values()) - {anchors[name]}:
            assert f"PERSPECTIVE ANCHOR: {other}" not in shown
    # the first-round prompts carry the labelling rules and the anchor, not yet a state
    first = texts(requests_with(fake, "independent", AGENT_MODELS["security"])[0])
    assert "=== EPISTEMIC LABELING ===" in first and "=== PERSPECTIVE ANCHOR: Risk-Attentive ===" in first
    assert "=== DEBATE STATE ===" not in first


def state_block(prompt: str) -> str:
    """The DEBATE STATE block of a prompt (it ends at the first blank line)."""
    return "=== DEBATE STATE ===" + prompt.split("=== DEBATE STATE ===", 1)[1].split("\n\n", 1)[0]


async def test_an_agent_gets_by_id_only_the_claims_its_prompt_states_the_gist_of(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake)
    # the round-3 agents are shown the synthesis without its tensions, so nothing in their prompt names C4
    run = await run_consultation(fake, "filtering.round3.tensions=0")
    views = run.result.peer_labels or {}  # each agent sees the panel under labels of its own
    labels = views["architect"]
    architect = state_block(texts(requests_with(fake, "cross_exam_reply", AGENT_MODELS["architect"])[0]))
    assert f"{labels['pragmatist']}:\n- open, by id: C3 INFER" in architect  # the consensus point names C3
    assert "C4" not in architect and "- … 1 other claim(s) not shown here" in architect
    security = state_block(texts(requests_with(fake, "cross_exam_reply", AGENT_MODELS["security"])[0]))
    assert f"{views['security']['security']} (you):\n- C4 [FACT]: Signed events make tampering evident." in security


async def test_the_engine_numbers_claims_and_evidence_and_the_judge_settles_statuses(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake)
    run = await run_consultation(fake)
    quality = run.result.quality
    assert quality is not None
    claims = {c["id"]: c for c in quality["state"]["claims"]}
    assert [(i, c["agent"], c["label"]) for i, c in claims.items()] == [
        ("C1", "architect", "FACT"), ("C2", "architect", "ASSUME"), ("C3", "pragmatist", "INFER"),
        ("C4", "security", "FACT"), ("C5", "pragmatist", "INFER")]
    assert claims["C1"]["status"] == "contested" and claims["C1"]["opposition"] == ["C5"]
    assert claims["C2"]["status"] == "retracted"  # withdrawn by its author in round 3
    assert claims["C3"]["status"] == "accepted"  # restated by another agent
    assert claims["C4"]["status"] == "accepted" and claims["C4"]["status_reason"] == "sourced"  # the judge
    assert [(e["id"], e["title"], e["supports"]) for e in quality["state"]["evidence"]] == [
        ("E1", "Billing dashboard", ["C3"]), ("E2", "NIST SP 800-92", ["C4"]), ("E3", "Unused source", [])]
    assert quality["unknown_ids"] == ["C99"]
    # the round-3 judge ruled on a state that already held the replies: new claims, challenges, retractions
    judge_saw = texts(requests_with(fake, "cross_exam", JUDGE_MODEL)[0])
    assert "- C5 [INFER]: Atomic writes matter less than scope. (opposes C1)" in judge_saw
    assert "- C1 [FACT/contested]: An outbox keeps writes atomic. (opposed by C5)" in judge_saw
    assert "- C2 [ASSUME/retracted]" in judge_saw
    states = run.of("quality:debate_state")
    assert [s["round_number"] for s in states] == [1, 2, 3, 4]


async def test_citation_rules_and_verification_are_recorded_per_agent_and_round(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake)
    run = await run_consultation(fake)
    quality = run.result.quality
    assert quality is not None
    round_1 = quality["checks"]["1"]
    assert [v["rule"] for v in round_1["architect"]["rules"]] == ["fact_uncited"]
    assert [(v["rule"], v.get("reference")) for v in round_1["security"]["rules"]] == [("unused_reference", 2)]
    assert round_1["pragmatist"]["claim_source"] == "inline" and round_1["pragmatist"]["rules"] == []
    results = {r["question_id"]: r for r in round_1["architect"]["verification"]}
    assert [results[q]["passed"] for q in ("U1", "U2", "U3", "U4", "U5")] == [True, False, True, False, False]
    names = {label: name for name, label in run.result.judge_labels.items()}
    judged = {r["question_id"]: r for r in round_1[names["Agent A"]]["verification"]}
    assert judged["U6"] == {"question_id": "U6", "passed": True, "reason": "consistent", "by": "judge"}
    assert judged["CV1"]["passed"] is None  # the judge left it unanswered
    security = {r["question_id"]: r["passed"] for r in round_1["security"]["verification"]}
    assert security["U2"] and security["U4"] and security["U5"] and not security["U3"]
    judge_prompt = texts(requests_with(fake, "synthesis", JUDGE_MODEL)[0])
    for line in ("- U6: No internal contradictions?", "- U7: Avoids harmful guidance?", "- CV1:", "- CV2:"):
        assert line in judge_prompt
    assert "- U1:" not in judge_prompt and "- HS1:" not in judge_prompt  # checked by code / not opted in
    assert set(quality["checks"]["3"]) == {"architect", "pragmatist", "security"}
    # a reply that does not restate them keeps its round-1 alternatives, failure modes and uncertainties
    replied = {r["question_id"]: r["passed"] for r in quality["checks"]["3"]["security"]["verification"]}
    assert replied["U4"] and replied["U5"] and not replied["U3"]
    assert {r["question_id"]: r["passed"] for r in quality["checks"]["3"]["architect"]["verification"]}["U3"]
    assert run.result.status == "complete"  # broken rules never sink a round
    metrics = quality["metrics"]
    assert metrics["rule_violations"]["fact_uncited"] == 1
    assert metrics["citation_compliance"] == 0.5  # C1 uncited, C4 cited
    assert metrics["pass_rate"]["U7"] == 0.0


async def test_high_stakes_adds_hs1_to_the_judged_questions(fake_provider_server: FakeProviderServer,
                                                            conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake)
    run = await run_consultation(fake, "quality.high_stakes=agentic", "rounds=2", "quality.anchors=none")
    judge_prompt = texts(requests_with(fake, "synthesis", JUDGE_MODEL)[0])
    assert "- HS1: Safety controls defined? (scope boundaries, approval gates, abort mechanisms)" in judge_prompt
    assert "PERSPECTIVE ANCHOR" not in texts(requests_with(fake, "independent", AGENT_MODELS["security"])[0])
    assert run.result.quality is not None and run.result.quality["anchors"] == {}


async def test_explicit_anchors_are_given_to_the_named_agents(fake_provider_server: FakeProviderServer,
                                                              conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake)
    run = await run_consultation(fake, "rounds=1", "+quality.anchors={architect: Systems-Aware}")
    assert "PERSPECTIVE ANCHOR: Systems-Aware" in texts(requests_with(fake, "independent", AGENT_MODELS["architect"])[0])
    assert "PERSPECTIVE ANCHOR" not in texts(requests_with(fake, "independent", AGENT_MODELS["security"])[0])
    assert {a.name: a.anchor for a in run.result.agents}["architect"] == "Systems-Aware"


async def test_a_resumed_run_rebuilds_the_same_ids_and_statuses(fake_provider_server: FakeProviderServer,
                                                                conclave_env: Any, tmp_path: Path) -> None:
    fake = fake_provider_server
    script(fake)
    recorder = Recorder(tmp_path, index=False)
    first = await run_consultation(fake, "rounds=3", recorder=recorder)
    recorder.close()
    fake.reset()
    script(fake)
    point = load_resume_point(StoreLayout(tmp_path), first.result.consultation_id, resumable=False)
    again = await run_consultation(fake, resume_from=point.resume_from)
    assert not requests_with(fake, "independent") and not requests_with(fake, "cross_exam_reply")
    before, after = first.result.quality, again.result.quality
    assert before is not None and after is not None
    assert after["state"]["claims"] == before["state"]["claims"]
    assert after["state"]["evidence"] == before["state"]["evidence"]


async def test_the_index_holds_claims_evidence_checks_anchors_and_figures(
        fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path) -> None:
    fake = fake_provider_server
    script(fake)
    recorder = Recorder(tmp_path)
    run = await run_consultation(fake, recorder=recorder)
    recorder.close()
    cid = run.result.consultation_id
    with sqlite3.connect(StoreLayout(tmp_path).index_path) as db:
        claims = db.execute("select claim_id, agent, status from claims where consultation_id = ? "
                            "order by length(claim_id), claim_id",
                            (cid,)).fetchall()
        evidence = db.execute("select evidence_id, title, supports from evidence where consultation_id = ?",
                              (cid,)).fetchall()
        checks = db.execute("select agent, violations, claim_source from claim_checks where consultation_id = ? "
                            "and round_number = 1 order by agent", (cid,)).fetchall()
        u6 = db.execute("select agent, passed, answered_by from verification where consultation_id = ? and "
                        "question_id = 'U6' and passed is not null", (cid,)).fetchall()
        anchors = dict(db.execute("select agent, anchor from agents where consultation_id = ?", (cid,)).fetchall())
        figures = db.execute("select label_adoption, citation_compliance, rule_violations from consultations "
                             "where id = ?", (cid,)).fetchone()
        coverage = db.execute("select round_number, claims, agents, claims_unaccounted, positions_unaccounted "
                              "from synthesis_coverage where consultation_id = ?", (cid,)).fetchall()
        from conclave.store.period_stats import Period, quality_figures

        stats = quality_figures(db, Period("all time"))
    assert claims == [("C1", "architect", "contested"), ("C2", "architect", "retracted"),
                      ("C3", "pragmatist", "accepted"), ("C4", "security", "accepted"),
                      ("C5", "pragmatist", "open")]
    assert evidence[1] == ("E2", "NIST SP 800-92", '["C4"]')
    assert checks == [("architect", 1, "structured"), ("pragmatist", 0, "inline"), ("security", 1, "structured")]
    labels = {label: name for name, label in run.result.judge_labels.items()}
    assert u6 == [(labels["Agent A"], 1, "judge")]
    assert anchors == run.result.quality["anchors"]  # type: ignore[index]
    metrics = run.result.quality["metrics"]  # type: ignore[index]
    assert figures == (metrics["label_adoption"], 0.5, 3)  # two citation rules broken, one claim unaccounted
    assert coverage == [(2, 4, 3, 1, 0)]
    assert stats["synthesis_unaccounted"] == 1 and stats["rule_violations"] == 3


async def test_judge_statements_resting_on_nothing_the_agents_said_are_flagged(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake)
    judged = {**SYNTHESIS, "consensus_points": [
        {"point": "An outbox is needed", "supporting_agents": ["Agent A"], "confidence": 0.6, "claim_ids": ["C1"]},
        {"point": "Quantum ledgers outperform blockchains", "supporting_agents": ["Agent B"], "confidence": 0.6}]}
    fake.script(JUDGE_MODEL, by_schema(synthesis=judged))
    run = await run_consultation(fake, "rounds=2")
    quality = run.result.quality
    assert quality is not None
    statements = {s["where"]: s for s in quality["grounding"]["2"]}
    assert statements["consensus_points[0]"]["grounded"] and statements["consensus_points[0]"]["claim_ids"] == ["C1"]
    assert not statements["consensus_points[1]"]["grounded"]
    assert quality["metrics"]["ungrounded_statements"] == sum(not s["grounded"] for s in statements.values())
    synthesis_prompt = texts(requests_with(fake, "synthesis", JUDGE_MODEL)[0])
    assert "- C1 [FACT]: An outbox keeps writes atomic." in synthesis_prompt  # the judge saw the ids


async def test_the_report_shows_anchors_checks_and_claim_standings(fake_provider_server: FakeProviderServer,
                                                                     conclave_env: Any) -> None:
    from conclave.render.markdown import render_markdown

    fake = fake_provider_server
    script(fake)
    run = await run_consultation(fake)
    report = render_markdown(run.result.as_dict())
    section = report.split("## Debate quality", 1)[1]
    assert "Claims labelled " in section and "FACT claims cited 50%" in section
    assert "5 claims: 2 accepted, 1 contested, 1 open, 1 retracted" in section
    assert "| 1 | architect | Implementation-Focused | 2 | fact_uncited |" in section
    assert "| 1 | security | Risk-Attentive | 1 | unused_reference |" in section


async def test_a_synthesis_that_leaves_a_claim_unaccounted_is_a_counted_violation_shown_in_the_report(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    from conclave.render.markdown import render_markdown

    fake = fake_provider_server
    script(fake)
    run = await run_consultation(fake, "rounds=2")
    quality = run.result.quality
    assert quality is not None
    (miss,) = quality["coverage"]["2"]
    assert (miss["rule"], miss["claim"], miss["agent"]) == ("claim_unaccounted", "C2", "architect")
    assert quality["metrics"]["rule_violations"]["claim_unaccounted"] == 1
    assert quality["metrics"]["rule_violations"]["position_unaccounted"] == 0  # every agent appears somewhere
    (event,) = run.of("quality:coverage")
    assert event["claims"] == 4 and event["agents"] == 3 and event["violations"] == [miss]
    section = render_markdown(run.result.as_dict()).split("## Debate quality", 1)[1]
    assert "The round-2 synthesis left unaccounted (1):" in section and "C2 (architect) is in no consensus" in section
    judge_prompt = texts(requests_with(fake, "synthesis", JUDGE_MODEL)[0])
    assert "every DEBATE STATE claim must appear in a consensus point" in judge_prompt  # the judge is asked for it


@pytest.mark.parametrize(("override", "message"), [
    ("quality.anchors=sometimes", "quality.anchors: must be auto, none or {agent: anchor}"),
    ("quality.high_stakes=finance", "quality.high_stakes: input should be 'security'"),
    ("quality.state_tokens=5000", "quality.state_tokens:"),
    ("+quality.anchors={nobody: Systems-Aware}", "quality.anchors: unknown agent(s) nobody"),
])
def test_a_bad_quality_setting_is_one_line_naming_the_key(override: str, message: str) -> None:
    from conclave.api import compose_settings
    from conclave.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        compose_settings("q?", [override])
    lines = str(info.value).strip().splitlines()
    assert len(lines) == 1 and message in lines[0]
