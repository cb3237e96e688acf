"""The index schema, as versioned sqlite-utils migrations. Add a new migration for every change; never edit one.

Every child table is keyed by (consultation_id, seq) — the journal position of the record it came from — so
live indexing and ``index rebuild`` produce identical rows whatever order consultations interleave in.
"""

from __future__ import annotations

import json
from typing import Any

from sqlite_utils import Migrations

from conclave.store.artifact_gist import gist
from conclave.store.index_reader import MIGRATION_SET
from conclave.store.rollups import (
    CONSULTATION_FIGURES,
    DISSENT_FIGURES,
    FILTER_FIGURES,
    FILTER_KEYS,
    FLOAT_FIGURES,
    MODEL_FIGURES,
    PROVIDER_FIGURES,
    VERIFICATION_FIGURES,
    refresh_all_days,
)

migrations = Migrations(MIGRATION_SET)

#: migrations that rewrite whole tables of an existing index: seconds at 10,000 consultations (on a 190 MB index
#: written before m028, on a loaded machine: m028 0.5-0.8 s, m029 1.6-2.4 s, the commit 0.6 s), ten times that
#: at 100,000; and those that read whole tables to build a rollup or index (m031-m033: 4.3 s on a 100k index)
REWRITING = ("m023_artifact_gist", "m024_verification_counted", "m026_gist_without_row_fields",
             "m028_model_and_verification_rollups", "m029_child_tables_in_key_order", "m031_filter_rollup",
             "m032_page_counts", "m033_early_termination_decisions", "m034_dissent_rollup")
#: from this many bytes in use (about 3,500 consultations written before m028, about a second of rewriting), an
#: upgrade that rewrites tables says so before it starts; a smaller or new index is upgraded silently
NOTICE_BYTES = 64 * 1024 * 1024


def page_bytes(db: Any) -> tuple[int, int]:
    """The index's bytes in use, and in free pages (which VACUUM gives back to the disk)."""
    (pages,) = db.execute("pragma page_count").fetchone()
    (free,) = db.execute("pragma freelist_count").fetchone()
    (page_size,) = db.execute("pragma page_size").fetchone()
    return int((pages - free) * page_size), int(free * page_size)


def upgrade_notice(db: Any) -> str | None:
    """The line to show before applying the pending migrations, when they rewrite tables of a big index."""
    rewriting = [m.name.split("_", 1)[0] for m in migrations.pending(db) if m.name in REWRITING]
    if not rewriting or page_bytes(db)[0] < NOTICE_BYTES:
        return None
    return f"conclave: upgrading the index ({', '.join(rewriting)}, one time) …"


@migrations()
def m001_core_tables(db: Any) -> None:
    db["config_snapshots"].create({"config_hash": str, "config": str}, pk="config_hash")
    db["consultations"].create(
        {
            "id": str, "question": str, "mode": str, "strategy": str, "status": str, "state": str,
            "started_at": str, "completed_at": str, "resumed_at": str, "duration_s": float,
            "planned_rounds": int, "rounds_completed": int, "agent_count": int,
            "judge_provider": str, "judge_model": str,
            "recommendation": str, "confidence": float, "dissent_count": int,
            "estimated_cost": float, "consent_approved": int, "consent_auto": int,
            "total_cost": float, "input_tokens": int, "output_tokens": int, "total_tokens": int,
            "calls": int, "failed_calls": int, "hedged_calls": int, "unknown_cost_calls": int,
            "substitutions": int, "filter_tokens_before": int, "filter_tokens_saved": int,
            "early_termination_offered": int, "early_terminated": int, "early_termination_confidence": float,
            "early_termination_threshold": float, "rounds_skipped": int, "cost_saved": float,
            "cost_gate_phase": str, "config_hash": str, "prompt_versions": str, "conclave_version": str,
            "shuffle_seed": int, "secrets_scrubbed": int,
        },
        pk="id",
        foreign_keys=[("config_hash", "config_snapshots", "config_hash")],
    )
    fk = [("consultation_id", "consultations", "id")]
    db["agents"].create(
        {"consultation_id": str, "agent": str, "persona": str, "provider": str, "model": str, "label": str},
        pk=("consultation_id", "agent"), foreign_keys=fk,
    )
    db["rounds"].create(
        {
            "consultation_id": str, "round_number": int, "round_type": str, "started_at": str,
            "completed_at": str, "duration_s": float, "input_tokens": int, "output_tokens": int, "cost": float,
        },
        pk=("consultation_id", "round_number"), foreign_keys=fk,
    )
    db["agent_rounds"].create(
        {
            "consultation_id": str, "round_number": int, "agent": str, "ok": int, "duration_s": float,
            "input_tokens": int, "output_tokens": int, "cost": float, "error": str,
        },
        pk=("consultation_id", "round_number", "agent"), foreign_keys=fk,
    )
    db["calls"].create(
        {
            "consultation_id": str, "seq": int, "round_number": int, "agent": str, "provider": str, "model": str,
            "attempt": int, "started_at": str, "latency_s": float, "outcome": str, "status": int, "error": str,
            "hedge": int, "input_tokens": int, "output_tokens": int, "cached_input_tokens": int, "cost": float,
        },
        pk=("consultation_id", "seq"), foreign_keys=fk,
    )
    db["artifacts"].create(
        {
            "consultation_id": str, "seq": int, "round_number": int, "artifact_type": str, "schema": str,
            "agent": str, "status": str, "artifact": str, "raw_chars": int,
        },
        pk=("consultation_id", "seq"), foreign_keys=fk,
    )
    db["transitions"].create(
        {"consultation_id": str, "seq": int, "at": str, "from_state": str, "to_state": str, "reason": str},
        pk=("consultation_id", "seq"), foreign_keys=fk,
    )
    db["filters_applied"].create(
        {
            "consultation_id": str, "seq": int, "round_number": int, "artifact_type": str, "filter": str,
            "limits": str, "tokens_before": int, "tokens_after": int, "tokens_saved": int,
        },
        pk=("consultation_id", "seq"), foreign_keys=fk,
    )
    db["substitutions"].create(
        {
            "consultation_id": str, "seq": int, "round_number": int, "agent": str, "original_provider": str,
            "original_model": str, "substitute_provider": str, "substitute_model": str, "reason": str,
        },
        pk=("consultation_id", "seq"), foreign_keys=fk,
    )


