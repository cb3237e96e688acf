"""The exit controller: after each cross-examination round, whether the debate has reached its end.

Every cross-examination reply carries a ``vote`` (``ACCEPT``: the emerging recommendation stands; ``MINOR``: it
stands with named changes; ``BLOCKER``: a problem must be resolved first) and a ``confidence``. After each
cross-examination round the controller checks, in order:

- **consensus** — at least ``exit.consensus`` (0.80) of the agents taking part vote ACCEPT or MINOR, none votes
  BLOCKER (a BLOCKER is unresolved until its author votes otherwise in a later round), and every agent's latest
  confidence is at least ``exit.min_confidence`` (0.70); an agent that gave no reply counts as not agreeing;
- **convergence** — the last ``exit.plateau_rounds`` (1: cross-examination repeats only while the panel
  moves) rounds each changed the panel by less than
  ``exit.plateau_delta`` (0.10) and introduced no new FACT claim. A round's change is the mean, over the agents
  who answered both it and the round before, of the largest of: the change of confidence, the share of the
  position's words that changed (1 − difflib ratio over word lists) and the vote's move (ACCEPT–MINOR–BLOCKER:
  one step 0.5, two steps 1). The first cross-examination round is compared with the round-1 answers;
- **round-cap** — another cross-examination round would push the verdict past ``exit.round_cap`` (6 rounds in
  all), or the plan is fixed: ``rounds=1..4`` and ``quick`` play exactly the rounds they name, never a repeat
  (nor does a plugin strategy whose replies carry no vote).

No reason: cross-examination repeats (R3a, R3b, …): the round's own steps are inserted again before the verdict
through :meth:`conclave.engine.rounds.Plan.insert_next`. ``exit.override=continue`` ignores consensus and
convergence and repeats up to the cap. On a terminal the user is asked before each decision that can still go
either way: stop on consensus/convergence (answering no continues: an override), or run another round (answering
no stops: ``user-stop``). With ``quality.stage=shadow`` every decision is recorded (``shadow: true``) as if repeats
were allowed and nobody could be asked, and nothing changes: the debate plays its four rounds. An accepted early
termination after the synthesis ends the debate with
``early-termination``. Each decision is journaled as ``exit:evaluated``; the consultation's exit reason is the
last one.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from statistics import fmean
from typing import TYPE_CHECKING, Any

from conclave.engine.rounds import Plan

if TYPE_CHECKING:
    from conclave.config.settings import ExitSettings, Settings
    from conclave.engine.interaction import Interaction
    from conclave.engine.record import Record
    from conclave.engine.rounds import RoundType, Step
    from conclave.quality.debate_state import StateClaim

VOTES = ("ACCEPT", "MINOR", "BLOCKER")
REASONS = ("consensus", "convergence", "round-cap", "user-stop", "early-termination")
EXIT_EVALUATED = "exit:evaluated"  # conclave.events.EXIT_EVALUATED
#: the agents' round type whose replies carry votes; its round is what repeats
REPLIES = "cross_exam_replies"
#: the fields an artifact states its position in, first found wins
POSITION_FIELDS = ("revised_position", "refined_position", "position", "final_answer", "recommendation")


@dataclass(frozen=True)
class Standing:
    """Where one agent stands after one round: its position, confidence and (in cross-examination) vote."""

    position: str
    confidence: float | None
    vote: str | None = None


def standing_of(artifact: Mapping[str, Any]) -> Standing:
    position = next((str(artifact[f]) for f in POSITION_FIELDS if artifact.get(f)), "")
    confidence = artifact.get("confidence")
    vote = artifact.get("vote")
    return Standing(position, float(confidence) if isinstance(confidence, int | float) else None,
                    str(vote) if vote in VOTES else None)


# ------------------------------------------------------------------------------------------------ the conditions


def consensus(standings: Mapping[str, Standing], present: Sequence[str], confidences: Mapping[str, float | None],
              settings: ExitSettings) -> dict[str, Any]:
    """The consensus check on one round's replies. ``confidences``: each agent's latest known confidence."""
    agreeing = [a for a in present if a in standings and standings[a].vote in ("ACCEPT", "MINOR")]
    blockers = [a for a in present if a in standings and standings[a].vote == "BLOCKER"]
    known = [confidences.get(a) for a in present]
    low = [a for a, c in zip(present, known, strict=True) if c is None or c < settings.min_confidence]
    share = len(agreeing) / len(present) if present else 0.0
    return {
        "share": round(share, 4),
        "blockers": blockers,
        "low_confidence": low,
        "min_confidence": round(min((c for c in known if c is not None), default=0.0), 4),
        "met": bool(present) and share >= settings.consensus and not blockers and not low,
    }


def vote_move(before: str | None, after: str | None) -> float:
    if before is None or after is None:
        return 0.0
    return abs(VOTES.index(before) - VOTES.index(after)) / 2


def position_change(before: str, after: str) -> float:
    """The share of a position's words that changed: 1 − difflib's ratio over lower-cased word lists."""
    if not before and not after:
        return 0.0

    return 1.0 - difflib.SequenceMatcher(None, before.lower().split(), after.lower().split(),
                                         autojunk=False).ratio()


def change(before: Mapping[str, Standing], after: Mapping[str, Standing]) -> float | None:
    """How much the panel moved from one round to the next (0 = not at all, 1 = completely); None when no agent
    answered both."""
    moves = []
    for agent in sorted(set(before) & set(after)):
        a, b = before[agent], after[agent]
        confidence = abs(b.confidence - a.confidence) if a.confidence is not None and b.confidence is not None \
            else 0.0
        moves.append(max(confidence, position_change(a.position, b.position), vote_move(a.vote, b.vote)))

    return round(fmean(moves), 4) if moves else None


def plateau(deltas: Sequence[float | None], new_facts: Sequence[int], settings: ExitSettings) -> bool:
    """Whether the last ``plateau_rounds`` rounds each moved less than ``plateau_delta`` and brought no new FACT
    claim (``deltas`` and ``new_facts`` are per cross-examination round, oldest first)."""
    n = settings.plateau_rounds
    if len(deltas) < n:
        return False
    recent = deltas[-n:]
    return all(d is not None and d < settings.plateau_delta for d in recent) and not any(new_facts[-n:])


# ------------------------------------------------------------------------------------------------ the controller


@dataclass
class Decision:
    """One ``exit:evaluated`` record: what the controller found after a cross-examination round and did."""

    round_number: int
    votes: dict[str, str | None]
    confidence: dict[str, float | None]
    consensus: dict[str, Any]
    change: float | None
    new_facts: int
    plateau: bool
    reason: str | None  # the exit reason found (None: keep going)
    action: str  # "stop" (go on to what the plan holds next) | "repeat" (another cross-examination round)
    can_repeat: bool
    overridden: bool = False  # consensus/convergence found, but exit.override or the user said continue
    asked: str | None = None  # the question put to the user, when one was
    answer: str | None = None
    restored: bool = False  # replayed from the journal on resume
    shadow: bool = False  # quality.stage=shadow: recorded, never acted on (the plan is not changed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ExitLimits:
    """What the controller reads of a consultation's settings: ``exit.*``, whether cross-examination may repeat at
    all (``rounds=null``), the round cap (rounds in all, the verdict included), and the shadow stage."""

    settings: ExitSettings
    may_repeat: bool
    cap: int
    shadow: bool

    @classmethod
    def of(cls, settings: Settings, default_cap: int, rounds_not_played: int = 0) -> ExitLimits:
        """``default_cap``: the strategy's cap when ``exit.round_cap`` is null (answer mode: 4, one
        cross-examination round); ``rounds_not_played``: rounds the aggregate decides in place of the judge
        (:mod:`conclave.engine.settle`), which still count."""
        cap = settings.exit.round_cap if settings.exit.round_cap is not None else default_cap
        shadow = getattr(settings.quality, "stage", "on") == "shadow"
        return cls(settings.exit, settings.may_repeat, cap - rounds_not_played, shadow)


@dataclass
class ExitController:
    """The runner controller (see the module doc). ``recorded``: the ``exit:evaluated`` payloads of an earlier
    run (resume), replayed for restored rounds instead of asking again."""

    interaction: Interaction
    recorded: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)
    reason: str | None = None  # the last decision's reason, or early-termination
    history: dict[int, dict[str, Standing]] = field(default_factory=dict)
    deltas: list[float | None] = field(default_factory=list)
    new_facts: list[int] = field(default_factory=list)

    @classmethod
    def from_resume(cls, interaction: Interaction, resume_from: Mapping[str, Any]) -> ExitController:
        recorded = {int(d["round_number"]): d for d in resume_from.get("exit") or [] if "round_number" in d}
        return cls(interaction, recorded)

    def after_round(self, steps: list[Step], restored: set[int], *, record: Record, plan: Plan,
                    present: Sequence[str], claims: Mapping[str, StateClaim], limits: ExitLimits,
                    emit: Callable[..., Any]) -> None:
        """After each round: ``present`` are the agents taking part, ``claims`` the debate state's claims, ``emit``
        journals the decision; a repeat is inserted into ``plan``."""
        number = steps[0].number
        early = record.early_termination or {}
        if early.get("accepted") and self.reason is None:
            self.reason = "early-termination"
        first = plan.types[0].name
        if any(s.type.name == first for s in steps):
            self.history[number] = {a: standing_of(x) for a, x in record.by_agent(first).items()}
            return
        if not any(s.type.name == REPLIES for s in steps):
            return
        output = record.output(REPLIES)
        if output is None or output.number != number:
            return
        new_facts = sum(1 for c in claims.values() if c.introduced_round == number and c.label == "FACT")
        to_come = [g for g in plan.rounds() if g[0].number > number]
        decision = self._after_cross_exam(number, output.by_agent, number in restored, present, new_facts,
                                          to_come, limits)
        emit(EXIT_EVALUATED, **decision.as_dict())
        if decision.action == "repeat" and not decision.shadow \
                and not (to_come and to_come[0][0].type.name == REPLIES):
            plan.insert_next([s.type for s in steps], _why(decision))

    def _after_cross_exam(self, number: int, replies: Mapping[str, Mapping[str, Any]], restored: bool,
                          present: Sequence[str], new_facts: int, to_come: list[list[Step]],
                          limits: ExitLimits) -> Decision:
        settings = limits.settings
        now = {a: standing_of(x) for a, x in replies.items()}
        before = self.history[max(self.history)] if self.history else {}
        self.history[number] = now
        latest: dict[str, float | None] = {}  # each agent's latest known confidence
        for n in sorted(self.history):
            latest.update({a: s.confidence for a, s in self.history[n].items() if s.confidence is not None})
        found = consensus(now, present, latest, settings)
        self.deltas.append(change(before, now))
        self.new_facts.append(new_facts)
        flat = plateau(self.deltas, self.new_facts, settings)
        reason = "consensus" if found["met"] else "convergence" if flat else None
        voted = any(s.vote for s in now.values())  # a strategy whose replies carry no vote never repeats
        can_repeat = limits.may_repeat and voted and number + 1 + len(to_come) <= limits.cap
        decision = Decision(number, {a: s.vote for a, s in now.items()}, {a: s.confidence for a, s in now.items()},
                            found, self.deltas[-1], self.new_facts[-1], flat, reason, "stop", can_repeat)
        recorded = self.recorded.get(number) if restored else None
        if limits.shadow:  # what it would do with repeats allowed and nobody to ask; the plan stays
            decision.shadow = True
            decision.can_repeat = voted and number + 1 + len(to_come) <= limits.cap
            self._decide(decision, settings, ask=False)
        elif recorded is not None:  # decided by an earlier run: the same again, nobody asked twice
            decision.reason, decision.action = recorded.get("reason"), str(recorded.get("action", "stop"))
            decision.overridden, decision.restored = bool(recorded.get("overridden")), True
        else:
            self._decide(decision, settings)
        self.decisions.append(decision)
        self.reason = decision.reason if not decision.shadow or decision.action == "stop" else None
        return decision

    def _decide(self, decision: Decision, settings: ExitSettings, *, ask: bool = True) -> None:
        interactive = ask and self.interaction.interactive
        if not decision.can_repeat:
            decision.reason = decision.reason or "round-cap"
            return
        if decision.reason is not None:
            if settings.override == "continue":
                decision.overridden, decision.action, decision.reason = True, "repeat", None
                return
            if interactive and not self._ask(decision, f"{_found(decision)} after round {decision.round_number}. "
                                             "Go on to the verdict? (no: another cross-examination round) [Y/n]"):
                decision.overridden, decision.action, decision.reason = True, "repeat", None
            return
        if interactive and not self._ask(decision, f"No consensus after round {decision.round_number} "
                                         f"({_open(decision)}). Run another cross-examination round? "
                                         "(no: go on to the verdict) [Y/n]"):
            decision.reason = "user-stop"
            return
        decision.action = "repeat"

    def _ask(self, decision: Decision, question: str) -> bool:
        """Put ``question`` to the user, record question and answer on ``decision``; True for yes (the default)."""
        decision.asked = question
        decision.answer = self.interaction.ask(question)
        return _yes(decision.answer)

    # ------------------------------------------------------------------------------------------- the record

    def final_reason(self, completed: bool) -> str | None:
        """The consultation's exit reason: the last decision's; a completed plan without one (``rounds=1..2``,
        ``quick``) ran to its configured end (round-cap); None for a consultation that stopped early."""
        if self.reason is not None:
            return self.reason
        return "round-cap" if completed else None

    def summary(self, limits: ExitLimits, *, rounds_played: int, planned_rounds: int, completed: bool,
                estimated_rounds: int | None) -> dict[str, Any]:
        """The result's ``exit`` record."""
        return {
            "reason": self.final_reason(completed),
            "rounds_played": rounds_played,
            "cross_exam_rounds": len(self.decisions),
            "round_cap": limits.cap if limits.may_repeat else planned_rounds,
            "estimated_rounds": estimated_rounds,
            "override": limits.settings.override,
            "decisions": [d.as_dict() for d in self.decisions],
        }


