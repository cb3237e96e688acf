"""SIGTERM and SIGHUP end a consultation the way Ctrl-C (SIGINT) does: the running round is journaled as
interrupted, the partial result is saved and printed, the process exits 130, and ``conclave resume`` continues."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

#: the signals treated as Ctrl-C (those that exist on this platform)
AS_INTERRUPT = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def _as_sigint(signum: int, frame: FrameType | None) -> Any:
    # Whatever handles SIGINT right now handles this too: inside ``asyncio.run`` that cancels the main task
    # (as Ctrl-C does), elsewhere Python's default raises KeyboardInterrupt.
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        return handler(signum, frame)
    raise KeyboardInterrupt


@contextlib.contextmanager
def termination_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP act as SIGINT; the previous handlers come back afterwards."""
    previous: dict[int, Any] = {}
    try:
        for signum in AS_INTERRUPT:
            previous[signum] = signal.signal(signum, _as_sigint)
    except ValueError:  # not the main thread: signals cannot be handled here
        pass
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
