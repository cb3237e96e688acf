"""Journal records → index rows. The only indexing code path: live indexing and ``index rebuild`` both use it.

:func:`build_batch` folds records (in journal order) into a :class:`Batch`; :meth:`Batch.write_rows` applies it
inside the caller's transaction with idempotent upserts (prepared ``executemany`` statements, one per table and
column set), then :func:`refresh_totals` recomputes each touched consultation's totals from its child rows and
:func:`~conclave.store.rollups.refresh_days` its days' rollups, so the result does not depend on how records were
split into batches. Live indexing does all three per batch (:meth:`Batch.write`); ``index rebuild`` writes rows
and totals per chunk of consultations and refreshes every day's rollups once at the end.
"""

from __future__ import annotations

import itertools
import json
import json.encoder
import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

from conclave import events as ev
from conclave.events import CONSULTATION_RESUMED as RESUMED  # written by `conclave resume` first
from conclave.store.artifact_gist import gist
from conclave.store.rollups import refresh_days

_MAX_FAST_TS = 253_402_300_800.0  # 10000-01-01T00:00:00Z, past datetime's range
_SECONDS = tuple(f"{second:02d}." for second in range(60))
_MILLIS = tuple(f"{milli:03d}+00:00" for milli in range(1000))


@lru_cache(maxsize=4096)
def _minute_prefix(minute: int) -> str:
    """``YYYY-MM-DDTHH:MM:`` of the UTC minute ``minute`` (minutes since the epoch)."""
    return datetime.fromtimestamp(minute * 60, tz=UTC).isoformat(timespec="seconds")[:17]


