"""The fake provider server in a process of its own, for benchmarks (like a remote API, it does not compete for
the measured interpreter): every model (the panel's and every tier's) answers each schema with an instance
generated once, after ``latency`` seconds; with ``log``, each request's arrival time is appended to that file.
With ``tail=(share, slow_s, seed)`` the latency is heavy-tailed: in every block of 100 requests, exactly
``share`` × 100 of them (at seeded random places) take ``slow_s`` instead.

    with fake_server_process(0.3) as overrides: ...   # the overrides that point conclave at it
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

MODELS = ("claude-sonnet-4-5", "gpt-4o", "gemini-2.5-pro", "gpt-4.1")


def _schedule(latency: float, tail: tuple[float, float, int] | None) -> Iterator[float]:
    if tail is None:
        while True:
            yield latency
    share, slow_s, seed = tail
    rng = random.Random(seed)
    slow = round(100 * share)
    while True:
        block = [slow_s] * slow + [latency] * (100 - slow)
        rng.shuffle(block)
        yield from block


async def serve(latency: float, log: str | None = None, tail: tuple[float, float, int] | None = None) -> None:
    from conclave.providers.tiers import Tiers
    from conclave.testing.fake_server import FakeProviderServer, RecordedRequest, Reply
    from conclave.testing.schema_instances import instance_for

    answers: dict[str, Any] = {}
    latencies = _schedule(latency, tail)

    def answer(request: RecordedRequest) -> Reply:
        if log is not None:
            with open(log, "a") as f:
                f.write(f"{time.time()}\n")
        key = json.dumps(request.schema, sort_keys=True)
        if key not in answers:
            answers[key] = instance_for(request.schema)
        return Reply(json=answers[key], latency=next(latencies))

    models = set(MODELS) | {model for tier in Tiers.load().tiers for _, model in tier.models}
    async with FakeProviderServer() as fake:
        for model in sorted(models):
            fake.script(model, answer)
        print(json.dumps(fake.overrides()), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin


@contextmanager
def fake_server_process(latency: float, log: str | None = None,
                        tail: tuple[float, float, int] | None = None) -> Iterator[list[str]]:
    """A fake server process answering after ``latency`` s; yields the overrides that point conclave at it."""
    extra = [log or "", *(str(x) for x in tail)] if tail else ([log] if log else [])
    child = subprocess.Popen([sys.executable, __file__, str(latency), *extra],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield json.loads(child.stdout.readline())
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


if __name__ == "__main__":
    tail_args = sys.argv[3:6]
    asyncio.run(serve(float(sys.argv[1]), (sys.argv[2] or None) if len(sys.argv) > 2 else None,
                      (float(tail_args[0]), float(tail_args[1]), int(tail_args[2])) if tail_args else None))
