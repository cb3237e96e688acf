"""The engine's recorder: every event goes to the journal (durable at round boundaries), then to the index.

Contract with the runner: ``recorder(event)`` for every event (subscribed as a critical subscriber, so a journal
that cannot be written stops the consultation), ``flush()`` at each round boundary before the next round starts,
``close()`` at the end. The index is best effort: a failed index write is retried at the next flush and only
ever warns — the journal is the truth and ``conclave index rebuild`` repairs the index.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from conclave import events as ev
from conclave.store.heads import HeadsLog
from conclave.store.index import IndexWriter
from conclave.store.journal import JournalWriter
from conclave.store.paths import StoreLayout
from conclave.store.redact import Redactor

log = logging.getLogger(__name__)


class Recorder:
    """Journal + index writer for the consultations of one process, under data home ``home``.

    ``index=False`` journals only (the index can be rebuilt from the journal at any time).
    """

    def __init__(self, home: Path, *, index: bool = True) -> None:
        self.layout = StoreLayout(Path(home))
        self._heads = HeadsLog(self.layout.heads_path)
        self._redactor = Redactor.from_env()
        self._writers: dict[str, JournalWriter] = {}
        self._index = IndexWriter(self.layout.index_path) if index else None
        self._pending: list[dict[str, Any]] = []
        self._index_failures = 0

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
        if type_ == ev.ROUND_STARTED:
            # Before the round spends anything, the rounds before it are durable (even if the runner did not
            # flush), and so is its start, which shows where a crash interrupted the consultation.
            self.flush()
        elif type_ == ev.CONSULTATION_COMPLETED:
            self.flush()
            del self._writers[consultation_id]  # a long-lived recorder must not keep every journal open
            writer.close()

    def flush(self) -> None:
        """Make every appended record durable (fsync + head), then index them."""
        for writer in self._writers.values():
            writer.flush()
        self._write_index()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            for writer in self._writers.values():
                writer.close()
            if self._index is not None:
                if self._pending:
                    log.warning("the index is missing %d record(s); run `conclave index rebuild`", len(self._pending))
                self._index.close()

    def _write_index(self) -> None:
        if self._index is None or not self._pending:
            return
        try:
            self._index.write(self._pending)
        except Exception as exc:
            # Keep the records: the next flush retries them in order, so a passing lock timeout heals itself.
            self._index_failures += 1
            if self._index_failures == 1:
                log.warning("index write failed (%s); the journal is intact, retrying at the next round", exc)
            return
        self._pending = []
