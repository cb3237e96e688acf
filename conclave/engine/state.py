"""The consultation state machine: the allowed transitions, and a record of every transition taken.

Each transition is recorded (from, to, reason, at) and handed to a listener (the runner emits it as a
``state:transition`` event). A transition the table does not allow raises :class:`InvalidTransitionError`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


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

#: state -> states it may move to. COMPLETE after INDEPENDENT/SYNTHESIS/CROSS_EXAM serves ``rounds=1..3`` and
#: early termination; ABORTED is reachable from every non-terminal state.
ALLOWED: dict[ConsultState, frozenset[ConsultState]] = {
    S.IDLE: frozenset({S.ESTIMATING, S.ABORTED}),
    S.ESTIMATING: frozenset({S.AWAITING_CONSENT, S.ABORTED}),
    S.AWAITING_CONSENT: frozenset({S.INDEPENDENT, S.ABORTED}),
    S.INDEPENDENT: frozenset({S.SYNTHESIS, S.COMPLETE, S.ABORTED}),
    S.SYNTHESIS: frozenset({S.CROSS_EXAM, S.COMPLETE, S.ABORTED}),
    S.CROSS_EXAM: frozenset({S.VERDICT, S.COMPLETE, S.ABORTED}),
    S.VERDICT: frozenset({S.COMPLETE, S.ABORTED}),
    S.COMPLETE: frozenset(),
    S.ABORTED: frozenset(),
}

#: the state in which each round runs
ROUND_STATES = {1: S.INDEPENDENT, 2: S.SYNTHESIS, 3: S.CROSS_EXAM, 4: S.VERDICT}


class InvalidTransitionError(RuntimeError):
    """A transition the table does not allow; always a bug in the runner, never a user error."""


@dataclass(frozen=True)
class Transition:
    from_state: ConsultState
    to_state: ConsultState
    reason: str
    at: str  # ISO-8601 UTC

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.from_state.value, "to": self.to_state.value, "reason": self.reason, "at": self.at}


class StateMachine:
    """Current state plus the ordered list of transitions; ``on_transition`` sees each one as it happens."""

    def __init__(self, on_transition: Callable[[Transition], None] | None = None) -> None:
        self.state = S.IDLE
        self.transitions: list[Transition] = []
        self._on_transition = on_transition

    @property
    def is_terminal(self) -> bool:
        return not ALLOWED[self.state]

    def can(self, to: ConsultState) -> bool:
        return to in ALLOWED[self.state]

    def transition(self, to: ConsultState, reason: str) -> Transition:
        if to not in ALLOWED[self.state]:
            allowed = ", ".join(sorted(s.value for s in ALLOWED[self.state])) or "none (terminal)"
            raise InvalidTransitionError(f"cannot go from {self.state.value} to {to.value}; allowed: {allowed}")
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

    def visited(self) -> list[ConsultState]:
        return [S.IDLE, *(t.to_state for t in self.transitions)]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
