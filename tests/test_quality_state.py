"""The debate state (ids, links, statuses, serialisation, the bounded prompt block), anchors and the
deterministic verification checkers."""

from __future__ import annotations

from typing import Any

import pytest

from conclave.quality.anchors import ANCHORS, anchor_prompt, assign_anchors
from conclave.quality.debate_state import DebateState
from conclave.quality.verification import UNIVERSAL, judge_results, questions_for, run_checkers
from conclave.tokens import count_tokens


def _artifact(*claims: tuple[str, str, list[int]], refs: list[dict[str, Any]] | None = None,
              **extra: Any) -> dict[str, Any]:
    return {"claims": [{"id": i, "text": f"{i} claim text", "label": label, "citations": c} for i, label, c in claims],
            "references": refs or [], **extra}


def test_ids_run_across_agents_and_rounds_and_a_restated_id_is_not_renumbered() -> None:
    state = DebateState("q", ["a", "b"])
    first = state.absorb(1, "a", _artifact(("1", "FACT", [1]), ("2", "INFER", []), refs=[{"id": 1, "title": "T"}]))
    second = state.absorb(1, "b", _artifact(("x", "ASSUME", [])))
    third = state.absorb(3, "a", _artifact(("C2", "INFER", []), ("9", "FACT", [])))
    assert (first.claims, second.claims, third.claims) == ({"1": "C1", "2": "C2"}, {"x": "C3"},
                                                           {"C2": "C2", "9": "C4"})
    assert first.evidence == {1: "E1"} and state.claims["C2"].last_updated_round == 3
    assert state.agent_status["a"]["claims"] == ["C1", "C2", "C4"]


def test_the_same_source_cited_by_two_agents_is_one_piece_of_evidence() -> None:
    state = DebateState("q", ["a", "b"])
    state.absorb(1, "a", _artifact(("1", "FACT", [1]), refs=[{"id": 1, "title": "A", "url": "https://x/1"}]))
    done = state.absorb(1, "b", _artifact(("1", "FACT", [3]), refs=[{"id": 3, "title": "other", "url": "https://x/1"}]))
    assert done.evidence == {3: "E1"} and state.evidence["E1"].supports == ["C1", "C2"]


def test_opposing_contests_backing_accepts_and_authors_retract() -> None:
    state = DebateState("q", ["a", "b"])
    state.absorb(1, "a", _artifact(("1", "FACT", []), ("2", "INFER", [])))
    state.absorb(3, "b", {"claims": [
        {"id": "1", "text": "no", "label": "INFER", "citations": [], "opposes": ["C1"]},
        {"id": "2", "text": "yes", "label": "INFER", "citations": [], "supports": ["C2"]}]})
    assert (state.claims["C1"].status, state.claims["C1"].opposition) == ("contested", ["C3"])
    assert (state.claims["C2"].status, state.claims["C2"].backing) == ("accepted", ["C4"])
    state.absorb(3, "b", {"retracts": ["C1"]})  # not b's claim: ignored
    state.absorb(3, "a", {"retracts": ["C1", "C77"]})
    assert state.claims["C1"].status == "retracted"


def test_the_judge_sets_a_status_by_id_and_unknown_ids_are_refused() -> None:
    state = DebateState("q", ["a"])
    state.absorb(1, "a", _artifact(("1", "FACT", [])))
    assert state.set_status("C1", "accepted", 3, "well sourced")
    assert not state.set_status("C9", "accepted", 3) and not state.set_status("C1", "settled", 3)
    assert (state.claims["C1"].status, state.claims["C1"].status_reason) == ("accepted", "well sourced")


def test_the_state_round_trips_through_its_dict() -> None:
    state = DebateState("q", ["a", "b"])
    state.absorb(1, "a", _artifact(("1", "FACT", [1]), refs=[{"id": 1, "title": "T", "snippet": "s"}]))
    again = DebateState.from_dict(state.as_dict())
    assert again.as_dict() == state.as_dict()
    assert again.absorb(2, "b", _artifact(("1", "INFER", []))).claims == {"1": "C2"}  # numbering continues


def _big_state(claims: int) -> DebateState:
    state = DebateState("Should billing move to event sourcing?", ["alpha", "beta", "gamma", "delta"])
    words = "a deliberately long claim about throughput latency replay cost audit history and team skill " * 3
    for n in range(claims):
        agent = state.participants[n % 4]
        state.absorb(1 + n // 20, agent, _artifact(
            (str(n), "FACT", [1]), refs=[{"id": 1, "title": f"Source {n} " + "title " * 10, "url": f"https://x/{n}",
                                          "snippet": words}]))
        state.claims[f"C{n + 1}"].text = f"C{n + 1} " + words
    for n in range(1, 31):  # the older half is settled
        state.set_status(f"C{n}", "accepted", 2)
    return state


