"""Hedged requests: when to start a backup, how many backups a consultation may start, and the race itself.

Budget rounding: a consultation that has started ``calls`` calls may have hedged at most
``floor(budget × calls)`` of them. So the first hedge needs ``budget × calls ≥ 1`` (20 calls at the default 5%),
and hedges never exceed the budget fraction at any moment, not only at the end.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import TypeVar

from conclave.config import HedgingSettings
from conclave.providers.base import ProviderError

T = TypeVar("T")

#: hedge delay while a model has no latency history
NO_HISTORY_HEDGE_AFTER_S = 10.0


class HedgeBudget:
    """Caps the hedges of one consultation at ``floor(fraction × calls started)``."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.calls = 0
        self.used = 0

    def note_call(self) -> None:
        self.calls += 1

    @property
    def allowed(self) -> int:
        # the epsilon keeps 0.05 × 20 from flooring to 0 through binary rounding
        return math.floor(self.fraction * self.calls + 1e-9)

    def try_acquire(self) -> bool:
        """Spend one hedge if the budget has room."""
        if self.used + 1 > self.allowed:
            return False
        self.used += 1
        return True


def hedge_after(settings: HedgingSettings, p95_s: float | None) -> float | None:
    """Seconds to wait for the primary before hedging; None when hedging is off.

    ``hedging.hedge_after_s`` wins; otherwise the model's rolling p95 latency, never below ``hedging.floor_s``,
    and :data:`NO_HISTORY_HEDGE_AFTER_S` until the model has answered once.
    """
    if not settings.enabled:
        return None
    if settings.hedge_after_s is not None:
        return settings.hedge_after_s
    if p95_s is None:
        return NO_HISTORY_HEDGE_AFTER_S
    return max(settings.floor_s, p95_s)


async def race(
    primary: asyncio.Task[T], backup: asyncio.Task[T], *, fatal: Callable[[BaseException], bool]
) -> tuple[T, bool]:
    """The first successful result of two running tasks and whether the backup produced it.

    The loser is cancelled and awaited, so its connection is released before this returns. A primary error for
    which ``fatal`` is true, or any error that is not a :class:`ProviderError`, ends the race at once; when both
    fail, the primary's error is raised with the backup's attached as a note.
    """
    pending: set[asyncio.Task[T]] = {primary, backup}
    errors: dict[asyncio.Task[T], BaseException] = {}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            # When both finished in the same tick, prefer the primary: no substitution is better than one.
            for task in sorted(done, key=lambda t: t is not primary):
                exc = task.exception()
                if exc is None:
                    return task.result(), task is backup
                # a non-provider exception is a bug: surface it rather than let the other task hide it
                if not isinstance(exc, ProviderError) or (task is primary and fatal(exc)):
                    raise exc
                errors[task] = exc
        primary_error = errors[primary]
        primary_error.add_note(f"the hedged backup failed too: {errors[backup]}")
        raise primary_error
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
