"""The one retry layer: exponential backoff with full jitter, Retry-After honoured, bounded attempts, a deadline.

Providers make exactly one HTTP attempt and never retry on their own; :func:`call_with_retries` decides whether
another attempt is worth it. Auth, unknown-model and bad-request errors are not retryable (``retryable=False``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from conclave.providers.base import ProviderError, ProviderTimeoutError

T = TypeVar("T")
log = logging.getLogger(__name__)

#: one attempt: ``(attempt number starting at 1, seconds left before the deadline) -> result``
AttemptFn = Callable[[int, float], Awaitable[T]]


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff shape. Full jitter (uniform in ``[0, min(cap, base·2^(n-1))]``) spreads clients that failed together."""

    base_s: float = 0.5
    cap_s: float = 8.0

    def delay(self, error: ProviderError, failures: int, rng: random.Random) -> float:
        """Seconds to wait after the ``failures``-th failed attempt; never less than the server's Retry-After."""
        backoff = rng.uniform(0.0, min(self.cap_s, self.base_s * 2 ** (failures - 1)))
        retry_after = getattr(error, "retry_after_s", None)
        return backoff if retry_after is None else max(backoff, retry_after)


async def call_with_retries(
    attempt: AttemptFn[T],
    *,
    max_attempts: int,
    deadline: float,
    policy: RetryPolicy,
    rng: random.Random,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Run ``attempt`` until it succeeds, fails for good, runs out of attempts, or waiting would pass ``deadline``.

    ``deadline`` is on ``clock``'s scale. The last error is raised unchanged, so its type says what went wrong.
    """
    number = 0
    while True:
        number += 1
        remaining = deadline - clock()
        if remaining <= 0:
            raise ProviderTimeoutError(f"the call's deadline passed before attempt {number}")
        try:
            return await attempt(number, remaining)
        except ProviderError as exc:
            if not exc.retryable or number >= max_attempts:
                raise
            delay = policy.delay(exc, number, rng)
            if clock() + delay >= deadline:  # a retry that cannot finish in time only burns a request
                log.debug("not retrying (deadline in %.2fs, wait %.2fs): %s", deadline - clock(), delay, exc)
                raise
            log.debug("attempt %d failed, retrying in %.2fs: %s", number, delay, exc)
        await asyncio.sleep(delay)
