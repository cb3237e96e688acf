"""The journal: hash-chained JSONL, buffered appends made durable at flush, head kept apart, secrets redacted."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
from pathlib import Path

import pytest

from conclave import events as ev
from conclave.store.chain import GENESIS, canonical_json
from conclave.store.heads import HeadsLog
from conclave.store.journal import JournalError, JournalWriter, last_record, read_journal
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.redact import Redactor, key_variables
from conclave.store.verify import verify_store
from conclave.testing.synthetic_events import synthetic_events


def writer(home: Path, cid: str = "c-test", redactor: Redactor | None = None) -> JournalWriter:
    layout = StoreLayout(home)
    return JournalWriter(layout.journal_path(cid), cid, HeadsLog(layout.heads_path), redactor or Redactor([]))


def test_records_are_hash_chained_over_canonical_json(tmp_path: Path) -> None:
    w = writer(tmp_path)
    for i in range(3):
        w.append("state:transition", 1000.0 + i, {"from": "A", "to": "B", "i": i})
    w.close()
    lines = (tmp_path / "journal" / "c-test.jsonl").read_text().splitlines()
    prev = GENESIS
    for seq, line in enumerate(lines):
        record = json.loads(line)
        body = {k: v for k, v in record.items() if k != "hash"}
        assert set(body) == {"consultation_id", "data", "prev", "seq", "ts", "type"}
        assert record["hash"] == hashlib.sha256(canonical_json(body).encode()).hexdigest()
        assert (record["seq"], record["prev"]) == (seq, prev)
        prev = record["hash"]


def test_appends_are_buffered_and_flush_fsyncs_then_records_the_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    w = writer(tmp_path)
    path = tmp_path / "journal" / "c-test.jsonl"
    w.append("round:started", 1.0, {"round_number": 1})
    last = w.append("round:completed", 2.0, {"round_number": 1})
    assert path.stat().st_size == 0 and not synced  # still in the buffer: appends are cheap
    assert w.flush() is True
    assert len(read_journal(path).records) == 2
    assert synced  # journal (and heads) fsynced
    assert HeadsLog(tmp_path / "journal" / "HEADS").load() == {"c-test": [(1, last["hash"])]}
    assert w.flush() is False  # nothing new, no extra fsync or head
    w.close()


def test_recorder_makes_each_round_durable_before_the_next_round_starts(tmp_path: Path) -> None:
    recorder = Recorder(tmp_path, index=False)
    events = synthetic_events(1)
    path = StoreLayout(tmp_path).journal_path(events[0].consultation_id)
    for i, event in enumerate(events):
        recorder(event)
        if event.type == ev.ROUND_STARTED:
            asyncio.run(recorder.until_durable())  # what the round's first request waits for
            on_disk = read_journal(path).records
            # everything before the new round, and its own round:started, is on disk before its first call
            assert [r["type"] for r in on_disk] == [e.type for e in events[: i + 1]]
    recorder.close()


def test_continuing_a_journal_extends_its_chain_and_cuts_a_torn_last_line(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.append("a", 1.0, {})
    w.append("b", 2.0, {})
    w.close()
    path = tmp_path / "journal" / "c-test.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"consultation_id":"c-test","data":{"half')  # a crash in the middle of a write
    assert read_journal(path).torn_at is not None
    w = writer(tmp_path)
    record = w.append("c", 3.0, {})
    w.close()
    journal = read_journal(path)
    assert journal.torn_at is None
    assert [r["type"] for r in journal.records] == ["a", "b", "c"]
    assert record["seq"] == 2 and record["prev"] == journal.records[1]["hash"]
    assert verify_store(StoreLayout(tmp_path)).ok


def test_refuses_to_continue_a_journal_that_fails_verification(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.append("a", 1.0, {"n": 1})
    w.append("b", 2.0, {})
    w.close()
    path = tmp_path / "journal" / "c-test.jsonl"
    path.write_text(path.read_text().replace('"n":1', '"n":2'))
    with pytest.raises(JournalError, match="edited"):
        writer(tmp_path)


def test_a_journal_has_one_writer_at_a_time(tmp_path: Path) -> None:
    first = writer(tmp_path)
    with pytest.raises(JournalError, match="another process"):
        writer(tmp_path)
    first.close()
    writer(tmp_path).close()  # the lock goes with its writer


def test_last_record_reads_backwards_past_a_torn_line_and_across_blocks(tmp_path: Path) -> None:
    w = writer(tmp_path)
    w.append("small", 1.0, {})
    w.append("big", 2.0, {"text": "x" * 200_000})
    w.close()
    path = tmp_path / "journal" / "c-test.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"torn')
    last = last_record(path, block=4096)
    assert last is not None and last["type"] == "big" and len(last["data"]["text"]) == 200_000


KEYS = {
    "OPENAI_API_KEY": "sk-proj-AAAAAAAAAAAAAAAAAAAAAAAA",
    "ANTHROPIC_API_KEY": 'sk-ant-quote"and\\backslash',
    "GEMINI_API_KEY": "AIzaSyGEMINIKEY0000000000",
    "GOOGLE_API_KEY": "AIzaSyGOOGLEKEY0000000000",
    "XAI_API_KEY": "xai-SECRET-1111111111",
    "MISTRAL_API_KEY": "mistral-SECRET-22222222",
    "CONCLAVE_JOURNAL_KEY": "journal-hmac-SECRET-33333333",
}


def test_api_key_values_never_reach_the_journal_or_the_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(KEYS) == set(key_variables())
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    recorder = Recorder(tmp_path)
    events = synthetic_events(3)
    leaky = {
        "question": f"is {KEYS['OPENAI_API_KEY']} safe?",
        "nested": [{"raw_text": "header x-api-key: " + KEYS["ANTHROPIC_API_KEY"]}],
        KEYS["XAI_API_KEY"]: "a key used as a key",
        "all": " ".join(KEYS.values()),
    }
    first = events[0]
    recorder.record(first.consultation_id, first.type, {**first.data, "question": leaky["question"]}, first.ts)
    recorder.record(first.consultation_id, "custom:leak", leaky, first.ts + 1)
    for event in events[1:]:
        recorder(event)
    recorder.close()
    raw = (tmp_path / "journal" / f"{first.consultation_id}.jsonl").read_text()
    index = (tmp_path / "index.db").read_bytes()
    for value in KEYS.values():
        assert value not in raw and json.dumps(value)[1:-1] not in raw
        assert value.encode() not in index
    assert raw.count("[REDACTED]") >= len(KEYS) + 3
    assert verify_store(StoreLayout(tmp_path)).ok  # redaction happens before hashing


def test_values_too_short_to_be_keys_are_left_alone() -> None:
    redactor = Redactor.from_env({"OPENAI_API_KEY": "abc", "XAI_API_KEY": ""})
    assert redactor.secrets == []
    assert redactor.scrub({"q": "abc"}) == {"q": "abc"}


def test_an_early_flush_the_disk_refuses_leaves_no_torn_bytes_and_fails_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer's early flush on a full disk: the half-written bytes are cut off again and the writer is not
    failed; the round's own flush retries the same records (here: the disk has room again) and the journal
    verifies."""
    import errno

    from conclave.store import journal as journal_module

    w = writer(tmp_path)
    w.append("a", 1.0, {"n": 1})
    w.flush()
    size = w.path.stat().st_size
    w.append("b", 2.0, {"n": 2})
    real_write_all = journal_module._write_all

    def full(fd: int, data: bytes) -> None:
        os.write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(journal_module, "_write_all", full)
    w.flush_if_possible()
    assert w.path.stat().st_size == size and w.failed is None
    monkeypatch.setattr(journal_module, "_write_all", real_write_all)
    w.append("c", 3.0, {"n": 3})
    w.close()
    assert [r["type"] for r in read_journal(w.path).records] == ["a", "b", "c"]
    assert verify_store(StoreLayout(tmp_path)).ok


