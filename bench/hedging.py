"""Hedged requests against a heavy-tailed primary: tail latency and extra requests, hedging off vs on.

The primary answers 95% of calls in 200 ms and exactly 5% (randomly placed) in 5 s; a healthy backup answers in
200 ms. Hedges may use 5% of calls (the default budget), so every hedge must land on a slow call. All latencies and
the hedge floor are divided by SCALE so the 1,000 calls finish in seconds; the table shows unscaled figures.
Run: ``python bench/hedging.py [--calls 1000] [--concurrency 20] [--seed 7]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from typing import Any

from conclave.plugins import load_plugins
from conclave.providers.base import CompletionRequest, Message
from conclave.providers.pool import ProviderPool
from conclave.providers.retry import RetryPolicy
from conclave.providers.tiers import Tier, Tiers
from conclave.testing.fake_server import FakeProviderServer, Reply

SCALE = 10.0
FAST_S, SLOW_S, SLOW_SHARE = 0.200, 5.0, 0.05
PRIMARY = ("openai", "primary-model")
BACKUP = ("anthropic", "backup-model")


def primary_latencies(calls: int, seed: int) -> list[float]:
    """Exactly 5% slow calls in a random order (the same order in every scenario), scaled down."""
    slow = round(calls * SLOW_SHARE)
    latencies = [SLOW_S / SCALE] * slow + [FAST_S / SCALE] * (calls - slow)
    random.Random(seed).shuffle(latencies)
    return latencies


async def run(hedging: dict[str, Any], calls: int, concurrency: int, seed: int) -> dict[str, float]:
    """``calls`` calls through one pool (one consultation's budget); latencies in unscaled seconds."""
    async with FakeProviderServer(seed=seed) as fake:
        queue = iter(primary_latencies(calls, seed))
        fake.script(PRIMARY[1], Reply(text="primary", latency=lambda _rng: next(queue)))
        fake.script(BACKUP[1], Reply(text="backup", latency=FAST_S / SCALE))
        settings = fake.settings(hedging=hedging)
        tiers = Tiers([Tier("bench", (PRIMARY, BACKUP))])
        request = CompletionRequest(model=PRIMARY[1], messages=(Message("user", "q"),))
        latencies: list[float] = []
        gate = asyncio.Semaphore(concurrency)
        unhedged_slow = 0
        async with ProviderPool(settings, load_plugins(), tiers=tiers, retry_policy=RetryPolicy()) as pool:

            async def one() -> None:
                nonlocal unhedged_slow
                async with gate:
                    started = time.perf_counter()
                    completion = await pool.complete(agent="a", provider=PRIMARY[0], request=request,
                                                     round_number=1)
                    latencies.append((time.perf_counter() - started) * SCALE)
                    primary = completion.attempts[-1] if not any(a.hedge for a in completion.attempts) else None
                    if primary is not None and primary.latency_s * SCALE >= SLOW_S:
                        unhedged_slow += 1

            await asyncio.gather(*(one() for _ in range(calls)))
            hedges = pool.budget.used
        ordered = sorted(latencies)
        return {
            "p50": statistics.median(ordered),
            "p95": ordered[int(0.95 * len(ordered)) - 1],
            "p99": ordered[int(0.99 * len(ordered)) - 1],
            "max": ordered[-1],
            "extra": (len(fake.requests) - calls) / calls,
            "hedges": hedges,
            "unhedged_slow": unhedged_slow,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("CONCLAVE_PLUGINS", "openai,anthropic,gemini")
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        os.environ.setdefault(var, "bench-key")
    scenarios: list[tuple[str, dict[str, Any]]] = [
        ("off", {"enabled": False}),
        ("on: p95, floor 2 s (defaults)", {"enabled": True, "floor_s": 2.0 / SCALE, "budget": 0.05}),
        ("on: p95, floor 0.5 s", {"enabled": True, "floor_s": 0.5 / SCALE, "budget": 0.05}),
    ]
    print(f"hedging benchmark: {args.calls} calls, {args.concurrency} in flight; primary 95% {FAST_S * 1000:.0f} ms / "
          f"5% {SLOW_S:.0f} s, backup {FAST_S * 1000:.0f} ms, budget 5%")
    print(f"(latencies run divided by {SCALE:g}; figures below are scaled back up)\n")
    header = f"{'hedging':<32}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}{'extra req':>11}{'slow unhedged':>15}"
    print(header)
    print("-" * len(header))
    results = {}
    for name, hedging in scenarios:
        r = asyncio.run(run(hedging, args.calls, args.concurrency, args.seed))
        results[name] = r
        print(f"{name:<32}{r['p50']:>8.2f}s{r['p95']:>8.2f}s{r['p99']:>8.2f}s{r['max']:>8.2f}s{r['extra']:>10.1%}"
              f"{r['unhedged_slow']:>15}")
    base = results["off"]["p99"]
    print()
    for name, r in list(results.items())[1:]:
        print(f"{name}: p99 {1 - r['p99'] / base:.0%} lower than off, {r['extra']:.1%} extra requests "
              f"(goal: ≥50% lower with ≤5% extra)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
