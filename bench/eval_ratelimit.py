"""An unattended `conclave eval` sweep against a rate-limited provider (the fake server answering 429 with
Retry-After from a token bucket, as a hosted API limits a key, and reporting the bucket's state in OpenAI's
x-ratelimit-* headers on every answer), run as users run it: one `conclave eval -m` process, its points in parallel
joblib workers sharing one CONCLAVE_HOME.

Prints: whether the sweep finished on its own (exit 0, every item of every point complete), calls answered (paid),
429s and retries as a share of the calls, the fewest requests the bucket had left (the limit binds when it runs
low), requests paid twice (an identical request answered more than once), and the wall time. Goals: completes;
retries ≤ 10% of calls; nothing paid twice.

    python bench/eval_ratelimit.py [--items 1000] [--points 3] [--per-second 40] [--burst 20] [--latency 0.05]
    python bench/eval_ratelimit.py --items 20 --json      # the test's smaller version; the figures as JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer
from conclave.testing.rate_limit import RateLimit

PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o",
         "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]
NAMES = ("Security Expert", "Systems Architect", "Pragmatic Engineer")
# only the panel's provider has a key: no backup provider (the fake does not script one) takes its calls
KEYS = {"OPENAI_API_KEY": "sk-bench-0000"}


async def sweep(items: int, points: int, per_second: float, burst: int, latency: float,
                extra: list[str]) -> dict[str, Any]:
    """Run the sweep and measure it (see the module docstring)."""
    limit = RateLimit(per_second, burst)
    async with FakeProviderServer() as fake:
        AnswerPanel({name: 0.7 for name in NAMES}, latency=latency).install(fake, gate=limit)
        with tempfile.TemporaryDirectory() as home:
            env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_") and not k.endswith("_API_KEY")}
            env.update(KEYS, CONCLAVE_HOME=home, CONCLAVE_PROGRESS="0", CONCLAVE_SWEEP_DIR=f"{home}/multirun")
            seeds = ",".join(str(s) for s in range(1, points + 1))
            args = ["eval", "-m", "arithmetic", f"eval.n={items}", f"eval.seed={seeds}", "rounds=2",
                    "cost.auto_approve=true", "hydra/launcher=joblib", f"hydra.launcher.n_jobs={points}", *PANEL,
                    *fake.overrides(), *extra]
            started = time.perf_counter()
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "conclave", *args, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, env=env, cwd=home)
            _, err = await process.communicate()
            wall = time.perf_counter() - started
            db = sqlite3.connect(Path(home) / "index.db")
            statuses = dict(db.execute("select status, count(*) from eval_items group by status").fetchall())
            complete = statuses.get("complete", 0)
            runs = db.execute("select count(*) from eval_runs where status = 'complete'").fetchone()[0]
            hedges = hedges_sent(db)
            db.close()
    paid = limit.paid
    by_hedge, other = classify_repeats(limit.repeats(), hedges)
    return {
        "exit_code": process.returncode, "items": items * points, "items_complete": complete,
        "item_statuses": statuses, "points_complete": runs, "points": points, "calls_paid": paid,
        "rate_limited_429": limit.limited, "lowest_remaining": limit.lowest,
        "retry_share": round(limit.limited / paid, 4) if paid else None, "paid_twice": limit.paid_twice,
        "hedges_sent": len(hedges), "paid_twice_by_hedges": by_hedge, "paid_twice_other": other,
        "wall_s": round(wall, 1), "per_second": per_second, "burst": burst, "latency_s": latency,
        "stderr_tail": err.decode()[-3000:],
    }


def hedges_sent(db: sqlite3.Connection) -> list[tuple[float, str]]:
    """(time sent, model) of every hedge attempt that reached the provider on the same model as its primary
    (answered, or cancelled once the primary won: both are billed), from the index's calls table."""
    rows = db.execute(
        "select h.started_at, h.model from calls h where h.hedge = 1 and h.outcome in ('ok', 'cancelled') "
        "and exists (select 1 from calls p where p.consultation_id = h.consultation_id "
        "and p.round_number = h.round_number and p.agent = h.agent and p.hedge = 0 and p.model = h.model)")
    return [(datetime.fromisoformat(at).timestamp(), model) for at, model in rows]


def classify_repeats(repeats: list[list[tuple[float, str]]], hedges: list[tuple[float, str]],
                     window_s: float = 2.0) -> tuple[int, int]:
    """(repeated answers a same-model hedge explains, the rest). A same-model hedge sends the primary's request
    again on purpose, and both are billed; anything else is a true duplicate. Hedges and repeats are paired by
    model, the closest first: a hedge sent at most ``window_s`` before one of the body's answers explains one of
    its repeats (each hedge explains one)."""
    pairs = sorted((at - sent, r, h) for r, answers in enumerate(repeats) for h, (sent, model) in enumerate(hedges)
                   for at, answered_model in answers if answered_model == model and 0.0 <= at - sent <= window_s)
    wanted = [len(answers) - 1 for answers in repeats]
    used: set[int] = set()
    by_hedge = 0
    for _, r, h in pairs:
        if wanted[r] and h not in used:
            used.add(h)
            wanted[r] -= 1
            by_hedge += 1
    return by_hedge, sum(wanted)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=1000, help="items per point")
    parser.add_argument("--points", type=int, default=3)
    parser.add_argument("--per-second", type=float, default=40.0, help="the provider's request rate limit")
    parser.add_argument("--burst", type=int, default=20, help="requests the limit lets through at once")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per answered call")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("overrides", nargs="*", help="further conclave overrides (e.g. eval.concurrency=2)")
    args = parser.parse_args()
    figures = asyncio.run(sweep(args.items, args.points, args.per_second, args.burst, args.latency, args.overrides))
    if args.json:
        print(json.dumps(figures))
        return
    finished = figures["exit_code"] == 0 and figures["items_complete"] == figures["items"]
    share = figures["retry_share"] or 0.0
    print(f"conclave eval sweep under a rate limit of {args.per_second:g} req/s (burst {args.burst}), "
          f"{args.latency * 1000:.0f} ms per call: {args.items} items × {args.points} points, joblib workers")
    print(f"{'finished unattended':<24} {'yes' if finished else 'NO'} (exit {figures['exit_code']}, "
          f"{figures['items_complete']}/{figures['items']} items, {figures['points_complete']}/{args.points} points)")
    print(f"{'calls paid':<24} {figures['calls_paid']}")
    print(f"{'429s (retries)':<24} {figures['rate_limited_429']} = {100 * share:.1f}% of calls "
          f"(goal ≤ 10%: {'met' if share <= 0.10 else 'NOT met'})")
    print(f"{'fewest left in bucket':<24} {figures['lowest_remaining']} of {args.burst}")
    print(f"{'paid twice':<24} {figures['paid_twice']}: {figures['paid_twice_by_hedges']} by same-model hedges "
          f"(of {figures['hedges_sent']} sent; a hedge pays twice by design, within hedging.budget), "
          f"{figures['paid_twice_other']} otherwise "
          f"(goal 0: {'met' if figures['paid_twice_other'] == 0 else 'NOT met'})")
    print(f"{'wall':<24} {figures['wall_s']} s ({figures['calls_paid'] / max(figures['wall_s'], 1e-9):.1f} calls/s)")
    if figures["stderr_tail"]:
        print(figures["stderr_tail"], file=sys.stderr)


if __name__ == "__main__":
    main()
