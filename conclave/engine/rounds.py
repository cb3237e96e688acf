"""Round types and plans: what one round of a debate *is*, declared once, and the order a strategy plays them in.

A :class:`RoundType` says everything about one kind of round:

- who plays it (``seat``): ``"agents"`` — every agent at once, each with its own call — or ``"judge"``;
- the strategy template that words its user message (``template``) and the ``prompt_versions`` key that template
  is recorded under (``prompt_key``); the system prompt is the strategy's ``agent_system`` or ``judge_system``;
- the artifact schema its answers must match (``schema``) and the output budget of each call (``max_tokens``);
- what it is shown (``inputs``): template placeholder → an earlier round's artifacts, and how they are filtered;
- where it sits: the state the consultation is in while it runs (``state``), the debate stage that ``rounds=N``
  counts (``stage``, 1–4), and whether it opens a new numbered round or continues the one before
  (``opens_round``: the cross-examination judgement is part of the round its replies opened).

Every call also receives ``question``, ``panel`` (the judge's neutral labels), ``absent`` (who is missing) and,
on the agents' seat, the agent's own ``label``.

A :class:`Plan` is a strategy's debate: an ordered list of round types. The engine plays it from the front;
``rounds=N``/``quick`` cut it to the stages ≤ N before it starts, and a controller may change what is still to
come while it runs through :meth:`Plan.insert_next` (insert an objection round, repeat cross-examination) or
:meth:`Plan.end_here` (early termination). Numbers, states and transitions all follow from the plan.

To add a round type, declare one ``RoundType`` (in a plugin too) and put it in a strategy's plan; the strategy
ships its template.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

Seat = Literal["agents", "judge"]


@dataclass(frozen=True)
class Input:
    """One artifact input of a round: the latest artifacts of round type ``source``.

    ``take``:
      - ``"own"`` — the calling agent's own artifact (agents' seat only), shown in full;
      - ``"each"`` — every present agent's artifact, as a list in the judge's order;
      - ``"each_by_label"`` — every present agent's artifact, as an object keyed by label;
      - ``"judge"`` — the judge's artifact.
    ``filtered`` names the ``filtering.<section>`` limits applied to it first, or None for the artifact in full:
    the built-in rounds use ``round3`` and ``round4``; a plugin's round type may name a section of its own, which
    the user then sets as ``+filtering.<section>.<field>=N``. Only the judge's artifacts are filtered: agents'
    answers are always shown whole.
    """

    source: str
    take: Literal["own", "each", "each_by_label", "judge"]
    filtered: str | None = None


@dataclass(frozen=True)
class RoundType:
    name: str
    title: str  # how people read it: "Independent", "Cross-exam replies"
    seat: Seat
    template: str
    prompt_key: str
    schema: str
    max_tokens: int
    state: str
    stage: int
    inputs: dict[str, Input] = field(default_factory=dict)
    opens_round: bool = True
    #: agents' seat: fewer valid answers than this ends the consultation; ``too_few`` says so
    #: ({got}, {of} and {needed} are filled in)
    min_answers: int = 1
    too_few: str = "only {got} of {of} agents gave a valid {title} answer"
    #: whether answers may mention the neutral labels they were shown (then they are translated back to names)
    sees_labels: bool = True
    #: names this step inside its round, where the round has several ("round 3 replies")
    short: str = ""

    @property
    def filter_sections(self) -> frozenset[str]:
        """The ``filtering.<section>`` names this round's inputs are filtered with."""
        return frozenset(i.filtered for i in self.inputs.values() if i.filtered is not None)

    def with_schema(self, schema: str) -> RoundType:
        """The same round answered with another artifact schema (a strategy's own reply or verdict shape)."""
        return replace(self, schema=schema)

    def carried_tokens(self, catalogue: Callable[[str], RoundType], agents: int) -> int:
        """Upper bound of the artifact tokens one call of this round carries: each input at its producer's cap."""
        total = 0
        for source in self.inputs.values():
            producer = catalogue(source.source).max_tokens
            total += producer * agents if source.take in ("each", "each_by_label") else producer
        return total


