"""Evaluation harness throughput and overhead against the fake provider server at zero latency.

1. Items per second through `conclave eval` (separate CLI processes, as users run it) with 1, 2 and 4 Hydra joblib
   workers sharing one CONCLAVE_HOME; the same total items are split over the workers' runs. Scaling ratio =
   items/s with W workers ÷ items/s with 1.
2. The harness's overhead per item over the consultations it runs: the same items run as bare consultations
   (engine + journal + index, sequentially) versus through the harness (estimate, consent, scoring, item rows in
   files and index), in one process. Goal: ≤ 5%.
3. The vote at the debate's budget: its billed tokens ÷ the debates' over a run, against a panel whose re-samples
   are independent draws. Goal: 0.95–1.05.

    python bench/eval.py [--items 24] [--workers 1 2 4] [--overhead-items 20] [--matched-items 40]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
import tempfile
import time
from pathlib import Path

PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o",
         "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]
NAMES = ("Security Expert", "Systems Architect", "Pragmatic Engineer")
KEYS = {"OPENAI_API_KEY": "sk-bench-0000", "ANTHROPIC_API_KEY": "sk-ant-bench", "GEMINI_API_KEY": "bench"}


async def _cli_rate(items: int, workers: int, rounds: int) -> float:
    from conclave.testing.answer_panel import AnswerPanel
    from conclave.testing.fake_server import FakeProviderServer

    async with FakeProviderServer() as fake:
        AnswerPanel({name: 0.7 for name in NAMES}).install(fake)
        with tempfile.TemporaryDirectory() as home:
            env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
            env.update(KEYS, CONCLAVE_HOME=home, CONCLAVE_PROGRESS="0", CONCLAVE_SWEEP_DIR=f"{home}/multirun")
            seeds = ",".join(str(s) for s in range(1, workers + 1))
            args = ["eval", "-m", "arithmetic", f"eval.n={items // workers}", f"eval.seed={seeds}",
                    f"rounds={rounds}", "cost.auto_approve=true", "hydra/launcher=joblib",
                    f"hydra.launcher.n_jobs={workers}", *PANEL, *fake.overrides()]
            started = time.perf_counter()
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "conclave", *args, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, env=env, cwd=home)
            _, err = await process.communicate()
            wall = time.perf_counter() - started
            if process.returncode != 0:
                raise SystemExit(f"conclave eval failed ({process.returncode}): {err.decode()[-2000:]}")
    return (items // workers) * workers / wall


async def _overhead(items: int, rounds: int, repeats: int) -> tuple[float, float]:
    """Median seconds per item (bare consultations, through the harness), the two interleaved ``repeats`` times so
    warm-up and the machine's other load fall on both alike."""
    import statistics

    from conclave.engine.interaction import Interaction
    from conclave.engine.run import Consultation
    from conclave.eval.evaluate import EvalOptions, prepare, run_async
    from conclave.eval.items import arithmetic
    from conclave.plugin_manager import get_plugins
    from conclave.store.recorder import Recorder
    from conclave.testing.answer_panel import AnswerPanel
    from conclave.testing.fake_server import FakeProviderServer

    plugins = get_plugins()
    bare_times: list[float] = []
    harness_times: list[float] = []
    async with FakeProviderServer() as fake:
        AnswerPanel({name: 0.7 for name in ("Alpha", "Beta", "Gamma")}).install(fake)
        with tempfile.TemporaryDirectory() as tmp:
            def settings(home: str):  # type: ignore[no-untyped-def]
                return fake.settings(
                    question="eval", rounds=rounds, home=home, hedging={"enabled": False},
                    agents={k: {"persona": k, "provider": "openai", "model": "gpt-4o"} for k in ("a", "b", "c")},
                    personas={k: {"name": n, "focus": "arithmetic"} for k, n in
                              (("a", "Alpha"), ("b", "Beta"), ("c", "Gamma"))},
                    judge={"provider": "openai", "model": "gpt-4.1"}, mode={"strategy": "answer"},
                    cost={"auto_approve": True})

            async def bare(home: str) -> float:
                base = settings(home)
                recorder = Recorder(Path(home))
                started = time.perf_counter()
                for item in arithmetic(items, 0):
                    await Consultation(base.model_copy(update={"question": item.question}), plugins=plugins,
                                       interaction=Interaction.non_interactive(), recorder=recorder).run()
                recorder.close()
                return (time.perf_counter() - started) / items

            async def harness(home: str) -> float:
                evaluation = prepare(settings(home), EvalOptions(n=items, concurrency=1), plugins)
                started = time.perf_counter()
                await run_async(evaluation, plugins, Interaction.non_interactive(), out=io.StringIO(),
                                err=io.StringIO())
                return (time.perf_counter() - started) / items

            await bare(f"{tmp}/warm")  # imports, tokenizer, schemas
            for n in range(repeats):
                bare_times.append(await bare(f"{tmp}/bare-{n}"))
                harness_times.append(await harness(f"{tmp}/harness-{n}"))
    return statistics.median(bare_times), statistics.median(harness_times)


