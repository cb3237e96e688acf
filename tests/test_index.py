"""The SQLite index: written as the journal is, identical after ``index rebuild``, safe with concurrent writers,
and never able to fail a consultation."""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from conclave import events as ev
from conclave.store import sqlite_index as index_module
from conclave.store.indexer import RESUMED
from conclave.store.migrations import VIEWS, migrations
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.sqlite_index import connect, rebuild, settle_killed_rounds
from conclave.testing.synthetic_events import consultation_id, synthetic_events

TABLES = ("consultations", "agents", "rounds", "agent_rounds", "calls", "artifacts", "transitions",
          "filters_applied", "substitutions", "consultation_daily", "provider_daily", "config_snapshots")


SEARCHED = ("kubernetes", "sqlite", "rust", "graphql", "service", "adopt", "incrementally", "question:should")


def dump(home: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every data table and view, in a stable order (rowids excluded: they follow insert order),
    and which consultations a few full-text searches find."""
    db = connect(StoreLayout(home).index_path)
    try:
        rows = {name: sorted(db.conn.execute(f"select * from [{name}]").fetchall(), key=repr)
                for name in (*TABLES, *VIEWS)}
        rows["search"] = [
            (term, cid) for term in SEARCHED for (cid,) in db.conn.execute(
                "select c.id from consultations_fts f join consultations c on c.rowid = f.rowid "
                "where consultations_fts match ? order by c.id", [term])
        ]
        return rows
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
    assert "the index is missing" in caplog.text and "conclave index rebuild" in caplog.text
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
    from conclave.testing.synthetic_events import synthetic_events
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


# --- index rebuild: fast paths that must give exactly what the plain ones give -------------------------------------

def test_rebuild_in_large_chunks_matches_live_indexing(tmp_path: Path) -> None:
    """Chunks big enough for multi-row INSERTs (and a resumed consultation's repeated keys inside one of them)."""
    streams = [synthetic_events(n, interrupted_after_round=n % 5 or None) for n in range(40)]
    streams += [resumed_stream(99), resumed_stream(102)]
    record_interleaved(tmp_path, streams)
    live = dump(tmp_path)
    assert {term for term, _ in live["search"]} == set(SEARCHED)
    for workers in (0, 2):
        rebuild(StoreLayout(tmp_path), chunk=500, workers=workers)
        assert dump(tmp_path) == live
    rebuild(StoreLayout(tmp_path), chunk=21, workers=2)
    assert dump(tmp_path) == live


def test_a_config_snapshot_holds_what_its_hash_covers_not_one_consultations_question(tmp_path: Path) -> None:
    """config_hash leaves out the question and the home, so the snapshot stored under it does too (it used to
    keep the first consultation's question, shown for every other consultation sharing the hash)."""
    from conclave.engine.ids import config_hash

    streams = []
    for n in range(9):
        config = {"mode": {"strategy": "converge"}, "question": f"question {n}", "home": f"/home/{n}"}
        stream = synthetic_events(n, config=config)
        stream[0].data["config"] = config
        stream[0].data["config_hash"] = config_hash(config)
        streams.append(stream)
    record_interleaved(tmp_path, streams, writers=1)
    live = dump(tmp_path)
    [(stored_hash, stored)] = live["config_snapshots"]
    assert json.loads(stored) == {"mode": {"strategy": "converge"}}
    assert stored_hash == config_hash(json.loads(stored))  # the key is the hash of exactly what is stored
    rebuild(StoreLayout(tmp_path), chunk=4, workers=0)
    assert dump(tmp_path) == live


def _write_journal(home: Path, cid: str, datas: list[dict[str, Any]], *, tail: bytes = b"") -> list[dict[str, Any]]:
    """A hash-chained journal of ``datas`` (one record type) written as the recorder writes it."""
    from conclave.store.heads import HeadsLog
    from conclave.store.journal import JournalWriter
    from conclave.store.redact import Redactor

    layout = StoreLayout(home)
    writer = JournalWriter(layout.journal_path(cid), cid, HeadsLog(layout.heads_path), Redactor([]))
    records = [writer.append(ev.ROUND_ARTIFACT, 1_767_225_600.5 + i, data) for i, data in enumerate(datas)]
    writer.close()
    if tail:
        with open(layout.journal_path(cid), "ab") as f:
            f.write(tail)
    return records


TRICKY_VALUES: list[Any] = [
    2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 10**30, -(10**19), 1234567890123456789, 123456789012345678,
    1e-05, 5e-06, 1e16, 1.2345678901234568e+16, -0.0, 0.1 + 0.2, float("nan"), float("inf"), -float("inf"),
    "é ü 中文 😀", "\u2028\x7f\x01", 'a "quoted" \\ back\nslash', "1234567890123456789012345 in a string",
    {"nested": [1, [2, [3, {"deep": 12345678901234567890}]]]}, [], {}, None, True, False,
]


@pytest.mark.parametrize("value", TRICKY_VALUES, ids=repr)
def test_read_records_parses_exactly_as_the_live_path_does(tmp_path: Path, value: Any) -> None:
    from conclave.store.journal import read_records

    written = _write_journal(tmp_path, "c-tricky", [{"artifact": {"value": value}, "round_number": 1}] * 3)
    parsed = read_records(StoreLayout(tmp_path).journal_path("c-tricky"))
    # repr: nan != nan, and 1 == 1.0 == True would hide a changed type
    assert repr(parsed) == repr(written)


def test_read_records_keeps_complete_lines_only_and_falls_back_line_by_line(tmp_path: Path) -> None:
    from conclave.store.journal import read_records

    path = StoreLayout(tmp_path).journal_path("c-torn")
    written = _write_journal(tmp_path, "c-torn", [{"n": 1}, {"n": 2}], tail=b'{"consultation_id": "c-torn", "da')
    assert read_records(path) == written  # the torn last line was never durable
    path.write_bytes(path.read_bytes()[: -len(b'{"consultation_id": "c-torn", "da')] + b"not json\n")
    assert read_records(path) == written  # the bad line is skipped (``logs verify`` reports it)
    path.write_bytes(b'{"consultation_id": "c-torn"}')  # no complete line at all
    assert read_records(path) == []


def test_rebuild_reproduces_live_rows_of_values_a_fast_parser_could_alter(tmp_path: Path) -> None:
    """Integers past 64 bits, NaN and the like reach the index exactly as the live path indexed them."""
    stream = synthetic_events(3)
    for event in stream:
        if event.type == ev.ROUND_ARTIFACT:
            event.data["artifact"]["tricky"] = [v for v in TRICKY_VALUES if not isinstance(v, float) or math.isfinite(v)]
    next(e for e in stream if e.type == ev.PROVIDER_ATTEMPT).data["input_tokens"] = 10**18  # 19 digits
    record_interleaved(tmp_path, [stream, synthetic_events(4)], writers=1)
    live = dump(tmp_path)
    assert any("18446744073709551616" in row[7] for row in live["artifacts"])  # 2**64, in the artifact's gist
    rebuild(StoreLayout(tmp_path), workers=0)
    assert dump(tmp_path) == live


def test_rebuild_leaves_the_schema_a_fresh_index_has(tmp_path: Path) -> None:
    record_interleaved(tmp_path, [synthetic_events(n) for n in range(5)], writers=1)
    rebuild(StoreLayout(tmp_path), chunk=2, workers=0)
    fresh = connect(tmp_path / "fresh.db")
    rebuilt = connect(StoreLayout(tmp_path).index_path)
    schema = "select type, name, tbl_name, sql from sqlite_master order by type, name"
    try:
        assert rebuilt.conn.execute(schema).fetchall() == fresh.conn.execute(schema).fetchall()
        assert not migrations.pending(rebuilt)
        # every migration, in order (all of them made the schema before the rows were loaded)
        applied = [r[0] for r in rebuilt.conn.execute("select name from _sqlite_migrations order by id")]
        assert applied == [r[0] for r in fresh.conn.execute("select name from _sqlite_migrations order by id")]
    finally:
        fresh.close()
        rebuilt.close()


def test_an_interrupted_rebuild_leaves_the_index_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows load into a scratch file with the indexes and search set aside, made again once loaded; a rebuild
    that dies after loading leaves the installed index whole: every row, search, no pending migration."""
    record_interleaved(tmp_path, [synthetic_events(n) for n in range(6)], writers=1)
    live = dump(tmp_path)

    def die(*args: Any, **kwargs: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(index_module, "settle_killed_rounds", die)
    with pytest.raises(KeyboardInterrupt):
        rebuild(StoreLayout(tmp_path), chunk=2, workers=0)
    monkeypatch.undo()
    assert dump(tmp_path) == live
    db = connect(StoreLayout(tmp_path).index_path)
    try:
        assert not migrations.pending(db)
        hits = db.conn.execute(
            "select count(*) from consultations_fts where consultations_fts match 'incrementally'").fetchone()[0]
        assert hits == 6
    finally:
        db.close()


def test_a_writer_connecting_mid_rebuild_applies_the_pending_migrations(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A live writer that connects while the rows load (and so builds the indexes early) changes nothing."""
    record_interleaved(tmp_path, [synthetic_events(n) for n in range(8)], writers=1)
    live = dump(tmp_path)
    real = index_module._ChunkWriter.__call__
    calls: list[list[str]] = []

    def chunk_then_live_writer(self: Any, ids: list[str]) -> Any:
        result = real(self, ids)
        if not calls:
            connect(StoreLayout(tmp_path).index_path).close()  # as `conclave stats` or a recorder would
        calls.append(ids)
        return result

    monkeypatch.setattr(index_module._ChunkWriter, "__call__", chunk_then_live_writer)
    rebuild(StoreLayout(tmp_path), chunk=3, workers=0)
    assert len(calls) == 3
    assert dump(tmp_path) == live
    db = connect(StoreLayout(tmp_path).index_path)
    try:  # the search index covers the rows loaded before and after the early migration
        assert db.conn.execute(
            "select count(*) from consultations_fts where consultations_fts match 'incrementally'").fetchone()[0] == 8
    finally:
        db.close()


def test_iso_is_datetime_isoformat_exactly() -> None:
    from datetime import UTC, datetime

    from conclave.store.indexer import iso

    def reference(ts: float) -> str:
        return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds")

    edges = [0.0, 0.0005, 0.0004999, 0.9995, 0.9999995, 0.99999949, 59.9999996, 86399.9999995, 1_767_225_599.9999995,
             1_767_225_600.0005, 1_767_225_600.123456, 253_402_300_799.9, 1_767_225_600, True, -1.5, -0.0000001]
    rng = __import__("random").Random(7)
    samples = [rng.uniform(0, 2.534e11) for _ in range(20_000)]
    samples += [rng.randint(0, 2**35) + rng.choice((0.0005, 0.9995, 0.9999995, 0.0000005, 0.5)) for _ in range(20_000)]
    for ts in edges + samples:
        assert iso(ts) == reference(ts), ts
    for ts in (253_402_300_800.0, 1e300):  # past year 9999 it fails as datetime does
        with pytest.raises((ValueError, OverflowError)):
            reference(ts)
        with pytest.raises((ValueError, OverflowError)):
            iso(ts)


def test_json_columns_are_encoded_as_json_dumps_would() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from conclave.store.indexer import _json

    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda children: st.lists(children) | st.dictionaries(st.text(), children),
        max_leaves=25,
    )

    @settings(max_examples=300, deadline=None)
    @given(values)
    def check(value: Any) -> None:
        assert _json(value) == (None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False))

    check()