@migrations()
def m002_search(db: Any) -> None:
    db["consultations"].enable_fts(["question", "recommendation"], tokenize="porter")
    # Our own triggers, not sqlite-utils' create_triggers: theirs re-index on *any* update, and every batch
    # updates each consultation's totals; these fire only when the searched columns change.
    db.executescript("""
        CREATE TRIGGER consultations_fts_insert AFTER INSERT ON consultations BEGIN
          INSERT INTO consultations_fts (rowid, question, recommendation)
          VALUES (new.rowid, new.question, new.recommendation);
        END;
        CREATE TRIGGER consultations_fts_delete AFTER DELETE ON consultations BEGIN
          INSERT INTO consultations_fts (consultations_fts, rowid, question, recommendation)
          VALUES ('delete', old.rowid, old.question, old.recommendation);
        END;
        CREATE TRIGGER consultations_fts_update AFTER UPDATE OF question, recommendation ON consultations BEGIN
          INSERT INTO consultations_fts (consultations_fts, rowid, question, recommendation)
          VALUES ('delete', old.rowid, old.question, old.recommendation);
          INSERT INTO consultations_fts (rowid, question, recommendation)
          VALUES (new.rowid, new.question, new.recommendation);
        END;
    """)


@migrations()
def m003_views(db: Any) -> None:
    for name, sql in VIEWS.items():
        db.create_view(name, sql, replace=True)


VIEWS = {
    "run_summary": """
select c.id, c.started_at, c.status, c.mode, c.question, c.recommendation, c.confidence, c.dissent_count,
       c.total_cost, c.total_tokens, c.duration_s, c.agent_count, c.rounds_completed, c.planned_rounds,
       c.early_terminated, c.substitutions, c.failed_calls, c.filter_tokens_saved
from consultations c
""",
    # Every call, grouped: read in the table's own order and sorted (the unary + keeps SQLite from walking the
    # (provider, model) index instead, which fetches each row from wherever it lies: 1 s cold at 10k).
    # Summed from the model_daily rollup (m028), a few rows a day, not from every call of history.
    "cost_by_provider": """
select provider, model, sum(calls) as calls, sum(ok_calls) as ok_calls, sum(failed_calls) as failed_calls,
       sum(hedged_calls) as hedged_calls, sum(input_tokens) as input_tokens, sum(output_tokens) as output_tokens,
       round(total(cost), 6) as cost, round(total(latency_s) / sum(timed_calls), 3) as avg_latency_s
from model_daily group by provider, model
""",
    # The latest verdict of each consultation (a resumed round 4 may have produced an earlier one), read from the
    # verdicts' own index (m025): SQLite would rather find them by artifact type and read each from the table.
    "dissent_log": """
select a.consultation_id, c.started_at, c.question, c.mode,
       json_extract(d.value, '$.agent') as agent,
       json_extract(d.value, '$.concern') as concern,
       json_extract(d.value, '$.severity') as severity
from artifacts a indexed by artifacts_verdicts
join consultations c on c.id = a.consultation_id
join json_each(a.artifact, '$.dissent') d
where a.artifact_type = 'verdict'
  and a.seq = (select max(seq) from artifacts v indexed by artifacts_verdicts
               where v.consultation_id = a.consultation_id and v.artifact_type = 'verdict')
""",
    "early_terminations": """
select id, started_at, question, mode, early_termination_confidence as confidence,
       early_termination_threshold as threshold, rounds_skipped, cost_saved, total_cost, status
from consultations where early_terminated = 1
""",
}


