"""The SQL that restricts a stats query to a period of consultations."""

from __future__ import annotations


def period_where(since: str | None, until: str | None, column: str = "c.started_at") -> tuple[str, list[str]]:
    """``where …`` (or "") restricting ``column`` to [since, until), and its parameters."""
    clauses, params = _bounds(column, since, until)
    return (f"where {' and '.join(clauses)}" if clauses else ""), params


def period_rows(table: str, alias: str, since: str | None, until: str | None,
                *conditions: str) -> tuple[str, list[str]]:
    """``from … where …`` selecting the rows of ``table`` (as ``alias``; the consultation is ``c``) whose
    consultation started in [since, until) and that meet ``conditions``, and its parameters.

    For a period the rows are reached from the period's consultations, found by their start, then each one's rows
    by its consultation_id: a CROSS JOIN keeps that order, since with a one-sided bound (``--week``) SQLite's
    estimate prefers walking the whole table in another index's order and looking up every row's consultation.
    All time reads the table alone (every indexed row has its consultation)."""
    clauses, params = _bounds("c.started_at", since, until)
    if clauses:
        source = f"consultations c cross join {table} {alias} on {alias}.consultation_id = c.id"
    else:
        source = f"{table} {alias}"
    clauses += conditions
    return f"from {source}" + (f" where {' and '.join(clauses)}" if clauses else ""), params


def _bounds(column: str, since: str | None, until: str | None) -> tuple[list[str], list[str]]:
    clauses, params = [], []
    for op, bound in ((">=", since), ("<", until)):
        if bound is not None:
            clauses.append(f"{column} {op} ?")
            params.append(bound)
    return clauses, params
