"""The consultation state machine: the allowed transitions, and a record of every transition taken.

The states of the rounds come from the plan (:class:`conclave.engine.rounds.Plan`): the consultation moves
IDLE → ESTIMATING → AWAITING_CONSENT → the state of each round in plan order → COMPLETE. Any round may be the
last (``rounds=N``, early termination), ABORTED is reachable from every non-terminal state, and when a
controller changes the plan the machine follows it (:meth:`StateMachine.follow`).

Each transition is recorded (from, to, reason, at) and handed to a listener (the runner emits it as a
``state:transition`` event). A transition the table does not allow raises :class:`InvalidTransitionError`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from conclave.errors import ConclaveError


class ConsultState(enum.StrEnum):
    IDLE = "IDLE"
    ESTIMATING = "ESTIMATING"
    AWAITING_CONSENT = "AWAITING_CONSENT"
    INDEPENDENT = "INDEPENDENT"
    SYNTHESIS = "SYNTHESIS"
    CROSS_EXAM = "CROSS_EXAM"
    VERDICT = "VERDICT"
    COMPLETE = "COMPLETE"
    ABORTED = "ABORTED"


S = ConsultState

#: the round states of the standard debate, in order
STANDARD_ROUND_STATES = (S.INDEPENDENT, S.SYNTHESIS, S.CROSS_EXAM, S.VERDICT)


def allowed_transitions(round_states: Sequence[str]) -> dict[str, frozenset[str]]:
    """state -> states it may move to, for a debate whose rounds run in ``round_states`` order."""
    table: dict[str, set[str]] = {
        S.IDLE: {S.ESTIMATING},
        S.ESTIMATING: {S.AWAITING_CONSENT},
        S.AWAITING_CONSENT: set(round_states[:1]),
        S.COMPLETE: set(),
        S.ABORTED: set(),
    }
    for here, after in zip(round_states, [*round_states[1:], None], strict=True):
        table.setdefault(here, set()).add(S.COMPLETE)
        if after is not None:
            table[here].add(after)
    return {
        state: frozenset(targets | ({S.ABORTED} if state not in (S.COMPLETE, S.ABORTED) else set()))
        for state, targets in table.items()
    }


class InvalidTransitionError(ConclaveError, RuntimeError):
    """A transition the table does not allow; always a bug in the runner, never a user error."""


@dataclass(frozen=True)
class Transition:
    from_state: str
    to_state: str
    reason: str
    at: str  # ISO-8601 UTC

    def as_dict(self) -> dict[str, Any]:
        return {"from": str(self.from_state), "to": str(self.to_state), "reason": self.reason, "at": self.at}


class StateMachine:
    """Current state plus the ordered list of transitions; ``on_transition`` sees each one as it happens."""

    def __init__(
        self,
        on_transition: Callable[[Transition], None] | None = None,
        round_states: Sequence[str] = STANDARD_ROUND_STATES,
    ) -> None:
        self.state: str = S.IDLE
        self.transitions: list[Transition] = []
        self._on_transition = on_transition
        self._allowed = allowed_transitions(round_states)

    def follow(self, round_states: Sequence[str]) -> None:
        """Allow the round states of a changed plan from here on (the rounds already played are kept)."""
        played = [t.to_state for t in self.transitions if t.to_state not in (S.ESTIMATING, S.AWAITING_CONSENT)]
        merged = allowed_transitions([*played, *round_states])
        for state, targets in merged.items():
            self._allowed[state] = self._allowed.get(state, frozenset()) | targets

    @property
    def is_terminal(self) -> bool:
        return not self._allowed.get(self.state)

    def can(self, to: str) -> bool:
        return to in self._allowed.get(self.state, frozenset())

    def transition(self, to: str, reason: str) -> Transition:
        to = _state(to)
        if not self.can(to):
            allowed = ", ".join(sorted(self._allowed.get(self.state, frozenset()))) or "none (terminal)"
            raise InvalidTransitionError(f"cannot go from {self.state} to {to}; allowed: {allowed}")
        record = Transition(self.state, to, reason, _now())
        self.state = to
        self.transitions.append(record)
        if self._on_transition is not None:
            self._on_transition(record)
        return record

    def abort(self, reason: str) -> None:
        """Move to ABORTED unless already terminal (an abort after completion changes nothing)."""
        if not self.is_terminal:
            self.transition(S.ABORTED, reason)

    def visited(self) -> list[str]:
        return [S.IDLE, *(t.to_state for t in self.transitions)]


def _state(name: str) -> str:
    """The enum member for a built-in state (so ``machine.state is S.COMPLETE`` holds), else the name."""
    try:
        return ConsultState(name)
    except ValueError:
        return name


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
