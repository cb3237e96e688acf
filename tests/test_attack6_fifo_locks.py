"""A FIFO where a journal or an eval run's lock file should be (anyone who may write the home can make one) no
longer blocks whoever asks whether a process holds it: opening a FIFO for reading waits for a writer, so one such
file hung ``conclave logs list`` and, through a ``running`` status cell, the whole Datasette server (render_cell
runs on its event loop). Both are now opened without blocking and read as held by nobody. Real ``datasette``
and ``conclave`` processes, real SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import clean_env

from conclave.store.sqlite_index import connect

STARTED = "2026-01-01T00:00:00+00:00"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_place_of_a_journal_or_run_lock_hangs_nobody(tmp_path: Path) -> None:
    db = connect(tmp_path / "index.db")
    db["consultations"].insert({"id": "c-fifo", "status": "running", "question": "q", "mode": "converge",
                                "started_at": STARTED})
    db["eval_runs"].insert({"run_id": "run-fifo", "status": "running", "started_at": STARTED})
    db.close()
    (tmp_path / "journal").mkdir()
    os.mkfifo(tmp_path / "journal" / "c-fifo.jsonl")
    (tmp_path / "eval" / "run-fifo").mkdir(parents=True)
    (tmp_path / "eval" / "run-fifo" / "run.json").write_text('{"run_id": "run-fifo", "status": "running"}')
    os.mkfifo(tmp_path / "eval" / "run-fifo" / "run.lock")
    commands = {
        "consultations": ([sys.executable, "-m", "datasette", "index.db", "--get", "/index/consultations?_col=status"],
                          "no process writes the journal of consultation c-fifo"),
        "eval_runs": ([sys.executable, "-m", "datasette", "index.db", "--get", "/index/eval_runs?_col=status"],
                      "no process runs eval run run-fifo"),
        "logs list": ([sys.executable, "-m", "conclave", "logs", "list"], "interrupted"),
    }
    for what, (command, expected) in commands.items():
        try:
            done = subprocess.run(command, cwd=tmp_path, env=clean_env(tmp_path), capture_output=True, text=True,
                                  timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{what}: still waiting on the FIFO after 20 s")
        assert done.returncode == 0 and expected in done.stdout, (what, done.stdout[-2000:], done.stderr[-2000:])
