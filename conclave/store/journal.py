"""The per-consultation JSONL journal, the source of truth: hash-chained records, buffered appends, fsync on flush.

Each line is ``{"consultation_id", "data", "prev", "seq", "ts", "type", "hash"}``; ``seq`` is the record's
position in its journal (0-based), ``prev`` the previous record's hash (:data:`~conclave.store.chain.GENESIS`
for the first) and ``hash`` the sha256 of the canonical JSON of the record without ``hash``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, NoReturn

from conclave.errors import StorageError
from conclave.store.chain import GENESIS, canonical_json
from conclave.store.heads import HeadsLog
from conclave.store.journal_file import (
    REFS,
    JournalFile,
    JournalLine,
    is_being_written,
    last_record,
    live_status,
    parse_records,
    read_journal,
    read_records,
    try_lock,
)
from conclave.store.redact import Redactor
from conclave.store.verify import check_journal, headed_lines

# The reading side lives in journal_file.py; re-exported because readers have long imported it from here.
__all__ = ["JournalError", "JournalFile", "JournalLine", "JournalWriter", "encode_line", "is_being_written",
           "last_record", "live_status", "parse_records", "read_journal", "read_records", "try_lock"]


class JournalError(StorageError):
    """A journal cannot be appended to (it fails verification, or the disk refuses the write) or read."""


def os_cause(exc: OSError) -> str:
    """The operating system's reason for ``exc`` in a few words ("No space left on device")."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    if exc.errno == errno.ENOSPC:
        return f"{reason} (the disk is full)"
    return reason


def encode_line(body: str) -> tuple[str, bytes]:
    """(hash, line) for the canonical JSON of a record without ``hash``: the body with the hash appended last."""
    digest = hashlib.sha256(body.encode()).hexdigest()
    return digest, f'{body[:-1]},"hash":"{digest}"}}\n'.encode()


