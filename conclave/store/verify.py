"""``logs verify``: walk each journal's hash chain and compare it with the heads log; name the first bad record.

Classification (first problem wins, in file order):
edited    a record's content no longer matches its hash, or it was re-hashed so the next link breaks,
          or it differs from a recorded head;
inserted  a line that is not part of the chain (the chain continues as if it were absent);
dropped   the chain skips one or more sequence numbers;
truncated the journal ends before a head that was recorded durable;
appended  a record follows the journal's seal: a ``consultation:completed`` that ended it for good (complete,
          completed_degraded), or a partial/aborted one followed by anything but ``consultation:resumed``;
missing   the heads log knows a consultation whose journal file is gone, or journals exist without a heads log;
unkeyed   (``CONCLAVE_JOURNAL_KEY`` set) a head without a valid MAC under that key, or a journal with no such
          head at all;
anchor    (``verify --against DIGEST``) the heads log no longer starts with what ``conclave logs head`` printed;
          and a journal that no process was writing at the digest continues with anything but a resume (appended).
A torn last line (a crash mid-write) is not a problem: it was never durable and ``resume`` cuts it off.

What each check proves is in docs/records-and-tamper-evidence.md ("Tamper evidence").
"""

from __future__ import annotations

import hashlib
import multiprocessing
import re
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conclave.store.chain import GENESIS, record_hash
from conclave.store.cores import default_workers
from conclave.store.heads import KEY_VARIABLE, HeadsLog
from conclave.store.journal_file import JournalFile, JournalLine, is_being_written, last_record, read_journal
from conclave.store.paths import StoreLayout

_FIELDS: dict[str, type | tuple[type, ...]] = {
    "consultation_id": str, "data": dict, "prev": str, "seq": int, "ts": (int, float), "type": str, "hash": str,
}


@dataclass(frozen=True)
class Problem:
    consultation_id: str
    kind: str  # edited | inserted | dropped | truncated | appended | missing | unkeyed | anchor
    seq: int | None
    line: int | None
    detail: str

    def __str__(self) -> str:
        where = []
        if self.seq is not None:
            where.append(f"seq {self.seq}")
        if self.line is not None:
            where.append(f"line {self.line}")
        at = f" ({', '.join(where)})" if where else ""
        return f"{self.consultation_id}: {self.kind}{at}: {self.detail}"


def _well_formed(record: dict[str, Any] | None) -> bool:
    return record is not None and all(
        isinstance(record.get(key), kind) and not isinstance(record.get(key), bool) for key, kind in _FIELDS.items()
    )


@dataclass(frozen=True, slots=True)
class _Link:
    """What the chain needs of one line."""

    seq: int
    prev: str
    hash: str
    consultation_id: str
    intact: bool  # its content matches its hash


_CID_PREFIX = b'{"consultation_id":"'
_HASH_KEY = b',"hash":"'
# A record with references (``refs``: lists of keys, list positions and seqs) has them between prev and seq; their
# text holds no colon or brace, so this tail can only match the record's own keys, never a look-alike in its data.
_BODY_TAIL = re.compile(
    rb',"prev":"([0-9a-f]{64})"(?:,"refs":\[[\[\]",0-9A-Za-z_\-]*\])?,"seq":(\d+),"ts":[^,"]*,"type":"(?:[^"\\]|\\.)*"\}$')


def _link(line: JournalLine) -> _Link | None:
    """The chain fields of a line; None when it is not a journal record."""
    raw = line.raw
    # Fast path, no JSON parse: a line exactly as JournalWriter wrote it is its canonical body with the hash
    # appended as the last key, so hashing the bytes in front of the hash checks it.
    if raw.startswith(_CID_PREFIX) and raw.endswith(b'"}') and raw[-75:-66] == _HASH_KEY:
        body = raw[:-75] + b"}"
        digest = raw[-66:-2].decode("ascii", "replace")
        match = _BODY_TAIL.search(body)
        cid_end = body.find(b'","data":{', len(_CID_PREFIX))
        if match and cid_end > 0 and hashlib.sha256(body).hexdigest() == digest:
            cid = body[len(_CID_PREFIX) : cid_end].decode("utf-8", "replace")
            return _Link(int(match[2]), match[1].decode(), digest, cid, True)
    # Anything else (reformatted, edited, foreign): parse it and hash its canonical form.
    record = line.record
    if record is None or not _well_formed(record):
        return None
    return _Link(record["seq"], record["prev"], record["hash"], record["consultation_id"],
                 record_hash(record) == record["hash"])


