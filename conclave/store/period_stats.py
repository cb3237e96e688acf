"""``conclave stats``: usage, cost, quality and savings figures over a period, computed from the index.

Sums come from the daily rollups (:mod:`conclave.store.rollups`), medians from walking a sorted index to its
middle: the cost stays in milliseconds at 100k consultations and does not grow with the number of calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from conclave.errors import UsageError
from conclave.store.indexer import iso
from conclave.store.period_sql import period_rows, period_where
from conclave.store.rollups import (
    CONFIDENCE_BUCKETS,
    CONSULTATION_FIGURES,
    Span,
    consultation_totals,
    provider_totals,
    verification_totals,
)
from conclave.store.safety_stats import render_line as safety_line
from conclave.store.safety_stats import safety_figures


@dataclass(frozen=True)
class Period:
    label: str
    since: str | None = None  # ISO, inclusive
    until: str | None = None  # ISO, exclusive

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "since": self.since, "until": self.until}


def period_from_args(*, week: bool = False, month: str | None = None, all_time: bool = False,
                     now: datetime | None = None) -> Period:
    """``--week`` = last 7 days, ``--month`` = last 30 days, ``--month YYYY-MM`` = that month; default all time."""
    now = now or datetime.now(UTC)
    if week:
        return Period("last 7 days", iso((now - timedelta(days=7)).timestamp()))
    if month == "":
        return Period("last 30 days", iso((now - timedelta(days=30)).timestamp()))
    if month is not None:
        match = re.fullmatch(r"(\d{4})-(\d{2})", month)
        # a datetime's years are 1 to 9999, and the end of the period is the month after
        if not match or not 1 <= int(match.group(2)) <= 12 or not 1 <= int(match.group(1)) <= 9998:
            raise UsageError(f"--month: expected YYYY-MM (years 0001 to 9998), got {month!r}")
        year, mon = int(match.group(1)), int(match.group(2))
        start = datetime(year, mon, 1, tzinfo=UTC)
        end = datetime(year + mon // 12, mon % 12 + 1, 1, tzinfo=UTC)
        return Period(month, iso(start.timestamp()), iso(end.timestamp()))
    del all_time  # the default; accepted so the flag reads naturally on the command line
    return Period("all time")


def compute_stats(db: Any, period: Period) -> dict[str, Any]:
    """All figures for ``period`` as a JSON-ready dict (``conclave stats --json`` prints it as is); ``db`` is a
    sqlite3 connection (index_reader.open_current) or a sqlite-utils Database."""
    conn = getattr(db, "conn", db)
    span = Span.of(period.since, period.until)
    groups = consultation_totals(conn, span)
    modes: dict[str, dict[str, Any]] = {}
    by_status: dict[str, int] = {}
    for group in groups:
        into = modes.setdefault(group["mode"], dict.fromkeys(CONSULTATION_FIGURES, 0))
        for key in CONSULTATION_FIGURES:
            into[key] += group[key]
        status = group["status"] or "unknown"
        by_status[status] = by_status.get(status, 0) + group["consultations"]

    def total(key: str) -> Any:
        return sum(group[key] for group in groups)

    count, cost, timed = total("consultations"), total("cost"), total("timed")
    quantile = _Quantiles(conn, period)
    input_tokens, output_tokens = total("input_tokens"), total("output_tokens")
    filter_saved = total("filter_saved")
    providers = sorted(provider_totals(conn, span), key=lambda p: (-p["cost"], str(p["provider"])))
    return {
        "period": period.as_dict(),
        "consultations": count,
        "by_status": dict(sorted(by_status.items())),
        "cost": {"total": round(cost, 6), "median": quantile("total_cost", 0.5, total("costed")),
                 "mean": _ratio(cost, count, 6)},
        "tokens": {"input": input_tokens, "output": output_tokens, "total": input_tokens + output_tokens,
                   # input read from / written to providers' prompt caches (part of "input")
                   "cached_input": sum(p["cached_input_tokens"] for p in providers),
                   "cache_write": sum(p["cache_write_tokens"] for p in providers)},
        "duration_s": {"median": quantile("duration_s", 0.5, timed),
                       "p95": quantile("duration_s", 0.95, timed)},
        "confidence": {
            "mean": _ratio(total("confidence_sum"), total("confidence_known"), 3),
            "distribution": {name: total(f"confidence_{i}") for i, (name, _lo, _hi) in enumerate(CONFIDENCE_BUCKETS)}
            | {"unknown": count - total("confidence_known")},
        },
        "early_termination": {
            "offered": total("et_offered"), "accepted": total("et_accepted"),
            "rate": _ratio(total("et_accepted"), count), "cost_saved": round(total("cost_saved"), 6),
        },
        "filtering": {
            "tokens_before": total("filter_before"), "tokens_saved": filter_saved,
            # As token_efficiency_stats defines it: saved / (used + saved), over the calls after the synthesis.
            "efficiency_pct": _pct(filter_saved, total("filter_before")),
        },
        "substitutions": {
            "count": total("substitutions"), "rate": _ratio(total("substitutions"), total("agent_seats")),
            "consultations": total("substituted_consultations"),
        },
        "providers": [
            {"provider": p["provider"], "calls": p["calls"], "failed_calls": p["failed_calls"],
             "failure_rate": _ratio(p["failed_calls"], p["calls"]), "input_tokens": p["input_tokens"],
             "output_tokens": p["output_tokens"], "cached_input_tokens": p["cached_input_tokens"],
             "cache_write_tokens": p["cache_write_tokens"], "cost": round(p["cost"], 6),
             "avg_latency_s": _ratio(p["latency_s"], p["calls"], 3)}
            for p in providers
        ],
        "modes": [
            {"mode": mode, "consultations": m["consultations"], "cost": round(m["cost"], 6),
             "median_cost": quantile("total_cost", 0.5, m["costed"], mode),
             "avg_confidence": _ratio(m["confidence_sum"], m["confidence_known"], 3),
             "early_termination_rate": _ratio(m["et_accepted"], m["consultations"])}
            for mode, m in sorted(modes.items(), key=lambda item: str(item[0]))
        ],
        "quality": quality_figures(conn, period),
        "safety": safety_figures(conn, period.since, period.until),
        "exit": exit_figures(conn, period),
        "groupthink": groupthink_figures(conn, period),
    }


def exit_figures(conn: Any, period: Period) -> dict[str, Any]:
    """How the period's debates ended: consultations per exit reason, mean rounds and cross-examination rounds
    played, and the context tokens every call sent with and without summarization (``saved``: the share removed,
    over all consultations; rounds before 5 are never summarized)."""
    # One pass over the period's consultations, grouped by reason. Neither a condition nor the grouping may use
    # the exit_reason index (the unary + keeps it out): SQLite would walk it over all of history to save a sort
    # instead of reading the period by start.
    where, params = period_where(period.since, period.until, "started_at")
    groups = conn.execute(
        "select exit_reason, count(*), total(rounds_completed), count(rounds_completed), total(cross_exam_rounds), "
        "count(cross_exam_rounds), coalesce(sum(context_tokens), 0), coalesce(sum(context_tokens_unsummarized), 0) "
        f"from consultations {where} group by +exit_reason", params).fetchall()
    reasons = sorted(((reason, n) for reason, n, *_ in groups if reason is not None), key=lambda r: (-r[1], r[0]))
    rounds = _ratio(sum(g[2] for g in groups), sum(g[3] for g in groups), 2)
    repeats = _ratio(sum(g[4] for g in groups), sum(g[5] for g in groups), 2)
    sent, whole = sum(g[6] for g in groups), sum(g[7] for g in groups)
    return {
        "reasons": {reason: n for reason, n in reasons},
        "avg_rounds": rounds,
        "avg_cross_exam_rounds": repeats,
        "context_tokens": sent,
        "context_tokens_unsummarized": whole,
        "context_saved": _ratio(whole - sent, whole),
    }


def groupthink_figures(conn: Any, period: Period) -> dict[str, Any]:
    """Groupthink over the period's consultations: detector firings by type (and how many were acted on), the
    objection rounds, how many changed a claim's status, escalations, and the consultations run in shadow."""
    since, until = period.since, period.until
    where, params = period_where(since, until)
    source, fired_params = period_rows("groupthink_checks", "g", since, until, "g.fired = 1")
    fired = dict(conn.execute(f"select g.detector, count(*) {source} group by g.detector", fired_params).fetchall())
    source, acted_params = period_rows("groupthink_checks", "g", since, until, "g.fired = 1", "g.acted = 1")
    acted = conn.execute(f"select count(*) {source}", acted_params).fetchone()[0]
    source, objection_params = period_rows("objection_rounds", "o", since, until)
    rounds, changed, new, escalated = conn.execute(
        "select count(*), coalesce(sum(o.status_changes > 0), 0), coalesce(sum(o.new_claims > 0), 0), "
        f"coalesce(sum(o.escalated), 0) {source}", objection_params).fetchone()
    shadow = conn.execute(f"select count(*) from consultations c {where} {'and' if where else 'where'} "
                          "c.quality_stage = 'shadow'", params).fetchone()[0]
    return {
        "firings": {d: int(fired.get(d, 0)) for d in ("early_convergence", "stagnation")},
        "acted": acted,
        "objection_rounds": rounds,
        "objection_rounds_changed_status": changed,
        "objection_rounds_new_claims": new,
        "escalations": escalated,
        "shadow_consultations": shadow,
    }


