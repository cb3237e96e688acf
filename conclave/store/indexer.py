"""Journal records → index rows. The only indexing code path: live indexing and ``index rebuild`` both use it.

:func:`build_batch` folds records (in journal order) into a :class:`Batch`; :meth:`Batch.write` applies it inside
the caller's transaction with idempotent upserts, then recomputes each touched consultation's totals from its
child rows, so the result does not depend on how records were split into batches.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from conclave import events as ev
from conclave.events import CONSULTATION_RESUMED as RESUMED  # written by `conclave resume` first
from conclave.store.rollups import refresh_days


def iso(ts: float) -> str:
    """UTC ISO-8601 with milliseconds; one fixed format so text comparison orders timestamps."""
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds")


def _json(value: Any) -> str | None:
    return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)


def _flag(value: Any) -> int | None:
    return None if value is None else int(bool(value))


# child table -> columns, in insert order; every one is keyed by (consultation_id, seq) or a natural key
_CHILD_COLUMNS = {
    "calls": ("consultation_id", "seq", "round_number", "agent", "provider", "model", "attempt", "started_at",
              "latency_s", "outcome", "status", "error", "hedge", "input_tokens", "output_tokens",
              "cached_input_tokens", "cost"),
    "artifacts": ("consultation_id", "seq", "round_number", "artifact_type", "schema", "agent", "status",
                  "artifact", "raw_chars"),
    "transitions": ("consultation_id", "seq", "at", "from_state", "to_state", "reason"),
    "filters_applied": ("consultation_id", "seq", "round_number", "artifact_type", "filter", "limits",
                        "tokens_before", "tokens_after", "tokens_saved"),
    "substitutions": ("consultation_id", "seq", "round_number", "agent", "original_provider", "original_model",
                      "substitute_provider", "substitute_model", "reason"),
    "agents": ("consultation_id", "agent", "persona", "provider", "model", "label", "anchor"),
    "agent_rounds": ("consultation_id", "round_number", "agent", "ok", "duration_s", "input_tokens",
                     "output_tokens", "cost", "error"),
    "claims": ("consultation_id", "claim_id", "agent", "label", "status", "text", "introduced_round",
               "last_updated_round", "support", "opposition", "status_reason"),
    "evidence": ("consultation_id", "evidence_id", "kind", "title", "url", "gist", "agent", "added_round",
                 "supports"),
    "claim_checks": ("consultation_id", "round_number", "agent", "anchor", "claim_source", "labelled",
                     "unlabelled", "facts", "facts_cited", "violations", "rules"),
    "verification": ("consultation_id", "round_number", "agent", "question_id", "passed", "reason",
                     "answered_by"),
}

_REFRESH_TOTALS = """
update consultations set
  total_cost = (select total(cost) from calls where consultation_id = :id),
  input_tokens = (select coalesce(sum(input_tokens), 0) from calls where consultation_id = :id),
  output_tokens = (select coalesce(sum(output_tokens), 0) from calls where consultation_id = :id),
  calls = (select count(*) from calls where consultation_id = :id),
  failed_calls = (select count(*) from calls where consultation_id = :id and outcome not in ('ok', 'cancelled')),
  hedged_calls = (select count(*) from calls where consultation_id = :id and hedge),
  unknown_cost_calls = (select count(*) from calls where consultation_id = :id and cost is null),
  substitutions = (select count(*) from substitutions where consultation_id = :id),
  filter_tokens_before = (select coalesce(sum(tokens_before), 0) from filters_applied where consultation_id = :id),
  filter_tokens_saved = (select coalesce(sum(tokens_saved), 0) from filters_applied where consultation_id = :id),
  rounds_completed = (select count(*) from rounds where consultation_id = :id and completed_at is not null),
  duration_s = coalesce(duration_s, round((julianday(completed_at) - julianday(started_at)) * 86400.0, 3))
