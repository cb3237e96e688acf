"""The per-consultation JSONL journal, the source of truth: hash-chained records, buffered appends, fsync on flush.

Each line is ``{"consultation_id", "data", "prev", "seq", "ts", "type", "hash"}``; ``seq`` is the record's
position in its journal (0-based), ``prev`` the previous record's hash (:data:`~conclave.store.chain.GENESIS`
for the first) and ``hash`` the sha256 of the canonical JSON of the record without ``hash``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from conclave.errors import ConclaveError
from conclave.store.chain import GENESIS, canonical_json
from conclave.store.heads import HeadsLog
from conclave.store.journal_file import (
    JournalFile,
    JournalLine,
    last_record,
    parse_records,
    read_journal,
    read_records,
)
from conclave.store.redact import Redactor
from conclave.store.verify import check_journal

# The reading side lives in journal_file.py; re-exported because readers have long imported it from here.
__all__ = ["JournalError", "JournalFile", "JournalLine", "JournalWriter", "encode_line", "is_being_written",
           "last_record", "parse_records", "read_journal", "read_records", "try_lock"]


class JournalError(ConclaveError):
    """A journal cannot be appended to (it fails verification) or read."""


def encode_line(body: str) -> tuple[str, bytes]:
    """(hash, line) for the canonical JSON of a record without ``hash``: the body with the hash appended last."""
    digest = hashlib.sha256(body.encode()).hexdigest()
    return digest, f'{body[:-1]},"hash":"{digest}"}}\n'.encode()


class JournalWriter:
    """Appends one consultation's records. Writes are buffered; :meth:`flush` makes them durable and records the head.

    Opening an existing journal continues its chain (``conclave resume``): it must verify, and a torn last line
    left by a crash is cut off first.
    """

    def __init__(self, path: Path, consultation_id: str, heads: HeadsLog, redactor: Redactor) -> None:
        self.path = path
        self.consultation_id = consultation_id
        self._heads = heads
        self._redactor = redactor
        self.next_seq = 0
        self.prev = GENESIS
        self._unflushed = 0
        self._new_file = not path.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "ab", buffering=1 << 16)  # noqa: SIM115 - lives as long as the writer
        # One writer per journal: the lock dies with its process, so a killed run never blocks `resume`.
        if not try_lock(self._file.fileno(), exclusive=True):
            self._file.close()
            raise JournalError(f"consultation {consultation_id} is being recorded by another process")
        if not self._new_file:
            try:
                self._continue_existing()
            except BaseException:
                self._file.close()
                raise

    def _continue_existing(self) -> None:
        journal = read_journal(self.path)
        heads = self._heads.load(self.consultation_id).get(self.consultation_id, [])
        problem = check_journal(self.consultation_id, journal, heads)
        if problem is not None:
            raise JournalError(f"refusing to append to {self.path}: {problem}")
        if journal.torn_at is not None:
            with open(self.path, "r+b") as f:
                f.truncate(journal.torn_at)
                os.fsync(f.fileno())
        records = journal.records
        if records:
            self.next_seq = records[-1]["seq"] + 1
            self.prev = records[-1]["hash"]

    def append(self, type_: str, ts: float, data: dict[str, Any]) -> dict[str, Any]:
        """Buffer one record; return it exactly as a reader will parse it back (secrets redacted, hash set)."""
        record: dict[str, Any] = {
            "consultation_id": self.consultation_id, "data": data, "prev": self.prev, "seq": self.next_seq,
            "ts": ts, "type": type_,
        }
        body = canonical_json(record)
        if self._redactor.secrets and self._redactor.leaks(body):
            record = self._redactor.scrub(record)
            body = canonical_json(record)
        digest, line = encode_line(body)
        self._file.write(line)
        self.prev = digest
        self.next_seq += 1
        self._unflushed += 1
        # Parsed back from the line, so the live index sees exactly what ``index rebuild`` will read.
        parsed: dict[str, Any] = json.loads(line)
        return parsed

    def flush(self) -> bool:
        """fsync what was appended and record the new head; False when there was nothing to flush."""
        if not self._unflushed:
            return False
        self._file.flush()
        os.fsync(self._file.fileno())
        if self._new_file:  # the file's directory entry must be durable too, once
            _fsync_dir(self.path.parent)
            self._new_file = False
        self._heads.append(self.consultation_id, self.next_seq - 1, self.prev)
        self._unflushed = 0
        return True

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self.flush()
        finally:
            self._file.close()


def try_lock(fd: int, *, exclusive: bool) -> bool:
    """Take an advisory lock on ``fd`` without waiting; True when held (always, where flock does not exist)."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; one writer per consultation is then the caller's promise
        return True
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def is_being_written(path: Path) -> bool:
    """True while some process holds a :class:`JournalWriter` open on ``path``."""
    try:
        with open(path, "rb") as f:
            return not try_lock(f.fileno(), exclusive=False)
    except FileNotFoundError:
        return False


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