def _trace(monkeypatch: pytest.MonkeyPatch, w: JournalWriter) -> list[str]:
    """What reaches the journal file and the heads log, in order: ``write``, ``fdatasync``/``fsync`` of the
    journal, ``head`` (written out) or ``head+sync``, ``heads sync``."""
    from conclave.store import journal as journal_module

    steps: list[str] = []
    real_write_all, real_fsync, real_fdatasync = journal_module._write_all, os.fsync, os.fdatasync
    real_append, real_sync = HeadsLog.append, HeadsLog.sync

    def write_all(fd: int, data: bytes) -> None:
        steps.append("write")
        real_write_all(fd, data)

    def fsync(fd: int) -> None:
        if fd == w._fd:
            steps.append("fsync")
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        if fd == w._fd:
            steps.append("fdatasync")
        real_fdatasync(fd)

    def append(self: HeadsLog, *args: object, sync: bool = True) -> None:
        steps.append("head+sync" if sync else "head")
        real_append(self, *args, sync=sync)  # type: ignore[arg-type]

    def sync(self: HeadsLog) -> None:
        steps.append("heads sync")
        real_sync(self)

    monkeypatch.setattr(journal_module, "_write_all", write_all)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(HeadsLog, "append", append)
    monkeypatch.setattr(HeadsLog, "sync", sync)
    return steps


