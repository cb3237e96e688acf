"""Reading journals: their lines, their complete records, their last record. Writing is
:mod:`conclave.store.journal`'s; ``logs verify`` (:mod:`conclave.store.verify`) and the writer both read through
this module, so neither depends on the other's import.

A journal is JSONL, one hash-chained record per line (see :mod:`conclave.store.journal`). A last line with no
newline is a write cut short by a crash: it was never durable and is never part of the chain.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec


class JournalLine:
    """One complete line of a journal; parsed on first use (``logs verify`` rarely needs to)."""

    __slots__ = ("_parsed", "_record", "number", "raw")

    def __init__(self, number: int, raw: bytes) -> None:
        self.number = number  # 1-based
        self.raw = raw  # without its newline
        self._parsed = False
        self._record: dict[str, Any] | None = None

    @property
    def record(self) -> dict[str, Any] | None:
        """The parsed record, or None when the line is not a JSON object."""
        if not self._parsed:
            self._record, self._parsed = _parse(self.raw), True
        return self._record


@dataclass
class JournalFile:
    lines: list[JournalLine]
    # Byte offset of a last line with no newline: a write cut short by a crash. Never part of the chain.
    torn_at: int | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every complete record, its references to earlier records' values filled in (:func:`expand_records`)."""
        return expand_records([r for r in (line.record for line in self.lines) if r is not None])


