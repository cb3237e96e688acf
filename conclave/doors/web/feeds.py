"""What viewers of the live view are sent: each consultation's events, replayed from the start, then live.

A consultation running in this process has a :class:`Feed` (an event subscriber): every event it emits is encoded
once, as the Server-Sent Events frame every viewer is sent (the same bytes for all of them), kept in order (late
joiners get all of it) and pushed to every viewer's queue; ``agent:chunk`` frames are pushed but not kept (the
artifact that follows holds their text). A finished consultation's frames are kept only while viewers follow it,
and then for a small window (the ``keep_finished`` most recently finished, for at most ``keep_s`` seconds) so a
viewer who reconnects is served from memory; after that it is read from its journal like a consultation this
process does not run, which is followed until it records its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
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
#: finished consultations whose frames stay in memory after their last viewer left, and for how long at most
KEEP_FINISHED, KEEP_S = 8, 30.0


def sse_frame(record: dict[str, Any]) -> bytes:
    """The Server-Sent Events frame of a journal record or event (``id:`` is its sequence number, except for
    ``agent:chunk``, which the journal does not keep)."""
    data = json.dumps({k: record.get(k) for k in ("type", "seq", "ts", "data")}, ensure_ascii=False)
    head = "" if record.get("type") == ev.AGENT_CHUNK else f"id: {record['seq']}\n"
    return f"{head}data: {data}\n\n".encode()


class Feed:
    """The events of one consultation running in this process, for any number of viewers, as SSE frames."""

    def __init__(self, consultation_id: str) -> None:
        self.consultation_id = consultation_id
        #: (sequence number, frame) of every event but ``agent:chunk``, in order
        self.history: list[tuple[int, bytes]] = []
        self.viewers: set[asyncio.Queue[tuple[int, bytes] | None]] = set()
        self.finished_at: float | None = None  # time.monotonic() of its end
        #: its row of the list page (the index's columns), until the index has it
        self.row: dict[str, Any] = {"id": consultation_id, "question": "", "mode": "", "started_at": "",
                                    "status": "running"}

    @property
    def finished(self) -> bool:
        return self.finished_at is not None

    def __call__(self, event: ev.Event) -> None:
        frame = sse_frame(event.as_dict())  # once, for every viewer now and later
        chunk = event.type == ev.AGENT_CHUNK
        item = (-1 if chunk else event.seq, frame)
        if not chunk:
            self.history.append(item)
        if event.type == ev.CONSULTATION_STARTED:
            self.row.update(question=event.data.get("question", ""), mode=event.data.get("mode", ""),
                            started_at=_iso(event.ts))
        for queue in list(self.viewers):
            if queue.qsize() >= QUEUE_LIMIT:
                self.viewers.discard(queue)
                queue.put_nowait(None)  # too slow: end its stream
            else:
                queue.put_nowait(item)
        if event.type == ev.CONSULTATION_COMPLETED:
            self.row["status"] = event.data.get("status")
            self.finish()

    def finish(self) -> None:
        """The consultation ended (or its task did, without an end event): viewers' streams end here."""
        if self.finished_at is not None:
            return
        self.finished_at = time.monotonic()
        for queue in self.viewers:
            queue.put_nowait(None)

    def summary(self) -> dict[str, Any]:
        """This consultation as a row of the list page (the index's columns)."""
        return dict(self.row)

    async def follow(self, after: int) -> AsyncGenerator[list[bytes], None]:
        """Batches of frames: every kept event with a sequence number above ``after`` (one batch), then live ones
        until the end. What queued up while the viewer sent its last batch goes out as the next one: a viewer
        that fell behind catches up in one write, not one per event."""
        queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        self.viewers.add(queue)  # before reading the history: nothing falls between the two
        try:
            sent = after
            batch = []
            for seq, frame in list(self.history):
                if seq > sent:
                    sent = seq
                    batch.append(frame)
            if batch:
                yield batch
            if self.finished:
                return
            while True:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                batch = []
                for item in items:
                    if item is None:
                        if batch:
                            yield batch
                        return
                    seq, frame = item
                    if seq < 0:  # a chunk: live only, never replayed
                        batch.append(frame)
                    elif seq > sent:
                        sent = seq
                        batch.append(frame)
                if batch:
                    yield batch
        finally:
            self.viewers.discard(queue)