@migrations()
def m004_stats(db: Any) -> None:
    # `conclave stats` reads daily rollups (see rollups.py); medians walk a sorted index to its middle (all time)
    # or sort one period's values: it never scans every consultation or call.

    def columns(figures: dict[str, str]) -> dict[str, type]:
        return {name: float if name in FLOAT_FIGURES else int for name in figures}

    db["consultation_daily"].create({"day": str, "mode": str, "status": str, **columns(CONSULTATION_FIGURES)},
                                    pk=("day", "mode", "status"))
    db["provider_daily"].create({"day": str, "provider": str, **columns(PROVIDER_FIGURES)}, pk=("day", "provider"))
    # covers the values whose medians a period needs, so reading them never touches the table
    db["consultations"].create_index(["started_at", "mode", "total_cost", "duration_s"],
                                     index_name="consultations_by_start")
    db["consultations"].create_index(["total_cost"])
    db["consultations"].create_index(["duration_s"])
    db["consultations"].create_index(["mode", "total_cost"])
    db["calls"].create_index(["provider", "model"])
    db["artifacts"].create_index(["artifact_type"])


@migrations()
def m005_origin(db: Any) -> None:
    # Which door started a consultation (``mcp``; null for the CLI and the library) and, over MCP, the client.
    db["consultations"].add_column("origin", str)
    db["consultations"].add_column("client_name", str)


@migrations()
def m006_round_status(db: Any) -> None:
    # How each round's last run ended: running | ok | failed | interrupted | superseded (see indexer.py), and
    # why an interrupted one was (cancelled | stopped | error). Rows indexed before can only tell whether the
    # round completed; `conclave index rebuild` recomputes them from the journal.
    db["rounds"].add_column("status", str)
    db["rounds"].add_column("end_reason", str)
    db.execute("update rounds set status = case when completed_at is null then 'running' else 'ok' end")
    # Snapshots are keyed by config_hash, which leaves out the question and the data home: so do they now.
    db.execute("update config_snapshots set config = json_remove(config, '$.question', '$.home')")


@migrations()
def m007_eval_results(db: Any) -> None:
    # `conclave eval`: one row per evaluation run and per item of a run. The files under $CONCLAVE_HOME/eval/ are
    # the source of truth; `conclave index rebuild` refills these tables from them.
    protocols = ("single", "vote", "judge", "debate")
    per_protocol_run: dict[str, type] = {}
    for name in protocols:
        per_protocol_run.update({f"{name}_accuracy": float, f"{name}_ci_low": float, f"{name}_ci_high": float,
                                 f"{name}_cost": float, f"{name}_tokens": int, f"{name}_wall_s": float})
    db["eval_runs"].create(
        {
            "run_id": str, "sweep_id": str, "set_spec": str, "seed": int, "items": int, "items_done": int,
            "items_failed": int, "status": str, "started_at": str, "completed_at": str, "mode": str,
            "panel": str, "judge": str, "overrides": str, "swept": str, "config_hash": str,
            "estimated_cost": float, "total_cost": float, "total_tokens": int, "wall_s": float,
            **per_protocol_run,
            "oracle_gap": int, "right_to_wrong": int, "wrong_to_right": int, "early_terminated": int,
            "debate_vs_vote_pp": float, "debate_vs_vote_p": float, "debate_vs_vote_cost_ratio": float,
            "verdict_brier": float, "verdict_ece": float, "agreement_brier": float, "agreement_ece": float,
            "summary": str,
        },
        pk="run_id",
    )
    per_protocol_item: dict[str, type] = {}
    for name in protocols:
        per_protocol_item.update({f"{name}_answer": str, f"{name}_correct": int, f"{name}_confidence": float,
                                  f"{name}_cost": float, f"{name}_tokens": int, f"{name}_wall_s": float})
    db["eval_items"].create(
        {
            "run_id": str, "item_id": str, "consultation_id": str, "status": str, "kind": str, "question": str,
            "expected": str, **per_protocol_item,
            "agreement": float, "agreement_confidence": float, "oracle": int, "oracle_gap": int,
            "right_to_wrong": int, "wrong_to_right": int, "early_terminated": int, "rounds_completed": int,
            "answers": str,
        },
        pk=("run_id", "item_id"),
        foreign_keys=[("run_id", "eval_runs", "run_id"), ("consultation_id", "consultations", "id")],
    )
    db["eval_items"].create_index(["consultation_id"])
    db["eval_runs"].create_index(["sweep_id"])


