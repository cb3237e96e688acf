"""Scale benchmark (issue 28): homes of 1k, 10k, 100k consultations, and each command's time at each size.

    python bench/scale.py [--sizes 1000,10000,100000] [--work DIR] [--keep] [--reuse]

1. Records a few real consultations with the CLI (``python -m conclave``) against the fake provider server in a
   process of its own (``bench/fake_process.py``, rich judge answers): ``rounds=4``, ``quick=true`` and the default
   rounds.
2. For each size, builds a home by re-journaling copies of those runs through conclave's own
   :class:`~conclave.store.journal.JournalWriter` (one fsync and one head per consultation), each with a fresh
   time-sortable id and its timestamps moved so that the consultations are spread over the last 365 days, as they
   would have been written. The writer's own encoding is used, so a change to what a record holds shows here.
3. Times, each as a CLI process (``python -m conclave ...``): ``index rebuild`` and ``stats --week`` cold (the OS
   page cache dropped first when this process may, else said so) and warm, ``logs verify``; then starts a real
   ``datasette`` process on the index and fetches the dashboard, every visible table page and every canned query
   over HTTP, cold (fresh process, page cache dropped) and warm, with each page's status.
4. Prints bytes per consultation (journal per kind of run, index) and a table of figures per size with the ratio
   of each figure to the smallest size's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from fake_process import fake_server_process

from conclave.store.heads import HeadsLog
from conclave.store.journal import JournalWriter, read_records
from conclave.store.paths import StoreLayout
from conclave.store.redact import Redactor

QUESTION = "Should the billing service move to event sourcing?"
RUNS = {"rounds=4": ["rounds=4"], "quick": ["quick=true"], "default": []}
#: how the copies are mixed: mostly rounds=4 runs, as the issue's per-consultation figure is for those
MIX = ("rounds=4", "rounds=4", "rounds=4", "quick", "default")
SPAN_S = 365 * 86400.0
_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"
KEY_VARS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY")


def base36(value: int, width: int) -> str:
    digits = []
    for _ in range(width):
        value, digit = divmod(value, 36)
        digits.append(_BASE36[digit])
    return "".join(reversed(digits))


def cli_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update({"CONCLAVE_HOME": str(home), "CONCLAVE_PROGRESS": "0"})
    env.update({var: "bench-key" for var in KEY_VARS})
    env.pop("OPENAI_BASE_URL", None)
    return env


#: CPU seconds (user + system) of the last :func:`conclave` process and its children: on a shared machine the
#: wall time also counts the time other processes held the CPU
LAST_CPU = [0.0]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def conclave(home: Path, *args: str, check: bool = True) -> tuple[float, subprocess.CompletedProcess[str]]:
    started, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run([sys.executable, "-m", "conclave", *args], env=cli_env(home), capture_output=True,
                          text=True, cwd=home)
    elapsed = time.perf_counter() - started
    LAST_CPU[0] = _children_cpu() - cpu
    if check and done.returncode != 0:
        raise SystemExit(f"conclave {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return elapsed, done


# ------------------------------------------------------------------------------------------------ the seed runs


def record_seed(home: Path) -> dict[str, list[dict[str, Any]]]:
    """kind -> the records of one real CLI run of that kind."""
    home.mkdir(parents=True, exist_ok=True)
    seeds: dict[str, list[dict[str, Any]]] = {}
    with fake_server_process(0.0, rich=True) as overrides:
        for kind, extra in RUNS.items():
            before = set(StoreLayout(home).journal_ids())
            conclave(home, QUESTION, *overrides, "cost.auto_approve=true", *extra)
            (cid,) = set(StoreLayout(home).journal_ids()) - before
            seeds[kind] = read_records(StoreLayout(home).journal_path(cid))
    return seeds


# ------------------------------------------------------------------------------------------- re-journaling copies


def _shift(value: Any, delta: float) -> Any:
    """``value`` with every ISO timestamp string in it moved by ``delta`` seconds."""
    if isinstance(value, dict):
        return {k: _shift(v, delta) for k, v in value.items()}
    if isinstance(value, list):
        return [_shift(v, delta) for v in value]
    if isinstance(value, str) and 19 <= len(value) <= 40 and value[4:5] == "-" and value[10:11] == "T":
        try:
            moment = dt.datetime.fromisoformat(value)
        except ValueError:
            return value
        return (moment + dt.timedelta(seconds=delta)).isoformat()
    return value


def _copy_records(records: list[dict[str, Any]], new_id: str, start: float) -> list[tuple[str, float, Any]]:
    old_id = records[0]["consultation_id"]
    delta = start - records[0]["ts"]
    out = []
    for record in records:
        text = json.dumps(_shift(record["data"], delta), ensure_ascii=False).replace(old_id, new_id)
        out.append((record["type"], record["ts"] + delta, json.loads(text)))
    return out


def _write_copies(home: str, seeds: dict[str, list[dict[str, Any]]], jobs: list[tuple[str, str, float]]) -> int:
    layout = StoreLayout(Path(home))
    heads = HeadsLog(layout.heads_path)
    redactor = Redactor.from_env()
    written = 0
    for kind, cid, start in jobs:
        writer = JournalWriter(layout.journal_path(cid), cid, heads, redactor)
        try:
            for type_, ts, data in _copy_records(seeds[kind], cid, start):
                writer.append_line(type_, ts, data)
        finally:
            writer.close()  # one fsync and one head per consultation
        written += 1
    return written


def build_home(home: Path, seeds: dict[str, list[dict[str, Any]]], size: int, workers: int) -> float:
    """Journal ``size`` copies into ``home``; seconds taken."""
    home.mkdir(parents=True, exist_ok=True)
    rng = random.Random(size)
    now = time.time()
    jobs = []
    for i in range(size):
        start = now - SPAN_S + SPAN_S * (i + rng.random() * 0.5) / size
        cid = "c-" + base36(int(start * 1000), 8) + base36(i, 4)
        jobs.append((MIX[i % len(MIX)], cid, start))
    started = time.perf_counter()
    chunks = [jobs[i::workers] for i in range(workers)]
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        assert sum(pool.map(_write_copies, [str(home)] * workers, [seeds] * workers, chunks)) == size
    return time.perf_counter() - started


# ------------------------------------------------------------------------------------------------------- timing


def drop_caches() -> bool:
    """Drop the OS page cache (root on Linux); False when this process may not."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def fetch(url: str, timeout: float = 60.0) -> tuple[int, float]:
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    return status, time.perf_counter() - started


