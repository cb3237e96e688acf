"""The CLI's recorder writes the index on a thread of its own: the journal is durable before a flush returns, the
index never delays the caller, and after close() it is what a rebuild from the journal makes."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from test_index import dump

from conclave import events as ev
from conclave.store import index as index_module
from conclave.store.index import IndexWriter, connect, rebuild
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.synthetic import consultation_id, synthetic_events


def test_the_start_is_journaled_without_waiting_for_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    release, writing = threading.Event(), threading.Event()
    real_write = IndexWriter.write

    def slow_write(self: IndexWriter, records: list) -> None:
        writing.set()
        assert release.wait(10)
        real_write(self, records)

    monkeypatch.setattr(IndexWriter, "write", slow_write)
    events = synthetic_events(1)
    recorder = Recorder(tmp_path, background_index=True)
    recorder(events[0])  # consultation:started: flushed at once
    assert events[0].type == ev.CONSULTATION_STARTED
    assert writing.wait(10)  # the index write is under way on its own thread, and has not finished...
    journal = StoreLayout(tmp_path).journal_path(consultation_id(1))
    assert len(journal.read_text().splitlines()) == 1  # ...while the journal already holds the start
    for event in events[1:]:
        recorder(event)
    release.set()
    recorder.close()
    live = dump(tmp_path)
    rebuild(StoreLayout(tmp_path))
    assert live == dump(tmp_path) and len(live["consultations"]) == 1


def test_a_locked_index_is_caught_up_by_the_index_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "LIVE_BUSY_TIMEOUT_S", 0.05)
    connect(tmp_path / "index.db").close()
    blocker = sqlite3.connect(tmp_path / "index.db", isolation_level=None)
    events = synthetic_events(2)
    recorder = Recorder(tmp_path, background_index=True)
    blocker.execute("BEGIN IMMEDIATE")
    first_round_end = next(i for i, e in enumerate(events) if e.type == ev.ROUND_COMPLETED)
    for event in events[: first_round_end + 1]:
        recorder(event)
    recorder._run_index(lambda: None)  # queue behind the writes so far
    recorder._jobs[-1].result(timeout=10)
    blocker.execute("COMMIT")
    for event in events[first_round_end + 1 :]:
        recorder(event)
    recorder.close()
    live = dump(tmp_path)
    rebuild(StoreLayout(tmp_path))
    assert live == dump(tmp_path) and len(live["calls"]) > 0