@pytest.mark.parametrize("window", [0, 1, 3, 100])
def test_read_ahead_yields_every_file_in_order_and_closes_them(tmp_path: Path, window: int) -> None:
    import os

    paths = []
    for n in range(10):
        path = tmp_path / f"{n}.jsonl"
        path.write_bytes(b"x" * n)
        paths.append(str(path))
    open_fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    assert list(index_module._read_ahead(paths, window)) == [(p, b"x" * n) for n, p in enumerate(paths)]
    reader = index_module._read_ahead(paths, window)
    next(reader)
    reader.close()  # abandoned half way (a failing chunk): the files it opened ahead are closed
    if open_fds is not None:
        assert len(os.listdir("/proc/self/fd")) == open_fds


def test_a_worker_failing_fails_the_rebuild_and_the_next_connection_heals_the_schema(tmp_path: Path) -> None:
    record_interleaved(tmp_path, [synthetic_events(n) for n in range(4)], writers=1)
    journal = StoreLayout(tmp_path).journal_path(consultation_id(2))
    bad = json.loads(journal.read_text().splitlines()[5])
    del bad["seq"]  # a record the indexer cannot place
    with open(journal, "a") as f:
        f.write(json.dumps(bad) + "\n")
    with pytest.raises(KeyError):
        rebuild(StoreLayout(tmp_path), chunk=1, workers=2)
    db = connect(StoreLayout(tmp_path).index_path)
    try:
        assert not migrations.pending(db)
        assert set(VIEWS) <= set(db.view_names())
    finally:
        db.close()


