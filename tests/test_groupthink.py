"""The groupthink detectors and their offline text measure, on hand-made agreeing and disagreeing panels."""

from __future__ import annotations

from typing import Any

import pytest

from conclave.config.settings import GroupthinkSettings
from conclave.quality.claims import claims_of
from conclave.quality.groupthink import StagnationDetector, check_early_convergence, is_new
from conclave.quality.similarity import best_match, clusters, premise_overlap

SETTINGS = GroupthinkSettings()


def answer(position: str, points: list[str], confidence: float = 0.9, refs: list[str] = ()) -> dict[str, Any]:
    return {"position": position, "key_points": points, "confidence": confidence,
            "references": [{"id": i, "title": t} for i, t in enumerate(refs, 1)]}


AGREE = {
    "a": answer("Move billing to event sourcing next quarter",
                ["Event sourcing gives a full audit trail of billing changes",
                 "Replaying billing events rebuilds invoices after a bug"]),
    "b": answer("Yes, adopt event sourcing for billing next quarter",
                ["An audit trail of every billing change comes with event sourcing",
                 "Invoices can be rebuilt by replaying billing events"]),
    "c": answer("Billing should move to event sourcing next quarter",
                ["Event sourcing records every billing change for audit",
                 "Replaying events rebuilds invoices when bugs happen"]),
}
DISAGREE = {
    "a": AGREE["a"],
    "b": answer("Keep the relational ledger and add an append-only audit table",
                ["The team has no operational experience with Kafka or projections",
                 "A ledger table with triggers meets the auditors' needs at a fraction of the cost"]),
    "c": answer("Postpone any migration until the PCI compliance review finishes",
                ["Compliance scope could change the storage requirements",
                 "Migrating during an audit risks fines and rework"]),
}
SOURCES = ["Fowler, Event Sourcing", "Billing dashboard 2026", "PCI DSS 4.0", "Kafka ops runbook"]


def with_sources(panel: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: {**a, "references": [{"id": 1, "title": SOURCES[i]}, {"id": 2, "title": SOURCES[i + 1]}]}
            for i, (n, a) in enumerate(sorted(panel.items()))}


# ------------------------------------------------------------------------------------------------ the measure


def test_agreeing_premises_overlap_and_disagreeing_ones_do_not() -> None:
    agree = premise_overlap([a["key_points"] for a in AGREE.values()], SETTINGS.match_similarity)
    disagree = premise_overlap([a["key_points"] for a in DISAGREE.values()], SETTINGS.match_similarity)
    assert agree > 0.70 and disagree < 0.2


def test_agreeing_positions_form_one_cluster_and_disagreeing_ones_three() -> None:
    texts = [f"{a['position']} {' '.join(a['key_points'])}" for a in AGREE.values()]
    assert clusters(texts, SETTINGS.cluster_similarity) == [[0, 1, 2]]
    texts = [f"{a['position']} {' '.join(a['key_points'])}" for a in DISAGREE.values()]
    assert clusters(texts, SETTINGS.cluster_similarity) == [[0], [1], [2]]


def test_a_restatement_is_not_new_and_a_fresh_objection_is() -> None:
    earlier = [*AGREE["a"]["key_points"], AGREE["a"]["position"]]
    assert best_match("Event sourcing gives billing a full audit trail", earlier) > SETTINGS.novelty_similarity
    assert not is_new("Event sourcing gives billing a full audit trail", earlier, SETTINGS)
    assert is_new("Upcasting years of stored events makes every schema change expensive", earlier, SETTINGS)


def test_an_objection_answer_brings_its_three_mandatory_items_as_claims() -> None:
    claims, _, source = claims_of({
        "counterargument": {"text": "Schema changes get costly", "opposes": ["C1"]},
        "alternative_hypothesis": {"text": "An audit table suffices"},
        "challenged_assumption": {"assumption": "Ops can run it", "challenge": "Nobody has run it", "opposes": []},
        "revised_position": "x", "confidence": 0.5,
    })
    assert source == "structured"
    assert [(c["id"], c["text"], c.get("opposes")) for c in claims] == [
        ("counterargument", "Schema changes get costly", ["C1"]),
        ("alternative_hypothesis", "An audit table suffices", None),
        ("challenged_assumption", "Nobody has run it", None)]


# ------------------------------------------------------------------------------------------------ early convergence