def read_journal(path: Path) -> JournalFile:
    data = path.read_bytes()
    pieces = data.split(b"\n")
    last = pieces.pop()  # b"" when the file ends with a newline, as every complete write does
    lines = [JournalLine(number, raw) for number, raw in enumerate(pieces, 1)]
    return JournalFile(lines, len(data) - len(last) if last else None)


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a journal, fast: one JSON parse for the whole file (``index rebuild``).

    Falls back to :func:`read_journal` line by line when any line is not JSON (``logs verify`` says which).
    """
    with open(path, "rb", buffering=0) as f:
        data = f.readall()
    return parse_records(data, path)


def parse_records(data: bytes, path: str | Path) -> list[dict[str, Any]]:
    """:func:`read_records` of a journal already read into ``data`` (``path`` is read again line by line only if
    some line is not JSON).

    Parses with msgspec whenever it accepts the text: what it gives is then exactly what ``json.loads`` — which the
    live index sees (:meth:`JournalWriter.append`) — gives, integers of any size included (orjson, used before,
    turns those beyond 64 bits into floats), at about 2.5 times its speed. It refuses what only ``json.loads``
    accepts (NaN, Infinity, lone surrogates, numbers beyond a float's range), and ``json.loads`` parses those.
    """
    end = data.rfind(b"\n")
    if end <= 0:  # no complete line; a torn last line was never durable
        return []
    # Complete lines only. Raw newlines cannot occur inside JSON strings, so each one separates two records.
    text = b"[" + data[:end].replace(b"\n", b",") + b"]"
    records: Any = None
    # msgspec raises DecodeError for malformed JSON, but UnicodeDecodeError for invalid UTF-8 (which json.loads
    # reads with surrogatepass, or refuses line by line below), and deep nesting raises RecursionError
    with contextlib.suppress(msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        records = _DECODE(text)
    if records is None:
        try:
            records = json.loads(text)
        except (ValueError, RecursionError):  # a line nested past the recursion limit is no record, as below
            return read_journal(Path(path)).records
    return expand_records([r for r in records if isinstance(r, dict)], in_place=True)


#: A record's key listing the values of its ``data`` that repeat a value of an earlier record of the same journal,
#: which the writer left out (``null`` in their place): ``[[where, seq, there], ...]``, ``where`` the path (keys and
#: list positions) in this record's data, ``seq`` the earlier record and ``there`` the path in its data. The earlier
#: record is hash-chained before this one, so what a reference stands for is as tamper-evident as the record.
REFS = "refs"


def expand_records(records: list[dict[str, Any]], *, in_place: bool = False) -> list[dict[str, Any]]:
    """``records`` (in journal order) with every reference (:data:`REFS`) replaced by the value it stands for.

    A record with references is returned as a new record without :data:`REFS` (the parsed record, whose hash
    covers its references, is left as it is, for ``logs verify``); the others are returned as they are, so a
    journal written before references existed reads exactly as before. A reference that names no earlier value
    (a damaged journal, which ``logs verify`` reports) is left ``null``. Filled-in values are shared with the
    record they come from, not copied. ``in_place``: the records were just parsed for this caller alone, so
    references are filled into them rather than into copies (never into a value filled in from an earlier
    record: that one is copied first, as before)."""
    if not any(REFS in r for r in records):
        return records
    by_seq: dict[Any, dict[str, Any]] = {}
    out = []
    for record in records:
        refs = record.get(REFS)
        if isinstance(refs, list) and isinstance(record.get("data"), dict):
            if in_place:
                del record[REFS]
            else:
                record = {k: v for k, v in record.items() if k != REFS}
            shared: set[int] = set()  # ids of the values filled in: they belong to earlier records
            for ref in refs:
                try:
                    where, seq, there = ref
                    value = _at(by_seq[seq]["data"], there)
                    if in_place:
                        record["data"] = _put_in_place(record["data"], where, value, shared)
                    else:
                        record["data"] = _put(record["data"], where, value)
                except (LookupError, TypeError, ValueError):
                    continue
        by_seq.setdefault(record.get("seq"), record)
        out.append(record)
    return out


def filled_in(record: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """A record parsed from one line of the journal ``path`` (a live reader's), its references filled in from
    the records before it, which are in the file by then; a record without references is returned as it is."""
    if REFS not in record:
        return record
    return next((r for r in read_records(path) if r.get("seq") == record.get("seq")), record)


def _at(value: Any, path: list[Any]) -> Any:
    for step in path:
        value = value[step]
    return value


def _put_in_place(root: Any, path: list[Any], value: Any, shared: set[int]) -> Any:
    """``root`` with ``value`` at ``path``, set in place, except below a value in ``shared`` (filled in from an
    earlier record): from there on the containers along the path are copied (:func:`_put`)."""
    if not path:
        return value
    node = root
    for i, step in enumerate(path[:-1]):
        child = node[step]
        if id(child) in shared:
            node[step] = _put(child, path[i + 1 :], value)
            shared.add(id(value))
            return root
        node = child
    node[path[-1]] = value
    shared.add(id(value))
    return root


def _put(container: Any, path: list[Any], value: Any) -> Any:
    """A copy of ``container`` with ``value`` at ``path`` (only the containers along the path are copied)."""
    if not path:
        return value
    step, rest = path[0], path[1:]
    copy = dict(container) if isinstance(container, dict) else list(container)
    copy[step] = _put(container[step], rest, value)
    return copy


#: whole journals are parsed by msgspec where it accepts them (see :func:`parse_records`)
_DECODE = msgspec.json.Decoder().decode


def last_record(path: Path, block: int = 1 << 16) -> dict[str, Any] | None:
    """The last complete record of a journal, reading backwards from the end (a torn last line is skipped)."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        tail = b""
        position = end
        while position > 0:
            step = min(block, position)
            position -= step
            f.seek(position)
            tail = f.read(step) + tail
            complete = tail[: tail.rfind(b"\n")] if b"\n" in tail else b""
            start = complete.rfind(b"\n")
            if start >= 0 or (position == 0 and complete):
                last = _parse(complete[start + 1 :])
                if last is not None and REFS in last:  # its references name earlier records
                    records = read_records(path)
                    return records[-1] if records else None
                return last
    return None


def _parse(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


#: open flags that never wait for a writer (a FIFO's open does); nothing where the flag does not exist (Windows)
NONBLOCKING = getattr(os, "O_NONBLOCK", 0)


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
    """True while some process holds a :class:`JournalWriter` open on ``path``. Opened without blocking: a FIFO
    where the journal should be (anyone who may write the home can put one there) would otherwise block its
    reader until something writes to it — ``logs list`` and a whole Datasette server with it."""
    try:
        fd = os.open(path, os.O_RDONLY | NONBLOCKING)
    except FileNotFoundError:
        return False
    try:
        return not try_lock(fd, exclusive=False)
    finally:
        os.close(fd)


def live_status(status: str | None, path: Path) -> str | None:
    """What a consultation or round the index calls ``running`` is: running while some process writes its journal
    ``path`` (holds its :class:`JournalWriter` open), else ``interrupted`` — the process that wrote it was killed
    (SIGKILL, a crash, a power cut) before it could record the end. Any other status is returned as it is.

    The one rule for a run that nothing is writing any more: ``logs list`` and ``logs show``, the index's rounds
    table (:func:`~conclave.store.sqlite_index.settle_killed_rounds`) and the Datasette pages all read it from here."""
    if status != "running":
        return status
    try:
        return "running" if is_being_written(path) else "interrupted"
    except OSError:  # the journal cannot be opened (a directory where it should be, no permission): nobody writes it
        return "interrupted"