def test_parse_records_matches_json_loads_on_any_canonical_journal() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from conclave.store.chain import canonical_json
    from conclave.store.journal import parse_records

    values = st.recursive(
        st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80) | st.floats() | st.text(),
        lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
        max_leaves=20,
    )

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.dictionaries(st.text(max_size=8), values, max_size=5), min_size=1, max_size=5))
    def check(records: list[dict[str, Any]]) -> None:
        try:
            lines = [canonical_json(r).encode() + b"\n" for r in records]
        except UnicodeEncodeError:  # a lone surrogate: the journal writer cannot write it either
            return
        expected = [json.loads(line) for line in lines]
        assert repr(parse_records(b"".join(lines), "unused")) == repr(expected)

    check()


# --- index truth: how each round run ended, and a killed consultation --------------------------------------------

def _rounds_story() -> list[Any]:
    """Round 1 ok and round 2 failed; a resume whose round 2 is cancelled; a resume that re-runs round 1."""
    started = synthetic_events(7)[0]
    cid, t0 = started.consultation_id, started.ts

    def event(t: float, type_: str, **data: Any) -> Any:
        return ev.Event(type_, cid, 0, t0 + t, data)

    def end(t: float, number: int, **more: Any) -> Any:
        kind = ev.ROUND_INTERRUPTED if "reason" in more else ev.ROUND_COMPLETED
        return event(t, kind, round_number=number, round_type=f"type{number}", duration_s=1.0, input_tokens=10,
                     output_tokens=5, cost=0.25, **more)

    def final(t: float) -> Any:
        return event(t, ev.CONSULTATION_COMPLETED, status="partial", result={"status": "partial"})

    again = [event(0, RESUMED, restored_rounds=[]), ev.Event(started.type, cid, 0, started.ts, started.data)]
    return [
        started,
        event(1, ev.ROUND_STARTED, round_number=1, round_type="type1"), end(2, 1, ok=True),
        event(3, ev.ROUND_STARTED, round_number=2, round_type="type2"), end(4, 2, ok=False), final(5),
        *[ev.Event(e.type, cid, 0, t0 + 6, e.data) for e in again],
        event(7, ev.ROUND_STARTED, round_number=2, round_type="type2"), end(8, 2, reason="cancelled"), final(9),
        *[ev.Event(e.type, cid, 0, t0 + 10, e.data) for e in again],
        event(11, ev.ROUND_STARTED, round_number=1, round_type="type1"),
    ]


