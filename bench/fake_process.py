"""The fake provider server in a process of its own, for benchmarks (like a remote API, it does not compete for
the measured interpreter): every model answers each schema with an instance generated once, after ``latency``
seconds; with ``log``, each request's arrival time is appended to that file; ``prompt_cache=False`` turns the
fake's prompt caches off (every input token billed as uncached); ``rich=True`` makes the judge answer with a full
synthesis and cross-examination (several consensus points, tensions, challenges and rebuttals, from
``bench/filtering.py``'s generated debates) so that filtering has something to cut.
With ``tail=(share, slow_s, seed)`` the latency is heavy-tailed: in every block of 100 requests, exactly
``share`` × 100 of them (at seeded random places) take ``slow_s`` instead; every tier's model answers too.

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


def _rich_answers() -> dict[str, Any]:
    """Schema title -> a full judge artifact (synthesis, cross-examination) of a generated 3-agent debate, its
    agents named by the judge's labels."""
    from filtering import generate_debate

    from conclave.engine.extraction import request_schema

    debate = generate_debate(2026)
    text = json.dumps({"synthesis": debate["synthesis"], "cross_exam": debate["cross_exams"][0]})
    for name, label in zip(debate["agents"], ("Agent A", "Agent B", "Agent C"), strict=False):
        text = text.replace(f'"{name}"', f'"{label}"')
    artifacts = json.loads(text)
    return {request_schema(kind)["title"]: artifacts[kind] for kind in artifacts}


def _schema_in_prompt(request: Any) -> Any:
    """The schema the ``prompt`` structured-output form writes into the last user message, if any."""
    messages = (request.json or {}).get("messages") or []
    text = str(messages[-1].get("content") or "") if messages else ""
    start = text.rfind("```json\n")
    if start < 0:
        return None
    body = text[start + len("```json\n"):]
    return json.loads(body[: body.index("\n```")])


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


async def serve(latency: float, log: str | None = None, prompt_cache: bool = True, rich: bool = False,
                tail: tuple[float, float, int] | None = None) -> None:
    from conclave.providers.tiers import Tiers
    from conclave.testing.fake_server import FakeProviderServer, RecordedRequest, Reply
    from conclave.testing.prompt_cache import PromptCacheModel
    from conclave.testing.schema_instances import instance_for

    answers: dict[str, Any] = _rich_answers() if rich else {}
    latencies = _schedule(latency, tail)

    def answer(request: RecordedRequest) -> Reply:
        if log is not None:
            with open(log, "a") as f:
                f.write(f"{time.time()}\n")
        if not isinstance(request.schema, dict):
            request.schema = _schema_in_prompt(request)
        if not isinstance(request.schema, dict):  # no schema asked for (a cache warm-up)
            return Reply(text="OK", latency=latency)
        title = request.schema.get("title")
        if title in answers:
            return Reply(json=answers[title], latency=latency)
        key = json.dumps(request.schema, sort_keys=True)
        if key not in answers:
            answers[key] = instance_for(request.schema)
        return Reply(json=answers[key], latency=next(latencies))

    models = set(MODELS) | {model for tier in Tiers.load().tiers for _, model in tier.models}
    async with FakeProviderServer(prompt_cache=PromptCacheModel(enabled=prompt_cache)) as fake:
        for model in sorted(models):
            fake.script(model, answer)
        print(json.dumps(fake.overrides()), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes stdin


@contextmanager
def fake_server_process(latency: float, log: str | None = None, tail: tuple[float, float, int] | None = None, *,
                        prompt_cache: bool = True, rich: bool = False) -> Iterator[list[str]]:
    """A fake server process answering after ``latency`` s; yields the overrides that point conclave at it."""
    argv = [sys.executable, __file__, str(latency), log or "", *([] if prompt_cache else ["no-cache"]),
            *(["rich"] if rich else []), *([f"tail={tail[0]},{tail[1]},{tail[2]}"] if tail else [])]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        yield json.loads(child.stdout.readline())
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


if __name__ == "__main__":
    options = sys.argv[3:]
    tail_arg = next((o.removeprefix("tail=").split(",") for o in options if o.startswith("tail=")), None)
    asyncio.run(serve(float(sys.argv[1]), (sys.argv[2] or None) if len(sys.argv) > 2 else None,
                      prompt_cache="no-cache" not in options, rich="rich" in options,
                      tail=(float(tail_arg[0]), float(tail_arg[1]), int(tail_arg[2])) if tail_arg else None))
