"""The consultation state machine: allowed paths, invalid transitions, and the transition record."""

from __future__ import annotations

from typing import Any

import pytest

from conclave.engine.state import ConsultState, InvalidTransitionError, StateMachine

S = ConsultState


def test_full_path_is_allowed_and_recorded_in_order() -> None:
    seen: list[Any] = []
    machine = StateMachine(seen.append)
    path = [S.ESTIMATING, S.AWAITING_CONSENT, S.INDEPENDENT, S.SYNTHESIS, S.CROSS_EXAM, S.VERDICT, S.COMPLETE]
    for state in path:
        machine.transition(state, f"to {state.value}")
    assert machine.visited() == [S.IDLE, *path]
    assert [t.to_state for t in seen] == path
    first = machine.transitions[0].as_dict()
    assert first["from"] == "IDLE" and first["to"] == "ESTIMATING" and first["reason"] == "to ESTIMATING"
    assert first["at"].endswith("Z")
    assert machine.is_terminal


@pytest.mark.parametrize("last", [S.INDEPENDENT, S.SYNTHESIS, S.CROSS_EXAM])
def test_shorter_runs_may_complete_after_their_last_round(last: ConsultState) -> None:
    machine = StateMachine()
    order = [S.ESTIMATING, S.AWAITING_CONSENT, S.INDEPENDENT, S.SYNTHESIS, S.CROSS_EXAM]
    for state in order[: order.index(last) + 1]:
        machine.transition(state, "")
    machine.transition(S.COMPLETE, "fewer rounds")
    assert machine.state is S.COMPLETE


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        ([], S.INDEPENDENT),  # consent cannot be skipped
        ([S.ESTIMATING, S.AWAITING_CONSENT], S.SYNTHESIS),  # round 1 cannot be skipped
        ([S.ESTIMATING, S.AWAITING_CONSENT, S.INDEPENDENT, S.SYNTHESIS], S.VERDICT),  # nor round 3
        ([S.ESTIMATING, S.AWAITING_CONSENT], S.COMPLETE),
    ],
)
def test_invalid_transitions_raise_and_change_nothing(path: list[ConsultState], bad: ConsultState) -> None:
    machine = StateMachine()
    for state in path:
        machine.transition(state, "")
    before = (machine.state, len(machine.transitions))
    with pytest.raises(InvalidTransitionError, match=f"to {bad.value}"):
        machine.transition(bad, "")
    assert (machine.state, len(machine.transitions)) == before


def test_every_non_terminal_state_can_abort_and_terminal_states_cannot_move() -> None:
    for stop_at in [S.IDLE, S.ESTIMATING, S.AWAITING_CONSENT, S.INDEPENDENT, S.SYNTHESIS, S.CROSS_EXAM, S.VERDICT]:
        machine = StateMachine()
        for state in [S.ESTIMATING, S.AWAITING_CONSENT, S.INDEPENDENT, S.SYNTHESIS, S.CROSS_EXAM, S.VERDICT]:
            if machine.state is stop_at:
                break
            machine.transition(state, "")
        machine.abort("stop")
        assert machine.state is S.ABORTED
        with pytest.raises(InvalidTransitionError):
            machine.transition(S.COMPLETE, "")
    done = StateMachine()
    for state in [S.ESTIMATING, S.AWAITING_CONSENT, S.INDEPENDENT, S.COMPLETE]:
        done.transition(state, "")
    done.abort("late")  # aborting a finished consultation changes nothing
    assert done.state is S.COMPLETE and len(done.transitions) == 4
