"""Hedged requests: when to start a backup, how many backups may be started, and the race itself.

When: after ``hedging.hedge_after_s`` if set; otherwise after :data:`HISTORY_MARGIN` × the model's
:data:`HISTORY_QUANTILE` latency (1.5 × p90) over its remembered successful calls, never sooner than
``hedging.floor_s``. The history outlives the process (``$CONCLAVE_HOME/hedging.json``, see
:mod:`conclave.providers.hedge_memory`), so a CLI run starts with it. p90 × 1.5 rather than p95: when 5% or more
of a model's calls are slow, its p95 *is* a slow call and a p95 delay would stop hedging exactly when it helps;
p90 stays in the body of the distribution and the margin keeps ordinary jitter from triggering hedges.

A history thinner than :data:`MIN_HISTORY` calls (a home's first consultations) has its maximum as its p90, so
one slow call in it would put the delay past every later slow call: it is read as :data:`PEER_MARGIN` × its median
instead.

A model with no history at all (a new home, a model used for the first time) is measured against its peers: the
calls of the same round that have already answered (round 1's agents answer the same question at the same time),
or, in a round where none has, the calls this consultation has finished. It is hedged after :data:`PEER_MARGIN`
× the slowest of them (never sooner than ``hedging.floor_s``): when two of three agents are back in 0.3 s, the
third at 3 s is an outlier. The delay is re-evaluated whenever a peer answers; it only grows as more peers answer
(the slowest peer can only get slower), and until the first one answers it is :data:`NO_HISTORY_HEDGE_AFTER_S`.

How many: a token bucket. Every call started adds ``hedging.budget`` tokens (0.05), up to ``hedging.burst``
tokens (8); a hedge spends one. A new home starts with a full bucket, so a short consultation may hedge at once,
and over any sequence of N calls — in one process or many sharing a home — hedges stay at most
``burst + budget × N``: the long-run share of extra calls is ``hedging.budget``. The bucket is shared by every
process of the home (taken under a file lock when a hedge is about to start); a pool without a home keeps its own
bucket in memory, with the same rule. Why a burst of 8: when slow calls come at about the budget's rate (5%),
the bucket's level is a walk without drift, and a small bucket runs dry at every cluster of slow calls. Over
~1,000 calls with exactly 5% of them slow (at random places), a bucket of 2 leaves ~10 of ~48 slow calls
unhedged, 5 about 0.5, 8 none (simulated over 500 schedules); the long-run share stays ``hedging.budget``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from conclave.config.settings import HedgingSettings
from conclave.providers.base import ProviderError

if TYPE_CHECKING:
    from conclave.providers.hedge_memory import HedgeMemory

T = TypeVar("T")

#: hedge delay while a model has no latency history
NO_HISTORY_HEDGE_AFTER_S = 10.0
#: a model without history is hedged after this many times the slowest of its peers that have answered
PEER_MARGIN = 3.0
#: the latency quantile of a model's history the hedge delay is based on, and the margin it is multiplied by
HISTORY_QUANTILE = 0.90
HISTORY_MARGIN = 1.5
#: a history with fewer samples is thin: its p90 is its maximum (nearest rank), so one slow call would set the
#: delay past every later slow call; a thin history is read like peers, :data:`PEER_MARGIN` × its median
MIN_HISTORY = 10


class HedgeBudget:
    """The hedge token bucket: ``fraction`` tokens per call started, at most ``burst`` held, one per hedge.

    With ``memory`` the bucket lives in the home's hedging file and is shared with every other process;
    without, it lives in this object (starting full)."""

    def __init__(self, fraction: float, burst: float = 2.0, memory: HedgeMemory | None = None) -> None:
        self.fraction = fraction
        self.burst = burst
        self.memory = memory
        self.calls = 0
        self.used = 0
        self._tokens = float(burst)

    def note_call(self) -> None:
        self.calls += 1
        if self.memory is not None:
            self.memory.accrue(self.fraction)
        else:
            self._tokens = min(self.burst, self._tokens + self.fraction)

    def try_acquire(self) -> bool:
        """Spend one hedge if the bucket holds a whole token."""
        if self.fraction <= 0:
            return False
        if self.memory is not None:
            granted = self.memory.take_token(self.burst)
        else:
            # the epsilon keeps 20 × 0.05 from falling short of 1 through binary rounding
            granted = self._tokens >= 1.0 - 1e-9
            if granted:
                self._tokens -= 1.0
        if granted:
            self.used += 1
        return granted


def quantile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank ``q`` quantile of ``samples`` (not empty)."""
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def hedge_after(settings: HedgingSettings, history_s: float | None,
                peers_s: Sequence[float] = ()) -> float | None:
    """Seconds to wait for the primary before hedging; None when hedging is off.

    ``history_s`` is the model's :data:`HISTORY_QUANTILE` latency (None without history); ``peers_s`` the
    latencies of the calls that have answered alongside it (its round's, else its consultation's).
    ``hedging.hedge_after_s`` wins; otherwise :data:`HISTORY_MARGIN` × ``history_s``; without history
    :data:`PEER_MARGIN` × the slowest peer; both never below ``hedging.floor_s``; with neither,
    :data:`NO_HISTORY_HEDGE_AFTER_S`.
    """
    if not settings.enabled:
        return None
    if settings.hedge_after_s is not None:
        return settings.hedge_after_s
    if history_s is not None:
        return max(settings.floor_s, HISTORY_MARGIN * history_s)
    if peers_s:
        return max(settings.floor_s, PEER_MARGIN * max(peers_s))
    return NO_HISTORY_HEDGE_AFTER_S


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
