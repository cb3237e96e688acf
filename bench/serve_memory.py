"""Benchmark: ``conclave serve`` stays small and fair however long it runs.

``conclave serve`` runs as its own process against the fake provider server (another process). Two figures:

1. Memory: N consultations (default 1,000) are started through the page's form, a few at a time, and each one is
   watched to its end over its event stream, as a browser would. The server's resident memory (VmRSS of
   /proc/PID/status) is sampled after a warm-up and every 100 consultations. Goal: ≤ +20 MiB in all after 1,000.
2. Fairness: one full consultation (``--viewer-rounds``, default 4; the judge's artifacts full-sized, answers
   after ``--slow-latency`` s) watched by V viewers (default 50) from the start. Each viewer notes when the end
   of the stream reaches it; the lag is the last viewer's time minus the first's. Goal: ≤ 0.5 s. Also the
   server's CPU time (utime + stime of /proc/PID/stat) per extra viewer: the same consultation watched by V
   viewers minus watched by one, ÷ (V − 1). The viewers connect from several loopback addresses (127.0.0.2, …),
   ten per address, as people on different machines would: one address may hold at most 16 streams.

    python bench/serve_memory.py [--consultations 1000] [--viewers 50] [--rounds 2] [--parallel 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp
from fake_process import fake_server_process

from conclave.cli.commands.browse import free_port, wait_until_up
from conclave.doors.web.app import csrf_token

TOKEN = "bench-token"
QUESTION = "Should the billing service move to event sourcing?"
RSS_GOAL_MIB, LAG_GOAL_S = 20.0, 0.5
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def cpu_s(pid: int) -> float:
    """The CPU time process ``pid`` has used so far (user + system), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


@contextmanager
def serve_process(home: Path, overrides: list[str], *options: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``conclave serve`` in a process of its own; yields it and its base URL."""
    port = free_port()
    env = {**os.environ, "CONCLAVE_HOME": str(home), "CONCLAVE_WEB_TOKEN": TOKEN}
    server = subprocess.Popen([sys.executable, "-m", "conclave", "serve", "--port", str(port), *options,
                               *overrides, "cost.auto_approve=true", "judge.model=gpt-4.1"],
                              env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_up(f"{base}/?token={TOKEN}", server)
        yield server, base
    finally:
        server.terminate()
        server.wait(timeout=60)


async def start(session: aiohttp.ClientSession, base: str, rounds: int) -> str:
    """Start a consultation through the form; its id."""
    while True:
        async with session.post(f"{base}/consult", allow_redirects=False, headers=AUTH,
                                data={"question": QUESTION, "rounds": str(rounds), "csrf": csrf_token(TOKEN)}
                                ) as response:
            if response.status == 429:  # the page's rate limit: wait as told
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            if response.status != 303:
                raise RuntimeError(f"the form answered {response.status}: {(await response.text())[:300]}")
            return response.headers["Location"].removeprefix("/c/")


async def watch(session: aiohttp.ClientSession, base: str, cid: str) -> float:
    """Read the consultation's event stream to its end; when the end arrived (time.monotonic)."""
    while True:
        async with session.get(f"{base}/c/{cid}/events", headers=AUTH) as response:
            if response.status == 429:
                await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            tail = b""
            async for piece in response.content.iter_any():
                tail = (tail + piece)[-64:]
                if b"event: end\n" in tail:
                    return time.monotonic()
            raise RuntimeError(f"the stream of {cid} closed before its end")


async def memory(base: str, pid: int, n: int, rounds: int, parallel: int, warmup: int
                 ) -> tuple[float, float, list[tuple[int, float]], float, float]:
    """Run ``n`` consultations (``parallel`` at a time), each watched to its end; RSS before any, after the
    warm-up, samples every 100, at the end, and the wall time."""
    idle = rss_mib(pid)
    samples: list[tuple[int, float]] = []
    done = 0
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(n):
        queue.put_nowait(i)
    warm = [0.0]

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while not queue.empty():
            queue.get_nowait()
            await watch(session, base, await start(session, base, rounds))
            done += 1
            if done == warmup:
                warm[0] = rss_mib(pid)
            if done % 100 == 0:
                samples.append((done, rss_mib(pid)))
                print(f"  {done:>5} consultations: RSS {samples[-1][1]:.1f} MiB", file=sys.stderr, flush=True)

    began = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session) for _ in range(parallel)))
    return idle, warm[0], samples, rss_mib(pid), time.perf_counter() - began


