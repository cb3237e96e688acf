"""What a user waits for: whole `conclave` CLI processes against the fake provider at a fixed latency L.

Every model (3 agents + judge) answers after exactly L seconds, so a 4-round consultation's critical path is 5L
(``rounds=4``: with ``rounds=null`` cross-examination may repeat, and the path grows by 2L per repeat).
For each L, separate `conclave "Q" …` processes run one after another (as users run them); the fake server, in
its own process, logs when each request arrives. Reported per L (medians over the runs): process start → first
provider request; the pre-flight (journal: the ESTIMATING transition → the consent record); the consultation
alone ÷ critical path (the result's own duration); the whole process ÷ critical path; the process's peak RSS;
and its CPU time (user + system, which machine load inflates far less than wall times), for the first run of each L
(a fresh home) and for the repeats.
conclave's own modules are byte-compiled first, as installing a wheel does (an editable install under
``PYTHONDONTWRITEBYTECODE=1`` would otherwise compile ~90 modules from source in every run, ~0.15 s);
``--no-compile`` measures without that.

    python bench/cli_overhead.py [--latency 0.3 1.0] [--runs 5] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import os
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
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.time()
        proc = subprocess.Popen([sys.executable, "-m", "conclave", QUESTION, *overrides, "cost.auto_approve=true",
                                 "judge.model=gpt-4.1", "output.format=json", "rounds=4"],
                                stdout=out, stderr=err, stdin=subprocess.DEVNULL, text=True, env=env)
        _, status, usage = os.wait4(proc.pid, 0)  # this process's own rusage: peak RSS and CPU
        end = time.time()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"conclave failed: {stderr[-2000:]}")
    arrivals = sorted(float(line) for line in log.read_text().split())
    if len(arrivals) != CALLS:  # the ratios below assume exactly the 4-round plan's calls
        raise SystemExit(f"expected {CALLS} provider requests, the fake server saw {len(arrivals)}")
    result = json.loads(stdout)
    journal = Path(home) / "journal" / f"{result['consultation_id']}.jsonl"
    records = [json.loads(line) for line in journal.read_text().splitlines()]
    estimating = next(r["ts"] for r in records
                      if r["type"] == "state:transition" and r["data"].get("to") == "ESTIMATING")
    consent = next(r["ts"] for r in records if r["type"] == "consultation:user_consent")
    return {"first_request_s": arrivals[0] - start, "consultation_s": float(result["duration_s"]),
            "preflight_ms": (consent - estimating) * 1000, "process_s": end - start,
            "peak_rss_mib": usage.ru_maxrss / 1024, "cpu_s": usage.ru_utime + usage.ru_stime}


def _byte_compile() -> None:
    """Write the bytecode of conclave and its built-in plugins next to their sources, as pip does for a wheel."""
    import compileall
    import importlib.util

    for package in ("conclave", "conclave_plugins"):
        spec = importlib.util.find_spec(package)
        for directory in (spec.submodule_search_locations or []) if spec is not None else []:
            compileall.compile_dir(directory, quiet=2)


def _row(label: str, latency: float, runs: list[dict[str, float]]) -> str:
    critical = CRITICAL_CALLS * latency

    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    return (f"{latency:>6.2f} {label:<12} {med('first_request_s'):>16.3f} s {med('preflight_ms'):>7.1f} ms "
            f"{med('consultation_s') / critical:>16.3f} {med('process_s') / critical:>11.3f} "
            f"{max(r['peak_rss_mib'] for r in runs):>6.0f} MiB {med('cpu_s'):>5.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--latency", type=float, nargs="+", default=[0.3, 1.0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="do not byte-compile conclave's modules first")
    args = parser.parse_args()
    if not args.no_compile:
        _byte_compile()
    print("what a user waits for: separate conclave CLI processes, 3 agents + judge, 4 rounds, fixed latency L"
          + ("" if args.no_compile else " (conclave's modules byte-compiled, as a wheel install leaves them)"))
    print(f"uptime: {os.getloadavg()[0]:.2f} load (1 min) at the start")
    print(f"{'L (s)':>6} {'run':<12} {'start→1st request':>18} {'pre-flight':>10} {'consultation÷CP':>16} "
          f"{'process÷CP':>11} {'peak RSS':>9} {'CPU':>7}")
    for latency in args.latency:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "arrivals.log"
            with fake_server_process(latency, str(log)) as overrides:
                runs = [_run_once(overrides, log, tmp) for _ in range(args.runs)]
        print(_row("first", latency, runs[:1]))  # a fresh home
        if len(runs) > 1:
            print(_row(f"repeat ×{len(runs) - 1}", latency, runs[1:]))
    print(f"load (1 min) at the end: {os.getloadavg()[0]:.2f}")
    print("goals: start→1st request ≤ 0.5 s; pre-flight ≤ 50 ms; consultation÷CP ≤ 1.05 at L=0.3; process÷CP ≤ 1.10 "
          "at L=1.0; peak RSS ≤ 130 MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