@migrations()
def m008_quality_claims_evidence_checks(db: Any) -> None:
    # The debate-quality layer: the latest debate state's claims and evidence, citation-rule and verification
    # results per agent and round, each agent's perspective anchor, and the consultation's quality figures.
    fk = [("consultation_id", "consultations", "id")]
    db["claims"].create(
        {
            "consultation_id": str, "claim_id": str, "agent": str, "label": str, "status": str, "text": str,
            "introduced_round": int, "last_updated_round": int, "support": str, "opposition": str,
            "status_reason": str,
        },
        pk=("consultation_id", "claim_id"), foreign_keys=fk,
    )
    db["evidence"].create(
        {
            "consultation_id": str, "evidence_id": str, "kind": str, "title": str, "url": str, "gist": str,
            "agent": str, "added_round": int, "supports": str,
        },
        pk=("consultation_id", "evidence_id"), foreign_keys=fk,
    )
    db["claim_checks"].create(
        {
            "consultation_id": str, "round_number": int, "agent": str, "anchor": str, "claim_source": str,
            "labelled": int, "unlabelled": int, "facts": int, "facts_cited": int, "violations": int,
            "rules": str,
        },
        pk=("consultation_id", "round_number", "agent"), foreign_keys=fk,
    )
    db["verification"].create(
        {
            "consultation_id": str, "round_number": int, "agent": str, "question_id": str, "passed": int,
            "reason": str, "answered_by": str,
        },
        pk=("consultation_id", "round_number", "agent", "question_id"), foreign_keys=fk,
    )
    db["verification"].create_index(["question_id", "passed"])
    db["agents"].add_column("anchor", str)
    for column, kind in (("label_adoption", float), ("citation_compliance", float), ("rule_violations", int),
                         ("verification_pass_rate", float), ("ungrounded_statements", int)):
        db["consultations"].add_column(column, kind)


@migrations()
def m010_quality_groupthink(db: Any) -> None:
    # The groupthink detectors: every check (fired or not, the stage, what was done), every critical objection
    # round's outcome, and per consultation the rollout stage, firings, objection rounds and escalation.
    fk = [("consultation_id", "consultations", "id")]
    db["groupthink_checks"].create(
        {
            "consultation_id": str, "seq": int, "round_number": int, "detector": str, "fired": int, "stage": str,
            "action": str, "acted": int, "not_acted_because": str, "why": str, "figures": str,
        },
        pk=("consultation_id", "round_number", "detector"), foreign_keys=fk,  # a resumed run checks again: one row
    )
    db["groupthink_checks"].create_index(["detector", "fired"])
    db["objection_rounds"].create(
        {
            "consultation_id": str, "round_number": int, "trigger": str, "new_claims": int,
            "status_changes": int, "produced_new": int, "escalated": int, "continued": int, "detail": str,
        },
        pk=("consultation_id", "round_number"), foreign_keys=fk,
    )
    for column, kind in (("quality_stage", str), ("groupthink_firings", int), ("objection_rounds", int),
                         ("objection_status_changes", int), ("escalated", int)):
        db["consultations"].add_column(column, kind)


@migrations()
def m011_store_exit_and_context(db: Any) -> None:
    # The exit controller and progressive summarization: why each debate ended and how many rounds it played, each
    # cross-examination round's exit decision, and the context tokens of every round with and without summaries.
    fk = [("consultation_id", "consultations", "id")]
    for column, kind in (("exit_reason", str), ("cross_exam_rounds", int), ("round_cap", int),
                         ("context_tokens", int), ("context_tokens_unsummarized", int), ("context_saved", float)):
        db["consultations"].add_column(column, kind)
    db["exit_decisions"].create(
        {
            "consultation_id": str, "round_number": int, "reason": str, "action": str, "vote_share": float,
            "blockers": int, "min_confidence": float, "change": float, "new_facts": int, "plateau": int,
            "overridden": int, "votes": str,
        },
        pk=("consultation_id", "round_number"), foreign_keys=fk,
    )
    db["context_rounds"].create(
        {
            "consultation_id": str, "round_number": int, "calls": int, "tokens": int, "tokens_unsummarized": int,
            "summarized": int,
        },
        pk=("consultation_id", "round_number"), foreign_keys=fk,
    )
    db["consultations"].create_index(["exit_reason"])


