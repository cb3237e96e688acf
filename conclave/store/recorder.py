"""The engine's recorder: every event goes to the journal (durable at round boundaries), then to the index.

Contract with the runner: ``recorder(event)`` for every event (subscribed as a critical subscriber, so a journal
that cannot be written stops the consultation), ``flush()`` at each round boundary before the next round starts,
``close()`` at the end. The start of a consultation (its question and configuration) is durable before anything
else happens, so even a run killed at once can be resumed. A journal the disk refuses raises
:class:`~conclave.store.journal.JournalError` (one line: path and cause) from then on; ``close()`` never raises
it again. The index is best effort: a failed index write is retried at the next flush, and ``close()`` warns
once when records are still missing from it — the journal is the truth, ``conclave resume`` re-indexes the
consultation it continues and ``conclave index rebuild`` repairs the whole index.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from conclave import events as ev
from conclave import startup_trace
from conclave.store.heads import HeadsLog
from conclave.store.journal import JournalError, JournalWriter
from conclave.store.paths import StoreLayout
from conclave.store.redact import Redactor

log = logging.getLogger(__name__)


class Recorder:
    """Journal + index writer for the consultations of one process, under data home ``home``.

    ``index=False`` journals only (the index can be rebuilt from the journal at any time).

    ``defer_index=True`` (a CLI consultation) keeps SQLite off the path to every provider request: the flushes
    before the first round starts make the journal durable and leave the index writes pending; when the first
    round starts, a worker thread imports the index modules and migrates the index (after
    :data:`INDEX_WARMUP_AFTER_S`, so round 1's requests have left). From then on a flush makes the journal durable
    at once and indexes its records :data:`INDEX_AFTER_S` after the last flush, on the event loop (the flush at
    a round's start is followed by that round's requests, so the index is written while they wait on the
    network), or at once outside an event loop. The end of a consultation and ``close()`` write what is left.
    Only durable records are ever indexed.
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
        self._deferred = index and defer_index
        self._warmup: threading.Thread | None = None
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
        self._appended.append(writer.append_line(type_, time.time() if ts is None else ts, data))
        if type_ == ev.CONSULTATION_STARTED:
            # Durable before the first provider call: a run killed from here on can be resumed.
            self.flush()
            startup_trace.mark("journal started")
        elif type_ == ev.ROUND_STARTED:
            # Before the round spends anything, the rounds before it are durable (even if the runner did not
            # flush), and so is its start, which shows where a crash interrupted the consultation.
            self.flush()
            if self._deferred and self._warmup is None:
                self._warmup = threading.Thread(target=_warm_index, args=(self.layout.index_path,), daemon=True,
                                                name="conclave-index-warmup")
                self._warmup.start()
        elif type_ == ev.ROUND_ARTIFACT and data.get("agent"):
            # An agent's answer is paid for once it arrives: durable at once, so a run killed later in the round
            # resumes without asking (and paying) for it again. The index waits for the round's end.
            writer.flush_if_possible()
        elif type_ == ev.CONSULTATION_COMPLETED:
            self.flush(wait=True)
            del self._writers[consultation_id]  # a long-lived recorder must not keep every journal open
            writer.close()

    def flush(self, *, wait: bool = False) -> None:
        """Make every appended record durable (fsync + head), then index them (with ``defer_index``, later unless
        ``wait``: see the class doc). A journal the disk refuses raises :class:`JournalError`, and its records are
        not indexed (the index never runs ahead of it)."""
        for writer in self._writers.values():
            writer.flush()
        self._pending.extend(self._appended)
        self._appended.clear()
        if wait:
            self._cancel_timer()
            if self._warmup is not None:
                self._warmup.join()
            self._deferred = False
        elif self._deferred:
            self._index_later()
            return
        self._write_index()

    def write_out(self) -> None:
        """Hand every appended record to the operating system, without fsync (see
        :meth:`JournalWriter.write_out`): they survive this process being killed; the next :meth:`flush` (at the
        latest when the next round starts, before it spends anything) makes them durable and indexes them."""
        for writer in self._writers.values():
            writer.write_out()

    def _index_later(self) -> None:
        """With ``defer_index``: index the durable records :data:`INDEX_AFTER_S` after the last flush (each flush
        moves the write later), once the warm-up is done; nothing before the first round starts."""
        if self._warmup is None or not self._pending:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            if not self._warmup.is_alive():
                self._write_index()
            return
        self._cancel_timer()
        self._timer = loop.call_later(INDEX_AFTER_S, self._index_due)

    def _index_due(self) -> None:
        self._timer = None
        if self._warmup is not None and self._warmup.is_alive():
            self._index_later()  # the index is still being migrated: try again later
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
        from conclave.store.indexer import RESUMED

        self.record(consultation_id, RESUMED, data)
        self.reindex(consultation_id)

    def reindex(self, consultation_id: str) -> None:
        """Index every record of ``consultation_id``'s journal again at the next flush (``conclave resume``):
        whatever the run before could not index (a full disk, a locked index) catches up. Rows are keyed by
        journal position, so records indexed already are only rewritten as they were."""
        from conclave.store.journal import read_records

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
            failed = False
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
                from conclave.store.index import IndexWriter

                self._index = IndexWriter(self.layout.index_path)
            # Parsed back from the lines, so the live index sees exactly what ``index rebuild`` will read.
            self._pending = [json.loads(r) if isinstance(r, bytes) else r for r in self._pending]
            self._index.write(self._pending)
        except Exception as exc:
            # Keep the records: the next flush retries them in order, so a passing lock timeout heals itself;
            # close() says so once if they never made it.
            self._index_error = str(exc) or type(exc).__name__
            return
        self._pending = []
        self._index_error = None


#: with ``defer_index``, how long after the last flush its records are indexed (the next round's requests leave
#: first)
INDEX_AFTER_S = 0.05

#: how long after the first round starts the index warm-up begins (its requests leave first)
INDEX_WARMUP_AFTER_S = 0.05


def _warm_index(path: Path) -> None:
    """Import the index modules and migrate the index on a connection of this thread (SQLite connections stay in
    their thread); any failure is left for the real write to meet and report."""
    time.sleep(INDEX_WARMUP_AFTER_S)
    startup_trace.mark(startup_trace.WARM_UP, once=True)
    try:
        from conclave.store.index import connect

        connect(path).close()
    except Exception:
        pass
