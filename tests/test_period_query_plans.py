"""``conclave stats --week`` / ``--month`` read only the period (issue 28 item 2): every statement compute_stats
runs for a period, planned by SQLite on an index conclave wrote, starts from the period's consultations through
an index on started_at (or reads a daily rollup) and never scans a whole table. At 10k consultations the
verification pass rates scanned every check of history in question order and looked up each one's consultation
(1.8 s of a cold ``stats --week``)."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from index_queries import plan

from conclave.store.paths import StoreLayout
from conclave.store.period_stats import compute_stats, period_from_args
from conclave.store.recorder import Recorder
from conclave.store.rollups import REFRESH
from conclave.store.sqlite_index import connect
from conclave.testing.synthetic_events import synthetic_events

NOW = datetime(2026, 3, 15, 12, 0, tzinfo=UTC)
ROLLUPS = tuple(REFRESH)  # every daily rollup table
PERIODS = {"week": {"week": True}, "month": {"month": ""}, "2026-02": {"month": "2026-02"}}


class RecordingConnection:
    """A sqlite3 connection that remembers every statement run through ``execute`` with its parameters."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.connection = conn
        self.statements: list[tuple[str, Any]] = []

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        self.statements.append((sql, params))
        return self.connection.execute(sql, params)


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    recorder = Recorder(home)
    for n in range(12):  # one every five days, back to 56 days before NOW
        for event in synthetic_events(n, start_ts=NOW.timestamp() - (1 + 5 * n) * 86400.0, spacing_s=0):
            recorder(event)
    recorder.close()
    return StoreLayout(home).index_path


@pytest.mark.parametrize("period", PERIODS)
def test_every_period_statement_starts_from_the_periods_consultations(index: Path, period: str) -> None:
    db = connect(index)
    recording = RecordingConnection(db.conn)
    stats = compute_stats(recording, period_from_args(now=NOW, **PERIODS[period]))  # type: ignore[arg-type]
    assert stats["consultations"] > 0 and stats["quality"]["pass_rate"]  # the period holds checks to count
    assert len(recording.statements) > 10
    for sql, params in recording.statements:
        steps = [s for s in plan(db.conn, sql, params) if s.startswith(("SCAN", "SEARCH"))]
        assert steps, sql
        # a table's rows (subqueries and temporary b-trees are the statement's own results)
        reads = [s for s in steps if s.split()[1] not in ROLLUPS and not s.split()[1].startswith("(")]
        if not reads:
            continue  # the daily rollups alone
        first = reads[0]
        assert first.startswith("SEARCH") and "(started_at>?" in first, f"{sql[:300]}\n{steps}"
        assert not any(s.startswith("SCAN") for s in reads), f"{sql[:300]}\n{steps}"
    db.close()


def test_all_time_pass_rates_come_from_the_daily_rollup(index: Path) -> None:
    """All time summed 33 verification rows per consultation (1.1 s of ``conclave stats --all-time`` at 100k);
    the verification_daily rollup holds the same sums per day."""
    db = connect(index)
    recording = RecordingConnection(db.conn)
    stats = compute_stats(recording, period_from_args(now=NOW, all_time=True))  # type: ignore[arg-type]
    raw = dict(db.conn.execute("select question_id, round(1.0 * sum(passed) / count(*), 4) from verification "
                               "where passed is not null group by question_id").fetchall())
    assert stats["quality"]["pass_rate"] == raw and raw
    read = {s.split()[1] for sql, params in recording.statements for s in plan(db.conn, sql, params)
            if s.startswith(("SCAN", "SEARCH"))}
    assert "verification_daily" in read and "verification" not in read and "v" not in read
    db.close()