def test_sixty_claims_serialise_under_two_thousand_real_tokens() -> None:
    state = _big_state(60)
    block = state.block()
    assert count_tokens(block) < 2000
    assert block.startswith("=== DEBATE STATE ===")
    assert "- C60 [FACT]: C60 a deliberately" in block  # the newest open claims stay


def test_the_oldest_settled_claims_are_compressed_and_dropped_first() -> None:
    state = _big_state(60)
    full = state.block(budget=10**6)
    assert "- C1 [FACT/accepted]: C1 a deliberately long claim about throughput" in full
    budget = count_tokens(full) // 2
    block = state.block(budget=budget)
    assert count_tokens(block) < budget
    assert "- C1 [" not in block and "older settled claim(s) omitted: C1" in block
    # the newest open claim is kept, shortened
    assert "delta:\n" in block and "- C60 [FACT]: C60 a deliberately long claim about throughput latency …" in block


def test_a_small_state_is_shown_whole() -> None:
    state = DebateState("q", ["a"])
    state.absorb(1, "a", _artifact(("1", "FACT", [1]), refs=[{"id": 1, "title": "Dash", "snippet": "41k/day"}]))
    assert state.block(lambda n: "Agent A") == (
        "=== DEBATE STATE ===\nCLAIMS (open unless marked):\nAgent A:\n- C1 [FACT]: 1 claim text [E1]\n"
        "EVIDENCE (cited sources unless marked):\n- E1: Dash\n")


def _seats_state() -> DebateState:
    state = DebateState("q", ["a", "b", "c"])
    state.absorb(1, "a", _artifact(("1", "FACT", [1]), ("2", "ASSUME", []), refs=[{"id": 1, "title": "Dash"}]))
    state.absorb(1, "b", _artifact(("1", "INFER", [])))  # C3
    state.absorb(1, "c", _artifact(("1", "INFER", []), ("2", "INFER", [])))  # C4, C5
    state.round = 2
    state.absorb(2, "b", {"claims": [{"id": "x", "text": "no", "label": "INFER", "citations": [], "opposes": ["C4"]}]})
    return state


def test_the_judge_sees_what_the_latest_round_touched_and_what_is_contested_in_full() -> None:
    state = _seats_state()
    assert state.focus(None) == {"C4": 16, "C6": 16}
    block = state.block(focus=state.focus(None))
    assert "- C4 [INFER/contested]: 1 claim text (opposed by C6)" in block and "- C6 [INFER]: no (opposes C4)" in block
    assert "- … 4 other claim(s) not shown here" in block


def test_an_agent_sees_its_own_claims_what_answers_them_and_the_rest_it_has_the_gist_of_by_id() -> None:
    state = _seats_state()
    # agent c: its own claims shortened, the claim opposing one in full; of the claims the judge's statements in
    # its prompt name (C1, C3), the open ones nobody has touched by id; the rest (C2) not at all
    focus = state.focus("c", seen={"C1", "C3", "C99"})
    assert focus == {"C1": 0, "C3": 0, "C4": 8, "C5": 8, "C6": 16}
    block = state.block(focus=focus, own="c", evidence=False)
    assert "claims by id only are summed up where the judge's statements above name them" in block
    assert "a:\n- open, by id: C1 FACT\nb:\n- C6 [INFER]: no (opposes C4)\n- open, by id: C3 INFER\n" in block
    assert "c (you):\n- C4 [INFER/contested]: 1 claim text (opposed by C6)\n- C5 [INFER]: 2 claim text\n" in block
    assert "- … 1 other claim(s) not shown here" in block and "C2" not in block and "EVIDENCE" not in block
    # of the claims named in its prompt, one that takes part in an exchange is shown with its text, a settled one
    # by id; a contested one is shown in full whoever wrote it
    state.absorb(2, "a", {"claims": [{"id": "z", "text": "C3 is wrong", "label": "INFER", "citations": [],
                                      "opposes": ["C3"]}]})  # C7
    state.set_status("C1", "retracted", 2)
    focus = state.focus("c", seen={"C1", "C7"})
    assert (focus["C1"], focus["C7"], focus["C3"]) == (0, 8, 16)
    block = state.block(focus=focus, own="c", evidence=False)
    assert "- C7 [INFER]: C3 is wrong (opposes C3)" in block and "- retracted, by id: C1 FACT" in block
    assert "- C3 [INFER/contested]: 1 claim text (opposed by C7)" in block


# ------------------------------------------------------------------------------------------------ anchors


def test_anchors_are_assigned_round_robin_in_order() -> None:
    agents = ["a", "b", "c", "d", "e"]
    assert list(assign_anchors(agents, "auto").values()) == [*ANCHORS, "Risk-Attentive"]
    assert assign_anchors(agents, "none") == {}
    assert assign_anchors(agents, {"c": "Systems-Aware"}) == {"c": "Systems-Aware"}


def test_the_anchor_prompt_carries_the_definition() -> None:
    text = anchor_prompt("Evidence-Calibrated")
    assert text.startswith("=== PERSPECTIVE ANCHOR: Evidence-Calibrated ===\n")
    assert "Focus on data quality, uncertainty quantification, empirical grounding, confidence bounds — " in text
    assert "as far as the topic makes it relevant." in text


