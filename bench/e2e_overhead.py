"""Engine overhead against the physical limit: a consultation on the fake provider server at fixed latency L.

Every model (3 agents + judge) answers after exactly L seconds, so the critical path of a 4-round consultation
is 5L (round 1, round 2, round-3 agents, round-3 judge, round 4) and of a 2-round one 2L. The ratio
wall ÷ critical path shows what conclave adds: prompt building, token counting, HTTP, extraction, validation,
filtering, events and result assembly. The fake server runs in its own process (like a remote API, it does not
compete for our interpreter) and answers each schema with an instance generated once. The first consultation
of the process (imports, tokenizer and schema loading) is reported separately as a cold start.

    python bench/e2e_overhead.py [--latency 0.1 0.3 0.5] [--runs 5] [--rounds 4 2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time

from fake_process import fake_server_process

CRITICAL_CALLS = {4: 5, 3: 4, 2: 2, 1: 1}  # sequential model calls on the critical path, per planned rounds
MODELS = ("claude-sonnet-4-5", "gpt-4o", "gemini-2.5-pro", "gpt-4.1")
QUESTION = "Should the billing service move to event sourcing?"


# ------------------------------------------------------------------------------------------- measuring


async def one_run(overrides: list[str], rounds: int) -> tuple[float, str]:
    from conclave.api import compose_settings
    from conclave.engine.run import Consultation

    settings = compose_settings(QUESTION, [*overrides, "cost.auto_approve=true", "judge.model=gpt-4.1",
                                           f"rounds={rounds}"])
    started = time.perf_counter()
    result = await Consultation(settings).run()
    return time.perf_counter() - started, result.status


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--latency", type=float, nargs="+", default=[0.1, 0.3, 0.5])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, nargs="+", default=[4, 2])
    args = parser.parse_args()
    os.environ.setdefault("CONCLAVE_HOME", tempfile.mkdtemp(prefix="conclave-bench-"))
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"):
        os.environ.setdefault(var, "bench-key")
    os.environ.pop("OPENAI_BASE_URL", None)

    rows: list[tuple[float, int, list[float], float]] = []
    for index, latency in enumerate(args.latency):
        with fake_server_process(latency) as overrides:
            if index == 0:
                cold, _ = asyncio.run(one_run(overrides, 4))
                path = CRITICAL_CALLS[4] * latency
                print(f"cold start (first consultation of the process, L={latency:.2f}s): wall {cold:.3f}s, "
                      f"critical path {path:.3f}s, ratio {cold / path:.3f}\n")
            for rounds in args.rounds:
                walls = []
                for _ in range(args.runs):
                    wall, status = asyncio.run(one_run(overrides, rounds))
                    if status != "complete":
                        raise SystemExit(f"a benchmark consultation ended {status}")
                    walls.append(wall)
                rows.append((latency, rounds, walls, CRITICAL_CALLS[rounds] * latency))

    print(f"{'L (s)':>6} {'rounds':>6} {'runs':>4} {'wall min':>9} {'median':>7} {'max':>7} {'crit path':>9} "
          f"{'ratio min':>9} {'median':>7} {'max':>6} {'overhead':>9}")
    for latency, rounds, walls, path in rows:
        low, mid, high = min(walls), statistics.median(walls), max(walls)
        print(f"{latency:6.2f} {rounds:6d} {len(walls):4d} {low:9.3f} {mid:7.3f} {high:7.3f} {path:9.3f} "
              f"{low / path:9.3f} {mid / path:7.3f} {high / path:6.3f} {1000 * (mid - path):7.1f}ms")


if __name__ == "__main__":
    main()
