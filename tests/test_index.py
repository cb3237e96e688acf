"""The SQLite index: written as the journal is, identical after ``index rebuild``, safe with concurrent writers,
and never able to fail a consultation."""

from __future__ import annotations

import logging
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conclave import events as ev
from conclave.store import index as index_module
from conclave.store.index import connect, rebuild
from conclave.store.indexer import RESUMED
from conclave.store.migrations import VIEWS, migrations
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.synthetic import consultation_id, synthetic_events

TABLES = ("consultations", "agents", "rounds", "agent_rounds", "calls", "artifacts", "transitions",
          "filters_applied", "substitutions", "consultation_daily", "provider_daily", "config_snapshots")


def dump(home: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every data table and view, in a stable order (rowids excluded: they follow insert order)."""
    db = connect(StoreLayout(home).index_path)
    try:
        return {name: sorted(db.conn.execute(f"select * from [{name}]").fetchall(), key=repr)
                for name in (*TABLES, *VIEWS)}
    finally:
        db.close()


def record_interleaved(home: Path, streams: list[list[Any]], writers: int = 3) -> None:
    """Several recorders (as several processes would) write interleaved consultations, flushing per round."""
    recorders = [Recorder(home) for _ in range(writers)]
    iterators = {k: iter(s) for k, s in enumerate(streams)}  # stream k always goes to recorder k % writers
    while iterators:
        for k, it in list(iterators.items()):
            event = next(it, None)
            if event is None:
                del iterators[k]
            else:
                recorders[k % writers](event)
    for r in recorders:
        r.close()


def resumed_stream(n: int) -> list[Any]:
    """A consultation killed in round 3, then resumed: the second run re-emits started and runs rounds 3-4.

    ``n`` must be a multiple of 3: those run in explore mode, which never stops after round 2."""
    first = synthetic_events(n, interrupted_after_round=2)
    full = synthetic_events(n)
    third = next(i for i, e in enumerate(full) if e.type == ev.ROUND_STARTED and e.data["round_number"] == 3)
    marker = ev.Event(RESUMED, first[0].consultation_id, 0, full[-1].ts + 100, {"restored_rounds": [1, 2]})
    later = [ev.Event(e.type, e.consultation_id, e.seq, e.ts + 200, e.data) for e in [full[0], *full[third:]]]
    return [*first, marker, *later]


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "worker-processes"])
def test_rebuild_reproduces_live_indexing_row_for_row(tmp_path: Path, workers: int) -> None:
    streams = [synthetic_events(n, interrupted_after_round=n % 4 or None) for n in range(24)]
    streams.append(resumed_stream(99))
    record_interleaved(tmp_path, streams)
    live = dump(tmp_path)
    assert len(live["consultations"]) == 25 and all(live[t] for t in TABLES)
    report = rebuild(StoreLayout(tmp_path), chunk=4, workers=workers)
    assert report.consultations == 25
    assert dump(tmp_path) == live


def test_a_resumed_consultation_keeps_its_first_start_and_counts_every_attempt(tmp_path: Path) -> None:
    stream = resumed_stream(21)
    record_interleaved(tmp_path, [stream], writers=1)
    db = connect(StoreLayout(tmp_path).index_path)
    row = db.conn.execute("select started_at, status, resumed_at, calls, total_cost from consultations").fetchone()
    db.close()
    attempts = [e.data for e in stream if e.type == ev.PROVIDER_ATTEMPT]
    assert row[0].startswith("2026-01-01T00:21") and row[1] == "complete" and row[2] is not None
    assert row[3] == len(attempts)
    assert row[4] == pytest.approx(sum(a["cost"] for a in attempts))


def test_migrations_are_versioned_and_applied_once(tmp_path: Path) -> None:
    path = tmp_path / "index.db"
    connect(path).close()
    db = connect(path)
    applied = [r[0] for r in db.conn.execute("select name from _sqlite_migrations order by id")]
    assert applied == [m.name for m in migrations._migrations]
    assert set(VIEWS) <= set(db.view_names())
    assert db.conn.execute("pragma journal_mode").fetchone()[0] == "wal"
    db.close()


def test_full_text_search_covers_question_and_recommendation(tmp_path: Path) -> None:
    record_interleaved(tmp_path, [synthetic_events(n) for n in range(12)], writers=1)
    db = connect(StoreLayout(tmp_path).index_path)
    by_question = db.conn.execute(
        "select count(*) from consultations_fts where consultations_fts match 'question:kubernetes'").fetchone()[0]
    expected = sum("Kubernetes" in synthetic_events(n)[0].data["question"] for n in range(12))
    by_recommendation = db.conn.execute(
        "select count(*) from consultations_fts where consultations_fts match 'recommendation:incrementally'"
    ).fetchone()[0]
    db.close()
    assert by_question == expected > 0
    assert by_recommendation == 12


def test_a_failing_index_warns_but_never_stops_the_journal(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "index.db").mkdir()  # cannot be opened as a database
    recorder = Recorder(tmp_path)
    with caplog.at_level(logging.WARNING, logger="conclave.store.recorder"):
        for event in synthetic_events(1):
            recorder(event)
        recorder.close()
    assert "index write failed" in caplog.text and "conclave index rebuild" in caplog.text
    journal = StoreLayout(tmp_path).journal_path(consultation_id(1))
    assert len(journal.read_text().splitlines()) == len(synthetic_events(1))
    (tmp_path / "index.db").rmdir()
    rebuild(StoreLayout(tmp_path))
    assert len(dump(tmp_path)["consultations"]) == 1


def test_a_locked_index_is_caught_up_at_the_next_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "LIVE_BUSY_TIMEOUT_S", 0.05)
    connect(tmp_path / "index.db").close()
    blocker = sqlite3.connect(tmp_path / "index.db", isolation_level=None)
    events = synthetic_events(2)
    recorder = Recorder(tmp_path)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock through round 1
    first_round_end = next(i for i, e in enumerate(events) if e.type == ev.ROUND_COMPLETED)
    for event in events[: first_round_end + 1]:
        recorder(event)
    blocker.execute("COMMIT")
    for event in events[first_round_end + 1 :]:
        recorder(event)
    recorder.close()
    live = dump(tmp_path)
    rebuild(StoreLayout(tmp_path))
    assert live == dump(tmp_path) and len(live["calls"]) > 0


def test_rebuild_recreates_an_index_that_is_not_a_database(tmp_path: Path) -> None:
    record_interleaved(tmp_path, [synthetic_events(n) for n in range(3)], writers=1)
    good = dump(tmp_path)
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"index.db{suffix}").unlink(missing_ok=True)
    (tmp_path / "index.db").write_bytes(b"garbage" * 1000)
    result = subprocess.run([sys.executable, "-m", "conclave", "index", "rebuild"], capture_output=True, text=True,
                            env={"CONCLAVE_HOME": str(tmp_path)}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "3 consultation(s)" in result.stderr
    assert dump(tmp_path) == good


WORKER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from conclave.store.recorder import Recorder
    from conclave.store.synthetic import synthetic_events
    home, first, count = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    recorder = Recorder(home)
    for n in range(first, first + count):
        for event in synthetic_events(n):
            recorder(event)
    recorder.close()
""")


def test_concurrent_writer_processes_lose_no_row(tmp_path: Path) -> None:
    processes, per_process = 4, 25
    # All start on a fresh home, so they also race to create and migrate the index.
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path), str(k * per_process),
                                 str(per_process)], stderr=subprocess.PIPE, text=True) for k in range(processes)]
    for w in workers:
        _, stderr = w.communicate(timeout=120)
        assert w.returncode == 0, stderr
        assert "index write failed" not in stderr
    live = dump(tmp_path)
    assert len(live["consultations"]) == processes * per_process
    expected_calls = sum(e.type == ev.PROVIDER_ATTEMPT for n in range(processes * per_process)
                         for e in synthetic_events(n))
    assert len(live["calls"]) == expected_calls
    rebuild(StoreLayout(tmp_path))
    assert dump(tmp_path) == live