def test_every_write_path_syncs_records_before_their_head(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A head must never reach the disk before its records (a machine crash would leave a head past the journal's
    end, which reads as a truncation): each path syncs the records' data, then writes the head."""
    w = writer(tmp_path)
    w.append("a", 1.0, {})
    w.flush()
    steps = _trace(monkeypatch, w)
    w.append("b", 2.0, {})
    w.flush_if_possible()  # an answer, as it arrives
    assert steps == ["write", "fdatasync", "head"]
    steps.clear()
    w.append("c", 3.0, {})
    w.write_out()  # a round's end
    assert steps == ["write", "fdatasync", "head"]
    steps.clear()
    w.flush()  # before the next round spends: the journal fsynced, then the heads written out already synced
    assert steps == ["write", "fsync", "heads sync"]
    steps.clear()
    w.append("d", 4.0, {})
    w.flush()
    assert steps == ["write", "fsync", "head+sync"]
    w.close()
    assert verify_store(StoreLayout(tmp_path)).ok


def _refuse_cuts(monkeypatch: pytest.MonkeyPatch) -> None:
    def ftruncate(fd: int, size: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "ftruncate", ftruncate)


def test_an_early_write_whose_refused_head_is_cut_back_is_written_once_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = writer(tmp_path)
    w.append("a", 1.0, {})
    w.flush()
    size = w.path.stat().st_size
    w.append("b", 2.0, {})
    real_append = HeadsLog.append

    def refused(self: HeadsLog, *args: object, sync: bool = True) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(HeadsLog, "append", refused)
    w.flush_if_possible()
    assert w.failed is None and w.path.stat().st_size == size  # no records without their head
    monkeypatch.setattr(HeadsLog, "append", real_append)
    w.close()
    assert [r["type"] for r in read_journal(w.path).records] == ["a", "b"]
    assert verify_store(StoreLayout(tmp_path)).ok


def _refusing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: str) -> tuple[JournalWriter, int, str]:
    """A writer holding record ``a`` durable and ``b`` buffered, whose next write (``refused="write"``: cut short
    after 5 bytes) or head the disk refuses; its journal's size, and how the refusal is reported."""
    from conclave.store import journal as journal_module

    w = writer(tmp_path)
    w.append("a", 1.0, {})
    w.flush()
    w.append("b", 2.0, {})

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    if refused == "write":
        monkeypatch.setattr(journal_module, "_write_all", lambda fd, data: (os.write(fd, data[:5]), full()))
        return w, w.path.stat().st_size, "cannot write the journal"
    monkeypatch.setattr(HeadsLog, "append", full)
    return w, w.path.stat().st_size, "cannot record the journal head"


@pytest.mark.parametrize("refused", ["write", "head"])
def test_an_early_write_that_cannot_be_cut_back_fails_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: str
) -> None:
    """Else the next flush would write the same records a second time after the bytes left behind."""
    w, _, expected = _refusing(tmp_path, monkeypatch, refused)
    _refuse_cuts(monkeypatch)
    w.flush_if_possible()  # never raises: the consultation meets the failure at its next flush
    assert w.failed is not None and w.failed.startswith(expected) and "cannot cut" in w.failed
    with pytest.raises(JournalError, match=expected):
        w.flush()
    w.close()


@pytest.mark.parametrize("path", ["write_out", "flush"])
@pytest.mark.parametrize("refused", ["write", "head"])
def test_a_refused_write_out_or_flush_is_cut_back_and_fails_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, refused: str
) -> None:
    w, size, expected = _refusing(tmp_path, monkeypatch, refused)
    with pytest.raises(JournalError, match=f"^{expected}.*No space left on device.*conclave resume c-test"):
        getattr(w, path)()
    assert w.path.stat().st_size == size  # the journal ends with its last headed record
    with pytest.raises(JournalError, match=expected):
        w.append("c", 3.0, {})
    w.close()
    assert [r["type"] for r in read_journal(w.path).records] == ["a"]


def test_cancelling_a_request_that_waits_for_the_journal_never_cancels_the_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hedge that lost, a task group's siblings or Ctrl-C cancel requests waiting in ``until_durable``: the
    write they waited for still happens, and the next request finds it done."""
    import threading

    slow = threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        slow.wait(5)  # held until the waiter below has been cancelled
        real_fsync(fd)

    recorder = Recorder(tmp_path, index=False)
    events = synthetic_events(1)
    monkeypatch.setattr(os, "fsync", slow_fsync)
    first_round = next(i for i, e in enumerate(events) if e.type == ev.ROUND_STARTED)
    for event in events[: first_round + 1]:  # the start's write runs (held in fsync); the round start's waits
        recorder(event)

    async def scenario() -> None:
        waiter = asyncio.ensure_future(recorder.until_durable(events[0].consultation_id))
        await asyncio.sleep(0.05)
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        slow.set()
        await recorder.until_durable(events[0].consultation_id)  # no CancelledError: the write ran

    asyncio.run(scenario())
    path = StoreLayout(tmp_path).journal_path(events[0].consultation_id)
    assert [r["type"] for r in read_journal(path).records] == [e.type for e in events[: first_round + 1]]
    recorder.close()


def test_a_recorder_wrapped_for_the_mcp_server_keeps_the_wait_before_each_request(tmp_path: Path) -> None:
    from conclave.doors.mcp.runs import OriginRecorder

    recorder = Recorder(tmp_path, index=False)
    wrapped = OriginRecorder(recorder, {"origin": "mcp"})
    assert wrapped.until_durable == recorder.until_durable  # the runner hands it to the pool
    assert wrapped.write_out == recorder.write_out
    recorder.close()
