"""What a live viewer costs and how fast it hears: consultations on the fake provider server at fixed latency L,
with and without a browser-like client following them through ``conclave serve`` (its own process).

Measures (1) wall time with a viewer ÷ wall time without (goal ≤ 1.02) and (2) delivery latency, from the moment
the engine emitted a record (its ``ts``) to the viewer receiving it over SSE, for the records written right before a
journal flush (``round:completed``, ``consultation:completed``), p50 and p95 (goal p95 ≤ 50 ms on loopback). The
engine does not stream provider tokens yet, so this is record-to-viewer latency, not chunk-to-browser latency.

    python bench/live.py [--latency 0.2] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from e2e_overhead import QUESTION, fake_server_process

FLUSHED = ("round:completed", "consultation:completed")


def start_serve(home: Path) -> tuple[subprocess.Popen[str], str, str]:
    env = {**os.environ, "CONCLAVE_HOME": str(home)}
    process = subprocess.Popen([sys.executable, "-m", "conclave", "serve", "--port", "0", "--no-open"],
                               stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    for line in process.stderr:
        match = re.search(r"at (http://127\.0\.0\.1:\d+)/\?token=([\w-]+) ", line)
        if match:
            return process, match.group(1), match.group(2)
    raise SystemExit("conclave serve printed no URL")


def follow(base: str, token: str, journal_dir: Path, known: set[str], latencies: list[float]) -> None:
    """Wait for the next consultation's journal, then read its SSE stream to the end, timing flushed records."""
    while True:
        new = [p for p in journal_dir.glob("*.jsonl") if p.stem not in known] if journal_dir.is_dir() else []
        if new:
            break
        time.sleep(0.005)
    cid = new[0].stem
    known.add(cid)
    with urllib.request.urlopen(f"{base}/c/{cid}/events?token={token}", timeout=120) as stream:
        event = ""
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "record":
                record = json.loads(line[6:])
                if record["type"] in FLUSHED:
                    latencies.append(time.time() - float(record["ts"]))
            elif line.startswith("data: ") and event == "end":
                return


async def one_run(overrides: list[str], home: Path) -> float:
    from conclave.api import compose_settings
    from conclave.engine.runner import Consultation
    from conclave.store.recorder import Recorder

    settings = compose_settings(QUESTION, [*overrides, "cost.auto_approve=true", "judge.model=gpt-4.1"])
    recorder = Recorder(home)
    started = time.perf_counter()
    try:
        result = await Consultation(settings, recorder=recorder).run()
    finally:
        recorder.close()
    if result.status != "complete":
        raise SystemExit(f"a benchmark consultation ended {result.status}")
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="conclave-bench-live-"))
    os.environ["CONCLAVE_HOME"] = str(home)
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        os.environ.setdefault(var, "bench-key")
    os.environ.pop("OPENAI_BASE_URL", None)

    server, base, token = start_serve(home)
    known: set[str] = set()
    latencies: list[float] = []
    alone: list[float] = []
    watched: list[float] = []
    try:
        with fake_server_process(args.latency) as overrides:
            asyncio.run(one_run(overrides, home))  # warm-up: imports, tokenizer, schemas
            known.update(p.stem for p in (home / "journal").glob("*.jsonl"))
            for _ in range(args.runs):  # interleaved, so drift in machine load hits both alike
                alone.append(asyncio.run(one_run(overrides, home)))
                known.update(p.stem for p in (home / "journal").glob("*.jsonl"))
                viewer = threading.Thread(target=follow, args=(base, token, home / "journal", known, latencies))
                viewer.start()
                watched.append(asyncio.run(one_run(overrides, home)))
                viewer.join(timeout=60)
    finally:
        server.terminate()
        server.wait(timeout=20)

    a, w = statistics.median(alone), statistics.median(watched)
    ms = sorted(1000 * x for x in latencies)
    p95 = ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))] if ms else float("nan")
    print(f"{'L (s)':>6} {'runs':>4} {'alone (s)':>10} {'watched (s)':>12} {'ratio':>6} {'goal':>6}")
    print(f"{args.latency:6.2f} {args.runs:4d} {a:10.3f} {w:12.3f} {w / a:6.3f} {'≤1.02':>6}")
    print(f"\nrecord → viewer latency over {len(ms)} flushed records: p50 {statistics.median(ms):.1f} ms, "
          f"p95 {p95:.1f} ms, max {ms[-1]:.1f} ms (goal p95 ≤ 50 ms)" if ms else "no records received")


if __name__ == "__main__":
    main()
