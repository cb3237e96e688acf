"""A ``running`` eval run's status cell on Datasette's pages reads the run's ``run.json``, a file of the home (which
anyone who can write the home shapes). A run.json that is valid JSON but no object (``[]``, ``5``) or is nested past
Python's recursion limit answered the whole eval_runs page with a 500; it now reads as one that cannot be read. And
a page of runs the home holds no run.json for listed every run of the home once per cell (the hint of read_run's
not-found error): 1,000 such rows in a home of 2,000 runs took seconds of the event loop. Real ``datasette serve``
processes over HTTP, real SQLite."""

from __future__ import annotations

import re
import time
from pathlib import Path

from browser_support import serve_datasette
from test_datasette_upgrade import get

from conclave.store.sqlite_index import connect

STARTED = "2026-01-01T00:00:00+00:00"
NOT_AN_OBJECT = {"a-list": "[]", "a-number": "5", "too-deep": "[" * 100_000 + "]" * 100_000}


def test_a_run_json_that_is_no_object_reads_as_unreadable_not_a_500(tmp_path: Path) -> None:
    db = connect(tmp_path / "index.db")
    for run_id, text in NOT_AN_OBJECT.items():
        (tmp_path / "eval" / run_id).mkdir(parents=True)
        (tmp_path / "eval" / run_id / "run.json").write_text(text)
        db["eval_runs"].insert({"run_id": run_id, "status": "running", "started_at": STARTED})
    db.close()
    with serve_datasette(tmp_path / "index.db") as url:
        for path in ("eval_runs?_col=status", "eval_runs_overview"):
            status, page = get(f"{url}/index/{path}")
            assert status == 200, (path, page[-3000:])
            for run_id in NOT_AN_OBJECT:
                assert f"the index says running, but the run.json of {run_id} cannot be read" in page, (path, run_id)


def test_a_page_of_runs_without_run_json_does_not_list_the_home_once_per_cell(tmp_path: Path) -> None:
    rows, runs = 1000, 2000
    db = connect(tmp_path / "index.db")
    db["eval_runs"].insert_all([{"run_id": f"gone{i:05d}", "status": "running", "started_at": STARTED}
                                for i in range(rows)])
    db["eval_runs"].insert_all([{"run_id": f"done{i:05d}", "status": "complete", "started_at": STARTED}
                                for i in range(rows)])
    db.close()
    for i in range(runs):
        (tmp_path / "eval" / f"r{i:05d}").mkdir(parents=True)
        (tmp_path / "eval" / f"r{i:05d}" / "run.json").write_text('{"status": "complete"}')
    with serve_datasette(tmp_path / "index.db") as url:
        timings = {}
        for status in ("complete", "running", "complete", "running"):  # each twice: the faster of the two
            started = time.perf_counter()
            code, page = get(f"{url}/index/eval_runs?status={status}&_size={rows}&_col=status")
            took = time.perf_counter() - started
            timings[status] = min(took, timings.get(status, took))
            assert code == 200, page[-3000:]
            assert len(re.findall(r'class="cv-live-status', page)) == (rows if status == "running" else 0)
    # the same page with 1,000 status cells that each look for one file, against one with none: listing 2,000 runs
    # per cell added about 10 s on this machine (each cell stat'ed every run.json of the home)
    assert timings["running"] - timings["complete"] < 2.5, timings
