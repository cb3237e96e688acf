"""Daily rollups: per UTC day (of a consultation's start), sums over consultations by mode and status and over
calls by provider. Every batch recomputes the days it touched, so ``conclave stats`` adds up a few hundred rows
instead of every consultation and call, and the rows do not depend on how records were batched.

Each figure is defined once, as an aggregate over the raw rows; the rollup stores it per day and a period is
whole days of the rollup plus, for a rolling window that starts mid-day, the raw rows of that first day.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

CONFIDENCE_BUCKETS = (("<0.50", 0.0, 0.5), ("0.50-0.70", 0.5, 0.7), ("0.70-0.85", 0.7, 0.85), (">=0.85", 0.85, 1.01))

#: figure -> aggregate over ``consultations`` rows (grouped by mode and status)
CONSULTATION_FIGURES: dict[str, str] = {
    "consultations": "count(*)",
    "cost": "total(total_cost)",
    "costed": "count(total_cost)",
    "timed": "count(duration_s)",
    "input_tokens": "coalesce(sum(input_tokens), 0)",
    "output_tokens": "coalesce(sum(output_tokens), 0)",
    "confidence_sum": "total(confidence)",
    "confidence_known": "count(confidence)",
    **{f"confidence_{i}": f"coalesce(sum(confidence >= {lo} and confidence < {hi}), 0)"
       for i, (_name, lo, hi) in enumerate(CONFIDENCE_BUCKETS)},
    "et_offered": "coalesce(sum(early_termination_offered), 0)",
    "et_accepted": "coalesce(sum(early_terminated), 0)",
    "cost_saved": "total(case when early_terminated then cost_saved end)",
    "filter_before": "coalesce(sum(filter_tokens_before), 0)",
    "filter_saved": "coalesce(sum(filter_tokens_saved), 0)",
    "substitutions": "coalesce(sum(substitutions), 0)",
    "agent_seats": "coalesce(sum(agent_count), 0)",
    "substituted_consultations": "coalesce(sum(substitutions > 0), 0)",
}
#: figure -> aggregate over ``calls`` rows ``k`` (grouped by provider)
PROVIDER_FIGURES: dict[str, str] = {
    "calls": "count(*)",
    "failed_calls": "coalesce(sum(k.outcome not in ('ok', 'cancelled')), 0)",
    "input_tokens": "coalesce(sum(k.input_tokens), 0)",
    "output_tokens": "coalesce(sum(k.output_tokens), 0)",
    "cached_input_tokens": "coalesce(sum(k.cached_input_tokens), 0)",
    "cache_write_tokens": "coalesce(sum(k.cache_write_tokens), 0)",
    "cost": "total(k.cost)",
    "latency_s": "total(k.latency_s)",
}
#: figure -> aggregate over ``calls`` rows ``k`` (grouped by provider and model): the cost_by_provider view
MODEL_FIGURES: dict[str, str] = {
    "calls": "count(*)",
    "ok_calls": "coalesce(sum(k.outcome = 'ok'), 0)",
    "failed_calls": "coalesce(sum(k.outcome not in ('ok', 'cancelled')), 0)",
    "hedged_calls": "coalesce(sum(k.hedge), 0)",
    "input_tokens": "coalesce(sum(k.input_tokens), 0)",
    "output_tokens": "coalesce(sum(k.output_tokens), 0)",
    "cost": "total(k.cost)",
    "latency_s": "total(k.latency_s)",
    "timed_calls": "count(k.latency_s)",
}
#: figure -> aggregate over answered ``verification`` rows ``v`` (grouped by question and answerer)
VERIFICATION_FIGURES: dict[str, str] = {
    "answered": "count(*)",
    "passed": "coalesce(sum(v.passed), 0)",
}
#: figure -> aggregate over ``filters_applied`` rows ``f`` (grouped by filter, round, artifact type and limits): the
#: savings_by_filter_limits and filter_savings canned queries. ``sum``, not ``coalesce``: a sum of the daily sums is
#: then what ``sum`` over the raw rows gives, null included.
FILTER_FIGURES: dict[str, str] = {
    "applications": "count(*)",
    "tokens_before": "sum(f.tokens_before)",
    "tokens_saved": "sum(f.tokens_saved)",
}
FILTER_KEYS = ("filter", "round_number", "artifact_type", "limits")
#: figure -> aggregate over the ``dissent_log`` view's rows ``d`` (each consultation's latest verdict's dissent,
#: grouped by agent): the dissent_by_agent canned query. A consultation starts on one day, so a period's distinct
#: consultations are the sum of its days'; ``sum``, not ``coalesce``, as for the filter figures.
DISSENT_FIGURES: dict[str, str] = {
    "dissents": "count(*)",
    "high": "sum(d.severity = 'high')",
    "medium": "sum(d.severity = 'medium')",
    "low": "sum(d.severity = 'low')",
    "consultations": "count(distinct d.consultation_id)",
}
FLOAT_FIGURES = {"cost", "confidence_sum", "cost_saved", "latency_s"}

_CONSULTATION_RAW = "select mode, status, {figures} from consultations{where} group by mode, status"
_PROVIDER_RAW = ("select k.provider, {figures} from consultations c join calls k on k.consultation_id = c.id"
                 "{where} group by k.provider")
_VERIFICATION_RAW = ("select v.question_id, {figures} from consultations c join verification v "
                     "on v.consultation_id = c.id{where} and v.passed is not null group by v.question_id")


def _figures(figures: dict[str, str]) -> str:
    return ", ".join(f"{expr} as {name}" for name, expr in figures.items())


def _sums(figures: dict[str, str]) -> str:
    return ", ".join(f"{'total' if name in FLOAT_FIGURES else 'sum'}({name}) as {name}" for name in figures)


_DAY = " where {column} >= :day and {column} < date(:day, '+1 day')"
_TOUCHED_DAYS = """
select distinct substr(started_at, 1, 10) from consultations
where id in (select value from json_each(?)) and started_at is not null
"""


def _daily(table: str, keys: tuple[str, ...], rows: str, figures: dict[str, str], also: str = "") -> tuple[str, str]:
    """The statements that recompute one ``:day`` of ``table``: ``figures`` over ``rows`` (a FROM clause whose
    consultations are ``c``, the day's ones: their started_at range comes first) grouped by ``keys`` (each a
    ``alias.column``, stored under the column's name); ``also``: more conditions on the rows."""
    columns = ", ".join(key.split(".")[1] for key in keys)
    grouped = ", ".join(keys)
    return (f"delete from {table} where day = :day",
            f"insert into {table} (day, {columns}, {', '.join(figures)}) select :day, {grouped}, {_figures(figures)} "
            f"from {rows}{_DAY.format(column='c.started_at')}{also} group by {grouped}")


#: rollup table -> the statements that recompute one ``:day`` of it
REFRESH: dict[str, tuple[str, str]] = {
    "consultation_daily": _daily("consultation_daily", ("c.mode", "c.status"), "consultations c",
                                 CONSULTATION_FIGURES),
    "provider_daily": _daily("provider_daily", ("k.provider",),
                             "consultations c join calls k on k.consultation_id = c.id", PROVIDER_FIGURES),
    "model_daily": _daily("model_daily", ("k.provider", "k.model"),
                          "consultations c join calls k on k.consultation_id = c.id", MODEL_FIGURES),
    "verification_daily": _daily("verification_daily", ("v.question_id", "v.answered_by"),
                                 "consultations c join verification v on v.consultation_id = c.id",
                                 VERIFICATION_FIGURES, also=" and v.passed is not null"),
    "filter_daily": _daily("filter_daily", tuple(f"f.{key}" for key in FILTER_KEYS),
                           "consultations c join filters_applied f on f.consultation_id = c.id", FILTER_FIGURES),
    # the dissent_log view's rows of the day's consultations, found from the day's consultations (the view itself
    # would walk every verdict of history for each day: CROSS JOIN keeps the consultations outermost)
    "dissent_daily": (
        "delete from dissent_daily where day = :day",
        "insert into dissent_daily (day, agent, {names}) select :day, d.agent, {figures} from ("
        "select a.consultation_id, json_extract(x.value, '$.agent') as agent, "
        "json_extract(x.value, '$.severity') as severity "
        "from consultations c cross join artifacts a indexed by artifacts_verdicts on a.consultation_id = c.id "
        "join json_each(a.artifact, '$.dissent') x{where} and a.artifact_type = 'verdict' "
        "and a.seq = (select max(seq) from artifacts v indexed by artifacts_verdicts "
        "where v.consultation_id = a.consultation_id and v.artifact_type = 'verdict')"
        ") d group by d.agent".format(names=", ".join(DISSENT_FIGURES), figures=_figures(DISSENT_FIGURES),
                                      where=_DAY.format(column="c.started_at")),
    ),
}


def _refresh(conn: Any, days: list[dict[str, str]], tables: tuple[str, ...] | None = None) -> None:
    """Recompute ``days`` of every rollup the index has, or of ``tables`` only (a migration before m028 refreshes
    an index that does not have the later ones yet)."""
    present = {name for (name,) in conn.execute(
        "select name from sqlite_master where type = 'table' and name in (select value from json_each(?))",
        [json.dumps(list(REFRESH if tables is None else tables))])}
    for table, statements in REFRESH.items():
        if table in present:
            for sql in statements:
                conn.executemany(sql, days)


def refresh_days(conn: Any, consultation_ids: list[str]) -> None:
    """Recompute the rollups for every day on which one of ``consultation_ids`` started."""
    days = [{"day": day} for (day,) in conn.execute(_TOUCHED_DAYS, [json.dumps(consultation_ids)])]
    _refresh(conn, days)


def refresh_all_days(conn: Any, tables: tuple[str, ...] | None = None) -> None:
    """Recompute the rollups (or ``tables`` of them) for every day any consultation started (after a figure or a
    rollup is added)."""
    days = [{"day": day} for (day,) in conn.execute(
        "select distinct substr(started_at, 1, 10) from consultations where started_at is not null")]
    _refresh(conn, days, tables)


#: a rollup's rows: its column names and the rows, in key order
Rows = tuple[list[str], list[tuple[Any, ...]]]


def sum_all_days(path: Path) -> dict[str, Rows]:
    """Every rollup of the index file ``path``, summed for every day from its rows without writing to it: the
    file is attached, read-only, to an in-memory database holding empty rollup tables of the same names, so
    :func:`refresh_all_days`' statements read the rows from the file and write the sums into memory. ``index
    rebuild`` sums them this way on a thread of its own while the loaded rows are copied (:func:`write_sums`)."""
    conn = sqlite3.connect("file::memory:", uri=True)
    try:
        conn.execute("ATTACH ? AS loaded", [path.resolve().as_uri() + "?mode=ro"])
        made = conn.execute("select name, sql from loaded.sqlite_master where type = 'table' "
                            "and name in (select value from json_each(?))", [json.dumps(list(REFRESH))]).fetchall()
        for _name, sql in made:
            conn.execute(sql)  # in main, which unqualified names find before the attached file
        refresh_all_days(conn)
        sums = {}
        for name, _sql in made:
            cursor = conn.execute(f'select * from main."{name}" order by day')
            sums[name] = ([c[0] for c in cursor.description], cursor.fetchall())
        return sums
    finally:
        conn.close()


def write_sums(conn: Any, sums: dict[str, Rows]) -> None:
    """Write rollups summed by :func:`sum_all_days` into the (empty) rollup tables of ``conn``'s index."""
    for name, (columns, rows) in sums.items():
        names = ", ".join(f'"{c}"' for c in columns)
        conn.executemany(f'insert into "{name}" ({names}) values ({", ".join("?" * len(columns))})', rows)


@dataclass(frozen=True)
class Span:
    """A period as the rollups see it: an optional partial first day, then whole days."""

    raw_since: str | None  # ISO start of the partial first day's raw rows (None: the period starts at midnight)
    raw_until: str | None
    first_day: str | None  # whole days from (inclusive) ...
    end_day: str | None  # ... to (exclusive)

    @classmethod
    def of(cls, since: str | None, until: str | None) -> Span:
        if since is None:
            return cls(None, None, None, until[:10] if until else None)
        day = since[:10]
        if since[11:23] == "00:00:00.000":
            return cls(None, None, day, until[:10] if until else None)
        next_day = (date.fromisoformat(day) + timedelta(days=1)).isoformat()
        return cls(since, next_day, next_day, until[:10] if until else None)


def _day_where(span: Span) -> tuple[str, list[str]]:
    clauses, params = [], []
    if span.first_day is not None:
        clauses.append("day >= ?")
        params.append(span.first_day)
    if span.end_day is not None:
        clauses.append("day < ?")
        params.append(span.end_day)
    return (" where " + " and ".join(clauses)) if clauses else "", params


def consultation_totals(conn: Any, span: Span) -> list[dict[str, Any]]:
    """Figures per (mode, status) over the span."""
    return _totals(conn, span, "mode, status", "consultation_daily", CONSULTATION_FIGURES, _CONSULTATION_RAW,
                   "started_at")


def provider_totals(conn: Any, span: Span) -> list[dict[str, Any]]:
    """Figures per provider over the span."""
    return _totals(conn, span, "provider", "provider_daily", PROVIDER_FIGURES, _PROVIDER_RAW, "c.started_at")


def verification_totals(conn: Any, span: Span) -> list[dict[str, Any]]:
    """Answered and passed verification questions per question over the span (all answerers together)."""
    return _totals(conn, span, "question_id", "verification_daily", VERIFICATION_FIGURES, _VERIFICATION_RAW,
                   "c.started_at")


def _totals(conn: Any, span: Span, keys: str, daily: str, figures: dict[str, str], raw: str,
            started_at: str) -> list[dict[str, Any]]:
    """``figures`` per ``keys`` over the span: the whole days of the ``daily`` rollup, plus, for a rolling window
    that starts mid-day, the ``raw`` rows (whose start is ``started_at``) of that first day."""
    where, params = _day_where(span)
    sql = f"select {keys}, {_sums(figures)} from {daily}{where} group by {keys}"
    if span.raw_since is not None:
        first_day = raw.format(figures=_figures(figures), where=f" where {started_at} >= ? and {started_at} < ?")
        sql = f"select {keys}, {_sums(figures)} from ({sql} union all {first_day}) group by {keys}"
        params = [*params, span.raw_since, span.raw_until or ""]
    cursor = conn.execute(sql, params)
    columns = [c[0] for c in cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