where id = :id
"""
# a second statement: within one UPDATE every expression still sees the row's old token counts
_REFRESH_TOTAL_TOKENS = "update consultations set total_tokens = input_tokens + output_tokens where id = :id"


@dataclass
class Batch:
    """Rows folded from journal records: consultation and round columns merged (later records win)."""

    consultations: dict[str, dict[str, Any]] = field(default_factory=dict)
    rounds: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: {t: [] for t in _CHILD_COLUMNS})
    configs: dict[str, str] = field(default_factory=dict)

    def consultation(self, cid: str) -> dict[str, Any]:
        return self.consultations.setdefault(cid, {})

    def write(self, db: Any) -> None:
        """Apply the batch with ``db`` (a sqlite-utils Database) inside the caller's transaction."""
        conn = db.conn
        if self.configs:
            conn.executemany("insert or ignore into config_snapshots (config_hash, config) values (?, ?)",
                             list(self.configs.items()))
        for columns, values in _group_by_columns(self.consultations.items()):
            conn.executemany(_upsert_sql("consultations", ("id",), columns), values)
        for table, rows in self.rows.items():
            if rows:
                columns = _CHILD_COLUMNS[table]
                marks = ", ".join("?" * len(columns))
                conn.executemany(f"insert or replace into {table} ({', '.join(columns)}) values ({marks})", rows)
        rounds = (((cid, number), cols) for (cid, number), cols in self.rounds.items())
        for columns, values in _group_by_columns(rounds):
            conn.executemany(_upsert_sql("rounds", ("consultation_id", "round_number"), columns), values)
        ids = [{"id": cid} for cid in sorted(self.consultations)]
        conn.executemany(_REFRESH_TOTALS, ids)
        conn.executemany(_REFRESH_TOTAL_TOKENS, ids)
        refresh_days(conn, sorted(self.consultations))


def _group_by_columns(
    items: Iterable[tuple[Any, dict[str, Any]]],
) -> Iterable[tuple[tuple[str, ...], list[tuple[Any, ...]]]]:
    """Group upserts by the set of columns they touch, so each group is one ``executemany``."""
    groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    for key, cols in items:
        names = tuple(sorted(cols))
        keys = key if isinstance(key, tuple) else (key,)
        groups.setdefault(names, []).append((*keys, *(cols[n] for n in names)))
    return groups.items()


# A resumed run emits consultation:started again; the consultation still started when it first did.
_FIRST_WINS = {("consultations", "started_at")}
_SQL_CACHE: dict[tuple[str, tuple[str, ...], tuple[str, ...]], str] = {}


def _upsert_sql(table: str, keys: tuple[str, ...], columns: tuple[str, ...]) -> str:
    sql = _SQL_CACHE.get((table, keys, columns))
    if sql is None:
        names = (*keys, *columns)
        marks = ", ".join("?" * len(names))
        update = ", ".join(
            f"{c} = coalesce({table}.{c}, excluded.{c})" if (table, c) in _FIRST_WINS else f"{c} = excluded.{c}"
            for c in columns
        ) if columns else None
        conflict = f"do update set {update}" if update else "do nothing"
        sql = f"insert into {table} ({', '.join(names)}) values ({marks}) on conflict ({', '.join(keys)}) {conflict}"
        _SQL_CACHE[(table, keys, columns)] = sql
    return sql


def build_batch(records: Iterable[dict[str, Any]], batch: Batch | None = None) -> Batch:
    """Fold ``records`` (journal order within each consultation) into ``batch``; unknown types are skipped."""
    batch = batch if batch is not None else Batch()
    for record in records:
        cid, data = record.get("consultation_id"), record.get("data")
        if not isinstance(cid, str) or not isinstance(data, dict):
            continue  # not a journal record; ``logs verify`` reports it
        handler = _HANDLERS.get(record.get("type", ""))
        if handler is not None:
            handler(batch, cid, record["seq"], record["ts"], data)
        else:  # still a consultation the index should know exists
            batch.consultation(cid)
    return batch


Handler = Callable[[Batch, str, int, float, dict[str, Any]], None]