def _rounds(home: Path) -> tuple[list[tuple[Any, ...]], int]:
    db = connect(StoreLayout(home).index_path)
    try:
        rows = db.conn.execute("select round_number, status, end_reason, completed_at is not null from rounds "
                               "order by round_number").fetchall()
        return rows, db.conn.execute("select rounds_completed from consultations").fetchone()[0]
    finally:
        db.close()


def test_rounds_record_how_their_last_run_ended(tmp_path: Path) -> None:
    """Failed and interrupted rounds used to be indexed as completed, and a re-run kept its stale completion."""
    story = _rounds_story()
    cut_after_failure = story.index(next(e for e in story if e.type == ev.CONSULTATION_COMPLETED)) + 1
    cut_after_cancel = len(story) - 3
    home = tmp_path / "a"
    record_interleaved(home, [story[:cut_after_failure]], writers=1)
    assert _rounds(home) == ([(1, "ok", None, 1), (2, "failed", None, 1)], 1)
    home = tmp_path / "b"
    record_interleaved(home, [story[:cut_after_cancel]], writers=1)
    assert _rounds(home) == ([(1, "ok", None, 1), (2, "interrupted", "cancelled", 0)], 1)
    home = tmp_path / "c"
    record_interleaved(home, [story], writers=1)
    # round 1 starts again: its earlier completion is gone, and round 2, which built on it, is superseded
    assert _rounds(home) == ([(1, "running", None, 0), (2, "superseded", "cancelled", 0)], 0)
    # no process writes the journal any more: whoever looks next records round 1 as killed, and a rebuild agrees
    db = connect(StoreLayout(home).index_path)
    try:
        assert settle_killed_rounds(db, StoreLayout(home)) == [story[0].consultation_id]
    finally:
        db.close()
    assert _rounds(home) == ([(1, "interrupted", "killed", 0), (2, "superseded", "cancelled", 0)], 0)
    live = dump(home)
    rebuild(StoreLayout(home), workers=0)
    assert dump(home) == live


