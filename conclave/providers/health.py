"""Passive provider health from real call outcomes: rolling latency, error rate and consecutive failures.

Thresholds: HEALTHY under 3 s, DEGRADED under 10 s, UNHEALTHY at
10 s or after 3 consecutive failures, over a window of the last 10 outcomes; UNKNOWN until a first outcome.
The same tracker keeps a longer per-model latency history (seeded from the home's hedging file when a pool opens)
that decides when to hedge.
"""

from __future__ import annotations

import enum
import math
import time
from collections import deque
from dataclasses import dataclass


class HealthStatus(enum.StrEnum):
    HEALTHY = "HEALTHY"
    DEGRADED = "DEGRADED"
    UNHEALTHY = "UNHEALTHY"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True)
class HealthThresholds:
    healthy_below_s: float = 3.0
    degraded_below_s: float = 10.0
    unhealthy_after_failures: int = 3
    window: int = 10
    #: latency samples per (provider, model) kept for the hedging p95; longer than ``window`` so one slow call
    #: in ten does not make p95 the maximum
    latency_window: int = 200


@dataclass(frozen=True)
class ProviderHealth:
    status: HealthStatus
    last_checked: float | None  # time.time() of the last outcome
    latency_s: float | None  # mean of the successful calls in the window
    error_rate: float  # failures / outcomes in the window
    consecutive_failures: int


class _Window:
    def __init__(self, size: int) -> None:
        self.outcomes: deque[tuple[bool, float]] = deque(maxlen=size)
        self.consecutive_failures = 0
        self.last_checked: float | None = None


class HealthTracker:
    """Per-provider health (status) and per-model latency history (hedging), fed by every finished attempt."""

    def __init__(self, thresholds: HealthThresholds | None = None) -> None:
        self.thresholds = thresholds or HealthThresholds()
        self._windows: dict[str, _Window] = {}
        self._latencies: dict[tuple[str, str], deque[float]] = {}

    def record(self, provider: str, model: str, *, ok: bool, latency_s: float, latency_history: bool = True) -> None:
        """One finished attempt. Cancelled attempts are not recorded: their latency is unknown, only bounded.
        ``latency_history=False``: the attempt counts for the provider's health, its latency for no hedge delay."""
        window = self._windows.get(provider)
        if window is None:
            window = self._windows[provider] = _Window(self.thresholds.window)
        window.outcomes.append((ok, latency_s))
        window.consecutive_failures = 0 if ok else window.consecutive_failures + 1
        window.last_checked = time.time()
        if ok and latency_history:
            key = (provider, model)
            history = self._latencies.get(key)
            if history is None:
                history = self._latencies[key] = deque(maxlen=self.thresholds.latency_window)
            history.append(latency_s)

    def seed(self, provider: str, model: str, latencies: list[float]) -> None:
        """Latencies remembered from earlier processes, oldest first, placed before anything recorded since."""
        key = (provider, model)
        history: deque[float] = deque(latencies, maxlen=self.thresholds.latency_window)
        history.extend(self._latencies.get(key, ()))
        self._latencies[key] = history

    def snapshot(self, provider: str) -> ProviderHealth:
        window = self._windows.get(provider)
        if window is None or not window.outcomes:
            return ProviderHealth(HealthStatus.UNKNOWN, None, None, 0.0, 0)
        latencies = [lat for ok, lat in window.outcomes if ok]
        latency = sum(latencies) / len(latencies) if latencies else None
        error_rate = 1 - len(latencies) / len(window.outcomes)
        return ProviderHealth(
            self._classify(latency, error_rate, window.consecutive_failures),
            window.last_checked,
            latency,
            error_rate,
            window.consecutive_failures,
        )

    def status(self, provider: str) -> HealthStatus:
        return self.snapshot(provider).status

    def _classify(self, latency: float | None, error_rate: float, consecutive: int) -> HealthStatus:
        t = self.thresholds
        if consecutive >= t.unhealthy_after_failures or (latency is not None and latency >= t.degraded_below_s):
            return HealthStatus.UNHEALTHY
        if latency is None:  # only failures so far, fewer than the unhealthy count
            return HealthStatus.DEGRADED
        if consecutive > 0 or error_rate >= 0.5 or latency >= t.healthy_below_s:
            return HealthStatus.DEGRADED
        return HealthStatus.HEALTHY

    def latency_count(self, provider: str, model: str) -> int:
        """How many successful latencies the model's history holds."""
        return len(self._latencies.get((provider, model), ()))

    def latency_quantile(self, provider: str, model: str, q: float) -> float | None:
        """Nearest-rank ``q`` quantile of the model's successful latencies; None without history."""
        history = self._latencies.get((provider, model))
        if not history:
            return None
        ordered = sorted(history)
        return ordered[max(0, math.ceil(q * len(ordered)) - 1)]

    def p95(self, provider: str, model: str) -> float | None:
        """Nearest-rank 95th percentile of the model's successful latencies; None without history."""
        return self.latency_quantile(provider, model, 0.95)