@migrations()
def m012_safety_checks(db: Any) -> None:
    # The safety evaluator: one row per screening (the question before round 1 is round 0; then every step), the
    # tier each round's checks reached, and per consultation the tier reached, whether it was blocked and why.
    db["safety_checks"].create(
        {
            "consultation_id": str, "seq": int, "round_number": int, "round_type": str, "stage": str, "tier": int,
            "tier_name": str, "responses": int, "tier1_ms": float, "flags": str, "triggers": str,
            "trigger_kinds": str, "evaluated": int, "verdict": str, "risk": float, "concern": int, "passed": int,
            "blocked": int, "would_block": int, "block_tier": int, "block_category": str, "reason": str,
        },
        pk=("consultation_id", "seq"), foreign_keys=[("consultation_id", "consultations", "id")],
    )
    db["safety_checks"].create_index(["blocked"])
    db["rounds"].add_column("safety_tier", int)
    for column, kind in (("safety_tier", int), ("safety_blocked", int), ("safety_would_block", int),
                         ("safety_reason", str)):
        db["consultations"].add_column(column, kind)


@migrations()
def m013_providers_cache_tokens(db: Any) -> None:
    # Prompt caching: each call's cache writes beside its cached reads, and both summed per provider and day for
    # `conclave stats`. An index whose daily rollup does not exist yet gets it with these columns; on an existing
    # index the days are recomputed from the calls.
    db["calls"].add_column("cache_write_tokens", int)
    if not db["provider_daily"].exists():
        return
    for column in ("cached_input_tokens", "cache_write_tokens"):
        if column not in db["provider_daily"].columns_dict:
            db["provider_daily"].add_column(column, int)

    refresh_all_days(db.conn)


@migrations()
def m015_views_synthesis_coverage(db: Any) -> None:
    """What each synthesis left unaccounted: round-1 claims named in no section, agents appearing in none."""
    db["synthesis_coverage"].create(
        {
            "consultation_id": str, "round_number": int, "claims": int, "agents": int, "claims_unaccounted": int,
            "positions_unaccounted": int, "violations": str,
        },
        pk=("consultation_id", "round_number"), foreign_keys=[("consultation_id", "consultations", "id")],
    )


@migrations()
def m016_eval_quality_protocol(db: Any) -> None:
    # `conclave eval`'s quality protocol (the debate with the quality layer on, forked from the item's round 1),
    # the quality layer's figures per protocol (JSON: protocol -> claims, violations, ungrounded, …), and the
    # vote at the debate's budget (self-consistency over extra round-1 samples).
    for column, kind in (("quality_answer", str), ("quality_correct", int), ("quality_confidence", float),
                         ("quality_cost", float), ("quality_tokens", int), ("quality_wall_s", float),
                         ("quality_consultation_id", str), ("quality_reused_round_1", int),
                         ("quality_right_to_wrong", int), ("quality_layer", str),
                         ("vote_matched_answer", str), ("vote_matched_correct", int),
                         ("vote_matched_confidence", float), ("vote_matched_cost", float),
                         ("vote_matched_tokens", int), ("vote_matched_wall_s", float),
                         ("vote_matched_samples", int)):
        db["eval_items"].add_column(column, kind)
    for column, kind in (("quality_accuracy", float), ("quality_ci_low", float), ("quality_ci_high", float),
                         ("quality_cost", float), ("quality_tokens", int), ("quality_wall_s", float),
                         ("quality_vs_debate_pp", float), ("quality_vs_debate_p", float),
                         ("quality_vs_debate_cost_ratio", float), ("quality_overrides", str), ("quality_off", str),
                         ("quality_layer", str), ("vote_matched_accuracy", float), ("vote_matched_ci_low", float),
                         ("vote_matched_ci_high", float), ("vote_matched_cost", float), ("vote_matched_tokens", int),
                         ("vote_matched_wall_s", float), ("debate_vs_vote_matched_pp", float),
                         ("debate_vs_vote_matched_p", float), ("debate_vs_vote_matched_cost_ratio", float)):
        db["eval_runs"].add_column(column, kind)


@migrations()
def m017_running_rounds(db: Any) -> None:
    # The rounds still ``running``, by consultation: what ``settle_killed_rounds`` (index.py) looks up on every
    # ``logs list`` and ``index rebuild``; a partial index holds only those rows, so it stays small and cheap.
    db.execute("create index if not exists rounds_running on rounds (consultation_id) where status = 'running'")


