"""The SQL that restricts a stats query to a period of consultations."""

from __future__ import annotations


def period_where(since: str | None, until: str | None, column: str = "c.started_at") -> tuple[str, list[str]]:
    """``where …`` (or "") restricting ``column`` to [since, until), and its parameters."""
    clauses, params = [], []
    for op, bound in ((">=", since), ("<", until)):
        if bound is not None:
            clauses.append(f"{column} {op} ?")
            params.append(bound)
    return (f"where {' and '.join(clauses)}" if clauses else ""), params
