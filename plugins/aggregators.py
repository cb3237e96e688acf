"""Built-in aggregators (``aggregator=<name>``): plurality, confidence, learned, judge_pick.

- ``plurality``: every agent weighs the same; the most common answer wins.
- ``confidence``: within-question relative confidence (CISC-style): each agent's stated confidence, softmax-
  normalised across the panel on this question (temperature :data:`CONFIDENCE_TEMPERATURE`), so an agent counts
  for more only when it is surer than its peers on this question.
- ``learned``: per-seat weights (persona on a provider's model) fitted from the user's graded history in the index
  (``conclave eval`` items with gold answers), of the same task kind when there is one: each seat's accuracy
  (Laplace-smoothed) as log-odds, the weights of the optimal weighted vote for independent errors, mixed with
  equal weights by n / (n + :data:`PRIOR_ITEMS`) so thin history stays near equal. With no graded history: equal
  weights, and the note says so.
- ``judge_pick``: the judge's pick among the round-1 answers (the synthesis' ``final_answer``); before a judge has
  seen them it cannot decide (a gate after round 1 then lets the debate run).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from conclave.engine.aggregation import (
    Aggregate,
    AggregationContext,
    Ballot,
    equal_weights,
    normalise,
    pick_heaviest,
)
from conclave.eval.graded import graded_history
from conclave.hookspecs import hookimpl

CONFIDENCE_TEMPERATURE = 0.25
#: graded items at which learned weights are trusted half (the rest is equal weights)
PRIOR_ITEMS = 20
#: accuracies are kept inside (EPS, 1 - EPS) so a perfect record gets a large, finite weight
EPS = 0.02


class Plurality:
    name = "plurality"

    def aggregate(self, ballots: Sequence[Ballot], groups: Sequence[Sequence[int]],
                  context: AggregationContext) -> Aggregate:
        return pick_heaviest(self.name, ballots, groups, equal_weights(ballots))


class ConfidenceWeighted:
    name = "confidence"

    def aggregate(self, ballots: Sequence[Ballot], groups: Sequence[Sequence[int]],
                  context: AggregationContext) -> Aggregate:
        return pick_heaviest(self.name, ballots, groups, confidence_weights(ballots),
                             note=f"softmax of stated confidences within the question (temperature "
                                  f"{CONFIDENCE_TEMPERATURE:g})")


def confidence_weights(ballots: Sequence[Ballot]) -> dict[str, float]:
    """Softmax of the confidences within the question; a missing confidence counts as 0.5."""
    scores = [(b.confidence if b.confidence is not None else 0.5) / CONFIDENCE_TEMPERATURE for b in ballots]
    top = max(scores, default=0.0)
    raw = [math.exp(s - top) for s in scores]
    total = sum(raw) or 1.0
    return {b.agent: r / total for b, r in zip(ballots, raw, strict=True)}


class Learned:
    name = "learned"

    def aggregate(self, ballots: Sequence[Ballot], groups: Sequence[Sequence[int]],
                  context: AggregationContext) -> Aggregate:
        if context.graded is not None:  # kept by the caller (an evaluation), current as of now
            history = context.graded(context.kind)
        else:
            history = graded_history(context.home, context.kind) if context.home is not None else {}
        weights, basis, note = learned_weights(ballots, history)
        return pick_heaviest(self.name, ballots, groups, weights, note=note, basis=basis)


def learned_weights(ballots: Sequence[Ballot], history: Mapping[str, tuple[int, int]]
                    ) -> tuple[dict[str, float], dict[str, int], str]:
    """(weights, graded items per seat, note) from ``history``: seat -> (right, graded)."""
    basis = {b.agent: history.get(b.seat, (0, 0))[1] for b in ballots}
    if not any(basis.values()):
        return equal_weights(ballots), basis, "no graded history: equal weights"
    odds = {}
    for b in ballots:
        right, graded = history.get(b.seat, (0, 0))
        accuracy = min(1 - EPS, max(EPS, (right + 1) / (graded + 2)))  # Laplace: no seat is certain
        odds[b.agent] = max(1e-3, math.log(accuracy / (1 - accuracy)))  # a seat worse than chance barely counts
    total = sum(odds.values())
    # thin history: mix with equal weights, trusting the fit by n / (n + PRIOR_ITEMS) of the panel's mean n
    trust = (sum(basis.values()) / len(basis)) / (sum(basis.values()) / len(basis) + PRIOR_ITEMS)
    equal = 1.0 / len(ballots)
    shown = ", ".join(f"{a} {basis[a]}" for a in basis)
    return ({a: trust * w / total + (1 - trust) * equal for a, w in odds.items()}, basis,
            f"per-seat accuracy from graded history (items: {shown}), {trust:.0%} learned, the rest equal "
            "weights")


class JudgePick:
    name = "judge_pick"

    def aggregate(self, ballots: Sequence[Ballot], groups: Sequence[Sequence[int]],
                  context: AggregationContext) -> Aggregate:
        weights = equal_weights(ballots)
        if context.judge_answer is None:
            return Aggregate(self.name, None, weights, 0.0, "the judge has not picked yet (it picks in round 2)")
        wanted = normalise(context.judge_answer)
        for k, group in enumerate(groups):
            if any(normalise(ballots[i].answer) == wanted for i in group):
                agreement = sum(weights[ballots[i].agent] for i in group)
                return Aggregate(self.name, k, weights, round(agreement, 4), "the judge's pick among round-1 answers")
        return Aggregate(self.name, None, weights, 0.0, "the judge picked none of the round-1 answers")


@hookimpl
def register_aggregators(register: Any) -> None:
    for aggregator in (Plurality(), ConfidenceWeighted(), Learned(), JudgePick()):
        register(aggregator.name, aggregator)
