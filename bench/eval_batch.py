"""A batched evaluation (`conclave eval eval.batch=true`) against the fake provider server's OpenAI Batch API, with
the price sheets' batch prices, as users run it (separate CLI processes).

1. A clean run of N items (4 rounds, the vote gate off so every item plays every round): the billed cost at batch
   prices ÷ the same calls at interactive prices, in the estimate and in the result (goal ≤ 0.55); the most
   batches one provider got at one round barrier (goal 1); wall ÷ (rounds × the scripted batch latency) (goal ≤ 1.10;
   the barriers are counted too, a cross-examination round has two: the agents, then the judge).
2. The same N items again, SIGKILLed while the first batch is being polled, then `conclave eval resume`: requests
   the fake received again after having accepted or answered them (goal 0).
3. The same again, SIGKILLed after the fake accepted the first batch but before its create call answered (the id
   never reached the journal): the resumed run must find the batch by its tag and adopt it (goal 0 resubmitted).

    python bench/eval_batch.py [--items 500] [--latency 20] [--poll 0.5] [--skip-clean]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o",
         "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]
NAMES = ("Security Expert", "Systems Architect", "Pragmatic Engineer")
KEYS = {"OPENAI_API_KEY": "sk-bench-0000", "ANTHROPIC_API_KEY": "sk-ant-bench", "GEMINI_API_KEY": "bench"}
ROUNDS = 4


def _args(items: int, run_id: str, poll: float, fake: object) -> list[str]:
    return ["eval", "arithmetic", f"eval.n={items}", f"eval.run_id={run_id}", f"rounds={ROUNDS}", "eval.batch=true",
            f"eval.batch_poll_s={poll}", "selective.enabled=false", "cost.auto_approve=true", "hydra/launcher=basic",
            *PANEL, *fake.overrides()]  # type: ignore[attr-defined]


async def _start(args: list[str], home: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(KEYS, CONCLAVE_HOME=home, CONCLAVE_PROGRESS="0")
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, env=env, cwd=home)


async def _clean(items: int, latency: float, poll: float) -> dict[str, float]:
    from conclave.eval import run_store as store
    from conclave.testing.answer_panel import AnswerPanel
    from conclave.testing.fake_server import FakeProviderServer

    async with FakeProviderServer() as fake:
        AnswerPanel({name: 0.7 for name in NAMES}).install(fake)
        fake.batches.latency = latency
        with tempfile.TemporaryDirectory() as home:
            started = time.perf_counter()
            process = await _start(_args(items, "bench-batch", poll, fake), home)
            _, err = await process.communicate()
            wall = time.perf_counter() - started
            if process.returncode not in (0, 1):
                raise SystemExit(f"conclave eval failed ({process.returncode}): {err.decode()[-2000:]}")
            run = store.read_run(Path(home), "bench-batch")
    batch = run["summary"]["batch"]
    found = re.search(r"at batch prices \(interactive: \$([0-9.]+), ratio ([0-9.]+)\)", err.decode())
    return {"estimate_ratio": float(found.group(2)) if found else float("nan"), "result_ratio": batch["ratio"],
            "per_provider_per_round": batch["most_batches_per_provider_per_wave"], "waves": batch["waves"],
            "batches": batch["batches"], "wall": wall, "rounds_wall": wall / (ROUNDS * latency),
            "waves_wall": wall / (batch["waves"] * latency)}


async def _killed(items: int, latency: float, poll: float, point: str) -> dict[str, Any]:
    """SIGKILL at ``point`` (``polling``: the first batch's id journaled and polled; ``accepted``: the fake accepted
    the first batch, its create call not yet answered), then ``conclave eval resume``."""
    from conclave.eval import run_store as store
    from conclave.testing.answer_panel import AnswerPanel
    from conclave.testing.fake_server import FakeProviderServer

    async with FakeProviderServer() as fake:
        AnswerPanel({name: 0.7 for name in NAMES}).install(fake)
        fake.batches.latency = latency
        fake.batches.stall_create = 3600.0 if point == "accepted" else 0.0
        with tempfile.TemporaryDirectory() as home:
            process = await _start(_args(items, "bench-kill", poll, fake), home)
            for _ in range(6000):
                if point == "accepted" and fake.batches.created:
                    break
                if point == "polling" and any(r.get("event") == "submitted"
                                              for r in store.read_batches(Path(home), "bench-kill")):
                    await asyncio.sleep(poll * 2)  # polling
                    break
                if process.returncode is not None:
                    break
                await asyncio.sleep(0.1)
            process.kill()
            await process.wait()
            fake.batches.stall_create = 0.0
            started = time.perf_counter()
            process = await _start(["eval", "resume", "bench-kill"], home)
            _, err = await process.communicate()
            if process.returncode not in (0, 1):
                raise SystemExit(f"conclave eval resume failed ({process.returncode}): {err.decode()[-2000:]}")
            finished = len(store.read_items(Path(home), "bench-kill"))
            summary = store.read_run(Path(home), "bench-kill")["summary"]["batch"]
        return {"resubmitted": fake.batches.resubmitted, "received": fake.batches.received, "finished": finished,
                "adopted": "found by its tag" in err.decode(), "resume_wall": time.perf_counter() - started,
                "ratio": summary["ratio"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=500)
    parser.add_argument("--latency", type=float, default=20.0, help="scripted seconds from a batch's creation to "
                        "its end")
    parser.add_argument("--poll", type=float, default=0.5, help="eval.batch_poll_s")
    parser.add_argument("--skip-clean", action="store_true", help="only the two kill-and-resume runs")
    options = parser.parse_args()
    clean = None if options.skip_clean else asyncio.run(_clean(options.items, options.latency, options.poll))
    killed = {point: asyncio.run(_killed(options.items, options.latency, options.poll, point))
              for point in ("polling", "accepted")}
    print(f"batched eval: {options.items} items, {ROUNDS} rounds, scripted batch latency {options.latency:g} s")
    if clean is not None:
        print(f"  cost batch ÷ interactive, estimate: {clean['estimate_ratio']:.3f}   (goal ≤ 0.55)")
        print(f"  cost batch ÷ interactive, result:   {clean['result_ratio']:.3f}   (goal ≤ 0.55)")
    for point, figures in killed.items():
        print(f"  SIGKILL while {point}: requests resubmitted after resume: {figures['resubmitted']} of "
              f"{figures['received']} received, {figures['finished']} items finished, batch adopted by its tag: "
              f"{'yes' if figures['adopted'] else 'no'}, cost ratio {figures['ratio']}   (goal 0)")
    if clean is not None:
        print(f"  batches per provider per round barrier: {clean['per_provider_per_round']} "
              f"({clean['batches']} batches, {clean['waves']} barriers)   (goal 1)")
        print(f"  wall ÷ (rounds × latency): {clean['rounds_wall']:.3f}   (goal ≤ 1.10); wall {clean['wall']:.1f} s; "
              f"÷ (barriers × latency): {clean['waves_wall']:.3f}")
    print(json.dumps({"clean": clean, "killed": killed}))


if __name__ == "__main__":
    main()