@migrations()
def m018_vote_gate(db: Any) -> None:
    # The vote gate after round 1 (selective debate): whether the aggregated round-1 answer decided, why, the
    # weighted agreement, tau and the aggregator that weighed the answers.
    for column, kind in (("vote_gate_decided", int), ("vote_gate_reason", str), ("vote_gate_agreement", float),
                         ("vote_gate_tau", float), ("vote_gate_aggregator", str)):
        db["consultations"].add_column(column, kind)
    # `conclave eval`'s protocols read from the same round-1 answers: the confidence-weighted and learned-weight
    # votes and the judge's pick of the best round-1 answer
    for name in ("vote_weighted", "vote_learned", "judge_pick", "sc_best"):
        for column, kind in (("answer", str), ("correct", int), ("confidence", float), ("cost", float),
                             ("tokens", int), ("wall_s", float)):
            db["eval_items"].add_column(f"{name}_{column}", kind)
        for column, kind in (("accuracy", float), ("ci_low", float), ("ci_high", float), ("cost", float),
                             ("tokens", int), ("wall_s", float)):
            db["eval_runs"].add_column(f"{name}_{column}", kind)


@migrations()
def m019_followup_parent(db: Any) -> None:
    # A follow-up question (``parent=ID``) is a consultation of its own linked to the one it continues; the index
    # finds a consultation's children by this column (``logs show`` and Datasette's thread).
    db["consultations"].add_column("parent_id", str)
    db.execute("create index if not exists consultations_parent on consultations (parent_id)")


@migrations()
def m020_calls_by_start(db: Any) -> None:
    # The calls table page sorts by started_at, newest first (datasette_metadata.yaml): at 100k consultations
    # (over a million calls) that is a walk down this index instead of a sort of the whole table.
    db.execute("create index if not exists calls_by_start on calls (started_at)")


@migrations()
def m021_dashboard_covering(db: Any) -> None:
    # The dashboard's totals and charts (datasette_plugin, the canned queries it draws) aggregate every
    # consultation: each reads one of these narrow indexes instead of the wide rows (questions, verdicts), so a
    # cold index of 100k consultations answers within Datasette's time limit. Spending per provider reads the
    # provider_daily rollup (calls are ten times as many rows).
    for name, columns in (
        ("consultations_spending", "started_at, total_cost, total_tokens"),
        ("consultations_totals", "total_cost, total_tokens, early_terminated, cost_saved, filter_tokens_saved"),
        ("consultations_confidence", "confidence"),
        ("consultations_stopped_early", "early_terminated, started_at, rounds_skipped, cost_saved"),
    ):
        db.execute(f"create index if not exists {name} on consultations ({columns})")
    db.execute("create index if not exists filters_saved on filters_applied "
               "(filter, round_number, tokens_before, tokens_saved)")


@migrations()
def m022_verification_covering(db: Any) -> None:
    # The verification_pass_rate canned query groups every answered check by question and answerer (some 45
    # rows a consultation): read in this index's order, it needs neither the table nor a sort.
    db.execute("create index if not exists verification_pass_rate on verification "
               "(question_id, answered_by, passed)")