def max_plan(plan: Sequence[RoundType], limits: ExitLimits) -> list[RoundType]:
    """The longest plan the exit controller could play: the first cross-examination round repeated until the
    plan reaches the round cap (the consent gate's estimate). Without repeats, the plan as it is."""
    types = list(plan)
    if not limits.may_repeat or limits.shadow:
        return types

    groups = Plan(types).rounds()
    at = next((i for i, g in enumerate(groups) if g[0].type.name == REPLIES), None)
    if at is None:
        return types
    repeat = [s.type for s in groups[at]]
    extra = max(0, limits.cap - len(groups))
    groups_types: list[list[RoundType]] = [[s.type for s in g] for g in groups]
    for _ in range(extra):
        groups_types.insert(at + 1, list(repeat))
    return [t for g in groups_types for t in g]



def _yes(answer: str | None) -> bool:
    return (answer or "").strip().lower()[:1] in ("", "y")


def _found(decision: Decision) -> str:
    if decision.reason == "consensus":
        return f"Consensus reached ({decision.consensus['share']:.0%} ACCEPT or MINOR, no BLOCKER)"
    return "The debate has converged (no real change for several rounds, no new FACT claim)"


def _open(decision: Decision) -> str:
    found = decision.consensus
    parts = []
    if found["blockers"]:
        parts.append(f"{len(found['blockers'])} BLOCKER vote(s)")
    parts.append(f"{found['share']:.0%} ACCEPT or MINOR")
    if found["low_confidence"]:
        parts.append(f"{len(found['low_confidence'])} agent(s) below the confidence floor")
    return ", ".join(parts)


def _why(decision: Decision) -> str:
    if decision.overridden:
        return "cross-examination repeats: exit criteria met, continued by override"
    return f"cross-examination repeats: {_open(decision)}"

