"""What viewers of the live view are sent: each consultation's events, replayed from the start, then live.

A consultation running in this process has a :class:`Feed` (an event subscriber): every event it emits is kept
in order (late joiners get all of it) and pushed to every viewer's queue; ``agent:chunk`` text is pushed but
not kept (the artifact that follows holds it). A consultation this process does not run is read from its
journal, which is followed until it records its end.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from conclave import events as ev
from conclave.errors import UsageError
from conclave.store.journal import is_being_written
from conclave.store.journal_file import filled_in
from conclave.store.paths import StoreLayout

#: how often a journal written by another process is checked for appended records
JOURNAL_POLL_S = 0.02
#: a viewer that falls this far behind is dropped (it reconnects and resumes from its last event id)
QUEUE_LIMIT = 10_000


class Feed:
    """The events of one consultation running in this process, for any number of viewers."""

    def __init__(self, consultation_id: str) -> None:
        self.consultation_id = consultation_id
        self.history: list[dict[str, Any]] = []
        self.viewers: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self.finished = False

    def __call__(self, event: ev.Event) -> None:
        record = event.as_dict()
        if event.type != ev.AGENT_CHUNK:
            self.history.append(record)
        for queue in list(self.viewers):
            if queue.qsize() >= QUEUE_LIMIT:
                self.viewers.discard(queue)
                queue.put_nowait(None)  # too slow: end its stream
            else:
                queue.put_nowait(record)
        if event.type == ev.CONSULTATION_COMPLETED:
            self.finished = True
            for queue in self.viewers:
                queue.put_nowait(None)

    def summary(self) -> dict[str, Any]:
        """This consultation as a row of the list page (the index's columns)."""
        started = next((r for r in self.history if r["type"] == ev.CONSULTATION_STARTED), {})
        final = next((r for r in reversed(self.history) if r["type"] == ev.CONSULTATION_COMPLETED), None)
        data = started.get("data", {})
        return {"id": self.consultation_id, "question": data.get("question", ""), "mode": data.get("mode", ""),
                "started_at": _iso(started.get("ts")),
                "status": final["data"].get("status") if final else "running"}

    async def follow(self, after: int) -> AsyncIterator[dict[str, Any]]:
        """Every kept event with a sequence number above ``after``, then live events until the end."""
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.viewers.add(queue)  # before reading the history: nothing falls between the two
        try:
            sent = after
            for record in list(self.history):
                if record["seq"] > sent:
                    sent = record["seq"]
                    yield record
            if self.finished:
                return
            while (live := await queue.get()) is not None:
                if live["type"] == ev.AGENT_CHUNK:
                    yield live
                elif live["seq"] > sent:
                    sent = live["seq"]
                    yield live
        finally:
            self.viewers.discard(queue)


class Feeds:
    """The feeds of this process's consultations; anything else is read from the journal."""

    def __init__(self, layout: StoreLayout) -> None:
        self.layout = layout
        self.running: dict[str, Feed] = {}

    def feed_for(self, consultation_id: str) -> Feed:
        feed = self.running.get(consultation_id)
        if feed is None:
            feed = self.running[consultation_id] = Feed(consultation_id)
        return feed

    def exists(self, consultation_id: str) -> bool:
        """Whether ``consultation_id`` runs here or has a journal; a string that is not an id shape (a path, say)
        names no consultation."""
        if consultation_id in self.running:
            return True
        try:
            return self.layout.journal_path(consultation_id).is_file()
        except UsageError:
            return False

    async def follow(self, consultation_id: str, after: int) -> AsyncIterator[dict[str, Any]]:
        feed = self.running.get(consultation_id)
        if feed is not None:
            async for record in feed.follow(after):
                yield record
            return
        async for record in follow_journal(self.layout.journal_path(consultation_id), after):
            yield record


async def follow_journal(path: Path, after: int) -> AsyncIterator[dict[str, Any]]:
    """Records of a journal above sequence ``after``, read again as the writing process appends, until its end
    record (a journal that ends without one was interrupted and is finished as it is)."""
    sent, offset, partial = after, 0, b""
    while True:
        writing = _is_being_written(path)  # before reading: what it wrote before closing is read below
        try:
            data = _read_from(path, offset)  # only what was appended since the last look
        except FileNotFoundError:
            return
        offset += len(data)
        *lines, partial = (partial + data).split(b"\n")
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("seq", -1) > sent:
                sent = record["seq"]
                yield filled_in(record, path)  # values repeated from earlier records are journaled as references
                if record.get("type") == ev.CONSULTATION_COMPLETED:
                    return
        if not writing:
            return
        await asyncio.sleep(JOURNAL_POLL_S)


def _read_from(path: Path, offset: int) -> bytes:
    """The bytes of ``path`` from ``offset`` on (a local file read: microseconds, fine on the event loop)."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read()


def _is_being_written(path: Path) -> bool:
    try:
        return bool(is_being_written(path))
    except OSError:
        return False


def _iso(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return ""
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat(timespec="seconds")
