"""The heads log: the last durable (seq, hash) of each journal, kept apart so truncating a journal's tail shows.

One append-only file shared by every process; each line (``consultation_id seq hash [mac]``) is far below
PIPE_BUF and written with a single ``O_APPEND`` write, so concurrent writers never interleave within a line.

Two ways to make the heads themselves hard to forge (``logs verify`` checks both):

- keyed: with ``CONCLAVE_JOURNAL_KEY`` set, each line carries ``mac``, the HMAC-SHA256 of ``consultation_id seq
  hash`` under that key. Whoever rewrites a journal and its heads without the key cannot make valid MACs.
- anchored: :meth:`HeadsLog.anchor` is a digest of the log as it is now (``heads-v1:<length>:<sha256>``). The
  log only ever grows, so the same first ``length`` bytes must hash to it later, whatever was appended since.
  Before the digest, ``conclave logs head`` appends a *closed* line (``consultation_id seq hash closed``) for each
  journal no process was writing that may still be continued (killed, partial, aborted): only ``conclave resume``
  continues such a journal, so under the digest its next record after ``seq`` must be ``consultation:resumed``.
  Readers of heads skip these lines.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from conclave.errors import StorageError

KEY_VARIABLE = "CONCLAVE_JOURNAL_KEY"
_ANCHOR_PREFIX = "heads-v1"
CLOSED = "closed"


def key_from_env() -> bytes | None:
    """The HMAC key for heads (``CONCLAVE_JOURNAL_KEY``), or None when keyed heads are off."""
    value = os.environ.get(KEY_VARIABLE)
    return value.encode() if value else None


@dataclass(frozen=True, slots=True)
class Head:
    consultation_id: str
    seq: int
    hash: str
    mac: str | None  # None when recorded without a key


class HeadsLog:
    """The heads log at ``path``; ``key`` (default: :func:`key_from_env`) signs what this process appends."""

    _DEFAULT = object()

    def __init__(self, path: Path, key: bytes | object | None = _DEFAULT) -> None:
        self.path = path
        self.key: bytes | None = key_from_env() if key is HeadsLog._DEFAULT else key  # type: ignore[assignment]

    def mac(self, consultation_id: str, seq: int, hash_: str) -> str | None:
        if self.key is None:
            return None
        return hmac.new(self.key, f"{consultation_id} {seq} {hash_}".encode(), hashlib.sha256).hexdigest()

    def append(self, consultation_id: str, seq: int, hash_: str, *, sync: bool = True) -> None:
        """Record a head, fsynced before returning; ``sync=False``: only handed to the operating system (it
        survives the process being killed; the next :meth:`sync` or synced append makes it durable)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mac = self.mac(consultation_id, seq, hash_)
        line = f"{consultation_id} {seq} {hash_}" + (f" {mac}" if mac else "") + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line.encode())
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def mark_closed(self, consultation_id: str, seq: int, hash_: str) -> None:
        """Record that no process was writing ``consultation_id``, whose last head is ``seq``, when this was said."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, f"{consultation_id} {seq} {hash_} {CLOSED}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def closed(self, anchor: str | None = None) -> dict[str, int]:
        """Consultation id → the head seq of its last *closed* line (only those in the part ``anchor`` covers)."""
        data = self._read()
        if anchor is not None:
            data = data[: self._anchor_parts(anchor)[0]]
        marks: dict[str, int] = {}
        for line in data.decode("utf-8", errors="replace").splitlines():
            parts = line.split(" ")
            if len(parts) == 4 and parts[3] == CLOSED and parts[1].isdigit() and len(parts[2]) == 64:
                marks[parts[0]] = int(parts[1])
        return marks

    def sync(self) -> None:
        """Make every head appended so far durable (heads appended with ``sync=False``)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _read(self) -> bytes:
        """The log's bytes (none yet: empty); a home the log cannot be read in (a file where its directory should
        be, no permission) is one :class:`StorageError` naming the log and the reason."""
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return b""
        except OSError as exc:
            raise StorageError(f"cannot read the heads log {self.path}: {exc.strerror or exc}") from None

    def entries(self, consultation_id: str | None = None) -> list[Head]:
        """Every head recorded (for one consultation, or all), in the order written. Lines that are not heads
        (a torn last line) are skipped."""
        prefix = None if consultation_id is None else consultation_id + " "
        text = self._read().decode("utf-8", errors="replace")
        heads = []
        for line in text.splitlines():
            if prefix is not None and not line.startswith(prefix):
                continue
            parts = line.split(" ")
            if len(parts) not in (3, 4) or len(parts[2]) != 64 or not parts[1].isdigit():
                continue
            if len(parts) == 4 and len(parts[3]) != 64:
                continue
            heads.append(Head(parts[0], int(parts[1]), parts[2], parts[3] if len(parts) == 4 else None))
        return heads

    def load(self, consultation_id: str | None = None) -> dict[str, list[tuple[int, str]]]:
        """Every head recorded (for one consultation, or all), in the order written. A torn last line is ignored."""
        heads: dict[str, list[tuple[int, str]]] = {}
        for head in self.entries(consultation_id):
            heads.setdefault(head.consultation_id, []).append((head.seq, head.hash))
        return heads

    def authentic(self, head: Head) -> bool:
        """True when ``head`` carries a valid MAC under this log's key (there must be a key)."""
        expected = self.mac(head.consultation_id, head.seq, head.hash)
        return expected is not None and head.mac is not None and hmac.compare_digest(expected, head.mac)

    def anchor(self) -> str:
        """``heads-v1:<length>:<sha256>`` of the log as it is now (length 0 when there is none yet)."""
        data = self._read()
        return f"{_ANCHOR_PREFIX}:{len(data)}:{hashlib.sha256(data).hexdigest()}"

    def check_anchor(self, anchor: str) -> str | None:
        """None when the log still starts with what ``anchor`` was taken of; else what differs."""
        length, digest = self._anchor_parts(anchor)
        data = self._read()
        if len(data) < length:
            return f"the heads log is {len(data)} bytes, shorter than the {length} the digest was taken of"
        if hashlib.sha256(data[:length]).hexdigest() != digest:
            return f"the first {length} bytes of the heads log changed since the digest was taken"
        return None

    @staticmethod
    def _anchor_parts(anchor: str) -> tuple[int, str]:
        parts = anchor.strip().split(":")
        if len(parts) != 3 or parts[0] != _ANCHOR_PREFIX or not parts[1].isdigit() or len(parts[2]) != 64:
            raise ValueError(f"not a heads digest: {anchor!r} (expected {_ANCHOR_PREFIX}:<length>:<sha256>, "
                             "as `conclave logs head` prints)")
        return int(parts[1]), parts[2]
