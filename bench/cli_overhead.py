"""What a user waits for: whole `conclave` CLI processes against the fake provider at a fixed latency L.

Every model (3 agents + judge) answers after exactly L seconds, so a 4-round consultation's critical path is 5L
(``rounds=4``: with ``rounds=null`` cross-examination may repeat, and the path grows by 2L per repeat).
For each L, separate `conclave "Q" …` processes run one after another (as users run them); the fake server, in
its own process, logs when each request arrives. Reported per L (medians over the runs): process start → first
provider request; the consultation alone ÷ critical path (the result's own duration); the whole process ÷
critical path; the process's peak RSS; and its CPU time (user + system, which machine load inflates far less
than wall times).

    python bench/cli_overhead.py [--latency 0.3 1.0] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fake_process import fake_server_process

QUESTION = "Should the billing service move to event sourcing?"
CRITICAL_CALLS = 5
CALLS = 9  # 3 round-1 answers, the synthesis, 3 round-3 replies, the cross-examination, the verdict


def _run_once(overrides: list[str], log: Path, home: str) -> dict[str, float]:
    log.write_text("")
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    env.update({"CONCLAVE_HOME": home, "OPENAI_API_KEY": "sk-bench", "ANTHROPIC_API_KEY": "sk-ant-bench",
                "GEMINI_API_KEY": "bench"})
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    before, cpu_before = usage.ru_maxrss, usage.ru_utime + usage.ru_stime
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "conclave", QUESTION, *overrides, "cost.auto_approve=true",
                           "judge.model=gpt-4.1", "output.format=json", "rounds=4"],
                          capture_output=True, text=True, env=env)
    end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"conclave failed: {proc.stderr[-2000:]}")
    arrivals = sorted(float(line) for line in log.read_text().split())
    if len(arrivals) != CALLS:  # the ratios below assume exactly the 4-round plan's calls
        raise SystemExit(f"expected {CALLS} provider requests, the fake server saw {len(arrivals)}")
    result = json.loads(proc.stdout)
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"first_request_s": arrivals[0] - start, "consultation_s": float(result["duration_s"]),
            "process_s": end - start, "peak_rss_mib": max(usage.ru_maxrss, before) / 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime - cpu_before}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.3, 1.0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print("what a user waits for: separate conclave CLI processes, 3 agents + judge, 4 rounds, fixed latency L")
    print(f"{'L (s)':>6} {'start→1st request':>18} {'consultation÷CP':>16} {'process÷CP':>11} {'peak RSS':>9} "
          f"{'CPU':>7}")
    for latency in args.latency:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "arrivals.log"
            with fake_server_process(latency, str(log)) as overrides:
                runs = [_run_once(overrides, log, tmp) for _ in range(args.runs)]
        critical = CRITICAL_CALLS * latency

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        print(f"{latency:>6.2f} {med('first_request_s'):>16.3f} s {med('consultation_s') / critical:>16.3f} "
              f"{med('process_s') / critical:>11.3f} {max(r['peak_rss_mib'] for r in runs):>6.0f} MiB "
              f"{med('cpu_s'):>5.2f} s")
    print("goals: start→1st request ≤ 0.5 s; consultation÷CP ≤ 1.05 at L=0.3; process÷CP ≤ 1.10 at L=1.0; "
          "peak RSS ≤ 130 MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
