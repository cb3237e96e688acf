"""``datasette -i`` (and ``--immutable``) serves a file unchanging: not only its bytes but its directory stay as they
were. The plugin told a conclave index from other SQLite files through a ``mode=ro`` connection, which on a WAL
file (every conclave index is one) creates ``-wal`` and ``-shm`` files beside it; served unchanging, the file is now
read as Datasette itself reads it (``immutable=1``). Real ``datasette`` processes (``--get``), real SQLite."""

from __future__ import annotations

import hashlib
import sqlite3
import subprocess
import sys
from pathlib import Path

from test_datasette_upgrade import behind, other_sqlite
from test_index_upgrade import env


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def wal_file(path: Path) -> Path:
    """A SQLite file of some other application, in WAL mode as conclave's index is."""
    other_sqlite(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("pragma journal_mode=wal")
    finally:
        conn.close()
    return path


def test_serving_unchanging_leaves_the_directory_as_it_was(tmp_path: Path) -> None:
    home = tmp_path / "home"
    index = behind(home)
    other = wal_file(home / "notes.db")
    before = {p.name: digest(p) for p in home.iterdir() if p.is_file()}
    assert {"index.db", "notes.db"} <= set(before) and not any(n.endswith(("-wal", "-shm")) for n in before)
    for flag, page, expected in (("-i", "/-/conclave", "served as it is"),
                                 ("--immutable", "/index/consultations.json?_col=id", '"rows"'),
                                 ("-i", "/notes/notes.json", "kept as it is")):
        done = subprocess.run([sys.executable, "-m", "datasette", flag, "index.db", flag, "notes.db",
                               "--get", page], cwd=home, env=env(home), capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and expected in done.stdout, (page, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr, done.stderr
        after = {p.name: digest(p) for p in home.iterdir() if p.is_file()}
        assert after == before, (flag, page, sorted(set(after) - set(before)))
    assert index.exists() and other.exists()
