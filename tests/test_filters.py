"""The top_n artifact filter: documented rankings, only drops items, re-validates, never mutates its input."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest
from conclave_plugins.filters import TopNArtifactFilter, severity_score, substantiveness_score
from hypothesis import given, settings
from hypothesis import strategies as st

from conclave.artifacts.artifact_filter import FILTERING_OFF_NOTICE, ArtifactFilter, limits_for, token_efficiency_stats
from conclave.artifacts.schema_registry import ArtifactValidationError, current_version, validate
from conclave.engine.filtering import checked_filter
from conclave.plugin_manager import load_plugins

HEADER = {"schema_version": current_version(), "created_at": "2025-12-28T14:00:30.000Z"}


def consensus(point: str, confidence: float, *agents: str) -> dict[str, Any]:
    return {"point": point, "supporting_agents": list(agents or ("security",)), "confidence": confidence,
            "claim_ids": []}


def tension(topic: str, *agents: str) -> dict[str, Any]:
    return {"topic": topic, "viewpoints": [{"agent": a, "viewpoint": f"{a} sees {topic} differently"} for a in agents],
            "claim_ids": []}


def synthesis(points: list[dict[str, Any]], tensions: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "artifact_type": "synthesis", "round_number": 2, **HEADER,
        "consensus_points": points, "tensions": tensions,
        "priority_order": ["auditability", "operational cost", "team familiarity", "latency"],
        "partial_coverage": [], "unique_insights": [], "blind_spots": [],
    }


def cross_exam(challenges: list[dict[str, Any]], rebuttals: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "artifact_type": "cross_exam", "round_number": 3, **HEADER,
        "challenges": challenges, "rebuttals": rebuttals,
        "unresolved": ["Whether replay cost stays bounded", "Who owns the event schema", "Migration order"],
    }


def challenge(text: str, evidence: int = 0) -> dict[str, Any]:
    return {"challenger": "skeptic", "target_agent": "architect", "challenge": text,
            "evidence": [f"incident report #{i}" for i in range(evidence)]}


def rebuttal(text: str) -> dict[str, Any]:
    return {"agent": "architect", "rebuttal": text}


SYNTHESIS = synthesis(
    [
        consensus("Keep the ledger append-only", 0.72),
        consensus("Adopt event sourcing for invoices only", 0.91, "architect", "security"),
        consensus("Snapshot every 1,000 events", 0.64),
        consensus("Use Postgres as the event store", 0.88),
        consensus("Publish integration events via an outbox", 0.95, "architect", "pragmatist"),
    ],
    [
        tension("Projection rebuild time", "architect", "pragmatist"),
        tension("Scope of the first milestone", "architect", "pragmatist", "security", "skeptic"),
        tension("GDPR erasure in an immutable log", "security", "architect", "skeptic"),
    ],
)

filter_ = TopNArtifactFilter()


def test_consensus_points_keep_the_most_confident_in_rank_order() -> None:
    out = filter_.filter(SYNTHESIS, {"consensus_points": 3})
    assert [p["confidence"] for p in out["consensus_points"]] == [0.95, 0.91, 0.88]


def test_tensions_keep_those_with_most_viewpoints() -> None:
    out = filter_.filter(SYNTHESIS, {"tensions": 2})
    assert [t["topic"] for t in out["tensions"]] == ["Scope of the first milestone", "GDPR erasure in an immutable log"]


def test_ties_keep_their_original_order() -> None:
    art = synthesis([consensus(f"point {i}", 0.8) for i in range(5)], [tension(f"t{i}", "a", "b") for i in range(4)])
    out = filter_.filter(art, {"consensus_points": 3, "tensions": 2})
    assert [p["point"] for p in out["consensus_points"]] == ["point 0", "point 1", "point 2"]
    assert [t["topic"] for t in out["tensions"]] == ["t0", "t1"]


def test_priority_order_unlimited_fields_and_header_are_untouched() -> None:
    out = filter_.filter(SYNTHESIS, {"consensus_points": 1})
    assert out["priority_order"] == SYNTHESIS["priority_order"]
    assert out["tensions"] == SYNTHESIS["tensions"]  # no limit given: passed whole, original order
    for key in ("artifact_type", "schema_version", "round_number", "created_at"):
        assert out[key] == SYNTHESIS[key]
    assert set(out) == set(SYNTHESIS)


def test_severity_score_follows_the_documented_formula() -> None:
    text = "The replay plan is flawed and a critical path is wrong"  # 3 keywords, 54 characters
    assert severity_score(challenge(text, evidence=2)) == pytest.approx(2 * 2 + 5 * 3 + len(text) / 100)
    # A keyword counts once however often it appears, and matching ignores case.
    assert severity_score(challenge("CRITICAL critical critical")) == pytest.approx(5 + 26 / 100)


def test_substantiveness_score_follows_the_documented_formula() -> None:
    text = "Load-test data shows replay finishes in 40 s because snapshots bound it"
    assert substantiveness_score(rebuttal(text)) == pytest.approx(len(text) / 10 + 3 * 3)  # data, shows, because


def test_challenges_rank_by_severity_and_unresolved_stays_whole() -> None:
    challenges = [
        challenge("Projections may lag behind writes during peaks."),                            # 0.47
        challenge("The migration plan is flawed: it is a fatal, critical risk.", evidence=1),  # 2+15+0.59
        challenge("Snapshot cadence is arbitrary.", evidence=3),                                # 6.3
        challenge("A serious gap: no plan for schema versioning of events."),                   # 5.56
    ]
    art = cross_exam(challenges, [rebuttal("Agreed.")])
    out = filter_.filter(art, {"challenges": 3, "rebuttals": 1})
    assert out["challenges"] == [challenges[1], challenges[2], challenges[3]]
    assert out["unresolved"] == art["unresolved"]


@pytest.mark.parametrize("schema", ["cross_exam_reply", "cross_exam_reply_answer"])
def test_a_replys_challenges_rank_by_severity_and_the_rest_stays_whole(schema: str) -> None:
    # an agent's reply shown again carries its schema as artifact_type (replies have no header)
    challenges = [{"target_agent": "Agent B", "challenge": "Replays may lag.", "evidence": []},
                  {"target_agent": "consensus", "challenge": "A critical gap in the rollback plan.", "evidence": ["x"]},
                  {"target_agent": "Agent C", "challenge": "Snapshots lack an owner.", "evidence": ["y", "z"]}]
    reply = {"artifact_type": schema, "critique": "The consensus skips rollback.", "challenges": challenges,
             "defense": "Snapshots bound replay.", "revised_position": "Invoices only.", "vote": "MINOR",
             "vote_reason": "Name an owner.", "confidence": 0.7, "claims": [], "references": [],
             **({"final_answer": "Yes, for invoices."} if schema.endswith("_answer") else {})}
    out = filter_.filter(reply, {"challenges": 2})
    assert out["challenges"] == [challenges[1], challenges[2]]  # 2 + 5 + 0.36 before 4 + 0.24
    assert {k: v for k, v in out.items() if k != "challenges"} == {k: v for k, v in reply.items() if k != "challenges"}


def test_rebuttals_rank_by_substantiveness() -> None:
    rebuttals = [
        rebuttal("We disagree."),
        rebuttal("Our benchmark data shows replays of 2M events finish in 38 s, because snapshots cap the work."),
        rebuttal("Snapshots are taken every thousand events, which bounds replay for any single aggregate."),
    ]
    out = filter_.filter(cross_exam([], rebuttals), {"rebuttals": 2})
    assert out["rebuttals"] == [rebuttals[1], rebuttals[2]]


def test_the_input_is_never_mutated_and_the_output_shares_nothing_with_it() -> None:
    original = copy.deepcopy(SYNTHESIS)
    out = filter_.filter(SYNTHESIS, {"consensus_points": 2, "tensions": 1})
    assert original == SYNTHESIS
    out["consensus_points"][0]["supporting_agents"].append("intruder")
    out["priority_order"].clear()
    assert original == SYNTHESIS


def test_limits_larger_than_the_array_and_zero_limits() -> None:
    out = filter_.filter(SYNTHESIS, {"consensus_points": 50, "tensions": 0})
    assert len(out["consensus_points"]) == 5
    assert out["tensions"] == []
    assert validate("synthesis", out) == []


@pytest.mark.parametrize(
    ("artifact", "limits", "message"),
    [
        (SYNTHESIS, {"challenges": 5}, "'challenges'"),
        (SYNTHESIS, {"consensus_point": 3}, "'consensus_point'"),
        (SYNTHESIS, {"priority_order": 2}, "always kept whole"),
        (cross_exam([], []), {"unresolved": 1}, "always kept whole"),
        (SYNTHESIS, {"consensus_points": -1}, "non-negative"),
    ],
)
def test_bad_limits_are_value_errors_naming_the_key(
    artifact: dict[str, Any], limits: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        filter_.filter(artifact, limits)


def test_the_result_is_revalidated() -> None:
    broken = copy.deepcopy(SYNTHESIS)
    broken["tensions"][0]["viewpoints"] = broken["tensions"][0]["viewpoints"][:1]  # a tension needs two
    with pytest.raises(ArtifactValidationError, match="tensions"):
        checked_filter(filter_, broken, {"consensus_points": 3})


def test_a_subclass_that_ranks_badly_cannot_duplicate_items() -> None:
    class Duplicating(TopNArtifactFilter):
        def rank(self, artifact_type: str, field: str, items: Sequence[Any]) -> list[int]:
            return [0] * len(items)

    with pytest.raises(ValueError, match="each index"):
        Duplicating().filter(SYNTHESIS, {"consensus_points": 3})


def test_top_n_is_registered_through_the_entry_point() -> None:
    registered = load_plugins().filters.get("top_n")
    assert registered is TopNArtifactFilter
    assert issubclass(registered, ArtifactFilter)


def test_limits_for_splits_a_round4_limit_set_per_artifact() -> None:
    round4 = {"consensus_points": 3, "tensions": 2, "challenges": 5, "rebuttals": 5}
    assert limits_for(SYNTHESIS, round4) == {"consensus_points": 3, "tensions": 2}
    assert limits_for(cross_exam([], []), round4) == {"challenges": 5, "rebuttals": 5}


def test_token_efficiency_stats_match_the_seed_example() -> None:
    assert token_efficiency_stats(15_650, 12_450, [4, 3, 3]) == {
        "tokens_used": 12_450,
        "tokens_saved_via_filtering": 3_200,
        "efficiency_percentage": 20.4,
        "filtering_method": "structured_artifact_array_truncation",
        "filtered_rounds": [3, 4],
    }


def test_token_efficiency_stats_never_report_negative_savings() -> None:
    stats = token_efficiency_stats(100, 101, [3])
    assert (stats["tokens_saved_via_filtering"], stats["efficiency_percentage"]) == (0, 0.0)
    assert token_efficiency_stats(0, 0, [])["efficiency_percentage"] == 0.0


def test_filtering_off_notice_text() -> None:
    assert FILTERING_OFF_NOTICE == "🔍 Filtering off: using full debate artifacts (higher token cost)"


_agent = st.sampled_from(["security", "architect", "pragmatist", "skeptic"])
_text = st.text(alphabet="abcdefghij klmnop", min_size=1, max_size=40).filter(str.strip)
_points = st.lists(
    st.builds(consensus, _text, st.floats(0, 1)), max_size=8
)
_tensions = st.lists(
    st.builds(lambda topic, agents: tension(topic, *agents), _text, st.lists(_agent, min_size=2, max_size=4)),
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(_points, _tensions, st.integers(0, 10), st.integers(0, 10))
def test_filtering_only_drops_items_and_stays_valid(
    points: list[dict[str, Any]], tensions: list[dict[str, Any]], n_points: int, n_tensions: int
) -> None:
    art = synthesis(points, tensions)
    out = filter_.filter(art, {"consensus_points": n_points, "tensions": n_tensions})
    assert validate("synthesis", out) == []
    assert len(out["consensus_points"]) == min(n_points, len(points))
    assert len(out["tensions"]) == min(n_tensions, len(tensions))
    remaining = list(points)
    for item in out["consensus_points"]:  # every kept item is an original item, each used at most once
        remaining.remove(item)
    kept_conf = [p["confidence"] for p in out["consensus_points"]]
    assert kept_conf == sorted(kept_conf, reverse=True)
    dropped_max = max((p["confidence"] for p in remaining), default=-1.0)
    assert all(c >= dropped_max for c in kept_conf)
