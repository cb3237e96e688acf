"""Starting a consultation for a door that answers over HTTP (the live view's form, the ``/v1`` chat door): in this
process, shown on the live view's feeds, with the cost gate asked non-interactively, and waited on only until that
gate has decided."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conclave import events as ev
from conclave.config.settings import Settings
from conclave.doors.web.feeds import Feeds
from conclave.engine.ids import new_consultation_id
from conclave.engine.interaction import Interaction
from conclave.engine.run import Consultation

#: how long the cost gate may take before the door gives up waiting for its decision (the consultation goes on)
DECISION_TIMEOUT_S = 120.0


@dataclass
class GatedStart:
    """A consultation started in this process: its engine task, and the estimate its cost gate made (if any)."""

    consultation: Consultation
    task: asyncio.Task[Any]
    estimate: float | None

    @property
    def id(self) -> str:
        return self.consultation.id

    def error(self) -> BaseException | None:
        """What the consultation's task failed with, if it has already ended that way."""
        if self.task.done() and not self.task.cancelled():
            return self.task.exception()
        return None


async def start_gated(settings: Settings, feeds: Feeds, recorder: Any, tasks: set[asyncio.Task[Any]], *,
                      on_event: Callable[[ev.Event], None] | None = None,
                      stdin_text: str | None = None) -> GatedStart:
    """Start the consultation ``settings`` describe and return once its cost gate has decided, it has ended, or
    ``DECISION_TIMEOUT_S`` have passed. Its task is kept in ``tasks`` while it runs; its feed ends when the task
    does, with or without an end event."""
    cid = new_consultation_id()
    decided = asyncio.Event()
    estimate: list[float | None] = [None]

    def watch(event: ev.Event) -> None:
        if event.type == ev.COST_ESTIMATED:
            estimate[0] = event.data.get("estimated_cost")
        if event.type in (ev.USER_CONSENT, ev.CONSULTATION_COMPLETED):
            decided.set()
        if on_event is not None:
            on_event(event)

    consultation = Consultation(settings, interaction=Interaction.non_interactive(), recorder=recorder,
                                subscribers=[feeds.feed_for(cid), watch], consultation_id=cid, stdin_text=stdin_text,
                                stream=True)
    task = asyncio.create_task(consultation.run())
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    task.add_done_callback(lambda _: feeds.finish(cid))
    waiter = asyncio.create_task(decided.wait())
    await asyncio.wait({task, waiter}, timeout=DECISION_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    return GatedStart(consultation, task, estimate[0])
