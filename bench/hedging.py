"""Hedged requests against a heavy-tailed primary: tail latency and extra requests, hedging off vs on.

Two modes. ``--cli`` (what users run): 100 separate ``python -m conclave`` processes per setting, each setting on
its own fresh home and against its own fake server process, where every model answers in 300 ms × scale except
exactly 5% of requests (per block of 100, at seeded places), which take 3 s × scale (the hedge floor is scaled
alike; scale 0.5 by default so the 300 consultations take ~10 minutes); the settings' consultations are
interleaved. Reported: p50/p90/p99 of the process wall and of the consultation's own duration (p99 by nearest
rank, with the number of consultations it rests on), extra provider calls (hedges ÷ calls), hedges won, answers
that waited for a slow primary (load-independent: how many slow calls hedging left on the critical path) and the
statuses, for hedging off, on with same-model backups (``strict_models=true``) and on with the defaults (tier
backups: a win is a substitution, so ``completed_degraded``).
Run: ``python bench/hedging.py --cli [--consultations 100] [--scale 0.5]``.

The in-process mode drives many calls through one long-lived pool. The primary answers 95% of calls in 200 ms and
exactly 5% (randomly placed) in 5 s; a healthy backup answers in 200 ms. Hedges may use 5% of calls (the default
budget), so every hedge must land on a slow call. All latencies and the hedge floor are divided by SCALE so the
1,000 calls finish in seconds; the table shows unscaled figures.
Run: ``python bench/hedging.py [--calls 1000] [--concurrency 20] [--seed 7]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from conclave.plugin_manager import load_plugins
from conclave.providers.base import CompletionRequest, Message
from conclave.providers.pool import ProviderPool
from conclave.providers.retry import RetryPolicy
from conclave.providers.tiers import Tier, Tiers
from conclave.testing.fake_server import FakeProviderServer, Reply

SCALE = 10.0
FAST_S, SLOW_S, SLOW_SHARE = 0.200, 5.0, 0.05
PRIMARY = ("openai", "primary-model")
BACKUP = ("anthropic", "backup-model")


def primary_latencies(calls: int, seed: int) -> list[float]:
    """Exactly 5% slow calls in a random order (the same order in every scenario), scaled down."""
    slow = round(calls * SLOW_SHARE)
    latencies = [SLOW_S / SCALE] * slow + [FAST_S / SCALE] * (calls - slow)
    random.Random(seed).shuffle(latencies)
    return latencies


async def run(hedging: dict[str, Any], calls: int, concurrency: int, seed: int) -> dict[str, float]:
    """``calls`` calls through one pool (one consultation's budget); latencies in unscaled seconds."""
    async with FakeProviderServer(seed=seed) as fake:
        queue = iter(primary_latencies(calls, seed))
        fake.script(PRIMARY[1], Reply(text="primary", latency=lambda _rng: next(queue)))
        fake.script(BACKUP[1], Reply(text="backup", latency=FAST_S / SCALE))
        settings = fake.settings(hedging=hedging)
        tiers = Tiers([Tier("bench", (PRIMARY, BACKUP))])
        request = CompletionRequest(model=PRIMARY[1], messages=(Message("user", "q"),))
        latencies: list[float] = []
        gate = asyncio.Semaphore(concurrency)
        unhedged_slow = 0
        async with ProviderPool(settings, load_plugins(), tiers=tiers, retry_policy=RetryPolicy()) as pool:

            async def one() -> None:
                nonlocal unhedged_slow
                async with gate:
                    started = time.perf_counter()
                    completion = await pool.complete(agent="a", provider=PRIMARY[0], request=request,
                                                     round_number=1)
                    latencies.append((time.perf_counter() - started) * SCALE)
                    primary = completion.attempts[-1] if not any(a.hedge for a in completion.attempts) else None
                    if primary is not None and primary.latency_s * SCALE >= SLOW_S:
                        unhedged_slow += 1

            await asyncio.gather(*(one() for _ in range(calls)))
            hedges = pool.budget.used
        ordered = sorted(latencies)
        return {
            "p50": statistics.median(ordered),
            "p95": ordered[int(0.95 * len(ordered)) - 1],
            "p99": ordered[int(0.99 * len(ordered)) - 1],
            "max": ordered[-1],
            "extra": (len(fake.requests) - calls) / calls,
            "hedges": hedges,
            "unhedged_slow": unhedged_slow,
        }


# ------------------------------------------------------------------------------------------- CLI mode

CLI_FAST_S, CLI_SLOW_S, CLI_FLOOR_S = 0.3, 3.0, 0.5
QUESTION = "Should the billing service move to event sourcing?"
CLI_SCENARIOS: list[tuple[str, list[str]]] = [
    ("off", ["hedging.enabled=false"]),
    ("on, same-model backups", ["strict_models=true"]),
    ("on, defaults (tier backups)", []),
]


def _nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _journal_attempts(home: Path, consultation_id: str) -> list[dict[str, Any]]:
    attempts = []
    for line in (home / "journal" / f"{consultation_id}.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "provider:attempt":
            attempts.append(record["data"])
    return attempts


def _one_cli_run(home: Path, fake: list[str], overrides: list[str], slow_s: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update({"CONCLAVE_HOME": str(home), "OPENAI_API_KEY": "sk-bench", "ANTHROPIC_API_KEY": "sk-ant-bench",
                "GEMINI_API_KEY": "bench"})
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "conclave", QUESTION, *fake, *overrides, "rounds=4",
                           "cost.auto_approve=true", "output.format=json", "output.progress=quiet"],
                          capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"conclave failed: {proc.stderr[-2000:]}")
    result = json.loads(proc.stdout)
    attempts = _journal_attempts(home, result["consultation_id"])
    return {"wall": wall, "duration": float(result["duration_s"]), "status": result["status"],
            "calls": sum(1 for a in attempts if not a["hedge"] and a["number"] == 1),
            "hedges": sum(1 for a in attempts if a["hedge"] and a["number"] == 1),
            "hedges_won": sum(1 for a in attempts if a["hedge"] and a["outcome"] == "ok"),
            # answers that waited for a slow primary: what hedging is there to prevent
            "slow_unhedged": sum(1 for a in attempts if not a["hedge"] and a["outcome"] == "ok"
                                 and a["latency_s"] >= 0.9 * slow_s)}


def _summary(runs: list[dict[str, Any]], requests: int) -> dict[str, Any]:
    calls = sum(r["calls"] for r in runs)
    statuses: dict[str, int] = {}
    for r in runs:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    walls, durations = [r["wall"] for r in runs], [r["duration"] for r in runs]
    return {
        **{f"wall_{q}": _nearest_rank(walls, p) for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        **{f"dur_{q}": _nearest_rank(durations, p) for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
        "calls": calls, "requests": requests, "hedges": sum(r["hedges"] for r in runs),
        "hedges_won": sum(r["hedges_won"] for r in runs), "statuses": statuses,
        "slow_unhedged": sum(r["slow_unhedged"] for r in runs),
        "runs_slow_unhedged": sum(1 for r in runs if r["slow_unhedged"]),
        "first_hedge": next((i + 1 for i, r in enumerate(runs) if r["hedges"]), None),
    }


def cli_main(consultations: int, seed: int, scale: float) -> int:
    """Every scenario on its own fresh home and its own fake server process (same seeded tail), the
    consultations interleaved (off, same-model, defaults, off, …) so that load changes hit all three alike."""
    sys.path.insert(0, str(Path(__file__).parent))
    from fake_process import fake_server_process

    fast, slow, floor = CLI_FAST_S * scale, CLI_SLOW_S * scale, CLI_FLOOR_S * scale
    rank = max(1, math.ceil(0.99 * consultations))
    print(f"hedging, CLI mode: {consultations} separate `python -m conclave` processes per scenario, interleaved, "
          f"each scenario on one fresh home; 3 agents + judge, 4 rounds; every model {fast * 1000:.0f} ms, exactly "
          f"{SLOW_SHARE:.0%} of requests {slow:g} s (latencies and hedging.floor_s = {floor:g} s are the 0.3 s / "
          f"3 s / 0.5 s case × {scale:g}). p99 is the nearest rank: the {rank}th of {consultations} "
          f"({consultations - rank + 1} largest), so it rests on the {consultations - rank + 1} worst "
          f"consultation(s).  load: {os.getloadavg()[0]:.2f}\n", flush=True)
    stack = contextlib.ExitStack()
    homes, servers = [], []
    with stack:
        for _ in CLI_SCENARIOS:
            home = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            homes.append(home)
            servers.append(stack.enter_context(
                fake_server_process(fast, str(home / "arrivals.log"), (SLOW_SHARE, slow, seed))))
        runs: list[list[dict[str, Any]]] = [[] for _ in CLI_SCENARIOS]
        for n in range(consultations):
            for i, (_, overrides) in enumerate(CLI_SCENARIOS):
                runs[i].append(_one_cli_run(homes[i], servers[i], [*overrides, f"hedging.floor_s={floor}"],
                                            slow))
            if (n + 1) % 10 == 0:
                print(f"  {n + 1}/{consultations} consultations per scenario, load {os.getloadavg()[0]:.2f}",
                      file=sys.stderr, flush=True)
        requests = [len((home / "arrivals.log").read_text().split()) for home in homes]
    results = {name: _summary(runs[i], requests[i]) for i, (name, _) in enumerate(CLI_SCENARIOS)}
    header = (f"{'hedging':<30}{'wall p50':>9}{'p90':>7}{'p99':>7}{'consult p50':>12}{'p90':>7}{'p99':>7}"
              f"{'extra':>7}{'hedges':>7}{'won':>5}{'slow waited':>12}  statuses")
    print(header)
    print("-" * len(header))
    for name, r in results.items():
        extra = r["hedges"] / r["calls"] if r["calls"] else 0.0
        print(f"{name:<30}{r['wall_p50']:>8.2f}s{r['wall_p90']:>6.2f}s{r['wall_p99']:>6.2f}s"
              f"{r['dur_p50']:>11.2f}s{r['dur_p90']:>6.2f}s{r['dur_p99']:>6.2f}s{extra:>7.1%}{r['hedges']:>7}"
              f"{r['hedges_won']:>5}{r['slow_unhedged']:>5} in {r['runs_slow_unhedged']:>2}  "
              f"{', '.join(f'{k} {v}' for k, v in sorted(r['statuses'].items()))}")
    off = results["off"]
    print()
    for name, r in list(results.items())[1:]:
        print(f"{name}: consultation p90 {r['dur_p90'] / off['dur_p90'] - 1:+.0%}, p99 "
              f"{r['dur_p99'] / off['dur_p99'] - 1:+.0%}; process wall p90 {r['wall_p90'] / off['wall_p90'] - 1:+.0%}, "
              f"p99 {r['wall_p99'] / off['wall_p99'] - 1:+.0%}; extra calls {r['hedges'] / r['calls']:.1%} "
              f"({r['hedges']} hedges / {r['calls']} calls; {r['requests']} requests vs {off['requests']} off); "
              f"first hedge in consultation {r['first_hedge']}")
    print(f"slow waited: answers that waited for a slow primary (in how many consultations); with an exactly "
          f"{SLOW_SHARE:.0%} tail, hedging every slow call costs ~{SLOW_SHARE:.0%} extra calls.  "
          f"load at the end: {os.getloadavg()[0]:.2f}")
    print("goals: consultation p90 and p99 −40% or better vs off, ≤ 5% extra calls; a same-model hedge win leaves "
          "the consultation complete")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--cli", action="store_true", help="separate CLI processes instead of one pool")
    parser.add_argument("--consultations", type=int, default=100)
    parser.add_argument("--scale", type=float, default=0.5,
                        help="CLI mode: latencies and the hedge floor × this (0.3 s / 3 s / 0.5 s at 1)")
    args = parser.parse_args()
    if args.cli:
        return cli_main(args.consultations, args.seed, args.scale)
    os.environ.setdefault("CONCLAVE_PLUGINS", "openai,anthropic,gemini")
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        os.environ.setdefault(var, "bench-key")
    scenarios: list[tuple[str, dict[str, Any]]] = [
        ("off", {"enabled": False}),
        ("on: floor 2 s", {"enabled": True, "floor_s": 2.0 / SCALE, "budget": 0.05}),
        ("on: floor 0.5 s (defaults)", {"enabled": True, "floor_s": 0.5 / SCALE, "budget": 0.05}),
    ]
    print(f"hedging benchmark: {args.calls} calls, {args.concurrency} in flight; primary 95% {FAST_S * 1000:.0f} ms / "
          f"5% {SLOW_S:.0f} s, backup {FAST_S * 1000:.0f} ms, budget 5%")
    print(f"(latencies run divided by {SCALE:g}; figures below are scaled back up)\n")
    header = f"{'hedging':<32}{'p50':>9}{'p95':>9}{'p99':>9}{'max':>9}{'extra req':>11}{'slow unhedged':>15}"
    print(header)
    print("-" * len(header))
    results = {}
    for name, hedging in scenarios:
        r = asyncio.run(run(hedging, args.calls, args.concurrency, args.seed))
        results[name] = r
        print(f"{name:<32}{r['p50']:>8.2f}s{r['p95']:>8.2f}s{r['p99']:>8.2f}s{r['max']:>8.2f}s{r['extra']:>10.1%}"
              f"{r['unhedged_slow']:>15}")
    base = results["off"]["p99"]
    print()
    for name, r in list(results.items())[1:]:
        print(f"{name}: p99 {1 - r['p99'] / base:.0%} lower than off, {r['extra']:.1%} extra requests "
              f"(goal: ≥50% lower with ≤5% extra)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
