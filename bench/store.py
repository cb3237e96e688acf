"""Benchmark the store at scale: journal appends, ``index rebuild``, ``logs verify`` and ``stats --json``.

    python bench/store.py [--consultations 100000] [--home DIR] [--realistic-sample 2000] [--full-size]
    python bench/store.py --home DIR --reuse [--rebuild-runs 3]   # again, on the journals already in DIR

Synthetic consultations (``conclave.testing.synthetic_events``: ~44 events each, deterministic) are journaled with the
production :class:`~conclave.store.journal.JournalWriter`. The first ``--realistic-sample`` are made durable the
way a live run is (fsync + head at every round start and end); the rest fsync once per consultation so a 100k
corpus can be built in reasonable time. Then the index is rebuilt from the journals (best of
``--rebuild-runs``; the CPU time counts every process), every journal is verified, and the stats queries are timed
at that size. Prints a table.

The synthetic streams model a consultation's records (ids, events, counts, tokens, costs), not its texts: their
artifacts are one-line stubs and their raw answers ``{...}``, so a journal is ~21 KB where a real 3-agent one is
77-112 KB. ``--full-size`` gives every stream (deterministically, the records otherwise unchanged) artifacts of real
length, raw answers that repeat them as a model writes them, and a result that embeds every artifact as the
engine's does, which brings a journal to that size; the quality layer's own records (debate state, grounding,
safety) are still not modelled: the engine's journals of ``bench/filtering.py``'s 3-agent debates are 167-185 KB at
``rounds=4`` and 230-250 KB at the defaults, a quarter of it debate-state snapshots.

The rebuild's figure depends on how much of the machine it gets: it forks one worker per CPU, so on a shared or
oversubscribed host run it more than once (``--rebuild-runs``) and compare the CPU time per consultation too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from conclave import events as ev
from conclave.store.heads import HeadsLog
from conclave.store.journal import JournalWriter
from conclave.store.paths import StoreLayout
from conclave.store.period_stats import compute_stats, period_from_args
from conclave.store.redact import Redactor
from conclave.store.sqlite_index import RebuildReport, connect, rebuild
from conclave.store.verify import verify_store
from conclave.testing.synthetic_events import synthetic_events

SPACING_S = 120.0  # 100k consultations then span ~139 days, so --week and --month select real subsets


TEXT = ("the billing service reduces operational risk under peak load because an outbox table bounds the replay "
        "window while the audit trail keeps every change for regulators and the read model stays consistent")


def full_size(events: list[ev.Event], n: int) -> list[ev.Event]:
    """``events`` with texts of real length: each artifact gains the prose a model writes (rationale, critique,
    defence; 180-260 words for an agent, 300-420 for the judge), its raw answer is its JSON as the model sent it,
    and the result embeds every artifact (as the engine's results do). Drawn from a generator of its own, so every
    other record is what it was."""
    rng = random.Random(f"full-size/{n}")
    words = TEXT.split()

    def prose(low: int, high: int) -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(low, high))).capitalize() + "."

    out, artifacts = [], []
    for event in events:
        data = event.data
        if event.type == ev.ROUND_ARTIFACT:
            judge = data.get("agent") is None
            artifact = {**data["artifact"], "rationale": prose(300, 420) if judge else prose(180, 260),
                        "key_points": [prose(12, 24) for _ in range(rng.randint(3, 6))]}
            artifacts.append({"round_number": data["round_number"], "agent": data.get("agent"), "artifact": artifact})
            data = {**data, "artifact": artifact, "raw_text": json.dumps(artifact, ensure_ascii=False, indent=2)}
        elif event.type == ev.CONSULTATION_COMPLETED:
            data = {**data, "result": {**data["result"], "artifacts": artifacts}}
        out.append(ev.Event(event.type, event.consultation_id, event.seq, event.ts, data))
    return out


def journal(layout: StoreLayout, count: int, realistic: int, full: bool = False) -> dict[str, float]:
    heads = HeadsLog(layout.heads_path)
    redactor = Redactor.from_env()
    start_ts = time.time() - count * SPACING_S
    append_s = flush_s = generate_s = 0.0
    records = flushes = 0
    realistic_s = 0.0
    for n in range(count):
        t0 = time.perf_counter()
        events = synthetic_events(n, start_ts=start_ts, spacing_s=SPACING_S)
        if full:
            events = full_size(events, n)
        t1 = time.perf_counter()
        generate_s += t1 - t0
        writer = JournalWriter(layout.journal_path(events[0].consultation_id), events[0].consultation_id, heads,
                               redactor)
        for event in events:
            ta = time.perf_counter()
            writer.append(event.type, event.ts, event.data)
            tb = time.perf_counter()
            append_s += tb - ta
            # a live run is made durable when each round starts and ends (recorder + runner)
            if n < realistic and event.type in (ev.ROUND_STARTED, ev.ROUND_COMPLETED, ev.USER_CONSENT):
                writer.flush()
                flushes += 1
                flush_s += time.perf_counter() - tb
        tc = time.perf_counter()
        writer.close()
        flushes += 1
        flush_s += time.perf_counter() - tc
        records += len(events)
        if n < realistic:
            realistic_s += time.perf_counter() - t1
    return {"records": records, "append_s": append_s, "flush_s": flush_s, "flushes": flushes,
            "generate_s": generate_s, "realistic_s": realistic_s}


def time_stats(layout: StoreLayout) -> dict[str, float]:
    db = connect(layout.index_path)
    timings = {}
    try:
        for label, period in (("all time", {}), ("--month", {"month": ""}), ("--week", {"week": True})):
            runs = []
            for _ in range(7):
                t0 = time.perf_counter()
                compute_stats(db, period_from_args(**period))
                runs.append(time.perf_counter() - t0)
            timings[label] = statistics.median(runs)
    finally:
        db.close()
    env = {**os.environ, "CONCLAVE_HOME": str(layout.home)}
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "conclave", "stats", "--json"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        runs.append(time.perf_counter() - t0)
    timings["cli"] = statistics.median(runs)
    return timings


def time_rebuild(layout: StoreLayout, runs: int) -> tuple[RebuildReport, float]:
    """The fastest of ``runs`` rebuilds, with the CPU time it took in this process and its workers."""
    best: tuple[RebuildReport, float] | None = None
    for _ in range(max(1, runs)):
        before = _cpu_s()
        report = rebuild(layout)
        cpu_s = _cpu_s() - before
        if best is None or report.seconds < best[0].seconds:
            best = (report, cpu_s)
    assert best is not None
    return best


def _cpu_s() -> float:
    """User + system CPU seconds of this process and its reaped children (rebuild's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--consultations", type=int, default=100_000)
    parser.add_argument("--realistic-sample", type=int, default=2_000)
    parser.add_argument("--home", type=Path, help="where to build the store (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the store afterwards")
    parser.add_argument("--reuse", action="store_true",
                        help="with --home: use the journals already there instead of journaling new ones")
    parser.add_argument("--rebuild-runs", type=int, default=1, help="rebuild this many times, report the best")
    parser.add_argument("--full-size", action="store_true",
                        help="texts of real length (journals of real size; ~4x the disk and the hashing)")
    args = parser.parse_args()
    if args.reuse and args.home is None:
        parser.error("--reuse needs --home")
    home = args.home or Path(tempfile.mkdtemp(prefix="conclave-bench-"))
    layout = StoreLayout(home)
    reused = args.reuse and bool(layout.journal_ids())
    n = len(layout.journal_ids()) if reused else args.consultations
    sample = min(args.realistic_sample, n)
    try:
        if reused:
            print(f"store bench: {n:,} journals already in {home}", file=sys.stderr)
            j = None
        else:
            print(f"store bench: {n:,} synthetic consultations in {home}", file=sys.stderr)
            j = journal(layout, n, sample, args.full_size)
            print(f"journaled {j['records']:,} records", file=sys.stderr)
        rebuilt, rebuild_cpu_s = time_rebuild(layout, args.rebuild_runs)
        print(f"rebuilt in {rebuilt.seconds:.1f} s", file=sys.stderr)
        t0 = time.perf_counter()
        report = verify_store(layout)
        verify_s = time.perf_counter() - t0
        assert report.ok, report.problems[:3]
        stats = time_stats(layout)
        size_mb = sum(p.stat().st_size for p in layout.journal_dir.iterdir()) / 1e6
        index_mb = layout.index_path.stat().st_size / 1e6

        rows = [
            ("consultations", f"{n:,}", f"{rebuilt.records:,} records, {rebuilt.records / n:.1f} per consultation"),
            ("journal size", f"{size_mb:,.0f} MB",
             f"{size_mb * 1e3 / n:,.1f} KB per consultation (real 3-agent journals: 77-112 KB; "
             + ("texts of real length" if args.full_size else "one-line texts, see --full-size")
             + f"), index {index_mb:,.0f} MB"),
        ]
        if j is not None:
            rows += [
                ("journal append (buffered)", f"{j['records'] / j['append_s']:,.0f} records/s",
                 f"{j['append_s'] / j['records'] * 1e6:.1f} µs per record (canonical JSON, sha256, redaction check)"),
                ("flush (fsync + head)", f"{j['flush_s'] / j['flushes'] * 1e3:.2f} ms each",
                 f"{j['flushes']:,} flushes"),
            ]
            if sample and j["realistic_s"] > 0:
                rows.append((f"live-like journaling ({sample:,})", f"{sample / j['realistic_s']:,.0f} consultations/s",
                             "fsync at consent and at every round start and end"))
        rows += [
            ("index rebuild", f"{rebuilt.consultations / rebuilt.seconds:,.0f} consultations/s",
             f"{rebuilt.seconds:.1f} s, {rebuilt.records / rebuilt.seconds:,.0f} records/s (goal ≥ 5,000/s)"),
            ("index rebuild CPU", f"{rebuild_cpu_s / rebuilt.consultations * 1e6:,.0f} µs/consultation",
             f"{rebuild_cpu_s:.1f} s of CPU over {rebuilt.seconds:.1f} s, every process (os.cpu_count() = "
             f"{os.cpu_count()})"),
            ("logs verify", f"{report.journals / verify_s:,.0f} consultations/s",
             f"{verify_s:.1f} s, {report.records / verify_s:,.0f} records/s"),
            ("stats query, all time", f"{stats['all time'] * 1e3:.0f} ms", "compute_stats (goal < 100 ms)"),
            ("stats query, --month", f"{stats['--month'] * 1e3:.0f} ms", "rolling 30 days"),
            ("stats query, --week", f"{stats['--week'] * 1e3:.0f} ms", "last 7 days"),
            ("conclave stats --json", f"{stats['cli'] * 1e3:.0f} ms", "whole command, process start included"),
        ]
        width = max(len(r[0]) for r in rows)
        value_width = max(len(r[1]) for r in rows)
        for name, value, note in rows:
            print(f"{name:<{width}}  {value:>{value_width}}  {note}")
    finally:
        if not args.keep and args.home is None:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
