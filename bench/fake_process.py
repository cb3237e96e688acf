"""The fake provider server in a process of its own, for benchmarks (like a remote API, it does not compete for
the measured interpreter): every model answers each schema with an instance generated once, after ``latency``
seconds; with ``log``, each request's arrival time is appended to that file.

    with fake_server_process(0.3) as overrides: ...   # the overrides that point conclave at it
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

MODELS = ("claude-sonnet-4-5", "gpt-4o", "gemini-2.5-pro", "gpt-4.1")


async def serve(latency: float, log: str | None = None) -> None:
    from conclave.testing.fake_server import FakeProviderServer, RecordedRequest, Reply
    from conclave.testing.schema_instances import instance_for

    answers: dict[str, Any] = {}

    def answer(request: RecordedRequest) -> Reply:
        if log is not None:
            with open(log, "a") as f:
                f.write(f"{time.time()}\n")
        key = json.dumps(request.schema, sort_keys=True)
        if key not in answers:
            answers[key] = instance_for(request.schema)
        return Reply(json=answers[key], latency=latency)

    async with FakeProviderServer() as fake:
        for model in MODELS:
            fake.script(model, answer)
        print(json.dumps(fake.overrides()), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin


@contextmanager
def fake_server_process(latency: float, log: str | None = None) -> Iterator[list[str]]:
    """A fake server process answering after ``latency`` s; yields the overrides that point conclave at it."""
    child = subprocess.Popen([sys.executable, __file__, str(latency), *([log] if log else [])],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield json.loads(child.stdout.readline())
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


if __name__ == "__main__":
    asyncio.run(serve(float(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