class DatasetteProcess:
    """``python -m datasette serve index.db`` (conclave's plugin loads itself), stopped on exit."""

    def __init__(self, home: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "datasette", "serve", str(home / "index.db"), "--port", str(self.port)],
            env=cli_env(home), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise SystemExit("datasette did not start")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def pages(base: str) -> list[str]:
    """The dashboard, every visible table page and every canned query of the index database."""
    with urllib.request.urlopen(f"{base}/index.json", timeout=120) as response:
        listing = json.load(response)
    paths = ["/-/conclave"]
    paths += [f"/index/{t['name']}" for t in listing.get("tables", []) if not t.get("hidden")]
    paths += [f"/index/{v['name']}" for v in listing.get("views", [])]
    paths += [f"/index/{q['name']}" for q in listing.get("queries", [])]
    return paths


def time_pages(home: Path, can_drop: bool) -> tuple[dict[str, tuple[int, float]], dict[str, tuple[int, float]]]:
    """(cold, warm): path -> (status, seconds). Each cold load is the first request of a fresh ``datasette``
    process after the page cache was dropped; the warm loads follow on one process."""
    probe = DatasetteProcess(home)
    try:
        paths = pages(probe.base)
    finally:
        probe.close()
    cold = {}
    for path in paths:
        if can_drop:
            drop_caches()
        server = DatasetteProcess(home)
        try:
            cold[path] = fetch(server.base + path)
        finally:
            server.close()
    server = DatasetteProcess(home)
    try:
        for path in paths:
            fetch(server.base + path)
        warm = {path: fetch(server.base + path) for path in paths}
    finally:
        server.close()
    return cold, warm


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure(home: Path, size: int, can_drop: bool) -> dict[str, Any]:
    figures: dict[str, Any] = {"size": size}
    # twice: with the journals read from disk (page cache dropped first, when this process may), then again from
    # the page cache, as right after they were written
    for label in ("cold", "warm"):
        if label == "cold" and can_drop:
            drop_caches()
        seconds, _ = conclave(home, "index", "rebuild")
        figures[f"index rebuild {label} s"] = seconds
        figures[f"index rebuild {label} cpu s"] = LAST_CPU[0]
        figures[f"rebuild {label} consultations/s"] = size / seconds
    figures["index bytes/consultation"] = du(home / "index.db") / size
    figures["journal bytes/consultation"] = du(home / "journal") / size
    if can_drop:
        drop_caches()
    figures["stats --week cold s"], _ = conclave(home, "stats", "--week")
    figures["stats --week cold cpu s"] = LAST_CPU[0]
    warm = []
    for _ in range(3):
        warm.append((conclave(home, "stats", "--week")[0], LAST_CPU[0]))
    figures["stats --week warm s"], figures["stats --week warm cpu s"] = min(warm)
    figures["stats --all-time warm s"] = min(conclave(home, "stats", "--all-time")[0] for _ in range(2))
    if can_drop:
        drop_caches()
    seconds, done = conclave(home, "logs", "verify", check=False)
    figures["logs verify s"] = seconds
    figures["logs verify cpu s"] = LAST_CPU[0]
    figures["logs verify exit"] = done.returncode
    figures["verify consultations/s"] = size / seconds
    for label, results in zip(("cold", "warm"), time_pages(home, can_drop), strict=True):
        figures[f"pages {label}"] = results
        figures[f"pages {label} worst s"] = max(t for _, t in results.values())
        figures[f"pages {label} non-200"] = sorted(p for p, (status, _) in results.items() if status != 200)
    return figures