def test_logs_list_shows_a_killed_consultation_as_interrupted(tmp_path: Path) -> None:
    from conclave.store.heads import HeadsLog
    from conclave.store.journal import JournalWriter
    from conclave.store.redact import Redactor

    events = synthetic_events(4)
    killed = events[: next(i for i, e in enumerate(events) if e.type == ev.ROUND_STARTED) + 1]
    record_interleaved(tmp_path, [killed], writers=1)  # the process is gone: nobody holds its journal
    env = {"CONCLAVE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def listed() -> str:
        done = subprocess.run([sys.executable, "-m", "conclave", "logs", "list", "--json"], capture_output=True,
                              text=True, env=env, timeout=60, check=True)
        [row] = json.loads(done.stdout)
        return str(row["status"])

    assert listed() == "interrupted"
    assert _rounds(tmp_path)[0] == [(1, "interrupted", "killed", 0)]  # its round, which will never end, too
    layout = StoreLayout(tmp_path)
    cid = killed[0].consultation_id
    live = JournalWriter(layout.journal_path(cid), cid, HeadsLog(layout.heads_path), Redactor([]))
    try:  # a process still writing it: running
        assert listed() == "running"
    finally:
        live.close()


def _killed_in_round(n: int, round_number: int) -> list[Any]:
    """Consultation ``n``'s events up to round ``round_number``'s start (the process then dies, recording no end)."""
    events = synthetic_events(n)
    return events[: next(i for i, e in enumerate(events)
                         if e.type == ev.ROUND_STARTED and e.data["round_number"] == round_number) + 1]


def test_only_rounds_nobody_writes_any_more_are_settled_interrupted(tmp_path: Path) -> None:
    from conclave.store.heads import HeadsLog
    from conclave.store.journal import JournalWriter
    from conclave.store.redact import Redactor

    killed, writing = _killed_in_round(5, 2), _killed_in_round(6, 1)
    record_interleaved(tmp_path, [killed, writing], writers=2)
    layout = StoreLayout(tmp_path)
    cid = writing[0].consultation_id
    live = JournalWriter(layout.journal_path(cid), cid, HeadsLog(layout.heads_path), Redactor([]))
    db = connect(layout.index_path)
    try:
        assert settle_killed_rounds(db, layout) == [killed[0].consultation_id]
        assert settle_killed_rounds(db, layout) == []  # recorded once
        statuses = db.conn.execute("select consultation_id, round_number, status, end_reason from rounds "
                                   "order by consultation_id, round_number").fetchall()
    finally:
        db.close()
        live.close()
    assert statuses == [(killed[0].consultation_id, 1, "ok", None),
                        (killed[0].consultation_id, 2, "interrupted", "killed"),
                        (cid, 1, "running", None)]  # its journal is held open: the round may still end


def test_logs_show_ends_a_killed_journal_with_the_round_it_left_open(tmp_path: Path) -> None:
    killed = _killed_in_round(7, 2)
    record_interleaved(tmp_path, [killed], writers=1)
    cid = killed[0].consultation_id
    done = subprocess.run([sys.executable, "-m", "conclave", "logs", "show", cid], capture_output=True, text=True,
                          env={"CONCLAVE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60, check=True)
    last = done.stdout.splitlines()[-1]
    round_type = killed[-1].data["round_type"]
    assert last.startswith(f"interrupted in round 2 ({round_type}): no process is writing this journal"), last
    assert f"conclave resume {cid}" in last


def test_settling_killed_rounds_never_waits_on_a_busy_index(tmp_path: Path) -> None:
    """`logs list` and `browse` settle killed rounds on the way: with another process holding the index's write
    lock (a rebuild, a running consultation's write) they leave it to the next look instead of waiting out the
    busy timeout (30 s)."""
    import sqlite3

    killed = _killed_in_round(7, 2)
    record_interleaved(tmp_path, [killed], writers=1)
    layout = StoreLayout(tmp_path)
    other = sqlite3.connect(layout.index_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # the write lock, held
    db = connect(layout.index_path)
    try:
        assert settle_killed_rounds(db, layout) == []  # left for later, at once
        other.execute("ROLLBACK")
        assert settle_killed_rounds(db, layout) == [killed[0].consultation_id]  # the next look settles it
    finally:
        db.close()
        other.close()


def test_a_writer_waits_a_moment_for_a_reader_looking_whether_its_journal_is_written(tmp_path: Path) -> None:
    import fcntl
    import threading
    import time

    from conclave.store.heads import HeadsLog
    from conclave.store.journal import JournalWriter
    from conclave.store.redact import Redactor

    layout = StoreLayout(tmp_path)
    path = layout.journal_path("c-reader")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)  # what is_being_written holds for an instant
    release = threading.Timer(0.05, lambda: (fcntl.flock(fd, fcntl.LOCK_UN), os.close(fd)))
    release.start()
    started = time.monotonic()
    writer = JournalWriter(path, "c-reader", HeadsLog(layout.heads_path), Redactor([]))  # no "another process"
    writer.close()
    release.join()
    assert time.monotonic() - started >= 0.04  # it did wait for the reader


def test_the_mcp_tools_call_a_killed_consultation_interrupted(tmp_path: Path) -> None:
    """conclave_sessions / conclave_show read the same rule as `logs list`: a client polling for the end of a
    killed consultation is told it is interrupted (and can resume it), not that it runs."""
    from conclave.doors.mcp import records
    from conclave.store.sessions import sessions

    killed = _killed_in_round(8, 2)
    record_interleaved(tmp_path, [killed], writers=1)
    layout = StoreLayout(tmp_path)
    cid = killed[0].consultation_id
    [session] = sessions(layout)
    assert session["status"] == "interrupted"
    assert sessions(layout, status="running") == []
    assert [s["id"] for s in sessions(layout, status="interrupted")] == [cid]
    shown = records.consultation(layout, cid)
    assert shown["status"] == "interrupted"
    assert [(r["round_number"], r["ended"]) for r in shown["rounds"]] == [(1, "completed"), (2, "interrupted (killed)")]


def test_the_mcp_status_filter_counts_only_consultations_that_match_it(tmp_path: Path) -> None:
    # running and interrupted share the index's status: the limit applies to what the journal says they are
    from conclave.store.heads import HeadsLog
    from conclave.store.journal import JournalWriter
    from conclave.store.redact import Redactor
    from conclave.store.sessions import sessions

    runs = [_killed_in_round(n, 1) for n in (9, 10, 11)]
    record_interleaved(tmp_path, runs, writers=3)
    layout = StoreLayout(tmp_path)
    started = {r[0].consultation_id: r[0].ts for r in runs}
    newest = max(started, key=started.__getitem__)
    live = JournalWriter(layout.journal_path(newest), newest, HeadsLog(layout.heads_path), Redactor([]))
    try:
        assert {s["id"] for s in sessions(layout, limit=2, status="interrupted")} == set(started) - {newest}
        assert [s["id"] for s in sessions(layout, limit=2, status="running")] == [newest]
    finally:
        live.close()
