"""The index schema, as versioned sqlite-utils migrations. Add a new migration for every change; never edit one.

Every child table is keyed by (consultation_id, seq) — the journal position of the record it came from — so
live indexing and ``index rebuild`` produce identical rows whatever order consultations interleave in.
"""

from __future__ import annotations

from typing import Any

from sqlite_utils import Migrations

migrations = Migrations("conclave.index")

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
    "cost_by_provider": """
select provider, model, count(*) as calls,
       sum(outcome = 'ok') as ok_calls,
       sum(outcome not in ('ok', 'cancelled')) as failed_calls,
       sum(hedge) as hedged_calls,
       sum(input_tokens) as input_tokens, sum(output_tokens) as output_tokens,
       round(total(cost), 6) as cost, round(avg(latency_s), 3) as avg_latency_s
from calls group by provider, model
""",
    # The latest verdict of each consultation (a resumed round 4 may have produced an earlier one).
    "dissent_log": """
select a.consultation_id, c.started_at, c.question, c.mode,
       json_extract(d.value, '$.agent') as agent,
       json_extract(d.value, '$.concern') as concern,
       json_extract(d.value, '$.severity') as severity
from artifacts a
join consultations c on c.id = a.consultation_id
join json_each(a.artifact, '$.dissent') d
where a.artifact_type = 'verdict'
  and a.seq = (select max(seq) from artifacts v
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
    from conclave.store.rollups import CONSULTATION_FIGURES, FLOAT_FIGURES, PROVIDER_FIGURES

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
def m_quality_claims_evidence_checks(db: Any) -> None:
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