# ------------------------------------------------------------------------------------------------ verification


def _results(artifact: dict[str, Any]) -> dict[str, bool]:
    return {r["question_id"]: r["passed"] for r in run_checkers(artifact, UNIVERSAL)}


def test_the_checkers_answer_u1_to_u5_only() -> None:
    assert set(_results({})) == {"U1", "U2", "U3", "U4", "U5"}


def test_u1_needs_a_stated_position() -> None:
    assert _results({"position": "yes"})["U1"] and _results({"refined_position": "yes"})["U1"]
    assert not _results({"position": "  "})["U1"]


def test_u2_needs_every_fact_cited() -> None:
    assert _results(_artifact(("1", "FACT", [1]), ("2", "ASSUME", [])))["U2"]
    assert not _results(_artifact(("1", "FACT", [1]), ("2", "FACT", [])))["U2"]
    assert not _results({})["U2"]  # nothing labelled


def test_u3_needs_two_rejected_alternatives_with_rationale() -> None:
    one = [{"option": "A", "rejected_because": "slow"}]
    assert not _results({"alternatives": one})["U3"]
    assert _results({"alternatives": [*one, {"option": "B", "rejected_because": "dear"}]})["U3"]
    assert not _results({"alternatives": [*one, {"option": "B", "rejected_because": " "}]})["U3"]


def test_u4_needs_three_failure_modes_with_mitigations() -> None:
    modes = [{"failure": f"f{n}", "mitigation": f"m{n}"} for n in range(3)]
    assert _results({"failure_modes": modes})["U4"] and not _results({"failure_modes": modes[:2]})["U4"]


def test_u5_needs_a_stated_uncertainty() -> None:
    assert _results({"uncertainties": ["peak load"]})["U5"] and not _results({"uncertainties": [""]})["U5"]


def test_hs1_is_asked_only_when_opted_in() -> None:
    assert "HS1" not in [q.id for q in questions_for((), None)]
    assert [q.id for q in questions_for((), "security")][-1] == "HS1"


def test_a_universal_question_a_strategy_declares_not_applicable_is_not_asked() -> None:
    ids = [q.id for q in questions_for((), None, ["U3", "U4"])]
    assert ids == ["U1", "U2", "U5", "U6", "U7"]
    with pytest.raises(ValueError, match="not universal verification questions: HS1"):
        questions_for((), "security", ["HS1"])  # only a universal question can be declared not applicable


def test_judge_answers_are_matched_by_agent_and_unanswered_ones_recorded() -> None:
    answers = [{"agent": "a", "question_id": "U6", "passed": False, "reason": "says both"},
               {"agent": "b", "question_id": "U7", "passed": True, "reason": ""}]
    out = {r["question_id"]: r for r in judge_results(answers, "a", UNIVERSAL)}
    assert out["U6"] == {"question_id": "U6", "passed": False, "reason": "says both", "by": "judge"}
    assert out["U7"]["passed"] is None


# ------------------------------------------------------------------------------------------------ grounding


def test_a_statement_naming_an_existing_claim_is_grounded() -> None:
    from conclave.quality.grounding import check_grounding

    synthesis = {"consensus_points": [{"point": "Quantum ledgers", "claim_ids": ["C1"]}]}
    [result] = check_grounding(synthesis, ["C1"], "nothing relevant")
    assert result["grounded"] and result["reason"] == "rests on C1"


def test_a_statement_without_ids_is_grounded_by_the_agents_words_or_flagged() -> None:
    from conclave.quality.grounding import agent_text, check_grounding

    corpus = agent_text([{"position": "An outbox keeps billing writes atomic", "claims": [{"text": "Replays cheap"}]}])
    verdict = {"artifact_type": "verdict", "evidence": ["outbox keeps billing writes atomic (architect)",
                                                        "quantum ledgers outperform blockchains"],
               "evidence_claims": [{"evidence": "quantum ledgers outperform blockchains", "claim_ids": ["C9"]}]}
    first, second = check_grounding(verdict, ["C1"], corpus, names=["architect"])
    assert first["grounded"] and not first["claim_ids"]
    assert not second["grounded"]
    assert second["reason"] == "names no existing claim (C9 unknown); 0 of 4 key terms appear in the agents' text"


def test_an_empty_claim_id_is_shown_as_such_in_the_grounding_reason() -> None:
    from conclave.quality.grounding import check_grounding

    synthesis = {"artifact_type": "synthesis", "consensus_points": [
        {"point": "1", "supporting_agents": [], "confidence": 0.5, "claim_ids": ["", "<claim_ids>"]}]}
    (result,) = check_grounding(synthesis, ["C1"], "", names=[])
    assert result["reason"].startswith("names no existing claim ('', <claim_ids> unknown)"), result["reason"]
