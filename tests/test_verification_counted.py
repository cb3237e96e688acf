"""The index keeps of each verification check what is counted (issue 28: the table and its indexes were 5.2 KB of a
consultation's 22 KB at 10k): question, answerer and passed, keyed by consultation, round and agent. The reason
stays in the journal; an index written before m024 is slimmed when a process next connects, its counts intact."""

from __future__ import annotations

from pathlib import Path

from conclave import events as ev
from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout
from conclave.store.period_stats import Period, quality_figures
from conclave.store.sqlite_index import connect, rebuild
from conclave.testing.synthetic_events import record_synthetic

COUNTED = ["consultation_id", "round_number", "agent", "question_id", "passed", "answered_by"]


def record(home: Path, count: int = 6) -> None:
    record_synthetic(home, range(count))


def journaled_checks(home: Path) -> list[tuple]:
    layout = StoreLayout(home)
    out = []
    for cid in layout.journal_ids():
        for r in read_records(layout.journal_path(cid)):
            if r["type"] == ev.QUALITY_CHECKS:
                out += [(cid, r["data"]["round_number"], r["data"]["agent"], v["question_id"], int(v["passed"]),
                         v["by"]) for v in r["data"]["verification"]]
    return sorted(out)


def verification(home: Path) -> tuple[list[str], set[str], list[tuple]]:
    db = connect(StoreLayout(home).index_path)
    try:
        columns = [c[1] for c in db.conn.execute("pragma table_info(verification)")]
        indexes = {row[1] for row in db.conn.execute("pragma index_list(verification)")}
        rows = sorted(db.conn.execute(f"select {', '.join(COUNTED)} from verification").fetchall())
    finally:
        db.close()
    return columns, indexes, rows


def test_the_index_keeps_what_is_counted_and_the_journal_the_reasons(tmp_path: Path) -> None:
    record(tmp_path)
    checks = journaled_checks(tmp_path)
    assert checks and all(r["reason"] is not None for r in _journaled_results(tmp_path))
    columns, indexes, rows = verification(tmp_path)
    assert columns == COUNTED
    # m022's covering index went with m028 (the pass-rate query reads the verification_daily rollup)
    assert not indexes & {"idx_verification_question_id_passed", "verification_pass_rate"}
    assert rows == checks
    db = connect(StoreLayout(tmp_path).index_path)
    try:  # stored in its key's order: the key is not kept again in an index of its own
        assert "WITHOUT ROWID" in db.conn.execute(
            "select sql from sqlite_master where name = 'verification'").fetchone()[0].upper()
    finally:
        db.close()
    rebuild(StoreLayout(tmp_path), workers=0)
    assert verification(tmp_path) == (columns, indexes, rows)


def test_m024_slims_an_index_written_before(tmp_path: Path) -> None:
    record(tmp_path)
    index = StoreLayout(tmp_path).index_path
    db = connect(index)
    try:
        before = quality_figures(db.conn, Period("all time"))
        # as m008 left the table: a reason per check and an index on (question_id, passed)
        db.conn.execute("alter table verification add column reason text")
        db.conn.execute("update verification set reason = 'a sentence for one reader'")
        db.conn.execute("create index idx_verification_question_id_passed on verification (question_id, passed)")
        db.conn.execute("delete from _sqlite_migrations where name = 'm024_verification_counted'")
    finally:
        db.close()
    columns, indexes, rows = verification(tmp_path)
    assert columns == COUNTED and rows == journaled_checks(tmp_path)
    assert not indexes & {"idx_verification_question_id_passed", "verification_pass_rate"}
    db = connect(index)
    try:
        assert quality_figures(db.conn, Period("all time")) == before and before["pass_rate"]
    finally:
        db.close()


def _journaled_results(home: Path) -> list[dict]:
    layout = StoreLayout(home)
    return [v for cid in layout.journal_ids() for r in read_records(layout.journal_path(cid))
            if r["type"] == ev.QUALITY_CHECKS for v in r["data"]["verification"]]