class Feeds:
    """The feeds of this process's consultations, running or finished a moment ago; anything else is read from
    the journal. Memory stays bounded however many consultations the process runs: a finished feed is dropped
    once no viewer follows it and it is not among the ``keep_finished`` most recently finished or finished more
    than ``keep_s`` seconds ago."""

    def __init__(self, layout: StoreLayout, keep_finished: int = KEEP_FINISHED, keep_s: float = KEEP_S) -> None:
        self.layout = layout
        self.keep_finished, self.keep_s = keep_finished, keep_s
        self.running: dict[str, Feed] = {}

    def feed_for(self, consultation_id: str) -> Feed:
        self.prune()
        feed = self.running.get(consultation_id)
        if feed is None:
            feed = self.running[consultation_id] = Feed(consultation_id)
        return feed

    def finish(self, consultation_id: str) -> None:
        """The consultation's task is over: its feed ends, whether or not it emitted its end event."""
        feed = self.running.get(consultation_id)
        if feed is not None:
            feed.finish()
        self.prune()

    def prune(self) -> None:
        """Drop the finished feeds nobody follows that fall outside the window."""
        now = time.monotonic()
        idle = sorted(((f.finished_at, cid) for cid, f in self.running.items()
                       if f.finished_at is not None and not f.viewers), reverse=True)
        for rank, (finished_at, cid) in enumerate(idle):
            if rank >= self.keep_finished or now - finished_at > self.keep_s:
                del self.running[cid]

    def retained_events(self) -> int:
        """How many events the feeds hold in memory (what ``prune`` keeps bounded)."""
        return sum(len(feed.history) for feed in self.running.values())

    def exists(self, consultation_id: str) -> bool:
        """Whether ``consultation_id`` runs here or has a journal; a string that is not an id shape (a path, say)
        names no consultation."""
        if consultation_id in self.running:
            return True
        try:
            return self.layout.journal_path(consultation_id).is_file()
        except UsageError:
            return False

    async def follow(self, consultation_id: str, after: int) -> AsyncIterator[list[bytes]]:
        """Batches of SSE frames of the consultation's events above ``after``, from memory or from its journal."""
        feed = self.running.get(consultation_id)
        if feed is not None:
            try:
                async with contextlib.aclosing(feed.follow(after)) as batches:  # its viewer leaves before pruning
                    async for batch in batches:
                        yield batch
            finally:
                self.prune()
            return
        async for records in follow_journal(self.layout.journal_path(consultation_id), after):
            yield [sse_frame(record) for record in records]


async def follow_journal(path: Path, after: int) -> AsyncIterator[list[dict[str, Any]]]:
    """Records of a journal above sequence ``after``, read again as the writing process appends, until its end
    record (a journal that ends without one was interrupted and is finished as it is); each batch is what one
    look at the file found."""
    sent, offset, partial = after, 0, b""
    while True:
        writing = _is_being_written(path)  # before reading: what it wrote before closing is read below
        try:
            data = _read_from(path, offset)  # only what was appended since the last look
        except FileNotFoundError:
            return
        offset += len(data)
        *lines, partial = (partial + data).split(b"\n")
        batch, ended = [], False
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("seq", -1) > sent:
                sent = record["seq"]
                batch.append(filled_in(record, path))  # repeated values are journaled as references
                if record.get("type") == ev.CONSULTATION_COMPLETED:
                    ended = True
                    break
        if batch:
            yield batch
        if ended or not writing:
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