async def fairness(base: str, viewers: int, rounds: int) -> list[float]:
    """One consultation watched by ``viewers`` from its start: when the end reached each (seconds after the
    first)."""
    sessions = [aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(f"127.0.0.{2 + i // 10}", 0)))
                for i in range(viewers)]
    try:
        cid = await start(sessions[0], base, rounds)
        ends = await asyncio.gather(*(watch(session, base, cid) for session in sessions))
    finally:
        await asyncio.gather(*(session.close() for session in sessions))
    first = min(ends)
    return sorted(end - first for end in ends)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--consultations", type=int, default=1000)
    parser.add_argument("--viewers", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every consultation (default 2)")
    parser.add_argument("--parallel", type=int, default=4, help="consultations running at once (default 4)")
    parser.add_argument("--latency", type=float, default=0.0, help="the fake's latency for the memory run")
    parser.add_argument("--slow-latency", type=float, default=0.5, help="the fake's latency for the viewers' run")
    parser.add_argument("--viewer-rounds", type=int, default=4, help="rounds of the watched consultation")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--serve-option", action="append", default=[], help="passed to conclave serve")
    args = parser.parse_args()
    os.environ.update({"OPENAI_API_KEY": "sk-bench", "ANTHROPIC_API_KEY": "sk-ant-bench", "GEMINI_API_KEY": "bench"})
    print(f"conclave serve, its own process; fake provider; rounds={args.rounds}")
    if args.consultations:
        with tempfile.TemporaryDirectory() as tmp, fake_server_process(args.latency) as overrides, \
                serve_process(Path(tmp), overrides, *args.serve_option) as (server, base):
            idle, warm, samples, last, wall = asyncio.run(memory(base, server.pid, args.consultations, args.rounds,
                                                           args.parallel, args.warmup))
        growth = last - warm
        print(f"{'RSS idle / after warm-up (' + str(args.warmup) + ')':<44}{idle:>8.1f} / {warm:.1f} MiB")
        for done, mib in samples:
            print(f"{'RSS after ' + format(done, ',') + ' consultations':<44}{mib:>8.1f} MiB")
        print(f"{'growth after warm-up (goal ≤ +' + format(RSS_GOAL_MIB, 'g') + ' MiB)':<44}{growth:>+8.1f} MiB"
              f"  {'met' if growth <= RSS_GOAL_MIB else 'missed'}  ({growth * 1024 / args.consultations:.1f} KiB"
              f" per consultation; {args.consultations / wall:.1f} consultations/s)")
    if args.viewers:
        with tempfile.TemporaryDirectory() as tmp, fake_server_process(args.slow_latency, rich=True) as overrides, \
                serve_process(Path(tmp), overrides, *args.serve_option) as (server, base):
            asyncio.run(fairness(base, 1, args.viewer_rounds))  # warm-up
            cpu = [cpu_s(server.pid)]
            asyncio.run(fairness(base, 1, args.viewer_rounds))
            cpu.append(cpu_s(server.pid))
            lags = asyncio.run(fairness(base, args.viewers, args.viewer_rounds))
            cpu.append(cpu_s(server.pid))
        per_viewer = ((cpu[2] - cpu[1]) - (cpu[1] - cpu[0])) / max(1, args.viewers - 1)
        print(f"{'serve CPU, 1 viewer / ' + str(args.viewers) + ' viewers':<44}{cpu[1] - cpu[0]:>8.2f} /"
              f" {cpu[2] - cpu[1]:.2f} s: {per_viewer * 1e3:.1f} ms per extra viewer")
        label = f"{args.viewers} viewers: end lag median / last (goal ≤ {LAG_GOAL_S:g} s)"
        print(f"{label:<44}"
              f"  {statistics.median(lags):.3f} / {lags[-1]:.3f} s  {'met' if lags[-1] <= LAG_GOAL_S else 'missed'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
