"""An index Datasette serves through a symlink (``datasette ~/shortcut.db``; SQLite follows it to the file) belongs
to the home of the file it names: the plugin looked for journals beside the symlink, so a consultation a process
was writing that very moment read ``interrupted`` with a hint to resume it, and its transcript and journal.json
fell back to the index tables. Real ``datasette`` processes (``--get``), real SQLite, a journal held by this test
as a live writer holds it."""

from __future__ import annotations

import fcntl
import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import clean_env
from fs_faults import unshare_available
from test_datasette_upgrade import behind

from conclave.store.sqlite_index import connect

RECORD = {"seq": 1, "type": "consultation:started", "consultation_id": "c-live", "ts": 1767225600.0,
          "data": {"question": "held by a live writer"}}


def test_an_index_served_through_a_symlink_reads_its_own_homes_journals(tmp_path: Path) -> None:
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    (home / "journal").mkdir(parents=True)
    elsewhere.mkdir()
    db = connect(home / "index.db")
    db["consultations"].insert({"id": "c-live", "status": "running", "question": "q", "mode": "converge",
                                "started_at": "2026-01-01T00:00:00+00:00"})
    db.close()
    (elsewhere / "shortcut.db").symlink_to(home / "index.db")
    journal = home / "journal" / "c-live.jsonl"
    journal.write_text(json.dumps(RECORD) + "\n")
    held = os.open(journal, os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # as the JournalWriter of a running consultation holds it
    try:
        for served, name in ((home / "index.db", "index"), (elsewhere / "shortcut.db", "shortcut")):
            pages = {}
            for page in (f"/{name}/consultations?_col=status", "/-/conclave/c-live/journal.json"):
                done = subprocess.run([sys.executable, "-m", "datasette", str(served), "--get", page],
                                      cwd=tmp_path, env=clean_env(home), capture_output=True, text=True, timeout=120)
                assert done.returncode == 0, (page, done.stderr[-2000:])
                pages[page] = done.stdout
            shown = re.findall(r'class="cv-live-status[^"]*"[^>]*>([^<]*)<', pages[f"/{name}/consultations?_col=status"])
            assert shown == ["running"], (served, shown)
            records = json.loads(pages["/-/conclave/c-live/journal.json"])
            assert [r.get("data", {}).get("question") for r in records] == ["held by a live writer"], (served, records)
    finally:
        os.close(held)


#: run under ``unshare -rm``: the index on a tmpfs made read-only, served through a symlink in a writable directory
READ_ONLY_BEHIND_A_SYMLINK = """
import json, shutil, subprocess, sys
from pathlib import Path
home, index, link, report = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
home.mkdir()
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(home)], check=True)
shutil.copy(index, home / "index.db")
subprocess.run(["mount", "-o", "remount,ro", str(home)], check=True)
link.symlink_to(home / "index.db")
done = subprocess.run([sys.executable, "-m", "datasette", str(link), "--get", "/-/conclave"], capture_output=True,
                      text=True, timeout=120)
report.write_text(json.dumps([done.returncode, done.stdout, done.stderr]))
"""


@pytest.mark.skipif(not unshare_available(), reason="needs `unshare -rm` to mount a read-only tmpfs")
def test_an_index_in_a_read_only_home_served_through_a_symlink_is_served_as_it_is(tmp_path: Path) -> None:
    """The plugin serves an index in a read-only directory unchanging (Datasette's mode=ro cannot open a WAL file
    there); it asked whether the symlink's directory was writable, so the same index reached through a symlink in
    a writable directory ended in Datasette's traceback."""
    old = behind(tmp_path / "old")
    report = tmp_path / "report.json"
    done = subprocess.run(["unshare", "-rm", sys.executable, "-c", READ_ONLY_BEHIND_A_SYMLINK, str(tmp_path / "home"),
                           str(old), str(tmp_path / "shortcut.db"), str(report)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    code, page, stderr = json.loads(report.read_text())
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert "served unchanging" in stderr
    assert "This index was written by an earlier release of conclave and is served as it is" in html.unescape(page)