def quality_figures(conn: Any, period: Period) -> dict[str, Any]:
    """Debate quality over the period's consultations: label adoption (share of claims labelled), citation
    compliance (share of FACT claims cited), rule violations (of them, what syntheses left unaccounted), pass rate
    per verification question, and judge statements resting on no agent claim or text."""
    since, until = period.since, period.until
    where, params = period_where(since, until)
    source, checks_params = period_rows("claim_checks", "k", since, until)
    labelled, unlabelled, facts, cited, violations = conn.execute(
        "select coalesce(sum(k.labelled), 0), coalesce(sum(k.unlabelled), 0), coalesce(sum(k.facts), 0), "
        f"coalesce(sum(k.facts_cited), 0), coalesce(sum(k.violations), 0) {source}", checks_params).fetchone()
    # from the daily rollup: all time walked 33 verification rows per consultation (1.1 s at 100k)
    passes = sorted(verification_totals(conn, Span.of(since, until)), key=lambda row: str(row["question_id"]))
    ungrounded = conn.execute(f"select coalesce(sum(c.ungrounded_statements), 0) from consultations c {where}",
                              params).fetchone()[0]
    source, coverage_params = period_rows("synthesis_coverage", "s", since, until)
    unaccounted = conn.execute(
        f"select coalesce(sum(s.claims_unaccounted + s.positions_unaccounted), 0) {source}",
        coverage_params).fetchone()[0]
    return {
        "claims": labelled,
        "label_adoption": _ratio(labelled, labelled + unlabelled),
        "citation_compliance": _ratio(cited, facts),
        "rule_violations": violations + unaccounted,  # the citation rules and the synthesis coverage rules
        "synthesis_unaccounted": unaccounted,
        "pass_rate": {row["question_id"]: _ratio(row["passed"], row["answered"]) for row in passes},
        "ungrounded_statements": ungrounded,
    }