# ------------------------------------------------------------------------------------------------ the built-ins

INDEPENDENT = RoundType(
    name="independent",
    title="Independent",
    seat="agents",
    template="round1",
    prompt_key="round_1",
    schema="independent",
    max_tokens=2048,
    state="INDEPENDENT",
    stage=1,
    min_answers=2,  # a debate needs at least two positions
    too_few="only {got} of {of} agents gave a valid round-1 answer; a debate needs at least {needed}",
    sees_labels=False,
)

SYNTHESIS = RoundType(
    name="synthesis",
    title="Synthesis",
    seat="judge",
    template="round2",
    prompt_key="round_2",
    schema="synthesis",
    max_tokens=4096,
    state="SYNTHESIS",
    stage=2,
    inputs={"independents": Input("independent", "each")},  # every round-1 answer, unfiltered
)

CROSS_EXAM_REPLIES = RoundType(
    name="cross_exam_replies",
    title="Cross-exam replies",
    seat="agents",
    template="round3_agent",
    prompt_key="round_3",
    schema="cross_exam_reply",
    max_tokens=2048,
    state="CROSS_EXAM",
    stage=3,
    inputs={
        "own_position": Input("independent", "own"),  # each agent sees its own round-1 answer in full
        "synthesis": Input("synthesis", "judge", filtered="round3"),
    },
    too_few="no agent gave a valid reply in round {number}",
    short="replies",
)

CROSS_EXAM = RoundType(
    name="cross_exam",
    title="Cross-exam",
    seat="judge",
    template="round3_judge",
    prompt_key="round_3_judge",
    schema="cross_exam",
    max_tokens=4096,
    state="CROSS_EXAM",
    stage=3,
    opens_round=False,  # the judgement closes the round its replies opened
    inputs={
        # the synthesis as the agents were shown it: they answered that one
        "synthesis": Input("synthesis", "judge", filtered="round3"),
        "replies": Input("cross_exam_replies", "each_by_label"),
    },
)

VERDICT = RoundType(
    name="verdict",
    title="Verdict",
    seat="judge",
    template="round4",
    prompt_key="round_4",
    schema="verdict",
    max_tokens=4096,
    state="VERDICT",
    stage=4,
    inputs={
        "independents": Input("independent", "each"),  # all round-1 answers in full
        "synthesis": Input("synthesis", "judge", filtered="round4"),
        "cross_exam": Input("cross_exam", "judge", filtered="round4"),
    },
)

#: the debate every built-in strategy plays, in order
STANDARD_PLAN: tuple[RoundType, ...] = (INDEPENDENT, SYNTHESIS, CROSS_EXAM_REPLIES, CROSS_EXAM, VERDICT)

#: the last round types of a debate whose judge artifact is the verdict
VERDICT_ROUND = VERDICT.name


# ------------------------------------------------------------------------------------------------ plans


@dataclass(frozen=True)
class Step:
    """One round type at its place in a consultation: the numbered round it belongs to."""

    number: int
    type: RoundType


@dataclass
class PlanChange:
    """A change a controller made to what is still to come (journaled as ``plan:changed``)."""

    action: Literal["insert", "end", "restore"]
    after: int  # the position in the plan it was made at (steps played so far)
    round_types: list[str]
    reason: str


