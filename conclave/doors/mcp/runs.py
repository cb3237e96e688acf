"""Running a consultation for an MCP client: journaled with its origin, reporting progress, cancellable.

- Progress: every round and agent event becomes a ``notifications/progress`` message, and while nothing happens a
  heartbeat goes out every ``heartbeat_s`` (≤ 15 s): clients reset their idle timeout on progress, not on logs.
  Nothing is sent when the client gave no progress token.
- Cancellation: the engine runs in its own task; a client's ``notifications/cancelled`` cancels it once, as Ctrl-C
  does, so completed rounds stay in the journal and ``conclave_resume`` continues from them.
- Origin: the ``consultation:started`` record carries ``origin: "mcp"`` and the client's name and version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio

from conclave import events as ev

log = logging.getLogger(__name__)

#: the longest silence between two progress notifications while a consultation runs
DEFAULT_HEARTBEAT_S = 10.0

Report = Callable[[float, float | None, str], Awaitable[None]]


class OriginRecorder:
    """The journal recorder, adding ``origin`` and ``client`` to every ``consultation:started`` record."""

    def __init__(self, recorder: Any, origin: Mapping[str, Any]) -> None:
        self._recorder = recorder
        self._origin = dict(origin)

    def __call__(self, event: ev.Event) -> None:
        if event.type == ev.CONSULTATION_STARTED:
            self._recorder.record(event.consultation_id, event.type, {**event.data, **self._origin}, event.ts)
        else:
            self._recorder(event)

    def flush(self, **kw: Any) -> None:
        self._recorder.flush(**kw)

    def __getattr__(self, name: str) -> Any:
        # the rest of the recorder's contract (until_durable, which every request awaits; write_out) as it is
        return getattr(self._recorder, name)


@dataclass
class ProgressBridge:
    """Turns consultation events into progress notifications (``report``), with a heartbeat between them.

    Progress counts rounds: ``n`` once round ``n`` completed, with each event inside a round moving a quarter of
    the way to the next whole number, so the value always increases as the protocol requires.
    """

    report: Report | None
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    total: float | None = None
    value: float = 0.0
    round_label: str = "estimating cost"
    estimated_cost: float | None = None
    _queue: asyncio.Queue[tuple[float, str]] = field(default_factory=asyncio.Queue)
    _started: float = field(default_factory=time.monotonic)

    def __call__(self, event: ev.Event) -> None:
        data = event.data
        if event.type == ev.COST_ESTIMATED:
            self.estimated_cost = data.get("estimated_cost")
        if self.report is None:
            return
        message = self._describe(event.type, data)
        if message is None:
            return
        if event.type == ev.ROUND_COMPLETED and data.get("ok", True):
            self.value = max(self.value + 1e-3, float(data.get("round_number") or 0))
        elif event.type == ev.CONSULTATION_COMPLETED:
            self.value = max(self.value + 1e-3, self.total or 0.0)
        else:
            self.value += (int(self.value) + 1 - self.value) * 0.25
        self._queue.put_nowait((self.value, message))

    def _describe(self, type_: str, d: Mapping[str, Any]) -> str | None:
        if type_ == ev.CONSULTATION_STARTED:
            self.total = float(d.get("planned_rounds") or 4)
            return f"started: {len(d.get('agents') or [])} agents, {d.get('planned_rounds')} rounds"
        if type_ == ev.ROUND_STARTED:
            self.round_label = f"round {d.get('round_number')} · {d.get('round_type')}"
            return f"{self.round_label} started"
        if type_ == ev.AGENT_COMPLETED:
            state = "✓" if d.get("ok") else f"✗ {d.get('error')}"
            return f"round {d.get('round_number')}: {d.get('agent')} {state} {d.get('duration_s')} s"
        if type_ == ev.ROUND_ARTIFACT and not d.get("agent"):
            return f"round {d.get('round_number')}: judge's {d.get('artifact_type')} ready"
        if type_ == ev.ROUND_COMPLETED:
            return f"round {d.get('round_number')} · {d.get('round_type')} completed in {d.get('duration_s')} s"
        if type_ == ev.ROUND_INTERRUPTED:
            return f"round {d.get('round_number')} interrupted ({d.get('reason')})"
        if type_ == ev.EXIT_EVALUATED:
            if d.get("action") == "repeat":  # one more round than planned: the progress total grows with it
                self.total = (self.total or 4.0) + 1
                return f"round {d.get('round_number')}: cross-examination repeats"
            return f"round {d.get('round_number')}: debate ends ({d.get('reason')})"
        if type_ == ev.EARLY_TERMINATION and d.get("accepted"):
            return f"early termination at confidence {d.get('confidence')}"
        if type_ == ev.PROVIDER_SUBSTITUTED:
            return (f"round {d.get('round_number')}: {d.get('agent')} switched to {d.get('substitute_provider')}/"
                    f"{d.get('substitute_model')} ({d.get('reason')})")
        if type_ == ev.CONSULTATION_COMPLETED:
            return f"finished: {d.get('status')}"
        return None

    async def pump(self) -> None:
        """Send queued progress, and a heartbeat whenever ``heartbeat_s`` passes without any (runs until cancelled)."""
        assert self.report is not None
        while True:
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the cancellation that stops this loop
                async with asyncio.timeout(self.heartbeat_s):
                    value, message = await self._queue.get()
            except TimeoutError:
                self.value += 1e-4
                value = self.value
                elapsed = time.monotonic() - self._started
                message = f"working: {self.round_label} ({elapsed:.0f} s elapsed)"
            try:
                await self.report(value, self.total, message)
            except Exception as exc:  # a client that went away must not stop the consultation
                log.debug("progress notification failed: %s", exc)

    async def drain(self) -> None:
        """Send what is still queued (the last events of a consultation that just ended)."""
        if self.report is None:
            return
        while not self._queue.empty():
            value, message = self._queue.get_nowait()
            with contextlib.suppress(Exception):
                await self.report(value, self.total, message)


async def run_with_progress(consultation: Any, bridge: ProgressBridge,
                            on_cancel: Callable[[], None] | None = None) -> Any:
    """Run ``consultation`` while ``bridge`` reports progress; a cancellation of the caller cancels the engine once
    (calling ``on_cancel`` first) and waits for it to save what it has (its partial result is in
    ``consultation.result``)."""
    pump = asyncio.create_task(bridge.pump()) if bridge.report is not None else None
    task = asyncio.create_task(consultation.run())
    try:
        result = await asyncio.shield(task)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.wait({task})
        raise
    finally:
        if pump is not None:
            pump.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait({pump}, timeout=5)
    await bridge.drain()
    return result