class _Quantiles:
    """Quantiles of cost and duration. For all time, walk the index sorted on the column to the right offset;
    for a period, read its values once from the started_at index and sort them here (walking the whole sorted
    index past every other period's values would cost more)."""

    def __init__(self, conn: Any, period: Period) -> None:
        self.conn = conn
        self.values: dict[tuple[str, str | None], list[float]] | None = None
        if period.since is None and period.until is None:
            return
        clauses, params = [], []
        for op, bound in ((">=", period.since), ("<", period.until)):
            if bound is not None:
                clauses.append(f"started_at {op} ?")
                params.append(bound)
        self.values = {}
        rows = conn.execute("select mode, total_cost, duration_s from consultations indexed by "
                            f"consultations_by_start where {' and '.join(clauses)}", params)
        for mode, cost, duration in rows:
            for column, value in (("total_cost", cost), ("duration_s", duration)):
                if value is not None:
                    self.values.setdefault((column, None), []).append(value)
                    self.values.setdefault((column, mode), []).append(value)
        for values in self.values.values():
            values.sort()

    def __call__(self, column: str, q: float, known: int, mode: str | None = None) -> float | None:
        """The ``q`` quantile of ``column`` (of one mode's consultations, if given), interpolated linearly."""
        if not known:
            return None
        position = q * (known - 1)
        offset = int(position)
        if self.values is not None:
            ordered = self.values.get((column, mode), [])
            pair = ordered[offset : offset + 2]
        else:
            where, params = f"{column} is not null", []
            if mode is not None:
                where, params = f"{where} and mode = ?", [mode]
            pair = [row[0] for row in self.conn.execute(
                f"select {column} from consultations where {where} order by {column} limit 2 offset ?",
                [*params, offset])]
        if not pair:
            return None
        low, high = pair[0], pair[-1]
        return round(low + (high - low) * (position - offset), 6)


def _ratio(part: float, whole: float, digits: int = 4) -> float | None:
    return round(part / whole, digits) if whole else None


def _pct(part: float, whole: float) -> float | None:
    return round(100 * part / whole, 1) if whole else None


