"""Where a consultation's time goes beyond its critical path: the gaps around and between its rounds.

Separate `conclave` CLI processes (3 agents + judge, ``rounds=4``) against the fake provider in its own process,
every call answered after exactly L seconds; the fake logs when each request arrives, so each answer leaves it at
arrival + L. Per run, the consultation (the result's own clock: ``created_at`` … ``duration_s``) is cut into its
5 sequential calls (round 1's three at once, the synthesis, round 3's three replies, the cross-examination, the
verdict) and the gaps between them: consultation start → round 1's first request; each step's last answer → the
next step's first request; the verdict's answer → the result. Printed: the median of each gap (ms) and of the
consultation ÷ critical path (5L), and each gap's share of the overhead (consultation − 5L).

    python bench/round_gaps.py [--latency 0.3] [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

from fake_process import fake_server_process

QUESTION = "Should the billing service move to event sourcing?"
#: how many requests each sequential step sends (rounds=4, 3 agents): what the gaps are cut between
STEPS = (3, 1, 3, 1, 1)
GAPS = ("start → round 1", "round 1 → synthesis", "synthesis → round 3", "round 3 replies → judge",
        "cross-exam → verdict", "verdict → result")


def _run_once(overrides: list[str], log: Path, home: str, latency: float) -> dict[str, float]:
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update({"CONCLAVE_HOME": home, "OPENAI_API_KEY": "sk-bench", "ANTHROPIC_API_KEY": "sk-ant-bench",
                "GEMINI_API_KEY": "bench"})
    done = subprocess.run([sys.executable, "-m", "conclave", QUESTION, *overrides, "cost.auto_approve=true",
                           "judge.model=gpt-4.1", "output.format=json", "rounds=4"],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"conclave failed: {done.stderr[-2000:]}")
    arrivals = sorted(float(line) for line in log.read_text().split())
    if len(arrivals) != sum(STEPS):
        raise SystemExit(f"expected {sum(STEPS)} provider requests, the fake server saw {len(arrivals)}")
    result = json.loads(done.stdout)
    start = datetime.fromisoformat(result["created_at"].replace("Z", "+00:00")).timestamp()
    end = start + float(result["duration_s"])
    firsts, lasts, at = [], [], 0
    for size in STEPS:
        firsts.append(arrivals[at])
        lasts.append(arrivals[at + size - 1])
        at += size
    edges = [start, *[x for pair in zip(firsts, [last + latency for last in lasts], strict=True) for x in pair], end]
    gaps = {name: (edges[2 * i + 1] - edges[2 * i]) * 1000 for i, name in enumerate(GAPS)}
    return {**gaps, "consultation_s": float(result["duration_s"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.3])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    print("the gaps around a consultation's critical path: separate CLI processes, 3 agents + judge, 4 rounds, "
          "fixed latency L")
    print(f"load (1 min) at the start: {os.getloadavg()[0]:.2f}")
    for latency in args.latency:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "arrivals.log"
            with fake_server_process(latency, str(log)) as overrides:
                _run_once(overrides, log, tmp, latency)  # composes with Hydra once; the runs below do not
                runs = [_run_once(overrides, log, tmp, latency) for _ in range(args.runs)]
        critical = 5 * latency
        consultation = statistics.median(r["consultation_s"] for r in runs)
        overhead_ms = (consultation - critical) * 1000
        print(f"\nL = {latency:g} s: consultation ÷ critical path {consultation / critical:.3f} "
              f"(median of {len(runs)}; overhead {overhead_ms:.0f} ms)")
        print(f"  {'gap':<26} {'median ms':>10} {'min ms':>8} {'share':>7}")
        for name in GAPS:
            values = [r[name] for r in runs]
            median = statistics.median(values)
            share = median / overhead_ms if overhead_ms > 0 else float("nan")
            print(f"  {name:<26} {median:>10.1f} {min(values):>8.1f} {share:>7.0%}")
    print(f"load (1 min) at the end: {os.getloadavg()[0]:.2f}")
    print("goal: consultation ÷ critical path ≤ 1.05 at L = 0.3 s (the gaps sum to at most 75 ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
