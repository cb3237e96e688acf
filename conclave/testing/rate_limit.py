"""A provider-wide request rate limit for the fake server, as a hosted API enforces one per key: a token bucket
refilled at ``per_second`` holding at most ``burst``; a request finding it empty is answered 429 with a
Retry-After saying when the next token arrives. Every answer, 429 or not, carries the limit's state in its API's
headers, as the real APIs send it: OpenAI ``x-ratelimit-{limit,remaining,reset}-requests`` (the reset as a duration
such as ``1s`` or ``120ms``), Anthropic ``anthropic-ratelimit-requests-{limit,remaining,reset}`` (the reset as an
RFC 3339 time, whole seconds rounded up); Gemini sends none. The reset is when the bucket is full again. It also
counts what was answered, so a caller can check that no request was paid twice (an identical request body answered
more than once), and the fewest requests left after an answer (how hard the callers pressed on the limit)."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

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
        self.lowest = burst  # the fewest requests left after an answered one: how close the callers came
        self.answered: Counter[str] = Counter()  # request body digest -> times answered (paid)
        #: request body digest -> (wall-clock time, model) of each answer: to tell what a repeat was
        self.answered_at: dict[str, list[tuple[float, str]]] = {}

    def __call__(self, request: RecordedRequest) -> Fault | None:
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.per_second)
        self.last = now
        if self.tokens < 1.0:
            self.limited += 1
            request.response_headers.update(self.headers(request.api))
            wait = (1.0 - self.tokens) / self.per_second
            return Fault.rate_limited(retry_after=round(max(wait, 0.001), 3))
        self.tokens -= 1.0
        self.lowest = min(self.lowest, math.floor(self.tokens))
        request.response_headers.update(self.headers(request.api))
        body = json.dumps(request.json, sort_keys=True, ensure_ascii=False).encode()
        digest = hashlib.sha256(body).hexdigest()
        self.answered[digest] += 1
        self.answered_at.setdefault(digest, []).append((time.time(), str(request.json.get("model") or "")))
        return None

    def headers(self, api: str) -> dict[str, str]:
        """The limit's state as ``api`` reports it: how many requests are left, and when the bucket is full."""
        remaining = str(math.floor(self.tokens))
        reset_s = (self.burst - self.tokens) / self.per_second
        if api == "openai":
            return {"x-ratelimit-limit-requests": str(self.burst), "x-ratelimit-remaining-requests": remaining,
                    "x-ratelimit-reset-requests": go_duration(reset_s)}
        if api == "anthropic":
            full_at = datetime.fromtimestamp(math.ceil(time.time() + reset_s), UTC)
            return {"anthropic-ratelimit-requests-limit": str(self.burst),
                    "anthropic-ratelimit-requests-remaining": remaining,
                    "anthropic-ratelimit-requests-reset": full_at.strftime("%Y-%m-%dT%H:%M:%SZ")}
        return {}

    @property
    def paid(self) -> int:
        """Requests answered (each one billed)."""
        return sum(self.answered.values())

    @property
    def paid_twice(self) -> int:
        """Answers to a request body already answered once."""
        return sum(count - 1 for count in self.answered.values())

    def repeats(self) -> list[list[tuple[float, str]]]:
        """The (time, model) of every answer to each request body answered more than once."""
        return [times for digest, times in self.answered_at.items() if self.answered[digest] > 1]


def go_duration(seconds: float) -> str:
    """``seconds`` as OpenAI writes a reset (Go's duration format): ``120ms``, ``1.5s``, ``6m0s``, ``1h2m3s``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms" if seconds > 0 else "0s"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    text = f"{round(secs, 3):g}s"
    if hours or minutes:
        text = f"{int(minutes)}m{text}"
    return f"{int(hours)}h{text}" if hours else text
