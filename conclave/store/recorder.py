"""The engine's recorder: every event goes to the journal (durable at round boundaries), then to the index.

Contract with the runner: ``recorder(event)`` for every event (subscribed as a critical subscriber, so a journal
that cannot be written stops the consultation), ``flush()`` at each round boundary before the next round starts,
``close()`` at the end, and ``await until_durable()`` before every provider request (the pool calls it). The start
of a consultation (its question and configuration) is durable before anything is spent, so even a run killed at
once can be resumed.

The disk's syncs run on one I/O thread, in order, while the event loop goes on (:meth:`Recorder.until_durable`):
the start of the consultation and of each round, an agent's answer as it arrives, a round's records at its end. The
next provider request waits until the writes submitted before it are done, so what the rule says is durable before
spending still is, but the fsyncs (2-10 ms each on an ordinary disk, more when it is busy) overlap the work that
builds the round's prompts and runs the controllers instead of adding to it. A journal the disk refuses raises
:class:`~conclave.store.journal.JournalError` (one line: path and cause) from then on; ``close()`` never raises
it again. The index is best effort: a failed index write is retried at the next flush, and ``close()`` warns
once when records are still missing from it — the journal is the truth, ``conclave resume`` re-indexes the
consultation it continues and ``conclave index rebuild`` repairs the whole index.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from conclave import events as ev
from conclave.store.heads import HeadsLog
from conclave.store.indexer import RESUMED
from conclave.store.journal import JournalError, JournalWriter, read_records
from conclave.store.journal_file import REFS, expand_records
from conclave.store.paths import StoreLayout
from conclave.store.redact import Redactor
from conclave.store.sqlite_index import IndexWriter

log = logging.getLogger(__name__)


class Recorder:
    """Journal + index writer for the consultations of one process, under data home ``home``.

    ``index=False`` journals only (the index can be rebuilt from the journal at any time).

    ``defer_index=True`` (a CLI consultation) keeps SQLite off the path to every provider request: the flushes
    before the first round starts make the journal durable and leave the index writes pending; once the first
    round has started, a flush makes the journal durable at once and indexes its records :data:`INDEX_AFTER_S`
    after the last flush, on the event loop (the flush at a round's start is followed by that round's requests, so
    the index is written while they wait on the network), or at once outside an event loop. The end of a
    consultation and ``close()`` write what is left. Only durable records are ever indexed.
    """

    def __init__(self, home: Path, *, index: bool = True, defer_index: bool = False) -> None:
        self.layout = StoreLayout(Path(home))
        self._heads = HeadsLog(self.layout.heads_path)
        self._redactor = Redactor.from_env()
        self._writers: dict[str, JournalWriter] = {}
        self._use_index = index
        self._index: Any = None  # the IndexWriter, made at the first index write
        self._appended: list[bytes] = []  # lines appended since the last flush (not durable yet)
        #: durable records not indexed yet: journal lines (parsed when indexed) or records read back
        self._pending: list[bytes | dict[str, Any]] = []
        self._index_error: str | None = None
        self._io: ThreadPoolExecutor | None = None  # the I/O thread, started by the first write
        self._let_go_failed = False  # a journal the disk refused was closed (its consultation ended)
        self._last: Future[Any] | None = None  # the last write submitted to it
        #: durable writes submitted, with the lines they make durable (indexed once the write is done)
        self._syncing: list[tuple[Future[Any], list[bytes]]] = []
        self._deferred = index and defer_index
        self._round_started = False  # with defer_index: nothing is indexed before the first round starts
        self._timer: asyncio.TimerHandle | None = None  # the deferred index write, while it is due

    def __call__(self, event: ev.Event) -> None:
        self.record(event.consultation_id, event.type, event.data, event.ts)

    def record(self, consultation_id: str, type_: str, data: dict[str, Any], ts: float | None = None) -> None:
        """Append one record (the event path, and records conclave itself adds such as a resume marker)."""
        writer = self._writers.get(consultation_id)
        if writer is None:
            writer = JournalWriter(
                self.layout.journal_path(consultation_id), consultation_id, self._heads, self._redactor
            )
            self._writers[consultation_id] = writer
        try:
            self._appended.append(writer.append_line(type_, time.time() if ts is None else ts, data))
        except JournalError:
            if type_ == ev.CONSULTATION_COMPLETED:  # its journal failed: a long-lived recorder lets it go
                self._let_go(consultation_id, writer)
            raise
        if type_ == ev.CONSULTATION_STARTED:
            # Durable before the first provider call (which waits for it): a run killed from here on can be
            # resumed.
            self._flush_soon()
        elif type_ == ev.ROUND_STARTED:
            # Before the round spends anything (its requests wait for this), the rounds before it are durable
            # (even if the runner did not flush), and so is its start, which shows where a crash interrupted the
            # consultation.
            self._flush_soon()
            if self._deferred:
                self._index_later()
                self._round_started = True
        elif type_ == ev.ROUND_ARTIFACT and data.get("agent"):
            # An agent's answer is paid for once it arrives: written out at once (on the I/O thread), so a run
            # killed later in the round resumes without asking (and paying) for it again. The index waits for the
            # round's end.
            self._submit(writer.flush_if_possible)
        elif type_ == ev.CONSULTATION_COMPLETED:
            try:
                self.flush(wait=True, consultation_id=consultation_id)
            finally:  # a long-lived recorder must not keep every journal open
                self._let_go(consultation_id, writer)

    def _let_go(self, consultation_id: str, writer: JournalWriter) -> None:
        self._writers.pop(consultation_id, None)
        self.wait_for_writes()
        self._let_go_failed = self._let_go_failed or writer.failed is not None
        writer.close()

    def flush(self, *, wait: bool = False, consultation_id: str | None = None) -> None:
        """Make every appended record durable (fsync + head), then index them (with ``defer_index``, later unless
        ``wait``: see the class doc). A journal the disk refuses raises :class:`JournalError` — only
        ``consultation_id``'s when one is given (a recorder several consultations share) — and its records are
        not indexed (the index never runs ahead of it)."""
        self._flush_soon()
        self._settle(consultation_id)
        if wait:
            self._cancel_timer()
            self._deferred = False
        elif self._deferred:
            self._index_later()
            return
        self._write_index()

    def write_out(self, consultation_id: str | None = None) -> None:
        """Hand every appended record (only ``consultation_id``'s when given) to the operating system, without
        fsync (see :meth:`JournalWriter.write_out`): they survive this process being killed; the next
        :meth:`flush` (at the latest when the next round starts, before it spends anything) makes them durable and
        indexes them. A recorder shared by many consultations (an evaluation) writes out only the one whose round
        ended: one job per round, not one per open journal."""
        if consultation_id is not None:
            writer = self._writers.get(consultation_id)
            writers = [] if writer is None else [writer]
        else:
            writers = list(self._writers.values())
        for writer in writers:
            self._submit(_quietly(writer.write_out))  # a refusal fails the writer, which says why

    def wait_for_writes(self) -> None:
        """Block until the I/O thread has done every write submitted so far (whatever their outcome)."""
        last = self._last
        if last is not None:
            concurrent.futures.wait([last])

    async def until_durable(self, consultation_id: str | None = None) -> None:
        """Wait until every write submitted so far is done; raise :class:`JournalError` when the disk refused one
        of ``consultation_id``'s (any consultation's: None), so a journal that failed stops its consultation
        before it spends anything more. Cancelling the wait (a hedge that lost, Ctrl-C) never cancels the write."""
        last = self._last
        if last is not None and not last.done():
            with contextlib.suppress(Exception):  # a refusal is read from the writer below
                await asyncio.shield(asyncio.wrap_future(last))
        self._raise_failure(consultation_id)

    def _submit(self, job: Callable[[], Any], lines: list[bytes] | None = None) -> Future[Any]:
        if self._io is None:
            self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="conclave-journal")
        future: Future[Any] = self._io.submit(job)
        self._last = future
        if lines is not None:
            self._syncing.append((future, lines))
        return future

    def _flush_soon(self, then: Callable[[], None] | None = None) -> None:
        """Submit a durable write (fsync and head) of every journal; the records appended so far are indexed
        once it is done (:meth:`_collect`); ``then`` runs on the I/O thread after it."""
        if not self._writers:
            return
        lines, self._appended = self._appended, []
        writers = list(self._writers.values())

        def job() -> set[str]:
            refused = set()
            for writer in writers:  # each on its own: one journal the disk refuses holds no other back
                try:
                    writer.flush()
                except JournalError:  # the writer is failed now and says why
                    refused.add(writer.consultation_id)
            if then is not None:
                then()
            return refused

        self._submit(job, lines)

    def _settle(self, consultation_id: str | None = None) -> None:
        """Wait until the I/O thread is idle; index what it made durable; raise the disk's refusal if any (of
        ``consultation_id``'s journal when one is given)."""
        self.wait_for_writes()
        self._collect()
        self._raise_failure(consultation_id)

    def _collect(self) -> None:
        """Move the lines of every finished durable write to the records to index; a refused write's lines
        were never durable and are never indexed."""
        while self._syncing and self._syncing[0][0].done():
            future, lines = self._syncing.pop(0)
            if future.cancelled() or future.exception() is not None:
                continue
            refused = future.result() or set()  # the journals this write could not make durable
            self._pending.extend(line for line in lines if not refused or _consultation_of(line) not in refused)

    def _raise_failure(self, consultation_id: str | None = None) -> None:
        for writer in self._writers.values():
            if writer.failed is not None and consultation_id in (None, writer.consultation_id):
                raise JournalError(writer.failed)
        last = self._last  # a bug in a write job (a refusal is the writer's, above)
        if last is not None and last.done() and not last.cancelled() and last.exception() is not None:
            raise last.exception()  # type: ignore[misc]

    def _index_later(self) -> None:
        """With ``defer_index``: index the durable records :data:`INDEX_AFTER_S` after the last flush (each flush
        moves the write later); nothing before the first round starts."""
        self._collect()
        if not self._round_started or not (self._pending or self._syncing):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._write_index()
            return
        self._cancel_timer()
        self._timer = loop.call_later(INDEX_AFTER_S, self._index_due)

    def _index_due(self) -> None:
        self._timer = None
        self._collect()
        if self._syncing:
            self._index_later()  # a durable write is still running: its records are indexed once it is done
            return
        self._write_index()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def resume(self, consultation_id: str, data: dict[str, Any]) -> None:
        """Record ``consultation:resumed`` (``data``) and catch the index up with the journal, whatever the run
        before could not index (a full disk). In this order: the record opens the journal's writer, which cuts
        off records no head covers, so those never reach the index."""
        self.record(consultation_id, RESUMED, data)
        self.reindex(consultation_id)

    def reindex(self, consultation_id: str) -> None:
        """Index every record of ``consultation_id``'s journal again at the next flush (``conclave resume``):
        whatever the run before could not index (a full disk, a locked index) catches up. Rows are keyed by
        journal position, so records indexed already are only rewritten as they were."""
        self._pending[:0] = read_records(self.layout.journal_path(consultation_id))

    def close(self) -> None:
        """Flush what can be flushed and close every journal. Never raises a journal's failure again: the
        consultation already stopped on it and said why."""
        try:
            self.flush(wait=True)
        except JournalError:
            pass
        finally:
            self._cancel_timer()
            if self._io is not None:  # before the writers close: no write of theirs may still be running
                self._io.shutdown(wait=True)
                self._io = None
            failed = self._let_go_failed  # its records were never all durable: no index warning for them
            for writer in self._writers.values():
                failed = failed or writer.failed is not None
                writer.close()
            if self._use_index:
                if self._pending and not failed:
                    log.warning("the index is missing %d record(s) (%s); the journal has them: run `conclave "
                                "index rebuild`", len(self._pending), self._index_error or "not written")
                if self._index is not None:
                    self._index.close()

    def _write_index(self) -> None:
        if not self._use_index or not self._pending:
            return
        try:
            if self._index is None:
                self._index = IndexWriter(self.layout.index_path)
            # Parsed back from the lines, so the live index sees exactly what ``index rebuild`` will read.
            records = self._filled_in([json.loads(r) if isinstance(r, bytes) else r for r in self._pending])
            self._pending[:] = records  # parsed once, even when the write below fails and is retried
            self._index.write(records)
        except Exception as exc:
            # Keep the records: the next flush retries them in order, so a passing lock timeout heals itself;
            # close() says so once if they never made it.
            self._index_error = str(exc) or type(exc).__name__
            return
        self._pending = []
        self._index_error = None


    def _filled_in(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``records`` with the values that repeat earlier records' (journaled as references) filled in: from the
        records written with them when those hold every value referred to (a consultation indexed at its end),
        else from their journals, where they are durable by now, each read once however many of its records
        hold references."""
        journals: dict[str, dict[Any, dict[str, Any]]] = {}
        written: dict[Any, dict[Any, dict[str, Any]]] = {}  # consultation -> seq -> record (filled) so far
        out = []
        for record in records:
            before = written.setdefault(record.get("consultation_id"), {})
            if REFS in record:
                refs = record[REFS] if isinstance(record[REFS], list) else []
                seqs = [ref[1] for ref in refs if isinstance(ref, list) and len(ref) == 3 and isinstance(ref[1], int)]
                if seqs and len(seqs) == len(refs) and all(seq in before for seq in seqs):
                    record = expand_records([*(before[seq] for seq in sorted(set(seqs))), record])[-1]
                else:
                    consultation_id = record["consultation_id"]
                    by_seq = journals.get(consultation_id)
                    if by_seq is None:
                        by_seq = journals[consultation_id] = {}
                        for known in read_records(self.layout.journal_path(consultation_id)):
                            by_seq.setdefault(known.get("seq"), known)
                    record = by_seq.get(record.get("seq"), record)
            before.setdefault(record.get("seq"), record)
            out.append(record)
        return out


#: with ``defer_index``, how long after the last flush its records are indexed (the next round's requests leave
#: first)
INDEX_AFTER_S = 0.05


def _quietly(write: Callable[[], None]) -> Callable[[], None]:
    def job() -> None:
        with contextlib.suppress(JournalError):
            write()
    return job


def _consultation_of(line: bytes) -> str | None:
    record = json.loads(line)
    return record.get("consultation_id") if isinstance(record, dict) else None
