"""Pacing under a rate limit: once an endpoint answers 429, this process spaces its requests to it.

Honouring each call's Retry-After alone is not enough when many calls run at once (an eval runs several items,
each with a panel): every waiting call comes back together and most are refused again. A rate limit belongs to the
endpoint (the key), not to one call or one consultation, so the pace is kept per endpoint for everything the
process runs on its event loop.
The rule is TCP's: on a 429 the request rate is halved (once per burst of refusals: a refusal of a request
scheduled before the last cut does not cut again) and no request starts before the Retry-After; every answer
raises the rate a little. An endpoint that never answers 429 is never paced.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections import deque
from collections.abc import Callable

#: per answer, the interval between request starts shrinks by this factor (the rate grows ~1% per answer)
SPEED_UP = 0.99
#: the slowest pace: one request per this many seconds
MAX_INTERVAL_S = 30.0
#: below this interval the endpoint is no longer paced
MIN_INTERVAL_S = 0.001


class Pacer:
    """The pace of requests to one endpoint."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.interval = 0.0  # seconds between request starts; 0 = unpaced
        self.next_start = 0.0
        self.cuts = 0  # how many times the rate was cut: a request remembers the pace it was sent under
        self.starts: deque[float] = deque(maxlen=32)

    def take(self) -> float:
        """0 when a request may start now (it takes the slot), else the seconds to wait before asking again (a cut
        while waiting pushes the slot further: waiters ask again rather than keep a start set at the old pace)."""
        now = self.clock()
        if now < self.next_start:
            return self.next_start - now
        if self.interval > 0:
            self.next_start = now + self.interval
        self.starts.append(now)
        return 0.0

    def refused(self, pace: int, retry_after_s: float | None) -> None:
        """A request sent under ``pace`` (:attr:`cuts` when it was sent) was answered 429."""
        now = self.clock()
        self.next_start = max(self.next_start, now + (retry_after_s or 0.0))
        if pace != self.cuts:
            return  # sent at an older pace: this burst of refusals has cut the rate already
        self.cuts += 1
        span = self.starts[-1] - self.starts[0] if len(self.starts) > 1 else 0.0
        sent_every = span / (len(self.starts) - 1) if span > 0 else (retry_after_s or 1.0)
        # never faster than the endpoint's own Retry-After says a request may come (its time to the next token)
        self.interval = min(MAX_INTERVAL_S, max(2 * self.interval, 2 * sent_every, retry_after_s or 0.0))

    def answered(self) -> None:
        if self.interval > 0:
            self.interval *= SPEED_UP
            if self.interval < MIN_INTERVAL_S:
                self.interval = 0.0


#: event loop -> endpoint -> its pacer. Everything a process runs on one loop shares an endpoint's pace (an
#: evaluation's concurrent items, a server's consultations); a new loop (the next CLI command, the next test) starts
#: unpaced, so one burst of refusals does not slow unrelated work for the rest of the process.
_PACERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Pacer]] = weakref.WeakKeyDictionary()


def pacer_for(endpoint: str) -> Pacer:
    """The pacer of ``endpoint`` (a base URL) on the running event loop."""
    return _PACERS.setdefault(asyncio.get_running_loop(), {}).setdefault(endpoint, Pacer())
