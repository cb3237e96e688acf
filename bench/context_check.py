"""What the pre-flight context-window check costs before the first request, against the estimate's own pre-flight.

In one process, for contexts of several sizes (default panel: claude-sonnet-4-5, gpt-4o, gemini-2.5-pro, judge
gpt-4.1; every model's limits known), a fresh session per run: the context check (:func:`check_context_windows`,
every seat × every round type) and the estimate's upper bound (``planned_texts`` + ``price_calls`` with the UTF-8
bound, what ``bench/cli_overhead.py`` reports as pre-flight), first run and median of the later ones, in ms, and
their ratio. A context whose UTF-8 size comes near a window is counted exactly (the tokenizer is loaded): that row
says so.

    python bench/context_check.py [--runs 7]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

PROSE = "Our invoices table has 40 million rows, and the nightly export takes four hours. "  # ~4.6 bytes/token
#: label → (text kind, bytes): ``letters`` are 2 bytes a token (the densest ordinary text), prose ~4.6
CONTEXTS = {"none": ("letters", 0), "10 KB": ("letters", 10_000), "100 KB": ("letters", 100_000),
            "300 KB prose (counted)": ("prose", 300_000), "1 MB (gpt-4o: refused)": ("letters", 1_000_000)}


async def measure(runs: int) -> list[tuple[str, list[float], list[float], bool]]:
    from test_context_limits import letters, session_for

    from conclave.engine.cost.estimate import planned_texts, price_calls
    from conclave.engine.cost.limits import check_context_windows
    from conclave.errors import ConfigError
    from conclave.testing.fake_server import FakeProviderServer
    from conclave.tokens import utf8_upper_bound

    rows = []
    async with FakeProviderServer() as fake:
        for label, (kind, size) in CONTEXTS.items():
            context = letters(size // 2) if kind == "letters" else PROSE * (size // len(PROSE))
            check, estimate, refused = [], [], False
            for _ in range(runs):
                async with session_for(fake, context) as session:
                    started = time.perf_counter()
                    try:
                        check_context_windows(session)
                    except ConfigError:
                        refused = True
                    check.append((time.perf_counter() - started) * 1000)
                    started = time.perf_counter()
                    numbers = session.plan.numbers()
                    price_calls(session.pool, planned_texts(session, numbers), utf8_upper_bound)
                    estimate.append((time.perf_counter() - started) * 1000)
            rows.append((label, check, estimate, refused))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    os.environ["CONCLAVE_HOME"] = tempfile.mkdtemp(prefix="conclave-bench-")
    from conclave.testing.pytest_plugin import FAKE_KEYS

    os.environ.update(FAKE_KEYS)
    print("the context-window check before the first request vs the estimate's upper bound (ms; first run / "
          f"median of {args.runs - 1} later runs)")
    print(f"load (1 min) at the start: {os.getloadavg()[0]:.2f}")
    print(f"{'context':<24} {'check first':>11} {'check':>8} {'estimate':>9} {'check÷estimate':>15}")
    for label, check, estimate, refused in asyncio.run(measure(args.runs)):
        later, reference = statistics.median(check[1:]), statistics.median(estimate[1:])
        note = "  (refused)" if refused else ""
        print(f"{label:<24} {check[0]:>11.2f} {later:>8.2f} {reference:>9.2f} {later / reference:>15.2f}{note}")
    print("goal: the whole pre-flight ≤ 50 ms; no tokenizer unless a prompt's UTF-8 bound is over its window")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
