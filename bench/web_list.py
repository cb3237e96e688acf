"""Benchmark: the live view's list page at 1k/10k consultations, as a user opens it.

A home is filled with N recorded consultations (the synthetic event streams the store tests use, journaled and
indexed by conclave's own recorder), then ``conclave serve`` runs as its own process and the list page is fetched
over HTTP. Reported per size: median and max of the page's response time over the fetches, the page's size, and
whether it meets the goal (≤ 0.2 s at 1,000 journals, served from the index). Times are this machine's, measured in
one run.

    python bench/web_list.py [--sizes 1000,10000] [--fetches 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from conclave.cli.commands.browse import free_port, wait_until_up
from conclave.store.recorder import Recorder
from conclave.testing.synthetic_events import synthetic_events

TOKEN = "bench-token"
GOAL_S = 0.2


def fill(home: Path, n: int) -> None:
    recorder = Recorder(home)
    for i in range(n):
        for event in synthetic_events(i):
            recorder(event)
    recorder.close()


def measure(home: Path, fetches: int) -> tuple[list[float], int]:
    port = free_port()
    env = {**os.environ, "CONCLAVE_HOME": str(home), "CONCLAVE_WEB_TOKEN": TOKEN}
    server = subprocess.Popen([sys.executable, "-m", "conclave", "serve", "--port", str(port)], env=env, cwd=home,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/?token={TOKEN}"
        wait_until_up(url, server)
        times, size = [], 0
        for _ in range(fetches):
            began = time.perf_counter()
            with urllib.request.urlopen(url, timeout=60) as response:
                size = len(response.read())
            times.append(time.perf_counter() - began)
        return times, size
    finally:
        server.terminate()
        server.wait(timeout=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000")
    parser.add_argument("--fetches", type=int, default=20)
    args = parser.parse_args()
    print(f"{'consultations':>13} {'median s':>9} {'max s':>7} {'page KB':>8}  goal ≤ {GOAL_S} s at 1,000")
    for n in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            home = Path(tmp)
            fill(home, n)
            times, size = measure(home, args.fetches)
        median = statistics.median(times)
        verdict = ("met" if median <= GOAL_S else "missed") if n == 1000 else ""
        print(f"{n:>13,} {median:>9.3f} {max(times):>7.3f} {size / 1024:>8.1f}  {verdict}")


if __name__ == "__main__":
    main()