def test_early_convergence_fires_on_a_confident_agreeing_panel() -> None:
    check = check_early_convergence(1, with_sources(AGREE), SETTINGS)  # four sources: only overlap and clusters fail
    assert check.fired and check.figures["sources"] == 4
    assert check.figures["semantic_clusters"] == 1 and check.figures["premise_overlap"] > 0.7
    assert "diversity gate failed" in check.why and "source" not in "".join(check.figures["diversity_gate_failed"])


def test_a_confident_but_diverse_panel_passes_the_gate() -> None:
    check = check_early_convergence(1, with_sources(DISAGREE), SETTINGS)
    assert not check.fired and check.figures["diversity_gate_failed"] == []
    assert check.figures["high_confidence_ratio"] == 1.0


def test_too_few_sources_alone_fail_the_gate() -> None:
    check = check_early_convergence(1, DISAGREE, SETTINGS)  # diverse, but nobody cites anything
    assert check.fired and check.figures["diversity_gate_failed"] == ["0 distinct source(s) < 3"]


def test_an_agreeing_panel_below_the_confidence_bar_does_not_fire() -> None:
    shy = {n: {**a, "confidence": 0.8 if n != "a" else 0.9} for n, a in AGREE.items()}  # 1 of 3 at ≥ 0.85
    check = check_early_convergence(1, shy, SETTINGS)
    assert not check.fired and check.figures["high_confidence_ratio"] == pytest.approx(1 / 3, abs=1e-3)


def test_every_early_convergence_threshold_is_configurable() -> None:
    lenient = GroupthinkSettings.model_validate({"early_convergence": {"min_sources": 0, "min_clusters": 1,
                                                                       "max_premise_overlap": 1.0}})
    assert not check_early_convergence(1, AGREE, lenient).fired
    strict = GroupthinkSettings.model_validate({"early_convergence": {"confidence": 0.95}})
    assert not check_early_convergence(1, AGREE, strict).fired


# ------------------------------------------------------------------------------------------------ stagnation


def test_stagnation_fires_after_two_low_activity_rounds_in_a_row() -> None:
    detector = StagnationDetector(SETTINGS)
    assert detector.observe(1, AGREE, new_facts=3) is None  # nothing to compare round 1 with
    first = detector.observe(3, AGREE, new_facts=0)
    assert first is not None and not first.fired and first.figures["consecutive_rounds"] == 1
    second = detector.observe(4, AGREE, new_facts=0)
    assert second is not None and second.fired
    assert second.figures["new_facts_per_agent"] == 0 and second.figures["mean_confidence_change"] == 0
    assert second.figures["stance_std"] < 0.15


def test_a_moving_debate_does_not_stagnate() -> None:
    detector = StagnationDetector(SETTINGS)
    detector.observe(1, AGREE, new_facts=0)
    moved = {n: {**a, "confidence": 0.6} for n, a in AGREE.items()}  # every confidence fell by 0.3
    check = detector.observe(3, moved, new_facts=0)
    assert check is not None and not check.fired and check.figures["consecutive_rounds"] == 0
    assert "confidence changed" in check.why


def test_new_fact_claims_or_a_split_panel_keep_stagnation_away() -> None:
    detector = StagnationDetector(SETTINGS)
    detector.observe(1, DISAGREE, new_facts=0)
    split = detector.observe(3, DISAGREE, new_facts=0)
    assert split is not None and split.figures["stance_std"] > 0.15 and split.figures["consecutive_rounds"] == 0
    detector = StagnationDetector(SETTINGS)
    detector.observe(1, AGREE, new_facts=0)
    facts = detector.observe(3, AGREE, new_facts=3)  # one new FACT per agent
    assert facts is not None and facts.figures["consecutive_rounds"] == 0


def test_an_answer_without_confidence_keeps_the_last_stated_one() -> None:
    detector = StagnationDetector(SETTINGS)
    detector.observe(1, AGREE, new_facts=0)
    replies = {n: {"revised_position": a["position"], "key_points": a["key_points"]} for n, a in AGREE.items()}
    check = detector.observe(3, replies, new_facts=0)
    assert check is not None and check.figures["mean_confidence_change"] == 0
    assert check.figures["confidence_stated_by"] == []


def test_the_consecutive_rounds_threshold_is_configurable() -> None:
    detector = StagnationDetector(GroupthinkSettings.model_validate({"stagnation": {"consecutive_rounds": 1}}))
    detector.observe(1, AGREE, new_facts=0)
    check = detector.observe(3, AGREE, new_facts=0)
    assert check is not None and check.fired