def _started(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    judge = d.get("judge") or {}
    agents = d.get("agents") or []
    labels = d.get("judge_labels") or {}
    config_hash = d.get("config_hash")
    if config_hash and d.get("config") is not None:
        b.configs[config_hash] = _json(d["config"]) or ""
    scrub = d.get("scrub_report") or {}
    columns = b.consultation(cid)
    columns.setdefault("started_at", iso(ts))
    columns.update(
        question=d.get("question"), mode=d.get("mode"), strategy=d.get("strategy"), status="running",
        planned_rounds=d.get("planned_rounds"), agent_count=len(agents),
        judge_provider=judge.get("provider"), judge_model=judge.get("model"), config_hash=config_hash,
        prompt_versions=_json(d.get("prompt_versions")), conclave_version=d.get("conclave_version"),
        shuffle_seed=d.get("shuffle_seed"), secrets_scrubbed=scrub.get("total"),
    )
    anchors = d.get("anchors") or {}
    for agent in agents:
        name = agent.get("name")
        b.rows["agents"].append(
            (cid, name, agent.get("persona"), agent.get("provider"), agent.get("model"), labels.get(name),
             anchors.get(name))
        )


def _transition(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.rows["transitions"].append((cid, seq, iso(ts), d.get("from"), d.get("to"), d.get("reason")))
    b.consultation(cid)["state"] = d.get("to")


def _cost_estimated(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid)["estimated_cost"] = d.get("estimated_cost")


def _consent(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid).update(consent_approved=_flag(d.get("approved")), consent_auto=_flag(d.get("auto_approved")))


def _round_started(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid)
    b.rounds.setdefault((cid, d["round_number"]), {}).update(round_type=d.get("round_type"), started_at=iso(ts))


def _round_completed(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid)
    b.rounds.setdefault((cid, d["round_number"]), {}).update(
        round_type=d.get("round_type"), completed_at=iso(ts), duration_s=d.get("duration_s"),
        input_tokens=d.get("input_tokens"), output_tokens=d.get("output_tokens"), cost=d.get("cost"),
    )


def _attempt(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid)
    started = d.get("started_at")
    b.rows["calls"].append((
        cid, seq, d.get("round_number"), d.get("agent"), d.get("provider"), d.get("model"), d.get("number"),
        iso(started) if isinstance(started, int | float) else None, d.get("latency_s"), d.get("outcome"),
        d.get("status"), d.get("error"), _flag(d.get("hedge")), d.get("input_tokens"), d.get("output_tokens"),
        d.get("cached_input_tokens"), d.get("cost"),
    ))


def _substituted(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid)
    b.rows["substitutions"].append((
        cid, seq, d.get("round_number"), d.get("agent"), d.get("original_provider"), d.get("original_model"),
        d.get("substitute_provider"), d.get("substitute_model"), d.get("reason"),
    ))


def _agent_completed(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid)
    b.rows["agent_rounds"].append((
        cid, d.get("round_number"), d.get("agent"), _flag(d.get("ok")), d.get("duration_s"),
        d.get("input_tokens"), d.get("output_tokens"), d.get("cost"), d.get("error"),
    ))


def _artifact(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid)
    raw = d.get("raw_text")
    b.rows["artifacts"].append((
        cid, seq, d.get("round_number"), d.get("artifact_type"), d.get("schema"), d.get("agent"), d.get("status"),
        _json(d.get("artifact")), len(raw) if isinstance(raw, str) else None,
    ))


def _filter_applied(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid)
    before, after = d.get("tokens_before"), d.get("tokens_after")
    saved = before - after if isinstance(before, int) and isinstance(after, int) else None
    b.rows["filters_applied"].append((
        cid, seq, d.get("round_number"), d.get("artifact_type"), d.get("filter"), _json(d.get("limits")),
        before, after, saved,
    ))


def _early_termination(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid).update(
        early_termination_offered=_flag(d.get("offered")), early_terminated=_flag(d.get("accepted")),
        early_termination_confidence=d.get("confidence"), early_termination_threshold=d.get("threshold"),
        rounds_skipped=d.get("rounds_skipped"), cost_saved=d.get("estimated_cost_saved"),
    )


def _cost_gate(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid)["cost_gate_phase"] = d.get("phase")


def _completed(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    result = d.get("result") or {}
    b.consultation(cid).update(status=d.get("status"), completed_at=iso(ts), **result_summary(result))


def _quality_checks(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid)
    number, agent = d.get("round_number"), d.get("agent")
    if "rules" in d:  # an agent's artifact was checked (the judge's answers come alone, with ``judged_in``)
        rules = d.get("rules") or []
        b.rows["claim_checks"].append((
            cid, number, agent, d.get("anchor"), d.get("claim_source"), d.get("labelled"), d.get("unlabelled"),
            d.get("facts"), d.get("facts_cited"), len(rules), _json(rules),
        ))
    for result in d.get("verification") or []:
        b.rows["verification"].append((
            cid, number, agent, result.get("question_id"), _flag(result.get("passed")), result.get("reason"),
            result.get("by"),
        ))


def _debate_state(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    """The latest state wins: every claim and piece of evidence is upserted under its stable id."""
    b.consultation(cid)
    state = d.get("state") or {}
    for c in state.get("claims") or []:
        b.rows["claims"].append((
            cid, c.get("id"), c.get("agent"), c.get("label"), c.get("status"), c.get("text"),
            c.get("introduced_round"), c.get("last_updated_round"), _json(c.get("support")),
            _json(c.get("opposition")), c.get("status_reason"),
        ))
    for e in state.get("evidence") or []:
        b.rows["evidence"].append((
            cid, e.get("id"), e.get("kind"), e.get("title"), e.get("url"), e.get("gist"), e.get("agent"),
            e.get("added_round"), _json(e.get("supports")),
        ))


def _resumed(b: Batch, cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.consultation(cid).update(status="running", resumed_at=iso(ts))


def result_summary(result: dict[str, Any]) -> dict[str, Any]:
    """The consultation columns a final result fills: recommendation, confidence, dissent count, duration."""
    verdict = result.get("verdict") if isinstance(result.get("verdict"), dict) else {}
    assert isinstance(verdict, dict)

    def pick(*keys: str) -> Any:
        for key in keys:
            for source in (result, verdict):
                if source.get(key) is not None:
                    return source[key]
        return None

    recommendation = pick("recommendation", "summary")
    dissent = pick("dissent")
    duration = pick("duration_s")
    if duration is None and isinstance(pick("duration_ms"), int | float):
        duration = pick("duration_ms") / 1000
    figures = (result.get("quality") or {}).get("metrics") or {}
    passes = list((figures.get("pass_rate") or {}).values())
    return {
        "label_adoption": figures.get("label_adoption"),
        "citation_compliance": figures.get("citation_compliance"),
        "rule_violations": sum((figures.get("rule_violations") or {}).values()) if figures else None,
        "verification_pass_rate": round(sum(passes) / len(passes), 4) if passes else None,
        "ungrounded_statements": figures.get("ungrounded_statements"),
        "recommendation": recommendation if isinstance(recommendation, str) else _json(recommendation),
        "confidence": pick("confidence"),
        "dissent_count": len(dissent) if isinstance(dissent, list) else None,
        "duration_s": duration,
    }


_HANDLERS: dict[str, Handler] = {
    ev.CONSULTATION_STARTED: _started,
    ev.STATE_TRANSITION: _transition,
    ev.COST_ESTIMATED: _cost_estimated,
    ev.USER_CONSENT: _consent,
    ev.ROUND_STARTED: _round_started,
    ev.ROUND_COMPLETED: _round_completed,
    ev.PROVIDER_ATTEMPT: _attempt,
    ev.PROVIDER_SUBSTITUTED: _substituted,
    ev.AGENT_COMPLETED: _agent_completed,
    ev.ROUND_ARTIFACT: _artifact,
    ev.FILTER_APPLIED: _filter_applied,
    ev.EARLY_TERMINATION: _early_termination,
    ev.COST_GATE_TRIGGERED: _cost_gate,
    ev.CONSULTATION_COMPLETED: _completed,
    RESUMED: _resumed,
    ev.QUALITY_CHECKS: _quality_checks,
    ev.DEBATE_STATE: _debate_state,
}
