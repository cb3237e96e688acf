"""What watching live costs: consultations with and without token streaming and a live viewer, and how fast a
streamed chunk reaches the viewer.

The fake provider server (its own process) answers every call after L seconds and streams its answers in
pieces; the viewer is another process reading the live view's event stream like a browser does. Reported:
median wall time of a 4-round consultation with streaming + one viewer ÷ without either (same process, same
settings), and the delay from the engine publishing a chunk (the event's timestamp) to the viewer receiving it
(p50, p95, max). One clock: everything runs on this machine.

    python bench/live.py [--latency 0.3] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fake_process import fake_server_process

QUESTION = "Should the billing service move to event sourcing?"
TOKEN = "bench-token"


async def _view(url: str, out: str) -> None:
    """A viewer: read the event stream, note when each chunk arrives."""
    import aiohttp

    seen = []
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        async for raw in response.content:
            line = raw.decode()
            if line.startswith("data: ") and '"agent:chunk"' in line:
                seen.append((time.time(), json.loads(line[6:])["ts"]))
            elif line.startswith("event: end"):
                break
    await asyncio.to_thread(Path(out).write_text, json.dumps(seen))


async def _consult(overrides: list[str], home: Path, watched: bool) -> tuple[float, list[float]]:
    from conclave.api import compose_settings
    from conclave.doors.web.app import make_app
    from conclave.doors.web.feeds import Feeds
    from conclave.doors.web.serving import start_site
    from conclave.engine.run import Consultation
    from conclave.store.paths import StoreLayout

    settings = compose_settings(QUESTION, [*overrides, "cost.auto_approve=true", "judge.model=gpt-4.1"])
    consultation = Consultation(settings, stream=watched)
    delays: list[float] = []
    if not watched:
        t0 = time.perf_counter()
        await consultation.run()
        return time.perf_counter() - t0, delays
    feeds = Feeds(StoreLayout(home))
    consultation.bus.subscribe(feeds.feed_for(consultation.id))
    runner, port = await start_site(make_app(home, TOKEN, feeds), "127.0.0.1", 0)
    out = str(home / "seen.json")
    viewer = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--view", f"http://127.0.0.1:{port}/c/{consultation.id}/events?token={TOKEN}", out)
    await asyncio.sleep(0.3)  # the viewer connects first, as someone watching from the start would
    t0 = time.perf_counter()
    await consultation.run()
    wall = time.perf_counter() - t0
    await viewer.wait()
    await runner.cleanup()
    seen = json.loads(await asyncio.to_thread(Path(out).read_text))
    delays = [received - sent for received, sent in seen]
    return wall, delays


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, default=0.3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--view", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.view:
        asyncio.run(_view(*args.view))
        return 0
    home = Path(tempfile.mkdtemp(prefix="conclave-live-bench-"))
    os.environ.update({"CONCLAVE_HOME": str(home), "OPENAI_API_KEY": "sk-bench", "ANTHROPIC_API_KEY": "sk-ant-bench",
                       "GEMINI_API_KEY": "bench"})
    with fake_server_process(args.latency) as overrides:

        async def run_all() -> tuple[list[float], list[float], list[float]]:
            await _consult(overrides, home, False)  # warm-up: imports, schemas, tokenizer
            plain, watched, delays = [], [], []
            for _ in range(args.runs):  # interleaved, so drift in the machine's load hits both alike
                plain.append((await _consult(overrides, home, False))[0])
                wall, seen = await _consult(overrides, home, True)
                watched.append(wall)
                delays += seen
            return plain, watched, delays

        plain, watched, delays = asyncio.run(run_all())
    delays.sort()
    p95 = delays[int(0.95 * (len(delays) - 1))] if delays else float("nan")
    print(f"live view cost, 3 agents + judge, 4 rounds, L = {args.latency} s, {args.runs} runs each")
    print(f"{'wall, no streaming, no viewer':<44}{statistics.median(plain):>8.3f} s")
    print(f"{'wall, streaming + one viewer (process)':<44}{statistics.median(watched):>8.3f} s")
    print(f"{'ratio (goal ≤ 1.02)':<44}{statistics.median(watched) / statistics.median(plain):>8.3f}")
    if delays:
        print(f"{'chunk → viewer, p50 / p95 / max (goal p95 ≤ 50 ms)':<44}{statistics.median(delays) * 1e3:>8.1f} /"
              f" {p95 * 1e3:.1f} / {delays[-1] * 1e3:.1f} ms over {len(delays)} chunks")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
