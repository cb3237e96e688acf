"""The time an evaluation spends reading the learned vote's graded history: one `conclave eval` run of N items
(rounds=2, against the fake provider server) under cProfile, as users run it (a separate CLI process); prints the
cumulative seconds in conclave.eval.graded (or, on an older tree, in the aggregator's graded_history) and the wall.

    python bench/graded_history.py [--items 500]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import sys
import tempfile
import time

PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o",
         "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]
NAMES = ("Security Expert", "Systems Architect", "Pragmatic Engineer")


async def main(items: int) -> None:
    from conclave.testing.answer_panel import AnswerPanel
    from conclave.testing.fake_server import FakeProviderServer

    async with FakeProviderServer() as fake:
        AnswerPanel({name: 0.7 for name in NAMES}).install(fake)
        with tempfile.TemporaryDirectory() as home:
            env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
            env.update(OPENAI_API_KEY="sk-bench-0000", CONCLAVE_HOME=home, CONCLAVE_PROGRESS="0")
            profile = os.path.join(home, "eval.prof")
            started = time.perf_counter()
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "cProfile", "-o", profile, "-m", "conclave", "eval", "arithmetic",
                f"eval.n={items}", "eval.run_id=bench-graded", "rounds=2", "selective.enabled=false",
                "cost.auto_approve=true", "eval.concurrency=8", *PANEL, *fake.overrides(),
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env, cwd=home)
            _, err = await process.communicate()
            wall = time.perf_counter() - started
            if process.returncode != 0:
                sys.exit(err.decode()[-2000:])
            stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    # the entry points into the history: the whole read (old) or the kept history's read, forget, learn and lookups
    entries = {"graded_history", "__init__", "forget", "learn", "__call__"}
    spent = sum(ct for (path, _, name), (_, _, _, ct, _) in stats.items()
                if (path.endswith("eval/graded.py") and name in entries and name != "graded_history")
                or (path.endswith("aggregators.py") and name == "graded_history"))
    calls = sum(nc for (path, _, name), (_, nc, _, _, _) in stats.items()
                if path.endswith("aggregators.py") and name == "graded_history")
    print(f"{items} items: {spent:.3f} s reading the graded history"
          f"{f' ({calls} whole reads)' if calls else ''}; eval wall {wall:.1f} s (under cProfile)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=500)
    asyncio.run(main(parser.parse_args().items))
