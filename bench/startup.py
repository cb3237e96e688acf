"""Start-up cost: median of N cold runs of `python -c "import conclave"` and `conclave --help`.

Each run is a fresh interpreter (the OS page cache stays warm; .pyc files exist after the first run).
Goals on the 2-core reference machine: import <= 0.25 s, --help <= 1.0 s. A last line names the provider/HTTP
packages `conclave --help` imports (none expected: provider plugins send through the pool's HTTP client).

    python bench/startup.py [--runs 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

GOALS = {"import conclave": 0.25, "conclave --help": 1.0, "python -c pass (floor)": None}
#: packages only a command that calls a provider (or validates artifacts) needs
HEAVY = ("aiohttp", "jsonschema", "conclave.providers.transport", "conclave.providers.pool")


def _time(cmd: list[str], runs: int) -> list[float]:
    samples = []
    subprocess.run(cmd, capture_output=True, check=True)  # warm the .pyc cache once
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    commands = {
        "python -c pass (floor)": [sys.executable, "-c", "pass"],
        "import conclave": [sys.executable, "-c", "import conclave"],
        "conclave --help": [sys.executable, "-m", "conclave", "--help"],
    }
    floor = None
    print(f"{'command':<24} {'median s':>9} {'min s':>7} {'max s':>7} {'goal s':>7}  {'vs floor':>8}")
    for name, cmd in commands.items():
        samples = _time(cmd, args.runs)
        median = statistics.median(samples)
        floor = floor if floor is not None else median
        goal = GOALS[name]
        verdict = "" if goal is None else ("ok" if median <= goal else "OVER")
        print(f"{name:<24} {median:>9.3f} {min(samples):>7.3f} {max(samples):>7.3f} "
              f"{'' if goal is None else f'{goal:.2f}':>7}  {median / floor:>7.1f}x {verdict}")
    trace = subprocess.run([sys.executable, "-X", "importtime", "-m", "conclave", "--help"], capture_output=True,
                           text=True, check=True).stderr
    loaded = {line.rpartition("|")[2].strip() for line in trace.splitlines() if line.startswith("import time:")}
    print(f"{'--help imports':<24} {', '.join(h for h in HEAVY if h in loaded) or 'none of ' + ', '.join(HEAVY)}")


if __name__ == "__main__":
    main()