def iso(ts: float) -> str:
    """UTC ISO-8601 with milliseconds; one fixed format so text comparison orders timestamps.

    Exactly ``datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds")``, three times as fast for
    a float in datetime's range: the same round-half-even to microseconds, then truncation to milliseconds.
    """
    if ts.__class__ is float and 0.0 <= ts < _MAX_FAST_TS:
        fraction, whole = math.modf(ts)
        micros = round(fraction * 1e6)  # what datetime does (_PyTime_ROUND_HALF_EVEN)
        seconds = int(whole)
        if micros >= 1_000_000:
            seconds += 1
            micros -= 1_000_000
        return _minute_prefix(seconds // 60) + _SECONDS[seconds % 60] + _MILLIS[micros // 1000]
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds")


def _unserialisable(value: Any) -> Any:
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")


def _json_encoder() -> Callable[[Any], str]:
    """``json.dumps(value, sort_keys=True, ensure_ascii=False)``, less the cost of building an encoder per call:
    the C encoder that ``JSONEncoder.encode`` builds, built once (no circular-reference check: parsed JSON has no
    cycles), or a reused ``JSONEncoder`` where the C accelerator is missing."""
    make = getattr(json.encoder, "c_make_encoder", None)
    basestring = getattr(json.encoder, "c_encode_basestring", None)
    if make is None or basestring is None:
        return json.JSONEncoder(sort_keys=True, ensure_ascii=False).encode
    encoder = make(None, _unserialisable, basestring, None, ": ", ", ", True, False, True)
    join = "".join
    return lambda value: join(encoder(value, 0))


_ENCODE = _json_encoder()


def _json(value: Any) -> str | None:
    return None if value is None else _ENCODE(value)


def _flag(value: Any) -> int | None:
    return None if value is None else int(bool(value))


# child table -> columns, in insert order; every one is keyed by (consultation_id, seq) or a natural key
_CHILD_COLUMNS = {
    "calls": ("consultation_id", "seq", "round_number", "agent", "provider", "model", "attempt", "started_at",
              "latency_s", "outcome", "status", "error", "hedge", "input_tokens", "output_tokens",
              "cached_input_tokens", "cost", "cache_write_tokens"),
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
    "groupthink_checks": ("consultation_id", "seq", "round_number", "detector", "fired", "stage", "action",
                          "acted", "not_acted_because", "why", "figures"),
    "objection_rounds": ("consultation_id", "round_number", "trigger", "new_claims", "status_changes",
                         "produced_new", "escalated", "continued", "detail"),
    "claims": ("consultation_id", "claim_id", "agent", "label", "status", "text", "introduced_round",
               "last_updated_round", "support", "opposition", "status_reason"),
    "evidence": ("consultation_id", "evidence_id", "kind", "title", "url", "gist", "agent", "added_round",
                 "supports"),
    "claim_checks": ("consultation_id", "round_number", "agent", "anchor", "claim_source", "labelled",
                     "unlabelled", "facts", "facts_cited", "violations", "rules"),
    "verification": ("consultation_id", "round_number", "agent", "question_id", "passed", "answered_by"),
    "synthesis_coverage": ("consultation_id", "round_number", "claims", "agents", "claims_unaccounted",
                           "positions_unaccounted", "violations"),
    "safety_checks": ("consultation_id", "seq", "round_number", "round_type", "stage", "tier", "tier_name",
                      "responses", "tier1_ms", "flags", "triggers", "trigger_kinds", "evaluated", "verdict", "risk",
                      "concern", "passed", "blocked", "would_block", "block_tier", "block_category", "reason"),
    "exit_decisions": ("consultation_id", "round_number", "reason", "action", "vote_share", "blockers",
                       "min_confidence", "change", "new_facts", "plateau", "overridden", "votes"),
    "context_rounds": ("consultation_id", "round_number", "calls", "tokens", "tokens_unsummarized", "summarized"),
}

# One pass over each child table per consultation (row-value assignments); every expression reads the row's old
# values, so total_tokens adds the two new sums itself. ``count(case when c then 1 end)`` counts the rows where
# ``c`` is true exactly as ``where c`` would (null and 0 are false).
_REFRESH_TOTALS = """
update consultations set
  (total_cost, input_tokens, output_tokens, total_tokens, calls, failed_calls, hedged_calls, unknown_cost_calls) = (
    select total(cost), coalesce(sum(input_tokens), 0), coalesce(sum(output_tokens), 0),
           coalesce(sum(input_tokens), 0) + coalesce(sum(output_tokens), 0), count(*),
           count(case when outcome not in ('ok', 'cancelled') then 1 end), count(case when hedge then 1 end),
           count(case when cost is null then 1 end)
    from calls where consultation_id = :id),
  substitutions = (select count(*) from substitutions where consultation_id = :id),
  rounds_completed = (select count(*) from rounds where consultation_id = :id and status = 'ok'),
  duration_s = coalesce(duration_s, round((julianday(completed_at) - julianday(started_at)) * 86400.0, 3))
where id = :id
"""


def refresh_totals(conn: Any, consultation_ids: Iterable[str]) -> None:
    """Recompute the totals of ``consultation_ids`` (a sqlite3 connection) from their child rows."""
    conn.executemany(_REFRESH_TOTALS, [{"id": cid} for cid in consultation_ids])


@dataclass
class Batch:
    """Rows folded from journal records: consultation and round columns merged (later records win)."""

    consultations: dict[str, dict[str, Any]] = field(default_factory=dict)
    rounds: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    rows: dict[str, list[tuple[Any, ...]]] = field(default_factory=lambda: {t: [] for t in _CHILD_COLUMNS})
    configs: dict[str, str] = field(default_factory=dict)
    # (consultation, round number, started_at) of each round start: it supersedes the later rounds that an
    # earlier run completed on top of that round's earlier run (see :data:`_SUPERSEDE`)
    restarts: list[tuple[str, int, str]] = field(default_factory=list)
    # (consultation, id) -> the row of the latest claim / piece of evidence of the batch's debate states: each
    # state restates every one, and only the last survives (insert or replace), so only the last becomes a row
    claims: dict[tuple[str, Any], tuple[Any, ...]] = field(default_factory=dict)
    evidence: dict[tuple[str, Any], tuple[Any, ...]] = field(default_factory=dict)
    # the latest states seen by the :func:`build_batch` call under way, made rows when it returns: the batch then
    # keeps no parsed record alive (a rebuild's batch spans hundreds of journals)
    latest_claims: dict[tuple[str, Any], dict[str, Any]] = field(default_factory=dict)
    latest_evidence: dict[tuple[str, Any], dict[str, Any]] = field(default_factory=dict)

    def consultation(self, cid: str) -> dict[str, Any]:
        return self.consultations.setdefault(cid, {})

    def write(self, db: Any) -> None:
        """Apply the batch with ``db`` (a sqlite-utils Database or a sqlite3 connection) inside the caller's
        transaction: rows, then the touched consultations' totals, then their days' rollups."""
        conn = getattr(db, "conn", db)
        self.write_rows(conn)
        ids = sorted(self.consultations)
        refresh_totals(conn, ids)
        refresh_days(conn, ids)

    def write_rows(self, conn: Any) -> None:
        """Upsert the batch's rows with ``conn`` (a sqlite3 connection) inside the caller's transaction; totals
        and rollups are left to the caller."""
        for sql, rows in self.statements():
            _insert_rows(conn, sql, rows)
        if self.restarts:
            conn.executemany(_SUPERSEDE, self.restarts)

    def statements(self) -> list[tuple[str, list[tuple[Any, ...]]]]:
        """``(sql, rows)`` pairs that upsert the batch, in order: config snapshots, consultations, child rows,
        rounds (consultations first: child rows reference them). Each ``sql`` has a ``{values}`` slot for one
        or more ``(?, ...)`` groups, one per row."""
        out: list[tuple[str, list[tuple[Any, ...]]]] = []
        if self.configs:
            out.append((_CONFIG_SQL, list(self.configs.items())))
        for columns, values in _group_by_columns(self.consultations.items()):
            out.append((_upsert_sql("consultations", ("id",), columns), values))
        for table, rows in self.rows.items():
            if rows:
                out.append((_CHILD_SQL[table], rows))
        if self.claims:
            out.append((_CHILD_SQL["claims"], list(self.claims.values())))
        if self.evidence:
            out.append((_CHILD_SQL["evidence"], list(self.evidence.values())))
        rounds = (((cid, number), cols) for (cid, number), cols in self.rounds.items())
        for columns, values in _group_by_columns(rounds):
            out.append((_upsert_sql("rounds", ("consultation_id", "round_number"), columns), values))
        return out


# Rows go in groups of up to this many per INSERT (multi-row VALUES): binding and stepping one statement per row
# costs more than the rows' own work. SQLite inserts a VALUES list's rows one after another, exactly as
# executemany would, so a later row still replaces or updates an earlier one with the same key.
_ROWS_PER_INSERT = 64
_MAX_VARIABLES = 999  # SQLite's limit on parameters per statement before 3.32
_VALUES_SQL: dict[tuple[str, int, int], str] = {}


def _insert_rows(conn: Any, sql: str, rows: list[tuple[Any, ...]]) -> None:
    width = len(rows[0])
    per_insert = max(1, min(_ROWS_PER_INSERT, _MAX_VARIABLES // width))
    whole = len(rows) - len(rows) % per_insert
    if whole and per_insert > 1:
        flat = list(itertools.chain.from_iterable(rows[:whole]))
        step = width * per_insert
        groups = [flat[i : i + step] for i in range(0, len(flat), step)]
        conn.executemany(_values_sql(sql, width, per_insert), groups)
    else:
        whole = 0
    if whole < len(rows):
        conn.executemany(_values_sql(sql, width, 1), rows[whole:])


def _values_sql(sql: str, width: int, count: int) -> str:
    key = (sql, width, count)
    values = _VALUES_SQL.get(key)
    if values is None:
        group = f"({', '.join('?' * width)})"
        values = _VALUES_SQL[key] = sql.format(values=", ".join([group] * count))
    return values


def _group_by_columns(
    items: Iterable[tuple[Any, dict[str, Any]]],
) -> Iterable[tuple[tuple[str, ...], list[tuple[Any, ...]]]]:
    """Group upserts by the set of columns they touch, so each group is one ``executemany``."""
    groups: dict[tuple[str, ...], list[tuple[Any, ...]]] = {}
    for key, cols in items:
        names = tuple(sorted(cols))
        group = groups.get(names)
        if group is None:
            group = groups[names] = []
        keys = key if isinstance(key, tuple) else (key,)
        group.append((*keys, *map(cols.__getitem__, names)))
    return groups.items()


_CONFIG_SQL = "insert or ignore into config_snapshots (config_hash, config) values {values}"
_CHILD_SQL = {table: f"insert or replace into {table} ({', '.join(columns)}) values {{values}}"
              for table, columns in _CHILD_COLUMNS.items()}

# A resumed run emits consultation:started again; the consultation still started when it first did.
_FIRST_WINS = {("consultations", "started_at")}
_SQL_CACHE: dict[tuple[str, tuple[str, ...], tuple[str, ...]], str] = {}


def _upsert_sql(table: str, keys: tuple[str, ...], columns: tuple[str, ...]) -> str:
    sql = _SQL_CACHE.get((table, keys, columns))
    if sql is None:
        names = (*keys, *columns)
        update = ", ".join(
            f"{c} = coalesce({table}.{c}, excluded.{c})" if (table, c) in _FIRST_WINS else f"{c} = excluded.{c}"
            for c in columns
        ) if columns else None
        conflict = f"do update set {update}" if update else "do nothing"
        sql = f"insert into {table} ({', '.join(names)}) values {{values}} on conflict ({', '.join(keys)}) {conflict}"
        _SQL_CACHE[(table, keys, columns)] = sql
    return sql


_NOT_HASHED = ("question", "home")  # what conclave.engine.ids.config_hash leaves out
_RECORD = operator.itemgetter("consultation_id", "data", "type", "seq", "ts")


def build_batch(records: Iterable[dict[str, Any]], batch: Batch | None = None) -> Batch:
    """Fold ``records`` (journal order within each consultation) into ``batch``; unknown types are skipped."""
    batch = batch if batch is not None else Batch()
    consultations = batch.consultations
    handlers = _HANDLERS
    for record in records:
        try:
            cid, data, type_, seq, ts = _RECORD(record)
        except KeyError:  # a key is missing: the same steps, one key at a time
            cid, data, type_ = record.get("consultation_id"), record.get("data"), record.get("type", "")
            seq = ts = None
        if not isinstance(cid, str) or not isinstance(data, dict):
            continue  # not a journal record; ``logs verify`` reports it
        # every record makes its consultation known to the index, whatever its type
        columns = consultations.get(cid)
        if columns is None:
            columns = consultations[cid] = {}
        handler = handlers.get(type_)
        if handler is not None:
            if seq is None or ts is None:  # a record without them (KeyError) or with null ones
                seq, ts = record["seq"], record["ts"]
            handler(batch, columns, cid, seq, ts, data)
    for (cid, claim_id), c in batch.latest_claims.items():
        batch.claims[(cid, claim_id)] = _claim_row(cid, c)
    for (cid, evidence_id), e in batch.latest_evidence.items():
        batch.evidence[(cid, evidence_id)] = _evidence_row(cid, e)
    batch.latest_claims.clear()
    batch.latest_evidence.clear()
    return batch


# (batch, the consultation's columns, consultation id, seq, ts, data)
Handler = Callable[[Batch, dict[str, Any], str, int, float, dict[str, Any]], None]


def _started(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    get = d.get
    judge = get("judge") or {}
    agents = get("agents") or []
    labels = get("judge_labels") or {}
    config_hash = get("config_hash")
    config = get("config")
    # A snapshot is stored under config_hash, which leaves out the question and the data home: so is the snapshot,
    # or the first consultation's question would stand in every later one's (the question is a column of its own).
    if config_hash and config_hash not in b.configs and isinstance(config, dict):
        b.configs[config_hash] = _json({k: v for k, v in config.items() if k not in _NOT_HASHED}) or ""
    scrub = get("scrub_report") or {}
    if "started_at" not in columns:
        columns["started_at"] = iso(ts)
    columns.update(
        question=get("question"), mode=get("mode"), strategy=get("strategy"), status="running",
        planned_rounds=get("planned_rounds"), agent_count=len(agents),
        judge_provider=judge.get("provider"), judge_model=judge.get("model"), config_hash=config_hash,
        prompt_versions=_json(get("prompt_versions")), conclave_version=get("conclave_version"),
        shuffle_seed=get("shuffle_seed"), secrets_scrubbed=scrub.get("total"),
        origin=get("origin"), client_name=(get("client") or {}).get("name"), parent_id=get("parent"),
    )
    rows = b.rows["agents"]
    anchors = get("anchors") or {}
    for agent in agents:
        name = agent.get("name")
        rows.append((cid, name, agent.get("persona"), agent.get("provider"), agent.get("model"), labels.get(name),
                     anchors.get(name)))


def _transition(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    get = d.get
    b.rows["transitions"].append((cid, seq, iso(ts), get("from"), get("to"), get("reason")))
    columns["state"] = get("to")


def _cost_estimated(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    columns["estimated_cost"] = d.get("estimated_cost")


def _consent(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    columns.update(consent_approved=_flag(d.get("approved")), consent_auto=_flag(d.get("auto_approved")))


# A round run is ``running`` from its start until its end record: ``ok`` or ``failed`` (round:completed with its
# ``ok``; journals from before ``ok`` existed only recorded rounds that ran to their end), ``interrupted``
# (round:interrupted, with its reason), or ``superseded`` when an earlier round started again after it (a resume
# re-runs that round and every round after it, which built on it). A round that starts again replaces its own
# earlier run's columns entirely, so a stale completion never survives.
_ROUND_RUN = ("completed_at", "duration_s", "input_tokens", "output_tokens", "cost", "end_reason", "safety_tier")
_SUPERSEDE = """
update rounds set status = 'superseded'
where consultation_id = ? and round_number > ? and started_at < ? and status != 'superseded'
"""


def _round(b: Batch, cid: str, number: Any) -> dict[str, Any]:
    """The columns of round ``number``'s row in this batch (new when the batch has none yet)."""
    key = (cid, number)
    round_ = b.rounds.get(key)
    if round_ is None:
        round_ = b.rounds[key] = {}
    return round_


def _round_started(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    number = d["round_number"]
    started = iso(ts)
    _round(b, cid, number).update(dict.fromkeys(_ROUND_RUN), round_type=d.get("round_type"), started_at=started,
                                  status="running")
    b.restarts.append((cid, number, started))


def _round_ended(b: Batch, cid: str, d: dict[str, Any], completed_at: str | None, status: str,
                 end_reason: Any, **more: Any) -> None:
    """A round's end record, completed or interrupted: its figures, and how it ended."""
    get = d.get
    _round(b, cid, d["round_number"]).update(
        round_type=get("round_type"), completed_at=completed_at, duration_s=get("duration_s"),
        input_tokens=get("input_tokens"), output_tokens=get("output_tokens"), cost=get("cost"),
        status=status, end_reason=end_reason, **more,
    )


def _round_completed(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    _round_ended(b, cid, d, iso(ts), "failed" if d.get("ok", True) is False else "ok", None,
                 safety_tier=(d.get("safety") or {}).get("tier"))


def _round_interrupted(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    _round_ended(b, cid, d, None, "interrupted", d.get("reason"))  # its record carries no safety tier


def _attempt(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    get = d.get
    started = get("started_at")
    hedge = get("hedge")
    b.rows["calls"].append((
        cid, seq, get("round_number"), get("agent"), get("provider"), get("model"), get("number"),
        iso(started) if isinstance(started, (int, float)) else None, get("latency_s"), get("outcome"),
        get("status"), get("error"), None if hedge is None else int(bool(hedge)), get("input_tokens"),
        get("output_tokens"), get("cached_input_tokens"), get("cost"), get("cache_write_tokens"),
    ))


def _substituted(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    get = d.get
    b.rows["substitutions"].append((
        cid, seq, get("round_number"), get("agent"), get("original_provider"), get("original_model"),
        get("substitute_provider"), get("substitute_model"), get("reason"),
    ))


def _agent_completed(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    get = d.get
    ok = get("ok")
    b.rows["agent_rounds"].append((
        cid, get("round_number"), get("agent"), None if ok is None else int(bool(ok)), get("duration_s"),
        get("input_tokens"), get("output_tokens"), get("cost"), get("error"),
    ))


def _artifact(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    get = d.get
    raw = get("raw_text")
    artifact = get("artifact")
    b.rows["artifacts"].append((
        cid, seq, get("round_number"), get("artifact_type"), get("schema"), get("agent"), get("status"),
        None if artifact is None else _ENCODE(gist(artifact)), len(raw) if isinstance(raw, str) else None,
    ))


def _filter_applied(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    get = d.get
    before, after = get("tokens_before"), get("tokens_after")
    saved = before - after if isinstance(before, int) and isinstance(after, int) else None
    b.rows["filters_applied"].append((
        cid, seq, get("round_number"), get("artifact_type"), get("filter"), _json(get("limits")),
        before, after, saved,
    ))


def _early_termination(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    get = d.get
    columns.update(
        early_termination_offered=_flag(get("offered")), early_terminated=_flag(get("accepted")),
        early_termination_confidence=get("confidence"), early_termination_threshold=get("threshold"),
        rounds_skipped=get("rounds_skipped"), cost_saved=get("estimated_cost_saved"),
    )


def _vote_gate(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    get = d.get
    columns.update(vote_gate_decided=_flag(get("decided")), vote_gate_reason=get("reason"),
                   vote_gate_agreement=get("agreement"), vote_gate_tau=get("tau"),
                   vote_gate_aggregator=get("aggregator"))


def _cost_gate(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    columns["cost_gate_phase"] = d.get("phase")


def _completed(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    result = d.get("result") or {}
    columns.update(status=d.get("status"), completed_at=iso(ts), **result_summary(result))
    # the consultation's savings are its result's token_efficiency_stats (every call after the synthesis, as sent
    # and as it would have been unfiltered); filters_applied keeps what each filter removed from each artifact
    saved = (result.get("token_efficiency_stats") or {}).get("tokens_saved_via_filtering")
    used = (result.get("token_efficiency_stats") or {}).get("tokens_used")
    if isinstance(saved, int) and isinstance(used, int):
        columns.update(filter_tokens_before=used + saved, filter_tokens_saved=saved)
    ended, context = result.get("exit") or {}, result.get("context") or {}
    if ended or context:
        columns.update(exit_reason=ended.get("reason"), cross_exam_rounds=ended.get("cross_exam_rounds"),
                       round_cap=ended.get("round_cap"), context_tokens=context.get("tokens"),
                       context_tokens_unsummarized=context.get("tokens_unsummarized"),
                       context_saved=context.get("saved"))
    for row in context.get("rounds") or []:
        b.rows["context_rounds"].append((cid, row.get("round_number"), row.get("calls"), row.get("tokens"),
                                         row.get("tokens_unsummarized"), _flag(row.get("summarized"))))


def _exit_evaluated(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    found = d.get("consensus") or {}
    b.rows["exit_decisions"].append((
        cid, d.get("round_number"), d.get("reason"), d.get("action"), found.get("share"),
        len(found.get("blockers") or []), found.get("min_confidence"), d.get("change"), d.get("new_facts"),
        _flag(d.get("plateau")), _flag(d.get("overridden")), _json(d.get("votes")),
    ))


def _resumed(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    columns.update(status="running", resumed_at=iso(ts))


def _quality_checks(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    number, agent = d.get("round_number"), d.get("agent")
    if "rules" in d:  # an agent's artifact was checked (the judge's answers come alone, with ``judged_in``)
        rules = d.get("rules") or []
        b.rows["claim_checks"].append((
            cid, number, agent, d.get("anchor"), d.get("claim_source"), d.get("labelled"), d.get("unlabelled"),
            d.get("facts"), d.get("facts_cited"), len(rules), _json(rules),
        ))
    for result in d.get("verification") or []:
        b.rows["verification"].append((
            cid, number, agent, result.get("question_id"), _flag(result.get("passed")), result.get("by"),
        ))


def _debate_state(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    """The latest state wins: every claim and piece of evidence is upserted under its stable id (and within a
    batch, only its latest state becomes a row: see :attr:`Batch.claims`)."""
    state = d.get("state") or {}
    claims, evidence = b.latest_claims, b.latest_evidence
    for c in state.get("claims") or []:
        claims[(cid, c.get("id"))] = c  # (both tables are WITHOUT ROWID: the order rows go in leaves no trace)
    for e in state.get("evidence") or []:
        evidence[(cid, e.get("id"))] = e


def _claim_row(cid: str, c: dict[str, Any]) -> tuple[Any, ...]:
    return (cid, c.get("id"), c.get("agent"), c.get("label"), c.get("status"), c.get("text"),
            c.get("introduced_round"), c.get("last_updated_round"), _json(c.get("support")),
            _json(c.get("opposition")), c.get("status_reason"))


def _evidence_row(cid: str, e: dict[str, Any]) -> tuple[Any, ...]:
    return (cid, e.get("id"), e.get("kind"), e.get("title"), e.get("url"), e.get("gist"), e.get("agent"),
            e.get("added_round"), _json(e.get("supports")))


def _coverage(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    """One row per synthesis: a re-run of its round replaces the whole row."""
    misses = d.get("violations") or []
    b.rows["synthesis_coverage"].append((
        cid, d.get("round_number"), d.get("claims"), d.get("agents"),
        sum(1 for v in misses if v.get("rule") == "claim_unaccounted"),
        sum(1 for v in misses if v.get("rule") == "position_unaccounted"), _json(misses),
    ))


def _safety_checked(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    get = d.get
    evaluation = get("evaluation") or {}
    block = get("block") or {}
    triggers = get("triggers") or []
    b.rows["safety_checks"].append((
        cid, seq, get("round_number"), get("round_type"), get("stage"), get("tier"), get("tier_name"),
        get("responses"), get("tier1_ms"), _json(get("flags") or []), _json(triggers),
        ",".join(sorted({str(t.get("kind")) for t in triggers if isinstance(t, dict)})) or None,
        int(evaluation.get("status") == "evaluated") if evaluation else 0, evaluation.get("verdict"),
        evaluation.get("risk"), _flag(get("concern")), _flag(get("passed")), _flag(get("blocked")),
        _flag(get("would_block")), block.get("tier"), block.get("category"), block.get("reason"),
    ))


def _groupthink_check(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.rows["groupthink_checks"].append((
        cid, seq, d.get("round_number"), d.get("detector"), _flag(d.get("fired")), d.get("stage"), d.get("action"),
        _flag(d.get("acted")), d.get("not_acted_because"), d.get("why"), _json(d.get("figures")),
    ))


def _objection_outcome(b: Batch, columns: dict[str, Any], cid: str, seq: int, ts: float, d: dict[str, Any]) -> None:
    b.rows["objection_rounds"].append((
        cid, d.get("round_number"), _json(d.get("trigger")), len(d.get("new_claims") or []),
        len(d.get("status_changes") or []), _flag(d.get("produced_new")), _flag(d.get("escalated")),
        _flag(d.get("continued")), _json({k: d.get(k) for k in ("new_claims", "restated_claims", "status_changes")}),
    ))


def groupthink_columns(result: dict[str, Any]) -> dict[str, Any]:
    """The consultation columns of the groupthink record: stage, firings, objection rounds, escalation (null for
    results written before the detectors existed)."""
    groupthink = (result.get("quality") or {}).get("groupthink")
    if not isinstance(groupthink, dict):
        return {}
    figures = groupthink.get("figures") or {}
    return {
        "quality_stage": groupthink.get("stage"),
        "groupthink_firings": sum((figures.get("firings") or {}).values()),
        "objection_rounds": figures.get("objection_rounds"),
        "objection_status_changes": figures.get("objection_rounds_changed_status"),
        "escalated": _flag(result.get("escalated")),
    }


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
    safety = result.get("safety") if isinstance(result.get("safety"), dict) else {}
    assert isinstance(safety, dict)
    block = safety.get("block") if isinstance(safety.get("block"), dict) else {}
    assert isinstance(block, dict)
    return {
        "safety_tier": safety.get("tier_reached"),
        "safety_blocked": _flag(safety.get("blocked")) if safety.get("enabled") else None,
        "safety_would_block": _flag(safety.get("would_block")) if safety.get("enabled") else None,
        "safety_reason": block.get("reason"),
        "label_adoption": figures.get("label_adoption"),
        "citation_compliance": figures.get("citation_compliance"),
        "rule_violations": sum((figures.get("rule_violations") or {}).values()) if figures else None,
        "verification_pass_rate": round(sum(passes) / len(passes), 4) if passes else None,
        "ungrounded_statements": figures.get("ungrounded_statements"),
        "recommendation": recommendation if isinstance(recommendation, str) else _json(recommendation),
        "confidence": pick("confidence"),
        "dissent_count": len(dissent) if isinstance(dissent, list) else None,
        "duration_s": duration,
        **groupthink_columns(result),
    }


_HANDLERS: dict[str, Handler] = {
    ev.CONSULTATION_STARTED: _started,
    ev.STATE_TRANSITION: _transition,
    ev.COST_ESTIMATED: _cost_estimated,
    ev.USER_CONSENT: _consent,
    ev.ROUND_STARTED: _round_started,
    ev.ROUND_COMPLETED: _round_completed,
    ev.ROUND_INTERRUPTED: _round_interrupted,
    ev.PROVIDER_ATTEMPT: _attempt,
    ev.PROVIDER_SUBSTITUTED: _substituted,
    ev.AGENT_COMPLETED: _agent_completed,
    ev.ROUND_ARTIFACT: _artifact,
    ev.FILTER_APPLIED: _filter_applied,
    ev.EARLY_TERMINATION: _early_termination,
    ev.VOTE_GATE: _vote_gate,
    ev.COST_GATE_TRIGGERED: _cost_gate,
    ev.CONSULTATION_COMPLETED: _completed,
    RESUMED: _resumed,
    ev.QUALITY_CHECKS: _quality_checks,
    ev.DEBATE_STATE: _debate_state,
    ev.COVERAGE: _coverage,
    ev.SAFETY_CHECKED: _safety_checked,
    ev.EXIT_EVALUATED: _exit_evaluated,
    ev.GROUPTHINK_CHECK: _groupthink_check,
    ev.OBJECTION_OUTCOME: _objection_outcome,
}
