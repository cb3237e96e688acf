"""Per-call overhead of ``ProviderPool.complete`` (openai provider) over a raw aiohttp POST to the same fake endpoint.

Both send the same JSON body to the same zero-latency fake server and decode the answer; the difference is what
the pool adds (request building, retry/hedge bookkeeping, attempt records, events, pricing). Calls alternate
between the two so drift hits both equally. Run: ``python bench/call_overhead.py [--calls 3000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any, cast

import aiohttp

from conclave.events import EventBus
from conclave.plugin_manager import load_plugins
from conclave.providers.base import CompletionRequest, Message
from conclave.providers.pool import ProviderPool
from conclave.testing.fake_server import FakeProviderServer, Reply

MODEL = "gpt-4o"


async def measure(calls: int, warmup: int) -> dict[str, list[float]]:
    async with FakeProviderServer() as fake:
        fake.script(MODEL, Reply(text="ok"))
        request = CompletionRequest(model=MODEL, system="You are terse.", messages=(Message("user", "Say ok."),))
        bus = EventBus("bench")
        bus.subscribe(lambda _event: None)  # a consultation always has subscribers (journal, progress)
        timings: dict[str, list[float]] = {"raw aiohttp POST": [], "ProviderPool.complete": []}
        async with ProviderPool(fake.settings(), load_plugins(), bus) as pool, aiohttp.ClientSession() as raw:
            provider = pool.provider("openai")
            url = fake.base_url("openai") + "/chat/completions"
            body = json.dumps(cast(Any, provider).body(request, stream=False))  # the exact body the pool sends
            headers = {"Content-Type": "application/json", "Authorization": "Bearer bench-key"}

            async def raw_call() -> None:
                async with raw.post(url, data=body, headers=headers) as resp:
                    json.loads(await resp.read())

            async def pool_call() -> None:
                await pool.complete(agent="a", provider="openai", request=request, round_number=1)

            for index in range(warmup + calls):
                for name, call in (("raw aiohttp POST", raw_call), ("ProviderPool.complete", pool_call)):
                    started = time.perf_counter()
                    await call()
                    if index >= warmup:
                        timings[name].append(time.perf_counter() - started)
        return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=200)
    args = parser.parse_args()
    os.environ.setdefault("CONCLAVE_PLUGINS", "openai,anthropic,gemini")
    os.environ.setdefault("OPENAI_API_KEY", "bench-key")
    timings = asyncio.run(measure(args.calls, args.warmup))
    print(f"per-call overhead: {args.calls} sequential calls each, zero-latency fake server on 127.0.0.1\n")
    header = f"{'path':<24}{'p50':>10}{'p90':>10}{'mean':>10}"
    print(header)
    print("-" * len(header))
    p50 = {}
    for name, values in timings.items():
        ordered = sorted(values)
        p50[name] = statistics.median(ordered) * 1e6
        print(f"{name:<24}{p50[name]:>8.0f}µs{ordered[int(0.9 * len(ordered))] * 1e6:>8.0f}µs"
              f"{statistics.fmean(ordered) * 1e6:>8.0f}µs")
    raw, ours = p50["raw aiohttp POST"], p50["ProviderPool.complete"]
    print(f"\noverhead p50: {ours - raw:.0f} µs ({ours / raw:.2f}× the raw POST; goal ≤ 200 µs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
