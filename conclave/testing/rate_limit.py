"""A provider-wide request rate limit for the fake server, as a hosted API enforces one per key: a token bucket
refilled at ``per_second`` holding at most ``burst``; a request finding it empty is answered 429 with a
Retry-After saying when the next token arrives. It also counts what was answered, so a caller can check that no
request was paid twice (an identical request body answered more than once)."""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable

from conclave.testing.fake_server import Fault, RecordedRequest


class RateLimit:
    """Pass as ``gate=`` to :meth:`conclave.testing.answer_panel.AnswerPanel.install`."""

    def __init__(self, per_second: float, burst: int = 1, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_second = per_second
        self.burst = burst
        self.clock = clock
        self.tokens = float(burst)
        self.last = clock()
        self.limited = 0  # requests answered 429
        self.answered: Counter[str] = Counter()  # request body digest -> times answered (paid)

    def __call__(self, request: RecordedRequest) -> Fault | None:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.per_second)
        self.last = now
        if self.tokens < 1.0:
            self.limited += 1
            wait = (1.0 - self.tokens) / self.per_second
            return Fault.rate_limited(retry_after=round(max(wait, 0.001), 3))
        self.tokens -= 1.0
        body = json.dumps(request.json, sort_keys=True, ensure_ascii=False).encode()
        self.answered[hashlib.sha256(body).hexdigest()] += 1
        return None

    @property
    def paid(self) -> int:
        """Requests answered (each one billed)."""
        return sum(self.answered.values())

    @property
    def paid_twice(self) -> int:
        """Answers to a request body already answered once."""
        return sum(count - 1 for count in self.answered.values())