# Final statuses after which a journal may only continue with ``consultation:resumed`` (see store/resume_points.py).
#: the ended statuses a resume continues (cancelled, Ctrl-C, failed): what ``conclave resume`` picks from
RESUMABLE_STATUSES = frozenset({"partial", "aborted"})
_COMPLETED = b'"type":"consultation:completed"'
_RESUMED = "consultation:resumed"


def check_journal(consultation_id: str, journal: JournalFile, heads: list[tuple[int, str]]) -> Problem | None:
    """The first problem in one journal, or None when its chain, its seal and every recorded head agree."""
    lines = journal.lines
    links = [_link(line) for line in lines]
    last, before_last = GENESIS, GENESIS
    sealed: tuple[int, str] | None = None  # (seq, status) of the consultation:completed the journal ended with
    for i, (line, link) in enumerate(zip(lines, links, strict=True)):
        if sealed is not None:
            record = line.record
            if sealed[1] not in RESUMABLE_STATUSES or record is None or record.get("type") != _RESUMED:
                return Problem(consultation_id, "appended", i, line.number,
                               f"a record follows the consultation:completed ({sealed[1]}) at seq {sealed[0]} "
                               "that sealed the journal")
            sealed = None
        expected = i  # a record's seq is its position in the chain
        if link is None:
            return Problem(consultation_id, "edited", None, line.number, "not a valid journal record")
        if not link.intact:
            return Problem(consultation_id, "edited", link.seq, line.number, "content does not match its hash")
        if link.prev != last:
            return _broken_link(consultation_id, lines, links, i, last, before_last)
        if link.seq != expected or link.consultation_id != consultation_id:
            # The chain links up, so it was forged consistently from here on: say what the numbering shows.
            kind = "dropped" if link.seq > expected else "inserted"
            detail = (f"record of consultation {link.consultation_id!r}" if link.seq == expected
                      else f"sequence jumps from {expected - 1} to {link.seq}")
            return Problem(consultation_id, kind, expected, line.number, detail)
        before_last, last = last, link.hash
        if _COMPLETED in line.raw:  # a cheap test first: most lines are not
            record = line.record
            if record is not None and record.get("type") == "consultation:completed":
                status = (record.get("data") or {}).get("status")
                sealed = (i, str(status))
    hashes = [link.hash for link in links if link is not None]
    for head_seq, head_hash in sorted(heads):
        if head_seq >= len(hashes):
            return Problem(consultation_id, "truncated", len(hashes), None,
                           f"journal ends after {len(hashes)} records but seq {head_seq} was recorded durable")
        if hashes[head_seq] != head_hash:
            return Problem(consultation_id, "edited", head_seq, lines[head_seq].number,
                           "differs from its recorded head (the chain was rewritten at or before this record)")
    return None


def _broken_link(
    cid: str, lines: list[JournalLine], links: list[_Link | None], i: int, last: str, before_last: str
) -> Problem:
    link = links[i]
    assert link is not None
    following = links[i + 1] if i + 1 < len(links) else None
    if following is not None and following.prev == last:
        return Problem(cid, "inserted", link.seq, lines[i].number, "not part of the chain")
    if i > 0 and link.prev == before_last:
        previous = links[i - 1]
        return Problem(cid, "inserted", previous.seq if previous else None, lines[i - 1].number,
                       "not part of the chain")
    if link.seq > i:
        missing = f"{i}" if link.seq == i + 1 else f"{i}..{link.seq - 1}"
        return Problem(cid, "dropped", i, lines[i].number, f"record(s) {missing} missing before this line")
    if i == 0:
        return Problem(cid, "edited", link.seq, lines[i].number, "first record does not start the chain")
    return Problem(cid, "edited", i - 1, lines[i - 1].number,
                   "re-hashed after an edit: the next record's link no longer matches")


@dataclass
class VerifyReport:
    journals: int = 0
    records: int = 0
    problems: list[Problem] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)  # consultations whose last write was cut short by a crash

    @property
    def ok(self) -> bool:
        return not self.problems


STORE = "(heads log)"  # the consultation_id of problems of the heads log itself


