"""The live index fills in a record's references (values repeated from earlier records of its journal) the same
way whether the records referred to are indexed in the same write (an evaluation item indexed at its end) or in
an earlier one (then the journal, durable by now, holds them)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from conclave.store.journal import read_journal
from conclave.store.journal_file import REFS
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder

VERDICT = {"recommendation": "Adopt an outbox table. " * 20, "confidence": 0.8,
           "points": [f"point {i} " * 10 for i in range(6)]}


def _run(home: Path, *, index_between: bool) -> tuple[str, float]:
    recorder = Recorder(home)
    cid = "c-refs1"
    recorder.record(cid, "consultation:started", {"question": "Outbox?", "agents": []})
    recorder.record(cid, "consultation:round_artifact", {"agent": "a", "artifact": VERDICT})
    if index_between:
        recorder.flush(wait=True)  # the artifact is indexed before the record that refers to it
    recorder.record(cid, "consultation:completed", {"status": "complete", "result": {"verdict": VERDICT}})
    recorder.close()
    raw = [line.record for line in read_journal(StoreLayout(home).journal_path(cid)).lines]
    assert raw[-1] is not None and raw[-1][REFS]  # the verdict was journaled by reference
    with sqlite3.connect(StoreLayout(home).index_path) as conn:
        row = conn.execute("select recommendation, confidence from consultations where id = ?", (cid,)).fetchone()
    return row


def test_references_filled_in_from_the_same_index_write(tmp_path: Path) -> None:
    assert _run(tmp_path, index_between=False) == (VERDICT["recommendation"], 0.8)


def test_references_filled_in_from_the_journal_after_an_earlier_index_write(tmp_path: Path) -> None:
    assert _run(tmp_path, index_between=True) == (VERDICT["recommendation"], 0.8)
