"""``index rebuild`` and ``logs verify`` over a whole home (issue 28 item 3): the rebuild loads a scratch file and
installs it in one step, so a rebuild killed half way leaves the old index as it was; its rows equal live
indexing's for every journal format; ``logs verify`` checks journals in worker processes and still names each
tampered one."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from cli_helpers import clean_env, run_conclave
from test_index import dump, record_interleaved

from conclave import events as ev
from conclave.store.heads import HeadsLog
from conclave.store.journal import JournalWriter, read_records, try_lock
from conclave.store.journal_file import REFS, expand_records, parse_records
from conclave.store.paths import StoreLayout
from conclave.store.redact import Redactor
from conclave.store.sqlite_index import IndexWriter, _catch_up, rebuild
from conclave.store.verify import VERIFY_CHUNK, verify_store
from conclave.testing.synthetic_events import synthetic_events

FIXTURES = Path(__file__).parent / "fixtures" / "journals"
OLD_ID = "c-mx006yi6z1ex"  # a real `quick` CLI run, journaled before references existed
NEW_ID = "c-mx006yi6z1ff"


def age_journals(home: Path) -> None:
    """Journals last written an hour ago: the rebuild alone indexes them (none is indexed again after the swap)."""
    past = time.time() - 3600
    for path in StoreLayout(home).journal_dir.glob("*.jsonl"):
        os.utime(path, (past, past))


def real_run_events(cid: str) -> list[ev.Event]:
    """The fixture's real run as events under id ``cid``: recorded again, today's writer journals references."""
    records = read_records(FIXTURES / "pre_refs_quick.jsonl")
    return [ev.Event(r["type"], cid, r["seq"], r["ts"], json.loads(json.dumps(r["data"]).replace(OLD_ID, cid)))
            for r in records]


def mixed_home(home: Path) -> None:
    """Synthetic consultations and a real run with references, recorded live (interleaved, as several processes
    write), and the journal of a real run written before references existed, indexed live when it was."""
    streams = [real_run_events(NEW_ID), *(synthetic_events(n, interrupted_after_round=n % 4 or None)
                                          for n in range(10))]
    record_interleaved(home, streams)
    layout = StoreLayout(home)
    shutil.copy(FIXTURES / "pre_refs_quick.jsonl", layout.journal_path(OLD_ID))
    writer = IndexWriter(layout.index_path)
    writer.write(read_records(layout.journal_path(OLD_ID)))
    writer.close()
    assert f'"{REFS}":'.encode() in layout.journal_path(NEW_ID).read_bytes()
    assert f'"{REFS}":'.encode() not in layout.journal_path(OLD_ID).read_bytes()


def test_a_rebuild_gives_the_rows_of_live_indexing_for_journals_with_and_without_references(tmp_path: Path) -> None:
    mixed_home(tmp_path)
    age_journals(tmp_path)
    live = dump(tmp_path)
    assert {NEW_ID, OLD_ID} <= {row[0] for row in live["consultations"]}
    for workers in (0, 2):
        report = rebuild(StoreLayout(tmp_path), chunk=3, workers=workers)
        assert report.consultations == 12
        assert dump(tmp_path) == live
    assert not StoreLayout(tmp_path).index_path.with_name("index.db.rebuild").exists()


def test_a_journal_written_during_a_rebuild_is_indexed_again_after_the_swap(tmp_path: Path) -> None:
    """The rebuild read the journal when half of it was written; the rest reached only the old index."""
    whole = tmp_path / "whole"
    record_interleaved(whole, [real_run_events(NEW_ID)], writers=1)
    home = tmp_path / "half"
    layout = StoreLayout(home)
    layout.journal_dir.mkdir(parents=True)
    journal = StoreLayout(whole).journal_path(NEW_ID).read_bytes()
    lines = journal.splitlines(keepends=True)
    layout.journal_path(NEW_ID).write_bytes(b"".join(lines[: len(lines) // 2]))
    age_journals(home)
    rebuild(layout, workers=0)
    assert dump(home) != dump(whole)
    since = time.time()
    layout.journal_path(NEW_ID).write_bytes(journal)  # the run goes on while the rebuild installs its file
    _catch_up(layout, since)
    assert dump(home) == dump(whole)


def test_a_rebuild_killed_half_way_leaves_the_old_index_intact(tmp_path: Path) -> None:
    record_interleaved(tmp_path, [synthetic_events(n) for n in range(120)])
    age_journals(tmp_path)
    before = dump(tmp_path)
    layout = StoreLayout(tmp_path)
    scratch = layout.index_path.with_name("index.db.rebuild")
    wal = layout.index_path.with_name("index.db-wal")
    assert not wal.exists()
    process = subprocess.Popen([sys.executable, "-m", "conclave", "index", "rebuild"], env=clean_env(tmp_path),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        # rows are loading: into the scratch file (or, as rebuilds used to, into the index itself)
        if any(path.exists() and path.stat().st_size > 0 for path in (scratch, wal)):
            break
        time.sleep(0.001)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert process.returncode == -signal.SIGKILL, "the rebuild finished before it could be killed"
    conn = sqlite3.connect(layout.index_path)
    try:
        assert conn.execute("pragma integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()
    assert dump(tmp_path) == before
    done = run_conclave("index", "rebuild", home=tmp_path)  # the next one starts over from what it left
    assert done.returncode == 0, done.stderr
    assert dump(tmp_path) == before
    assert not scratch.exists()


def test_a_rebuild_reaches_a_connection_that_holds_the_index_open(tmp_path: Path) -> None:
    """A reader (``browse``, ``serve``) keeps its connection: the rebuilt rows are copied into the file it has
    open, in one transaction, instead of a rename it would never see."""
    record_interleaved(tmp_path, [synthetic_events(n) for n in range(6)], writers=1)
    age_journals(tmp_path)
    live = dump(tmp_path)
    layout = StoreLayout(tmp_path)
    reader = sqlite3.connect(layout.index_path, isolation_level=None)
    try:
        reader.execute("delete from agents")  # damage the rebuild repairs
        assert reader.execute("select count(*) from agents").fetchone() == (0,)
        rebuild(layout, workers=0)
        assert reader.execute("select count(*) from agents").fetchone() == (len(live["agents"]),)
    finally:
        reader.close()
    assert dump(tmp_path) == live


def many_journals(home: Path, count: int) -> list[str]:
    """``count`` small hash-chained journals with their heads, as the journal writer writes them."""
    layout = StoreLayout(home)
    heads = HeadsLog(layout.heads_path)
    ids = [f"c-v{n:05d}" for n in range(count)]
    for cid in ids:
        writer = JournalWriter(layout.journal_path(cid), cid, heads, Redactor([]))
        for seq in range(3):
            writer.append_line("note", 1_790_000_000.0 + seq, {"n": seq, "text": f"{cid} record {seq}"})
        writer.close()
    return ids


def test_verify_in_worker_processes_names_every_tampered_journal(tmp_path: Path) -> None:
    ids = many_journals(tmp_path, 2 * VERIFY_CHUNK + 5)  # three workers' shares
    layout = StoreLayout(tmp_path)
    tampered = [ids[VERIFY_CHUNK + 7], ids[-1]]  # in the second and the third share
    for cid in tampered:
        path = layout.journal_path(cid)
        path.write_bytes(path.read_bytes().replace(b"record 1", b"record X"))
    in_process = verify_store(layout, workers=0)
    in_workers = verify_store(layout, workers=3)
    assert in_workers == in_process
    assert [(p.consultation_id, p.kind, p.seq) for p in in_workers.problems] == [(cid, "edited", 1) for cid in tampered]
    assert in_workers.journals == len(ids) and in_workers.records == 3 * len(ids)
    done = run_conclave("logs", "verify", home=tmp_path)
    assert done.returncode == 1
    assert [line.split(":")[0] for line in done.stdout.splitlines()] == [f"FAIL {cid}" for cid in tampered]


def test_references_filled_in_place_never_change_the_record_they_come_from() -> None:
    """``index rebuild`` fills references into the records it just parsed; one that points inside a value another
    reference filled in (no writer makes one; a damaged journal might) must not write into the earlier record."""
    earlier = {"x": {"k": 1, "big": ["long"] * 3}, "y": [1, 2]}
    records = [
        {"consultation_id": "c", "seq": 0, "data": earlier},
        {"consultation_id": "c", "seq": 1, "data": {"a": None, "b": {"c": None}, "l": [0, None]},
         REFS: [[["a"], 0, ["x"]], [["a", "k"], 0, ["x", "big"]], [["b", "c"], 0, ["y"]], [["l", 1], 0, ["y"]],
                [["a", "big", 0], 0, ["y"]], [["nowhere", "deep"], 0, ["x"]], [["b"], 7, ["x"]]]},
    ]
    text = b"".join(json.dumps(r).encode() + b"\n" for r in records)
    copied = expand_records(json.loads(json.dumps(records)))
    in_place = parse_records(text, "unused")
    assert in_place == copied
    assert in_place[0]["data"] == earlier  # the values it lent are as they were
    assert in_place[1]["data"]["a"] == {"k": ["long"] * 3, "big": [[1, 2], "long", "long"]}
    assert all(REFS not in r for r in in_place)


def test_a_second_rebuild_meanwhile_is_one_line_and_leaves_the_index_alone(tmp_path: Path) -> None:
    record_interleaved(tmp_path, [synthetic_events(n) for n in range(2)], writers=1)
    before = dump(tmp_path)
    scratch = StoreLayout(tmp_path).index_path.with_name("index.db.rebuild")
    fd = os.open(scratch, os.O_RDWR | os.O_CREAT)
    try:
        assert try_lock(fd, exclusive=True)  # as the first rebuild holds it
        done = run_conclave("index", "rebuild", home=tmp_path)
    finally:
        os.close(fd)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"conclave index: cannot rebuild the index: another `conclave index rebuild` is writing {scratch}"]
    assert dump(tmp_path) == before