def verify_store(layout: StoreLayout, consultation_ids: list[str] | None = None, *,
                 key: bytes | None = None, against: str | None = None, workers: int | None = 0) -> VerifyReport:
    """Verify the given journals (default: every journal, and every consultation the heads log knows).

    ``key``: also require every head of a verified journal to carry a valid HMAC under it (keyed mode).
    ``against``: also require the heads log to start with what :meth:`HeadsLog.anchor` gave (anchored mode).
    ``workers``: forked processes that check the journals, a share each (None: one per CPU, as ``logs verify``
    does; 0: this process, as a server or a single consultation's check does).
    """
    heads_log = HeadsLog(layout.heads_path, key)
    entries = heads_log.entries()
    all_heads: dict[str, list[tuple[int, str]]] = {}
    for head in entries:
        all_heads.setdefault(head.consultation_id, []).append((head.seq, head.hash))
    ids = consultation_ids if consultation_ids is not None else sorted(set(layout.journal_ids()) | set(all_heads))
    report = VerifyReport()
    closed: dict[str, int] = {}  # journals no process wrote when the digest was taken: their last head then
    if against is not None:
        changed = heads_log.check_anchor(against)
        if changed is not None:
            report.problems.append(Problem(STORE, "anchor", None, None, changed))
        else:
            closed = heads_log.closed(against)
    heads_log_exists = layout.heads_path.exists()
    if not heads_log_exists and any(_has_records(layout, cid) for cid in layout.journal_ids()):
        report.problems.append(Problem(
            STORE, "missing", None, None,
            f"{layout.heads_path} is missing while journals exist: every recorded head is gone, so a rewritten "
            "journal would pass unnoticed"))
    checker = _Checker(layout, all_heads, closed, heads_log_exists, heads_log if key is not None else None, entries)
    for found in _check_all(checker, ids, default_workers() if workers is None else workers):
        report.journals += found.journals
        report.records += found.records
        report.torn += found.torn
        report.problems += found.problems
    return report


class _Checker:
    """Checks journals against what the heads log recorded for them; one instance is shared by forked workers."""

    def __init__(self, layout: StoreLayout, all_heads: dict[str, list[tuple[int, str]]], closed: dict[str, int],
                 heads_log_exists: bool, keyed: HeadsLog | None, entries: list[Any]) -> None:
        self.layout, self.all_heads, self.closed = layout, all_heads, closed
        self.heads_log_exists, self.keyed = heads_log_exists, keyed
        self.entries: dict[str, list[Any]] = {}  # consultation -> its heads, as the log holds them (with MACs)
        for head in entries:
            self.entries.setdefault(head.consultation_id, []).append(head)

    def __call__(self, ids: list[str]) -> VerifyReport:
        """The report of the journals ``ids`` alone (in their order)."""
        layout, all_heads, closed, heads_log_exists = self.layout, self.all_heads, self.closed, self.heads_log_exists
        report = VerifyReport()
        for cid in ids:
            path = layout.journal_path(cid)
            heads = all_heads.get(cid, [])
            try:
                journal = read_journal(path)
            except FileNotFoundError:
                detail = f"journal file {path.name} is missing" + (
                    f" (heads log records seq {max(s for s, _ in heads)})" if heads else "")
                report.problems.append(Problem(cid, "missing", None, None, detail))
                continue
            report.journals += 1
            report.records += len(journal.lines)
            if journal.torn_at is not None:
                report.torn.append(cid)
            problem = check_journal(cid, journal, heads)
            if problem is None and heads_log_exists:  # (without the log, "missing" above already says it all)
                problem = check_headed(cid, path, journal, heads)
            if problem is None and cid in closed:
                problem = _check_continued(cid, journal, closed[cid])
            if problem is None and self.keyed is not None:
                problem = _check_keyed(self.keyed, self.entries.get(cid, []), cid, journal)
            if problem is not None:
                report.problems.append(problem)
        return report


#: journals per task of a worker: enough to amortise a task's round trip, few enough to share the work evenly
VERIFY_CHUNK = 200
_checker: _Checker | None = None  # in a worker process


def _start_checker(checker: _Checker) -> None:
    global _checker
    _checker = checker


def _check_chunk(ids: list[str]) -> VerifyReport:
    assert _checker is not None
    return _checker(ids)