def render_text(stats: dict[str, Any]) -> str:
    """The human-readable report (stdout of ``conclave stats``)."""
    lines = [f"conclave stats · {stats['period']['label']}", ""]
    count = stats["consultations"]
    if not count:
        return "\n".join([*lines, "no consultations in this period"]) + "\n"
    cost, tokens, duration = stats["cost"], stats["tokens"], stats["duration_s"]
    statuses = ", ".join(f"{k} {v}" for k, v in stats["by_status"].items())
    lines += [
        f"consultations      {count:,} ({statuses})",
        f"cost               ${cost['total']:,.4f} total · ${_num(cost['median'])} median · ${_num(cost['mean'])} mean",
        f"tokens             {tokens['total']:,} ({tokens['input']:,} in · {tokens['output']:,} out)",
        f"prompt caches      {tokens['cached_input']:,} input tokens read "
        f"({_pct_text(_ratio(tokens['cached_input'], tokens['input']))} of the input) · "
        f"{tokens['cache_write']:,} written",
        f"duration           {_num(duration['median'], 1)} s median · {_num(duration['p95'], 1)} s p95",
    ]
    conf = stats["confidence"]
    dist = " · ".join(f"{k} {v}" for k, v in conf["distribution"].items())
    lines.append(f"confidence         {_num(conf['mean'], 2)} mean · {dist}")
    et = stats["early_termination"]
    lines.append(f"early termination  {et['accepted']} of {count} ({_pct_text(et['rate'])}) · "
                 f"offered {et['offered']} · saved ${et['cost_saved']:,.4f}")
    flt = stats["filtering"]
    lines.append(f"filtering          saved {flt['tokens_saved']:,} tokens ({_num(flt['efficiency_pct'], 1)}%)")
    sub = stats["substitutions"]
    lines.append(f"substitutions      {sub['count']} ({_pct_text(sub['rate'])} of agent seats)")
    quality = stats.get("quality") or {}
    if quality.get("claims") or quality.get("pass_rate"):
        lines.append(f"debate quality     {quality['claims']:,} claims · labelled "
                     f"{_pct_text(quality['label_adoption'])} · FACT cited {_pct_text(quality['citation_compliance'])}"
                     f" · {quality['rule_violations']} rule violations ({quality.get('synthesis_unaccounted', 0)} "
                     f"left unaccounted by a synthesis) · {quality['ungrounded_statements']} ungrounded judge "
                     "statements")
        rates = " · ".join(f"{q} {_pct_text(r)}" for q, r in quality["pass_rate"].items())
        if rates:
            lines.append(f"verification       {rates}")
    safety = safety_line(stats.get("safety") or {})
    if safety:
        lines.append(safety)
    ended = stats.get("exit") or {}
    if ended.get("reasons"):
        reasons = " · ".join(f"{r} {n}" for r, n in ended["reasons"].items())
        lines.append(f"exit               {reasons} · {_num(ended['avg_rounds'], 1)} rounds, "
                     f"{_num(ended['avg_cross_exam_rounds'], 1)} cross-examinations on average")
        lines.append(f"context            {ended['context_tokens']:,} tokens sent · "
                     f"{ended['context_tokens_unsummarized']:,} without summaries "
                     f"(saved {_pct_text(ended['context_saved'])})")
    groupthink = stats.get("groupthink") or {}
    if sum((groupthink.get("firings") or {}).values()):
        firings = groupthink["firings"]
        lines.append(f"groupthink         fired {firings['early_convergence']} early convergence · "
                     f"{firings['stagnation']} stagnation ({groupthink['acted']} acted on) · "
                     f"{groupthink['objection_rounds']} objection rounds, "
                     f"{groupthink['objection_rounds_changed_status']} changed a claim's status · "
                     f"{groupthink['escalations']} escalated")
    lines += ["", "provider     calls   failed   tokens in   cached in  tokens out        cost  avg latency"]
    for p in stats["providers"]:
        lines.append(f"{p['provider'] or '-':<10} {p['calls']:>7,} {p['failed_calls']:>8,} {p['input_tokens']:>11,} "
                     f"{p['cached_input_tokens']:>11,} {p['output_tokens']:>11,} {p['cost']:>11,.4f} "
                     f"{p['avg_latency_s']:>10.2f} s")
    lines += ["", "mode         consultations        cost   median  confidence  early-term"]
    for m in stats["modes"]:
        lines.append(f"{m['mode'] or '-':<12} {m['consultations']:>13,} {m['cost']:>11,.4f} "
                     f"{_num(m['median_cost']):>8} {_num(m['avg_confidence'], 2):>11} "
                     f"{_pct_text(m['early_termination_rate']):>11}")
    return "\n".join(lines) + "\n"


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _pct_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}%"
