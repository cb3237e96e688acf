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

    ``defer_index=True`` (a CLI consultation) keeps SQLite off the path to the first provider request: the flushes
    before the first round starts make the journal durable and leave the index writes pending; when the first
    round starts, a worker thread imports the index modules and migrates the index (after
    :data:`INDEX_WARMUP_AFTER_S`, so round 1's requests have left), and the first flush after it is done writes
    everything pending. The end of a consultation and ``close()`` wait for it.
    """

    def __init__(self, home: Path, *, index: bool = True, defer_index: bool = False) -> None:
        self.layout = StoreLayout(Path(home))
        self._heads = HeadsLog(self.layout.heads_path)
        self._redactor = Redactor.from_env()
        self._writers: dict[str, JournalWriter] = {}
        self._use_index = index
        self._index: Any = None  # the IndexWriter, made at the first index write
        self._pending: list[dict[str, Any]] = []
        self._index_error: str | None = None
        self._deferred = index and defer_index
        self._warmup: threading.Thread | None = None

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
        self._pending.append(writer.append(type_, time.time() if ts is None else ts, data))
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
        elif type_ == ev.CONSULTATION_COMPLETED:
            self.flush(wait=True)
            del self._writers[consultation_id]  # a long-lived recorder must not keep every journal open
            writer.close()

    def flush(self, *, wait: bool = False) -> None:
        """Make every appended record durable (fsync + head), then index them (with ``defer_index``, once the
        index warm-up is done, or ``wait`` for it). A journal the disk refuses raises :class:`JournalError`, and
        its records are not indexed (the index never runs ahead of it)."""
        for writer in self._writers.values():
            writer.flush()
        if self._deferred:
            if not wait and (self._warmup is None or self._warmup.is_alive()):
                return
            if self._warmup is not None:
                self._warmup.join()
            self._deferred = False
        self._write_index()

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
            self._index.write(self._pending)
        except Exception as exc:
            # Keep the records: the next flush retries them in order, so a passing lock timeout heals itself;
            # close() says so once if they never made it.
            self._index_error = str(exc) or type(exc).__name__
            return
        self._pending = []
        self._index_error = None


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
