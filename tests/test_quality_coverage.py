"""Synthesis completeness: every round-1 claim and every present agent's position accounted for."""

from __future__ import annotations

from typing import Any

from conclave.quality.coverage import applies, check_coverage

CLAIMS = {"C1": "architect", "C2": "architect", "C3": "security", "C4": "pragmatist"}
AGENTS = ["architect", "security", "pragmatist"]


def synthesis(**sections: Any) -> dict[str, Any]:
    return {"consensus_points": [], "tensions": [], "partial_coverage": [], "unique_insights": [], "blind_spots": [],
            **sections}


def test_claims_named_in_any_section_and_agents_appearing_anywhere_are_accounted_for() -> None:
    complete = synthesis(
        consensus_points=[{"point": "p", "supporting_agents": ["architect", "security"], "confidence": 0.7,
                           "claim_ids": ["C1"]}],
        tensions=[{"topic": "t", "viewpoints": [{"agent": "security", "viewpoint": "v"},
                                                {"agent": "architect", "viewpoint": "w"}], "claim_ids": ["C3"]}],
        partial_coverage=[{"point": "q", "agents": ["architect"], "claim_ids": ["C2"]}],
        unique_insights=[{"agent": "pragmatist", "insight": "i", "claim_ids": ["C4"]}])
    assert check_coverage(complete, CLAIMS, AGENTS) == []


def test_an_unnamed_claim_and_an_absent_position_are_each_a_violation() -> None:
    partial = synthesis(
        consensus_points=[{"point": "p", "supporting_agents": ["architect", "security"], "confidence": 0.7,
                           "claim_ids": ["C1", "C2", "C3"]}],
        blind_spots=["C4 is about cost"])  # a blind spot is what no agent said: it accounts for nothing
    found = [(v.rule, v.claim, v.agent) for v in check_coverage(partial, CLAIMS, AGENTS)]
    assert found == [("claim_unaccounted", "C4", "pragmatist"), ("position_unaccounted", None, "pragmatist")]


def test_only_a_synthesis_with_the_coverage_sections_is_checked() -> None:
    assert applies(synthesis())
    # a third-party strategy's synthesis without the coverage sections (every built-in one has them)
    assert not applies({"consensus_points": [], "tensions": [], "final_answer": "42"})
