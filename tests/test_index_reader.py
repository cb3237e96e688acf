"""Issue 28: ``conclave stats`` reads the index with the standard library's sqlite3, without importing
sqlite-utils (and numpy with it), unless the index must be created or migrated. Real CLI processes, a real index."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from sqlite_utils import Database

from conclave.store.index_reader import MIGRATION_NAMES, open_current
from conclave.store.migrations import migrations
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.testing.synthetic_events import synthetic_events


def _record(home: Path, count: int) -> None:
    recorder = Recorder(home)
    for n in range(count):
        for event in synthetic_events(n):
            recorder(event)
    recorder.close()


def _stats(home: Path) -> tuple[dict, set[str]]:
    """``conclave stats --all-time --json`` as a process: its figures and the top-level packages it imported."""
    env = {**os.environ, "CONCLAVE_HOME": str(home)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "conclave", "stats", "--all-time", "--json"],
                          capture_output=True, text=True, env=env, check=True, timeout=120)
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    return json.loads(done.stdout), imported


def test_every_migration_is_listed_for_readers() -> None:
    assert tuple(m.name for m in migrations.pending(Database(memory=True))) == MIGRATION_NAMES


def test_stats_reads_a_current_index_without_sqlite_utils(tmp_path: Path) -> None:
    _record(tmp_path, 3)
    figures, imported = _stats(tmp_path)
    assert figures["consultations"] == 3
    assert "sqlite_utils" not in imported and "numpy" not in imported
    conn = open_current(StoreLayout(tmp_path).index_path)
    assert conn is not None
    conn.close()


def test_stats_migrates_an_index_that_needs_it_and_creates_a_missing_one(tmp_path: Path) -> None:
    _record(tmp_path, 2)
    index = StoreLayout(tmp_path).index_path
    with sqlite3.connect(index) as conn:
        conn.execute("delete from _sqlite_migrations where name = 'm023_artifact_gist'")
    assert open_current(index) is None
    figures, imported = _stats(tmp_path)
    assert figures["consultations"] == 2 and "sqlite_utils" in imported
    conn = open_current(index)  # migrated by that run
    assert conn is not None
    conn.close()
    empty = tmp_path / "empty"
    figures, _ = _stats(empty)
    assert figures["consultations"] == 0 and StoreLayout(empty).index_path.is_file()


def test_show_imports_no_sqlite_utils(tmp_path: Path) -> None:
    """``conclave show`` reads the journal: it imported sqlite-utils and numpy (0.4 s of CPU) only through the
    ``logs`` command's id lookup."""
    _record(tmp_path, 1)
    cid = StoreLayout(tmp_path).journal_ids()[0]
    env = {**os.environ, "CONCLAVE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "conclave", "show", cid[:6], "--format", "json"],
                          capture_output=True, text=True, env=env, check=True, timeout=120)
    assert json.loads(done.stdout)["consultation_id"] == cid
    imported = {line.split("|")[-1].strip().split(".")[0] for line in done.stderr.splitlines()
                if line.startswith("import time:")}
    assert "sqlite_utils" not in imported and "numpy" not in imported
