"""The consultation engine: state machine, rounds, early termination, cost gate."""
