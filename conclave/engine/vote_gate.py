"""The vote gate after round 1 (selective debate): decide on the aggregated answer when the panel agrees.

The panel agrees when the weighted agreement behind the aggregator's pick is at least ``selective.tau``, no
agent flags a BLOCKER and no agent backing the pick states a confidence below ``exit.min_confidence`` (a
dissenter's low confidence is already in the weights: it is what lets the panel decide against it). Then the
plan ends after round 1 and the verdict is taken from the vote (every string from the round-1 answers); otherwise
the debate runs. In
``mode=answer`` answers agree when their normalised ``final_answer`` is equal; in other modes when their
positions are similar (``quality.groupthink.cluster_similarity``). The decision — its inputs, weights and ``tau``
— is the ``vote:gate`` event (schema ``vote_gate``), the result's ``vote_gate`` and a line of the report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from conclave.artifacts import schema_registry as artifacts
from conclave.engine.aggregation import (
    Aggregate,
    AggregationContext,
    Ballot,
    answer_groups,
    position_groups,
)
from conclave.engine.extraction import header_for

if TYPE_CHECKING:
    from conclave.engine.session import Session

SCHEMA = "vote_gate"
#: fields a round-1 artifact states its answer in, first found wins (answer mode: final_answer)
ANSWER_FIELDS = ("final_answer", "position", "recommendation")


def enabled(session: Session) -> bool:
    """``selective.enabled``, or when null the strategy's default (on in answer mode)."""
    flag = session.settings.selective.enabled
    return bool(session.strategy.selective_by_default if flag is None else flag)


def aggregator_name(settings: Any, strategy: Any) -> str:
    """``aggregator``, or when null the strategy's default (answer mode: confidence)."""
    return str(settings.aggregator or strategy.default_aggregator)


def ballots_of(session: Session) -> list[Ballot]:
    """The round-1 answers in panel order, each with its seat and stated confidence."""
    out = []
    for name, artifact in session.record.round_1.items():
        spec = session.settings.agents[name]
        answer = next((str(artifact[f]).strip() for f in ANSWER_FIELDS if str(artifact.get(f) or "").strip()), "")
        confidence = artifact.get("confidence")
        out.append(Ballot(name, spec.persona, spec.provider, spec.model, answer,
                          float(confidence) if isinstance(confidence, int | float) else None))
    order = list(session.settings.agents)
    return sorted(out, key=lambda b: order.index(b.agent))


def decide(session: Session, aggregator: Any, *, has_final_answer: bool) -> dict[str, Any]:
    """The ``vote:gate`` payload for the round-1 answers (validated against the ``vote_gate`` schema)."""
    settings = session.settings
    ballots = ballots_of(session)
    if has_final_answer:
        groups, compared = answer_groups(ballots), "final_answer"
    else:
        groups = position_groups(ballots, settings.quality.groupthink.cluster_similarity)
        compared = "position_similarity"
    result: Aggregate = aggregator.aggregate(ballots, groups, AggregationContext(home=settings.home))
    tau, floor = settings.selective.tau, settings.exit.min_confidence
    blockers = [a for a, x in session.record.round_1.items() if x.get("vote") == "BLOCKER"]
    supporters = [ballots[i].agent for i in groups[result.group]] if result.group is not None else []
    low = [b.agent for b in ballots if b.agent in supporters and (b.confidence is None or b.confidence < floor)]
    if len(ballots) < 2:
        reason = "too_few_answers"
    elif result.group is None:
        reason = "aggregator_undecided"
    elif blockers:
        reason = "blocker"
    elif low:
        reason = "low_confidence"
    elif result.agreement < tau:
        reason = "below_tau"
    else:
        reason = "agreed"
    answer = _representative(ballots, supporters, result.weights) if supporters else None
    payload: dict[str, Any] = {
        **header_for(SCHEMA, 1, None),
        "decided": reason == "agreed",
        "reason": reason,
        "tau": tau,
        "agreement": round(result.agreement, 4),
        "aggregator": result.aggregator,
        "weights": result.weights,
        "basis": result.basis,
        "note": result.note,
        "compared": compared,
        "answer": answer,
        "supporters": supporters,
        "answered": len(ballots),
        "min_confidence": floor,
        "low_confidence": low,
        "blockers": blockers,
        "answers": {b.agent: {"answer": b.answer, "confidence": b.confidence} for b in ballots},
    }
    payload["summary"] = summary_line(payload)
    artifacts.check(SCHEMA, payload)
    return payload


def summary_line(gate: Mapping[str, Any]) -> str:
    """The report's line: "decided by the vote after round 1: 3 of 3 agree, weight 0.91 ≥ 0.8 (confidence)"."""
    agree = f"{len(gate.get('supporters') or [])} of {gate.get('answered')} agree"
    weight = f"weight {float(gate.get('agreement') or 0):.2f}"
    how = f"aggregator {gate.get('aggregator')}"
    if gate.get("decided"):
        return f"decided by the vote after round 1: {agree}, {weight} ≥ {gate.get('tau'):g} ({how})"
    why = {
        "below_tau": f"{agree}, {weight} < {gate.get('tau'):g}",
        "low_confidence": f"{agree}, but {', '.join(gate.get('low_confidence') or [])} below confidence "
                          f"{gate.get('min_confidence'):g}",
        "blocker": f"{', '.join(gate.get('blockers') or [])} flagged a BLOCKER",
        "aggregator_undecided": str(gate.get("note") or "the aggregator could not decide"),
        "too_few_answers": "fewer than two round-1 answers",
    }.get(str(gate.get("reason")), str(gate.get("reason")))
    return f"debated: the vote after round 1 did not decide ({why}; {how})"


def synthesis_from_vote(gate: Mapping[str, Any], ballots: Sequence[Ballot]) -> dict[str, Any]:
    """A synthesis-shaped record of the vote, from which the strategy derives its verdict: the picked answer as
    the one consensus point (its supporters, the agreement as confidence), each dissenting answer as a viewpoint.
    Every string is a round-1 answer."""
    supporters = list(gate.get("supporters") or [])
    dissent = [b for b in ballots if b.agent not in supporters]
    answer = str(gate.get("answer") or "")
    return {
        "final_answer": answer,
        "consensus_points": [{"point": answer, "supporting_agents": supporters,
                              "confidence": float(gate.get("agreement") or 0), "claim_ids": []}],
        "tensions": [{"topic": "round-1 answers", "viewpoints": [{"agent": b.agent, "viewpoint": b.answer}
                                                               for b in dissent]}] if dissent else [],
    }


def _representative(ballots: Sequence[Ballot], supporters: Sequence[str], weights: Mapping[str, float]) -> str:
    """The picked group's answer as its heaviest supporter gave it (panel order on a tie)."""
    chosen = [b for b in ballots if b.agent in supporters]
    return max(chosen, key=lambda b: (weights.get(b.agent, 0.0), -ballots.index(b))).answer