def _check_all(checker: _Checker, ids: list[str], workers: int) -> Iterator[VerifyReport]:
    """The reports of ``ids`` in chunks, in order; by ``workers`` forked processes when there are several chunks
    (fork only: a spawned worker would re-import ``python -m conclave``'s __main__ and run the CLI again)."""
    chunks = [ids[i : i + VERIFY_CHUNK] for i in range(0, len(ids), VERIFY_CHUNK)]
    if workers < 2 or len(chunks) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        yield checker(ids)
        return
    context = multiprocessing.get_context("fork")
    with ProcessPoolExecutor(min(workers, len(chunks)), mp_context=context, initializer=_start_checker,
                             initargs=(checker,)) as pool:
        yield from pool.map(_check_chunk, chunks)


def headed_lines(journal: JournalFile, heads: list[tuple[int, str]]) -> list[JournalLine]:
    """The journal's lines up to its last recorded head: what a resume continues from."""
    return journal.lines[: max((seq for seq, _ in heads), default=-1) + 1]


def check_headed(cid: str, path: Path, journal: JournalFile, heads: list[tuple[int, str]]) -> Problem | None:
    """Every write of a journal records its head (a write whose head the disk refuses is cut off again), so records
    after the last head were added afterwards: a forged ending, or records appended to a killed journal. A journal
    a process is writing right now may be between a write and its head, and is left alone."""
    last = max((seq for seq, _ in heads), default=-1)
    extra = len(journal.lines) - 1 - last
    if extra <= 0:
        return None
    if is_being_written(path):
        return None
    return Problem(cid, "appended", last + 1, journal.lines[last + 1].number,
                   f"{extra} record(s) after the last recorded head" + (f" (seq {last})" if last >= 0 else "")
                   + ": added after the journal was last written, or left by a run killed between a write and its "
                   "head (`conclave resume` drops them)")


def mark_closed_journals(layout: StoreLayout) -> None:
    """Before a digest is taken: a *closed* line in the heads log for every journal that no process is writing and
    that may still be continued (killed, partial, aborted), at its last head. Under the digest, such a journal may
    only go on with ``consultation:resumed``, as ``conclave resume`` writes it."""
    heads_log = HeadsLog(layout.heads_path)
    marked = heads_log.closed()
    for cid, recorded in heads_log.load().items():
        seq, hash_ = max(recorded)
        path = layout.journal_path(cid)
        if marked.get(cid) == seq or not path.exists() or is_being_written(path):
            continue
        last = last_record(path) or {}
        ended = (last.get("data") or {}).get("status")
        if last.get("type") == "consultation:completed" and ended not in RESUMABLE_STATUSES:
            continue  # sealed for good: the seal check already refuses anything after it
        heads_log.mark_closed(cid, seq, hash_)


def _check_continued(cid: str, journal: JournalFile, seq: int) -> Problem | None:
    """Anchored mode: a journal closed at ``seq`` when the digest was taken continues only with a resume."""
    if len(journal.lines) <= seq + 1:
        return None
    line = journal.lines[seq + 1]
    found = (line.record or {}).get("type")
    if found == _RESUMED:
        return None
    return Problem(cid, "appended", seq + 1, line.number,
                   f"a {found} record follows seq {seq}, where the journal stood, written by no process, when the "
                   f"digest was taken: only `conclave resume` continues it, and it starts with {_RESUMED}")


def _has_records(layout: StoreLayout, cid: str) -> bool:
    """True when the journal is not empty (a run killed before its first flush used to leave an empty one)."""
    try:
        return layout.journal_path(cid).stat().st_size > 0
    except OSError:
        return False


def _check_keyed(heads_log: HeadsLog, heads: list[Any], cid: str, journal: JournalFile) -> Problem | None:
    """Keyed mode: every head carries a valid MAC, and a journal with records has at least one such head."""
    for head in heads:
        if not heads_log.authentic(head):
            why = "no MAC" if head.mac is None else "a MAC that does not match"
            return Problem(cid, "unkeyed", head.seq, None,
                           f"its head at seq {head.seq} has {why} under {KEY_VARIABLE} (forged, or recorded "
                           "without the key)")
    if not heads and journal.lines:
        return Problem(cid, "unkeyed", None, None, f"no head recorded under {KEY_VARIABLE}")
    return None
