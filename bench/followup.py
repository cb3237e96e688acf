"""Benchmark: the input a follow-up question is billed, against the same question asked fresh.

Per pair, in a fresh home: a parent consultation (``python -m conclave "Q1"``), then ``conclave ask "Q2"`` (a
follow-up: its panel sees the parent's verdict, dissent and claims), then ``conclave "Q2"`` asked fresh in another
home with the same panel and rounds. Every run is a separate CLI process against the fake provider server in its own
process (``rich``: the judge's synthesis and cross-examination are full, so the parent has a real debate state).
Billed input tokens are the result's ``tokens.input`` (every provider attempt, retries and hedges included).
Prints each pair's ratio follow-up ÷ fresh and the median; the goal is ≤ 1.3.

    python bench/followup.py [--pairs 3] [--latency 0.05] [--rounds 4|default]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from fake_process import fake_server_process

PARENT = "Should the billing service move to event sourcing?"
FOLLOW_UP = "And what would the migration cost us in the first year, team time included?"
GOAL = 1.3


def conclave(home: str, overrides: list[str], *args: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and not k.startswith("CONCLAVE_")}
    env.update({"CONCLAVE_HOME": home, "CONCLAVE_PROGRESS": "0", "OPENAI_API_KEY": "sk-bench",
                "ANTHROPIC_API_KEY": "sk-ant-bench", "GEMINI_API_KEY": "bench"})
    proc = subprocess.run([sys.executable, "-m", "conclave", *args, *overrides, "hedging.enabled=false",
                           "cost.auto_approve=true", "output.format=json"],
                          capture_output=True, text=True, env=env, cwd=home)
    if proc.returncode != 0:
        raise SystemExit(f"conclave {' '.join(args[:2])} failed: {proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--rounds", default="4", help="4 (default) or 'default' (the full debate)")
    args = parser.parse_args()
    rounds = [] if args.rounds == "default" else [f"rounds={args.rounds}"]
    ratios = []
    print(f"{'pair':>4} {'parent in':>10} {'follow-up in':>13} {'fresh in':>9} {'ratio':>6}  block")
    with fake_server_process(args.latency, rich=True) as fake:
        overrides = [*fake, *rounds]
        for pair in range(1, args.pairs + 1):
            with tempfile.TemporaryDirectory() as home, tempfile.TemporaryDirectory() as fresh_home:
                parent = conclave(home, overrides, PARENT)
                follow_up = conclave(home, overrides, "ask", FOLLOW_UP)
                assert follow_up["parent"] == parent["consultation_id"]
                fresh = conclave(fresh_home, overrides, FOLLOW_UP)
            claims = len(((parent.get("quality") or {}).get("state") or {}).get("claims") or [])
            ratio = follow_up["tokens"]["input"] / fresh["tokens"]["input"]
            ratios.append(ratio)
            print(f"{pair:>4} {parent['tokens']['input']:>10,} {follow_up['tokens']['input']:>13,} "
                  f"{fresh['tokens']['input']:>9,} {ratio:>6.3f}  {claims} claims, "
                  f"{len(parent.get('dissent') or [])} dissent")
    median = statistics.median(ratios)
    print(f"median follow-up ÷ fresh billed input tokens: {median:.3f} (goal ≤ {GOAL}: "
          f"{'met' if median <= GOAL else 'MISS'})")


if __name__ == "__main__":
    main()
