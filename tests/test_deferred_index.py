"""A CLI consultation keeps SQLite off the path to its first provider request, and the index still ends complete."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from test_index import dump

from conclave import events as ev
from conclave.store.recorder import Recorder
from conclave.testing.synthetic_events import synthetic_events


def test_the_index_is_written_once_round_1_is_under_way_and_ends_the_same(tmp_path: Path) -> None:
    deferred_home, plain_home = tmp_path / "deferred", tmp_path / "plain"
    events = synthetic_events(1)
    first_round = next(i for i, e in enumerate(events) if e.type == ev.ROUND_STARTED)
    deferred = Recorder(deferred_home, defer_index=True)
    for event in events[: first_round + 1]:
        deferred(event)
    # the journal is durable before the first request; the index is not even created yet
    assert (deferred_home / "journal").is_dir() and not (deferred_home / "index.db").exists()
    for event in events[first_round + 1:]:
        deferred(event)
    deferred.close()
    plain = Recorder(plain_home)
    for event in events:
        plain(event)
    plain.close()
    assert dump(deferred_home) == dump(plain_home) and dump(plain_home)["calls"]


def test_a_consultation_that_never_starts_a_round_is_still_indexed(tmp_path: Path) -> None:
    events = synthetic_events(2)
    first_round = next(i for i, e in enumerate(events) if e.type == ev.ROUND_STARTED)
    recorder = Recorder(tmp_path, defer_index=True)
    for event in events[:first_round]:
        recorder(event)
    recorder.close()
    with sqlite3.connect(tmp_path / "index.db") as conn:
        assert conn.execute("select count(*) from consultations").fetchone()[0] == 1