async def _matched_ratio(items: int, rounds: int) -> tuple[float | None, str]:
    """The matched vote's billed-token ratio over ``items`` items, and the line the run printed about it."""
    from conclave.engine.interaction import Interaction
    from conclave.eval.evaluate import EvalOptions, prepare, run_async
    from conclave.plugin_manager import get_plugins
    from conclave.testing.answer_panel import AnswerPanel
    from conclave.testing.fake_server import FakeProviderServer

    class Resampled(AnswerPanel):
        """Each call is a fresh draw (a panel at temperature > 0): no two samples need agree."""

        draws = 0

        def right(self, persona: str, question: str) -> bool:
            self.draws += 1
            return super().right(persona, f"{question}\x00{self.draws}")

    async with FakeProviderServer() as fake:
        Resampled({name: 0.6 for name in ("Alpha", "Beta", "Gamma")}).install(fake)
        with tempfile.TemporaryDirectory() as home:
            settings = fake.settings(
                question="eval", rounds=rounds, home=home, hedging={"enabled": False},
                agents={k: {"persona": k, "provider": "openai", "model": "gpt-4o"} for k in ("a", "b", "c")},
                personas={k: {"name": n, "focus": "arithmetic"} for k, n in
                          (("a", "Alpha"), ("b", "Beta"), ("c", "Gamma"))},
                judge={"provider": "openai", "model": "gpt-4.1"}, mode={"strategy": "answer"},
                cost={"auto_approve": True})
            plugins = get_plugins()
            evaluation = prepare(settings, EvalOptions(n=items, matched_vote=True, concurrency=4), plugins)
            err = io.StringIO()
            await run_async(evaluation, plugins, Interaction.non_interactive(), out=io.StringIO(), err=err)
    line = next((x for x in err.getvalue().splitlines() if x.startswith("conclave eval: matched vote:")), "")
    return (evaluation.summary or {}).get("matched_ratio"), line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--overhead-items", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--matched-items", type=int, default=40)
    args = parser.parse_args()
    os.environ.update(KEYS)  # the fake accepts any key; the engine refuses to start without one
    print("conclave eval: items/s at zero latency by joblib workers, and harness overhead per item")
    print(f"cpus: {os.cpu_count()}  items: {args.items}  rounds: {args.rounds}\n")
    print(f"{'workers':>8} {'items/s':>9} {'scaling':>8}")
    base = None
    for workers in args.workers:
        rate = asyncio.run(_cli_rate(args.items, workers, args.rounds))
        base = base or rate
        print(f"{workers:>8} {rate:>9.2f} {rate / base:>7.2f}×", flush=True)
    bare, harness = asyncio.run(_overhead(args.overhead_items, args.rounds, args.repeats))
    overhead = (harness - bare) / bare
    verdict = "met" if overhead <= 0.05 else "NOT met"
    print(f"\nper item (median of {args.repeats}, interleaved): bare consultations {1000 * bare:.1f} ms, "
          f"through the harness {1000 * harness:.1f} ms: overhead {100 * overhead:+.1f}% (goal ≤ 5%: {verdict})")
    ratio, line = asyncio.run(_matched_ratio(args.matched_items, args.rounds))
    met = "met" if ratio is not None and 0.95 <= ratio <= 1.05 else "NOT met"
    shown = "unknown" if ratio is None else f"{ratio:.3f}"
    print(f"\nmatched vote over {args.matched_items} items: billed tokens {shown}× the debates' (goal 0.95–1.05: "
          f"{met}); the run printed: {line.removeprefix('conclave eval: ')}")


if __name__ == "__main__":
    main()