class JournalWriter:
    """Appends one consultation's records. Writes are buffered; :meth:`flush` makes them durable and records the head.

    Opening an existing journal continues its chain (``conclave resume``): it must verify, and a torn last line
    left by a crash is cut off first.

    A write, fsync or head the disk refuses (full, read-only, gone) raises :class:`JournalError` naming the path
    and the cause, and the writer is then failed: every later append or flush raises the same error and nothing
    more is written. What the refused write left in the file is cut off again, so the journal ends with the last
    record its heads cover (where even that cut is refused, a last line cut short is torn, which ``logs verify``
    notes and ``resume`` cuts off). A new journal whose first flush fails is removed: nothing was durable, so
    nothing can be resumed.
    """

    def __init__(self, path: Path, consultation_id: str, heads: HeadsLog, redactor: Redactor) -> None:
        self.path = path
        self.consultation_id = consultation_id
        self._heads = heads
        self._redactor = redactor
        self.next_seq = 0
        self.prev = GENESIS
        self._buffer: list[bytes] = []
        #: guards the buffer and the chain's end: records are appended on the event loop while a write of the
        #: records before them may run on the recorder's I/O thread (see :meth:`_snapshot`)
        self._lock = threading.Lock()
        #: one write at a time: the recorder's I/O thread, or whoever flushes directly (close, an interrupted wait)
        self._writing = threading.Lock()
        self._failed: str | None = None
        self._durable = False  # some record of this journal was made durable (by this writer or an earlier one)
        self._unsynced = False  # records written out (write_out) but not fsynced yet
        self._headed = -1  # the last seq whose head is in the heads log (synced or not)
        #: sha256 of the canonical JSON of each value (of at least :data:`REF_MIN_CHARS`) this writer journaled ->
        #: (seq, path) of its first place: a later record refers to it instead of repeating it (see ``REFS``)
        self._seen: dict[str, tuple[int, list[Any]]] = {}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise JournalError(f"cannot create the journal directory {_missing_part(path.parent)}: "
                               f"{os_cause(exc)}") from None
        self._new_file = not path.exists()
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise JournalError(f"cannot open the journal {path}: {os_cause(exc)}") from None
        # One writer per journal: the lock dies with its process, so a killed run never blocks `resume`.
        if not _lock_soon(self._fd):
            os.close(self._fd)
            raise JournalError(f"consultation {consultation_id} is being recorded by another process")
        if not self._new_file:
            try:
                self._continue_existing()
            except BaseException:
                os.close(self._fd)
                raise

    def _continue_existing(self) -> None:
        journal = read_journal(self.path)
        heads = self._heads.load(self.consultation_id).get(self.consultation_id, [])
        problem = check_journal(self.consultation_id, journal, heads)
        if problem is not None:
            raise JournalError(f"refusing to append to {self.path}: {problem}")
        # Records no head covers (a run killed between a write and its head, or lines added by hand) are not
        # continued, just as a torn last line is not: they are cut off, never covered by a new head.
        headed = headed_lines(journal, heads)
        if journal.torn_at is not None or len(headed) < len(journal.lines):
            try:
                os.ftruncate(self._fd, sum(len(line.raw) + 1 for line in headed))
                os.fsync(self._fd)
            except OSError as exc:
                raise JournalError(f"cannot cut the unrecorded end of {self.path}: {os_cause(exc)}") from None
        records = [r for r in (line.record for line in headed) if r is not None]
        if records:
            self.next_seq = records[-1]["seq"] + 1
            self.prev = records[-1]["hash"]
            self._durable = True

    @property
    def failed(self) -> str | None:
        """Why the disk refused this journal (the message of the :class:`JournalError` raised), or None."""
        return self._failed

    def append(self, type_: str, ts: float, data: dict[str, Any]) -> dict[str, Any]:
        """Buffer one record; return it exactly as a reader will parse it back (secrets redacted, hash set)."""
        # Parsed back from the line, so the live index sees exactly what ``index rebuild`` will read.
        parsed: dict[str, Any] = json.loads(self.append_line(type_, ts, data))
        if REFS in parsed:  # what a reader reads: the values it refers to filled in
            parsed = {k: v for k, v in parsed.items() if k != REFS}
            parsed["data"] = json.loads(canonical_json(data))
        return parsed

    def append_line(self, type_: str, ts: float, data: dict[str, Any]) -> bytes:
        """Buffer one record; return its line as written (secrets redacted, hash set), for a reader to parse when
        it needs the record (the index, once the record is durable)."""
        if self._failed is not None:
            raise JournalError(self._failed)
        with self._lock:
            first: dict[str, list[Any]] = {}
            lean, refs = self._refer(data, [], first)
            record: dict[str, Any] = {
                "consultation_id": self.consultation_id, "data": lean, "prev": self.prev, "seq": self.next_seq,
                "ts": ts, "type": type_,
            }
            if refs:
                record[REFS] = refs
            body = canonical_json(record)
            if self._redactor.secrets and self._redactor.leaks(body):
                record = self._redactor.scrub(record)
                body = canonical_json(record)
                first = {}  # its values were changed: later records repeat them in full
            for digest, path in first.items():
                self._seen.setdefault(digest, (self.next_seq, path))
            digest, line = encode_line(body)
            self._buffer.append(line)
            self.prev = digest
            self.next_seq += 1
        return line

    def _refer(self, value: Any, path: list[Any], first: dict[str, list[Any]]) -> tuple[Any, list[list[Any]]]:
        """``value`` with each dict or list in it (not itself) that repeats one an earlier record of this journal
        holds replaced by ``None``, and the references for them (``[path, seq, path there]``); values of at least
        :data:`REF_MIN_CHARS` met for the first time go to ``first`` (digest -> path)."""
        items = value.items() if isinstance(value, dict) else enumerate(value)
        out: Any = {} if isinstance(value, dict) else []
        refs: list[list[Any]] = []
        for key, item in items:
            if isinstance(item, (dict, list)) and item:
                text = canonical_json(item)
                if len(text) >= REF_MIN_CHARS:
                    digest = hashlib.sha256(text.encode()).hexdigest()
                    where = [*path, key]
                    if digest in self._seen:
                        seq, there = self._seen[digest]
                        refs.append([where, seq, there])
                        item = None
                    else:
                        first.setdefault(digest, where)
                        item, inner = self._refer(item, where, first)
                        refs += inner
            if isinstance(out, dict):
                out[key] = item
            else:
                out.append(item)
        return out, refs

    def _snapshot(self) -> tuple[int, bytes, int, str]:
        """What is buffered now: how many lines, their bytes, and the seq and hash of the last one (the head that
        a write of them records). Records appended after it wait for the next write, which
        :meth:`_written` leaves them to."""
        with self._lock:
            return len(self._buffer), b"".join(self._buffer), self.next_seq - 1, self.prev

    def _written(self, count: int) -> None:
        """The first ``count`` buffered lines are in the file: forget them (not what was appended since)."""
        with self._lock:
            del self._buffer[:count]

    def write_out(self) -> None:
        """Write what was appended and its head: the records' data is synced, the head is only handed to the
        operating system, and :meth:`flush` makes it durable. It survives this process being killed. A refusal
        fails the writer as :meth:`flush` does."""
        if self._failed is not None:
            raise JournalError(self._failed)
        self._write(durable=False, keep_on_refusal=False)

    def flush(self) -> bool:
        """Write and fsync what was appended and record the new head; False when there was nothing to flush."""
        if self._failed is not None:
            raise JournalError(self._failed)
        return self._write(durable=True, keep_on_refusal=False)

    def flush_if_possible(self) -> None:
        """Write out what was appended, with its head, if the disk takes it (as :meth:`write_out`: it survives this
        process being killed, and the next :meth:`flush` makes it durable), without failing the writer when it does
        not: the bytes a refused write (or a refused head) left behind are cut off again and the records stay
        buffered, so the next :meth:`flush` (at the round's end) retries them and reports the failure where the
        consultation handles it."""
        if self._failed is None:
            self._write(durable=False, keep_on_refusal=True)

    def _write(self, *, durable: bool, keep_on_refusal: bool) -> bool:
        """Write the records buffered now (:meth:`_snapshot`; possibly none, when earlier ones were written out
        unsynced and ``durable``), then their head; False when there was nothing to write. The one order every
        path keeps: the records' data reaches the disk before their head is written (a head on disk before its
        records would, after a machine crash, read as a truncated journal).

        ``durable`` (:meth:`flush`): fsync the journal (and, once, a new file's directory entry) and sync the head
        (a head written out before is synced, not appended again); else fdatasync the records and only hand the
        head to the operating system. A refused step cuts the file back to where this write began: the journal
        ends with its last headed record (records without a head are what an appended forgery looks like), and
        the writer fails (:class:`JournalError`). With ``keep_on_refusal`` the records stay buffered instead, for
        the next flush to retry, and the writer fails (without raising) only when the cut is refused too, or the
        next flush would write the same records a second time after the bytes left behind."""
        with self._writing:
            return self._write_locked(durable=durable, keep_on_refusal=keep_on_refusal)

    def _write_locked(self, *, durable: bool, keep_on_refusal: bool) -> bool:
        count, data, seq, digest = self._snapshot()
        if not count and not (durable and self._unsynced):
            return False
        size = self._size()
        if keep_on_refusal and size is None:
            return True  # nothing could be cut back: do not write
        try:
            _write_all(self._fd, data)
            if durable:
                os.fsync(self._fd)
                if self._new_file:  # the file's directory entry must be durable too, once
                    _fsync_dir(self.path.parent)
                    self._new_file = False
            else:
                os.fdatasync(self._fd)
        except OSError as exc:
            self._refused(size, keep_on_refusal, f"cannot write the journal {self.path}", exc,
                          "cannot cut a refused write back")
            return True
        try:
            if durable and self._headed == seq:  # its head was written out unsynced
                self._heads.sync()
            else:
                self._append_head(seq, digest, sync=durable)
        except OSError as exc:
            self._refused(size, keep_on_refusal, f"cannot record the journal head in {self._heads.path}", exc,
                          "cannot cut the records back")
            return True
        self._written(count)
        self._unsynced = not durable
        if durable:
            self._durable = True
        return True

    def _refused(self, size: int | None, keep: bool, what: str, exc: OSError, uncut: str) -> None:
        """A write or head the disk refused: cut the file back to ``size`` and fail the writer (raises), or with
        ``keep`` leave the records buffered, failing the writer quietly only when the cut is refused too."""
        cut = self._cut_back(size)
        if not keep:
            self._fail(f"{what}: {os_cause(exc)}")
        if not cut:
            with contextlib.suppress(JournalError):
                self._fail(f"{what}: {uncut}")

    def _append_head(self, seq: int, digest: str, *, sync: bool) -> None:
        self._heads.append(self.consultation_id, seq, digest, sync=sync)
        self._headed = seq

    def _size(self) -> int | None:
        try:
            return os.fstat(self._fd).st_size
        except OSError:
            return None

    def _cut_back(self, size: int | None) -> bool:
        """Cut the file back to ``size`` bytes; False when that failed (or the size was unknown)."""
        if size is None:
            return False
        try:
            os.ftruncate(self._fd, size)
            os.fsync(self._fd)
        except OSError:
            return False
        return True

    def _fail(self, message: str) -> NoReturn:
        if not self._durable:  # nothing of this journal was ever durable: leave no empty or torn file behind
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            message += "; nothing was recorded"
        else:
            message += (f"; the journal keeps every record made durable before it (`conclave resume "
                        f"{self.consultation_id}` continues once that is fixed)")
        self._failed = message
        with self._lock:
            self._buffer.clear()
        raise JournalError(message)

    def close(self) -> None:
        """Flush (unless failed) and close; a failed writer closes without writing anything more."""
        if self._fd < 0:
            return
        try:
            if self._failed is None:
                self.flush()
        finally:
            os.close(self._fd)
            self._fd = -1


#: the shortest value (characters of canonical JSON) a record refers to instead of repeating it: a reference costs
#: about 60
REF_MIN_CHARS = 256


def _lock_soon(fd: int) -> bool:
    """Take the writer's exclusive lock, waiting a moment for readers: ``logs list``, ``logs show`` and the
    Datasette pages hold a shared lock for microseconds to see whether a journal is being written."""
    deadline = time.monotonic() + WRITER_LOCK_WAIT_S
    while not try_lock(fd, exclusive=True):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


#: how long a writer waits for readers' shared locks on its journal before saying another process records it
WRITER_LOCK_WAIT_S = 0.2


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _missing_part(path: Path) -> Path:
    """The first part of ``path`` that is not a directory (a file where a directory should be), else ``path``."""
    for parent in (*reversed(path.parents), path):
        if parent.exists() and not parent.is_dir():
            return parent
    return path


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