def journal_sizes(seed_home: Path, seeds: dict[str, list[dict[str, Any]]]) -> dict[str, int]:
    """kind -> bytes of one copy as this writer journals it now."""
    sizes = {}
    for kind in seeds:
        home = seed_home.parent / f"one-{kind}"
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir()
        _write_copies(str(home), seeds, [(kind, "c-000000000000", time.time())])
        sizes[kind] = du(home / "journal" / "c-000000000000.jsonl")
        shutil.rmtree(home)
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="comma-separated home sizes")
    parser.add_argument("--work", type=Path, help="where the homes go (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the homes afterwards")
    parser.add_argument("--reuse", action="store_true",
                        help="measure the homes (and seed runs) already in --work instead of building them again")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes building a home")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    work = args.work or Path(tempfile.mkdtemp(prefix="conclave-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    can_drop = drop_caches()
    print(f"work dir {work}; cold = {'page cache dropped' if can_drop else 'fresh process only (no root)'}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)

    seed_home = work / "seed"
    if args.reuse and len(StoreLayout(seed_home).journal_ids()) == len(RUNS):
        layout = StoreLayout(seed_home)
        recorded = [read_records(layout.journal_path(cid)) for cid in layout.journal_ids()]  # in recording order
        seeds = dict(zip(RUNS, recorded, strict=True))
    else:
        seeds = record_seed(seed_home)
    for kind, size in journal_sizes(work / "seed", seeds).items():
        print(f"journal bytes, one {kind} consultation: {size:,} ({len(seeds[kind])} records)", flush=True)

    results = []
    for size in sizes:
        home = work / f"home-{size}"
        if args.reuse and len(StoreLayout(home).journal_ids()) == size:
            print(f"\n== {size:,} consultations (the journals already in {home}, load average "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
        else:
            shutil.rmtree(home, ignore_errors=True)
            built = build_home(home, seeds, size, args.workers)
            print(f"\n== {size:,} consultations (journaled in {built:.1f} s, load average "
                  f"{os.getloadavg()[0]:.1f})", flush=True)
        figures = measure(home, size, can_drop)
        results.append(figures)
        for key, value in figures.items():
            if key.startswith("pages ") and isinstance(value, dict):
                for path, (status, seconds) in value.items():
                    print(f"   {key[6:]:>4} {status} {seconds:7.3f} s  {path}")
            elif key != "size":
                print(f"  {key:32} {value:,.3f}" if isinstance(value, float) else f"  {key:32} {value}", flush=True)
        if not args.keep and not args.reuse:
            shutil.rmtree(home)

    numeric = [k for k, v in results[0].items() if isinstance(v, float)]
    print("\n" + f"{'figure':32}" + "".join(f"{r['size']:>12,}" for r in results) + "   ratio to first size")
    for key in numeric:
        row = [r[key] for r in results]
        ratios = " ".join(f"{v / row[0]:.2f}" if row[0] else "-" for v in row[1:])
        print(f"{key:32}" + "".join(f"{v:12,.3f}" for v in row) + f"   {ratios}")
    if not args.keep and args.work is None:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
