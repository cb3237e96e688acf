"""Aggregators: how the panel's round-1 answers become one, and how strongly the panel agrees on it.

An aggregator is a plugin (``register_aggregators``): an object with a ``name`` and
``aggregate(ballots, groups, context) -> Aggregate``. ``ballots`` are the round-1 answers in panel order;
``groups`` partitions them (indexes into ``ballots``) into answers that count as the same — equal normalised
``final_answer`` in answer mode, similar positions elsewhere (:func:`answer_groups`, :func:`position_groups`).
The aggregator gives each agent a weight (they sum to 1) and picks a group; the weighted agreement is the weight
behind the picked group. Built-ins live in ``conclave_plugins.aggregators``: plurality, confidence, learned,
judge_pick.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from conclave.quality.similarity import clusters


@dataclass(frozen=True)
class Ballot:
    """One agent's round-1 answer: its seat (persona, provider, model), the answer and its stated confidence."""

    agent: str
    persona: str
    provider: str
    model: str
    answer: str
    confidence: float | None

    @property
    def seat(self) -> str:
        """What learned weights are kept by: the persona played on a provider's model."""
        return f"{self.persona}@{self.provider}/{self.model}"


@dataclass(frozen=True)
class AggregationContext:
    """What an aggregator may use besides the ballots."""

    home: Path | None = None  # the user's home: learned weights read its index
    kind: str | None = None  # the task kind (eval items have one; a plain question has none)
    judge_answer: str | None = None  # the judge's pick among the round-1 answers, once a judge has seen them
    #: kind -> the graded history (seat -> (right, graded)) as the caller keeps it (an evaluation, which adds its
    #: items as it grades them); None: learned weights read it from ``home``'s index
    graded: Callable[[str | None], Mapping[str, tuple[int, int]]] | None = None


@dataclass
class Aggregate:
    """What an aggregator decided: the picked group (None: it cannot decide), each agent's weight, the weighted
    agreement behind the pick, and how the weights came about (``note``, ``basis``: items per seat)."""

    aggregator: str
    group: int | None
    weights: dict[str, float]
    agreement: float
    note: str = ""
    basis: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Aggregator(Protocol):
    name: str

    def aggregate(self, ballots: Sequence[Ballot], groups: Sequence[Sequence[int]],
                  context: AggregationContext) -> Aggregate: ...


def normalise(answer: str) -> str:
    """The form two short answers are compared in: case-folded, whitespace collapsed, a final period dropped."""
    return " ".join(answer.casefold().split()).rstrip(".").strip()


def answer_groups(ballots: Sequence[Ballot]) -> list[list[int]]:
    """Ballots with the same normalised answer, in order of first appearance."""
    index: dict[str, list[int]] = {}
    for i, ballot in enumerate(ballots):
        index.setdefault(normalise(ballot.answer), []).append(i)
    return list(index.values())


def position_groups(ballots: Sequence[Ballot], threshold: float) -> list[list[int]]:
    """Ballots whose positions are similar (TF-IDF cosine at least ``threshold``), for open-ended modes."""
    return [sorted(g) for g in clusters([b.answer for b in ballots], threshold)]


def pick_heaviest(name: str, ballots: Sequence[Ballot], groups: Sequence[Sequence[int]],
                  weights: Mapping[str, float], note: str = "", basis: Mapping[str, int] | None = None) -> Aggregate:
    """The group with the most weight behind it (a tie: the group whose first answer came first)."""
    totals = [sum(weights.get(ballots[i].agent, 0.0) for i in g) for g in groups]
    if not totals:
        return Aggregate(name, None, dict(weights), 0.0, note, dict(basis or {}))
    best = max(range(len(groups)), key=lambda k: (round(totals[k], 9), -min(groups[k])))
    return Aggregate(name, best, {a: round(w, 4) for a, w in weights.items()}, round(totals[best], 4), note,
                     dict(basis or {}))


def equal_weights(ballots: Sequence[Ballot]) -> dict[str, float]:
    return {b.agent: 1.0 / len(ballots) for b in ballots} if ballots else {}