class Plan:
    """The ordered round types of one consultation, and how far it has got.

    ``steps()`` numbers them (a round type with ``opens_round`` starts a new round). The engine takes
    :meth:`next_step` until none is left; controllers change the rest through :meth:`insert_next` and
    :meth:`end_here`, and each change is handed to ``on_change`` (the engine journals it).
    """

    def __init__(self, round_types: Iterable[RoundType], *, on_change: Callable[[PlanChange], None] | None = None):
        self.types: list[RoundType] = list(round_types)
        if not self.types or not self.types[0].opens_round:
            raise ValueError("a plan starts with a round type that opens a round")
        self.played = 0  # how many steps have been handed out
        self.changes: list[PlanChange] = []
        self.on_change = on_change

    # ------------------------------------------------------------------------------------------- reading

    def steps(self) -> list[Step]:
        out, number = [], 0
        for round_type in self.types:
            number += 1 if round_type.opens_round else 0
            out.append(Step(number, round_type))
        return out

    def rounds(self) -> list[list[Step]]:
        """The steps grouped by round number, in order."""
        grouped: list[list[Step]] = []
        for step in self.steps():
            if not grouped or grouped[-1][0].number != step.number:
                grouped.append([])
            grouped[-1].append(step)
        return grouped

    def numbers(self) -> list[int]:
        return [group[0].number for group in self.rounds()]

    def states(self) -> list[str]:
        """The state of each round, in order (what the state machine may move through)."""
        return [group[0].type.state for group in self.rounds()]

    def find(self, name: str) -> RoundType | None:
        """The last round type called ``name`` in the plan (strategies may replace a built-in's schema)."""
        return next((t for t in reversed(self.types) if t.name == name), None)

    def __iter__(self) -> Iterator[RoundType]:
        return iter(self.types)

    # ------------------------------------------------------------------------------------------- playing

    def next_round(self) -> list[Step] | None:
        """The steps of the next round to play (and mark them handed out), or None at the end."""
        steps = self.steps()[self.played :]
        if not steps:
            return None
        group = [steps[0]] + [s for s in steps[1:] if s.number == steps[0].number]
        self.played += len(group)
        return group

    @property
    def finished(self) -> bool:
        return self.played >= len(self.types)

    # ------------------------------------------------------------------------------------------- changing

    def insert_next(self, round_types: Sequence[RoundType], reason: str) -> None:
        """Play ``round_types`` right after the round being played, before the rest of the plan.

        The one call a controller uses to extend a debate: insert an objection round, repeat cross-examination.
        Later rounds are renumbered after them; played rounds never change."""
        if not round_types:
            return
        if not round_types[0].opens_round:
            raise ValueError(f"round type {round_types[0].name!r} cannot start an inserted round")
        self.types[self.played : self.played] = list(round_types)
        self._changed(PlanChange("insert", self.played, [t.name for t in round_types], reason))

    def end_here(self, reason: str) -> None:
        """Play nothing after the round being played (e.g. early termination)."""
        dropped = self.types[self.played :]
        del self.types[self.played :]
        self._changed(PlanChange("end", self.played, [t.name for t in dropped], reason))

    def restore(self, round_types: Sequence[RoundType], reason: str) -> None:
        """Replace the plan, before play starts, by the one a resumed consultation had reached."""
        if self.played:
            raise ValueError("a plan is restored before any round is played")
        self.types = list(round_types)
        self._changed(PlanChange("restore", 0, [t.name for t in round_types], reason))

    def cut_to_stage(self, stage: int) -> None:
        """Keep only the round types of stages ≤ ``stage`` (``rounds=N``, ``quick``); before play starts."""
        self.types = [t for t in self.types if t.stage <= stage]

    def _changed(self, change: PlanChange) -> None:
        self.changes.append(change)
        if self.on_change is not None:
            self.on_change(change)


def catalogue_of(plan: Iterable[RoundType], *extra: RoundType) -> Callable[[str], RoundType]:
    """Look up a round type by name among ``plan`` (the last one of a name wins) and ``extra``."""
    by_name = {t.name: t for t in (*extra, *plan)}

    def lookup(name: str) -> RoundType:
        try:
            return by_name[name]
        except KeyError:
            raise KeyError(f"round type {name!r} is an input of the plan but is not in it") from None

    return lookup