def _gist_text(text: str | None) -> str | None:
    """The gist of an artifact stored as JSON text (text that is not JSON is kept as is)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return json.dumps(gist(value), sort_keys=True, ensure_ascii=False)


@migrations()
def m023_artifact_gist(db: Any) -> None:
    # The index keeps each artifact's gist (artifact_gist.py), not its full text, which stays in the journal: an
    # index written before keeps its full artifacts until this rewrites them. The file keeps its size until
    # VACUUM (or `conclave index rebuild`, which writes a new one).
    db.conn.create_function("conclave_artifact_gist", 1, _gist_text, deterministic=True)
    db.execute("update artifacts set artifact = conclave_artifact_gist(artifact) where artifact is not null")


@migrations()
def m024_verification_counted(db: Any) -> None:
    # The index keeps of each verification check what is counted (question, answerer, passed; 33 rows a
    # consultation): its reason, a sentence for whoever reads that one consultation, stays in the journal and the
    # transcript (it was a third of the table). The (question_id, passed) index served no query that the primary
    # key (a period's checks) and m022's covering index (pass rates by question and answerer) do not. The rows
    # are stored in their key's order (WITHOUT ROWID), so the key is not kept a second time in an index of its
    # own: 3.6 KB a consultation at 10k after the cuts above, 2.8 KB with this.
    db.execute("drop index if exists idx_verification_question_id_passed")
    others = [sql for (sql,) in db.execute(
        "select sql from sqlite_master where type = 'index' and tbl_name = 'verification' and sql is not null")]
    # Copied out and back rather than renamed: a rename re-checks every view, and dissent_log names an index
    # (m025) that a new index does not have yet.
    columns = "consultation_id, round_number, agent, question_id, passed, answered_by"
    db.execute(f"create temp table verification_copy as select {columns} from verification")
    db.execute("drop table verification")
    db.execute("""
        create table verification (
          consultation_id text references consultations (id), round_number integer, agent text,
          question_id text, passed integer, answered_by text,
          primary key (consultation_id, round_number, agent, question_id)
        ) without rowid""")
    db.execute(f"insert into verification select {columns} from temp.verification_copy")
    db.execute("drop table temp.verification_copy")
    for sql in others:  # m022's covering index, on an index that has it
        db.execute(sql)


@migrations()
def m025_dissent_and_cost_reads(db: Any) -> None:
    # dissent_log (and the dissent_by_agent query over it) reads each consultation's latest verdict: this partial
    # index holds the verdicts' gists (a few hundred bytes a consultation), so neither the view nor its latest-
    # verdict lookup reads the artifact rows of history (cold at 10k: 2.2 s, past Datasette's limit). Both views
    # are created again as VIEWS now defines them.
    db.execute("create index if not exists artifacts_verdicts on artifacts "
               "(consultation_id, seq, artifact_type, artifact) where artifact_type = 'verdict'")
    for name in ("dissent_log", "cost_by_provider"):
        db.create_view(name, VIEWS[name], replace=True)


@migrations()
def m026_gist_without_row_fields(db: Any) -> None:
    # The gist leaves out what the artifact's row says in its own columns (artifact_gist.ON_THE_ROW): an index
    # written before has its gists cut again, as m023 cut the full texts (the gist of a gist is the gist).
    db.conn.create_function("conclave_artifact_gist", 1, _gist_text, deterministic=True)
    db.execute("update artifacts set artifact = conclave_artifact_gist(artifact) where artifact is not null")


@migrations()
def m027_groupthink_order(db: Any) -> None:
    # The groupthink canned query lists consultations escalated first, then by firings, newest first: walked in
    # this index's order, Datasette's first thousand rows are read and counted, not every consultation sorted
    # (1.3 s cold at 10k).
    db.execute("create index if not exists consultations_groupthink on consultations "
               "(escalated desc, groupthink_firings desc, started_at desc)")


@migrations()
def m028_model_and_verification_rollups(db: Any) -> None:
    # Two more daily rollups (rollups.py), kept as consultations are indexed: calls per provider and model, which
    # the cost_by_provider view sums (it grouped every call of history: 0.6 s cold at 10k), and answered
    # verification checks per question and answerer, which the verification_pass_rate query sums. That query no
    # longer needs m022's covering index, a second copy of the verification table (1.4 KB a consultation).
    def columns(figures: dict[str, str]) -> dict[str, type]:
        return {name: float if name in FLOAT_FIGURES else int for name in figures}

    db["model_daily"].create({"day": str, "provider": str, "model": str, **columns(MODEL_FIGURES)},
                             pk=("day", "provider", "model"), if_not_exists=True)
    db["verification_daily"].create({"day": str, "question_id": str, "answered_by": str,
                                     **columns(VERIFICATION_FIGURES)},
                                    pk=("day", "question_id", "answered_by"), if_not_exists=True)
    db.execute("drop index if exists verification_pass_rate")
    db.create_view("cost_by_provider", VIEWS["cost_by_provider"], replace=True)
    refresh_all_days(db.conn)


#: child tables m029 stores in their key's order: none is read by rowid, and each is smaller so (its other
#: indexes, which then hold the key instead of the rowid, grow by less than the key's own index took)
KEY_ORDERED = ("agent_rounds", "claim_checks", "transitions", "claims", "context_rounds", "synthesis_coverage",
               "evidence", "exit_decisions", "rounds", "artifacts", "filters_applied", "safety_checks",
               "groupthink_checks")


@migrations()
def m029_child_tables_in_key_order(db: Any) -> None:
    # Each of these child tables, keyed by (consultation_id, ...), kept its key a second time in the primary key's
    # own index (1.8 KB of a consultation's 17 KB at 10k): stored WITHOUT ROWID, the rows are the key's b-tree, as
    # m024 did for verification. Each table's rows are copied once, into a new table that then takes the old
    # one's name (copying out to a temporary table and back, as at first, took 3.1 s instead of 1.6-2.4 s on an
    # existing 10k index); its indexes are made again. The rename is done as legacy_alter_table does it, leaving
    # the views alone: they name the table as before, and dissent_log names an index (m025) the new table gets
    # only after.
    # ``agents`` keeps its rowid: the panel's order is read by it. The artifact_type index (m004) served only the
    # artifacts page's facet, which is no longer declared: it goes (200 bytes a consultation), and any column can
    # still be faceted from the page's menu.
    db.execute("drop index if exists idx_artifacts_artifact_type")
    (legacy,) = db.execute("pragma legacy_alter_table").fetchone()
    db.execute("pragma legacy_alter_table = on")
    try:
        for table in KEY_ORDERED:
            (sql,) = db.execute("select sql from sqlite_master where type = 'table' and name = ?",
                                [table]).fetchone()
            if "without rowid" in sql.lower():
                continue
            indexes = [index_sql for (index_sql,) in db.execute(
                "select sql from sqlite_master where type = 'index' and tbl_name = ? and sql is not null", [table])]
            columns = ", ".join(f'"{c}"' for c in db[table].columns_dict)
            _, body = sql.split("(", 1)  # CREATE TABLE "name" (columns...)
            db.execute(f'create table "key_ordered_copy" ({body} without rowid')
            db.execute(f'insert into "key_ordered_copy" ({columns}) select {columns} from "{table}"')
            db.execute(f'drop table "{table}"')
            db.execute(f'alter table "key_ordered_copy" rename to "{table}"')
            for index_sql in indexes:
                db.execute(index_sql)
    finally:
        db.execute(f"pragma legacy_alter_table = {int(legacy)}")


@migrations()
def m030_no_artifact_type_index(db: Any) -> None:
    # m029 drops m004's artifact_type index on an index written before; a fresh index (and ``index rebuild``,
    # which makes the whole schema over empty tables first) gets it from m004, so this drops it.
    db.execute("drop index if exists idx_artifacts_artifact_type")


@migrations()
def m031_filter_rollup(db: Any) -> None:
    # The savings_by_filter_limits canned query grouped every filters_applied row by filter, round, artifact type
    # and limits (text): at 100k consultations that sort ran past Datasette's 1 s limit (HTTP 400). A daily rollup
    # (rollups.py), kept as consultations are indexed, gives the same groups in a few rows a day; filter_savings
    # sums it too, so m021's covering index for that query (260 bytes a consultation) goes. No primary key: a
    # group's key may be null (a record without limits); the day's index serves the refresh, which replaces a day.
    columns = ", ".join([f'"{key}" {"integer" if key == "round_number" else "text"}' for key in FILTER_KEYS]
                        + [f'"{name}" integer' for name in FILTER_FIGURES])
    db.execute(f"create table if not exists filter_daily (day text, {columns})")
    db.execute("create index if not exists filter_daily_day on filter_daily (day)")
    db.execute("drop index if exists filters_saved")
    refresh_all_days(db.conn, ("filter_daily",))


@migrations()
def m032_page_counts(db: Any) -> None:
    # Table pages count their rows (Datasette's ``select count(*)``) and their declared facets; SQLite counts from
    # the narrowest b-tree over every row. Cold at 100k consultations:
    # - artifacts had only the (partial) verdicts index, so the count read the whole table, 370 MB (0.76 s page):
    #   its round numbers with the key are 220 bytes a consultation;
    # - the consultations page's status and judge facets read every consultation row (100 MB): these indexes
    #   are about 40 bytes a consultation;
    # - the provider_failures canned query read every call to find the failed ones: this partial index holds only
    #   failed attempts, with what the query shows, so it reads those alone.
    db.execute("create index if not exists artifacts_count on artifacts (round_number)")
    db.execute("create index if not exists consultations_status on consultations (status)")
    db.execute("create index if not exists consultations_judge on consultations (judge_provider, judge_model)")
    db.execute("create index if not exists calls_failures on calls "
               "(provider, model, outcome, status, consultation_id, started_at, error) "
               "where outcome not in ('ok', 'cancelled')")


@migrations()
def m033_early_termination_decisions(db: Any) -> None:
    # The early_terminations_by_threshold canned query groups every consultation that recorded a decision (most
    # of them) by mode and threshold: it read the whole table (0.34 s of a 0.52-0.67 s cold page at 100k). This
    # partial index holds what it sums, in its grouping order (about 45 bytes a consultation with a decision).
    db.execute("create index if not exists consultations_early_termination on consultations "
               "(mode, early_termination_threshold, early_termination_offered, early_terminated, cost_saved, "
               "early_termination_confidence) where early_termination_offered is not null")


@migrations()
def m034_dissent_rollup(db: Any) -> None:
    # The dissent_by_agent canned query counted every dissent of history from the verdicts' JSON (dissent_log):
    # 0.55 s cold at 100k consultations. This daily rollup (rollups.py), kept as consultations are indexed, gives
    # the same counts in a few rows a day. No primary key: an agent may be null.
    columns = ", ".join(f'"{name}" integer' for name in DISSENT_FIGURES)
    db.execute(f"create table if not exists dissent_daily (day text, agent text, {columns})")
    db.execute("create index if not exists dissent_daily_day on dissent_daily (day)")
    refresh_all_days(db.conn, ("dissent_daily",))
