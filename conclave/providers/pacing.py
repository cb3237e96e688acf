"""Pacing under a rate limit: requests to an endpoint are spaced by what its answers say is left of the key's limit,
and by the 429s it answers (the only signal from an API that says nothing).

A rate limit belongs to the endpoint's key, not to one call or one consultation, so the pace is kept per endpoint
for everything the process runs on its event loop (an evaluation's concurrent items, a server's consultations).

From the headers (OpenAI and Anthropic send them on every answer; the plugin reads its own dialect into
:class:`RateLimits`): with ``remaining`` requests left until the limit is whole again in ``reset`` seconds, requests
start at most ``remaining / reset`` per second, i.e. what is left is spread evenly over the time to reset; the same
for tokens, counting a call as the tokens this process's calls used on average. ``remaining`` is the server's own
count for the key, so every process sharing the key slows as it falls, before any 429: under a token bucket of
size L, n processes settle at the bucket's refill rate with about L/(n+1) left. A reading stops counting once its
reset time has passed (the limit is whole again).

From 429s (the fallback; Gemini sends no such headers), the rule is TCP's: on a 429 the request rate is
halved (once per burst of refusals: a refusal of a request scheduled before the last cut does not cut again) and no
request starts before the Retry-After; every answer raises the rate a little. The slower of the two paces holds.
A call's wait for its pace is not slowness: its hedge delay starts when the pacer lets it go (conclave.providers.pool).
"""

from __future__ import annotations

import asyncio
import math
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

#: per answer, the interval between request starts shrinks by this factor (the rate grows ~1% per answer)
SPEED_UP = 0.99
#: the slowest pace after 429s: one request per this many seconds
MAX_INTERVAL_S = 30.0
#: below this interval the endpoint is no longer paced
MIN_INTERVAL_S = 0.001
#: weight of the latest answer in the average tokens per call
TOKENS_WEIGHT = 0.2


@dataclass(frozen=True)
class Allowance:
    """What is left of one of the key's limits: ``remaining`` (requests or tokens), whole again in ``reset_s``."""

    remaining: float
    reset_s: float


@dataclass(frozen=True)
class RateLimits:
    """The rate-limit state one answer reported (None: the answer did not say)."""

    requests: Allowance | None = None
    tokens: Allowance | None = None


class Pacer:
    """The pace of requests to one endpoint."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.interval = 0.0  # seconds between request starts after 429s; 0 = unpaced
        self.not_before = 0.0  # no request starts before this (a Retry-After)
        self.last_start = -math.inf
        self.cuts = 0  # how many times the rate was cut: a request remembers the pace it was sent under
        self.starts: deque[float] = deque(maxlen=32)
        self.limits = RateLimits()
        self.heard_at = 0.0
        self.tokens_per_call = 0.0

    def take(self) -> float:
        """0 when a request may start now (it takes the slot), else the seconds to wait before asking again (a
        reading or a cut while waiting moves the slot: waiters ask again rather than keep a start set earlier)."""
        now = self.clock()
        ready = max(self.not_before, self.last_start + max(self.interval, self.spacing(now)))
        if now < ready:
            return ready - now
        self.last_start = now
        self.starts.append(now)
        return 0.0

    def spacing(self, now: float) -> float:
        """Seconds between request starts that spread what the last answer said is left over its time to reset."""
        gaps = [0.0]
        requests, tokens = self.limits.requests, self.limits.tokens
        if requests is not None and now < self.heard_at + requests.reset_s:
            gaps.append(requests.reset_s / max(requests.remaining, 1.0))
        if tokens is not None and self.tokens_per_call > 0 and now < self.heard_at + tokens.reset_s:
            gaps.append(tokens.reset_s / max(tokens.remaining / self.tokens_per_call, 1.0))
        return max(gaps)

    def heard(self, limits: RateLimits) -> None:
        """An answer (of any status) reported the key's rate-limit state."""
        self.limits, self.heard_at = limits, self.clock()

    def refused(self, pace: int, retry_after_s: float | None) -> None:
        """A request sent under ``pace`` (:attr:`cuts` when it was sent) was answered 429."""
        now = self.clock()
        self.not_before = max(self.not_before, now + (retry_after_s or 0.0))
        if pace != self.cuts:
            return  # sent at an older pace: this burst of refusals has cut the rate already
        self.cuts += 1
        span = self.starts[-1] - self.starts[0] if len(self.starts) > 1 else 0.0
        sent_every = span / (len(self.starts) - 1) if span > 0 else (retry_after_s or 1.0)
        # never faster than the endpoint's own Retry-After says a request may come (its time to the next token)
        self.interval = min(MAX_INTERVAL_S, max(2 * self.interval, 2 * sent_every, retry_after_s or 0.0))

    def answered(self, tokens: int = 0) -> None:
        """A request was answered; it used ``tokens`` (input and output) of the key's token limit."""
        if tokens > 0:
            self.tokens_per_call = (tokens if self.tokens_per_call == 0 else
                                    (1 - TOKENS_WEIGHT) * self.tokens_per_call + TOKENS_WEIGHT * tokens)
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
