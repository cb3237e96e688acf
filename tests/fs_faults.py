"""Storage faults for real: runs ``conclave`` on a small tmpfs (full, or read-only) inside a private mount
namespace, so the kernel itself answers ENOSPC or EROFS. Used by ``test_storage_faults.py``.

    unshare -rm python tests/fs_faults.py SCENARIO HOME REPORT OVERRIDES_JSON

``unshare -rm`` gives an unprivileged user its own mount namespace; the tmpfs disappears with it, so each
scenario runs every step it needs here and writes what the test checks to REPORT (a JSON file outside the tmpfs),
with a copy of the journal directory next to it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

QUESTION = "Should we shard the database?"


def unshare_available() -> bool:
    """True when this machine lets us mount a tmpfs in a private mount namespace."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt || "
                            "mount -t tmpfs -o size=64k tmpfs /tmp"], capture_output=True, timeout=30)
    return probe.returncode == 0


def mount_tmpfs(home: Path, size: str, *, read_only: bool = False) -> None:
    home.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(home)], check=True)
    if read_only:
        subprocess.run(["mount", "-o", "remount,ro", str(home)], check=True)


def fill(home: Path) -> Path:
    """Write a file until the filesystem refuses another byte."""
    filler = home / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (1 << 20, 1 << 12, 1 << 8, 1):
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler


def conclave(home: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "conclave", *args], capture_output=True, text=True,
                          env={**os.environ, "CONCLAVE_HOME": str(home)}, cwd="/", timeout=120)
    return {"code": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def journal_text(home: Path) -> str:
    paths = sorted((home / "journal").glob("*.jsonl")) if (home / "journal").is_dir() else []
    return paths[0].read_text() if paths else ""


def main() -> int:
    scenario, home, report_path, overrides = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
    consult = [QUESTION, *overrides, "cost.auto_approve=true", "rounds=4"]  # the four-round debate
    report: dict[str, Any] = {}
    if scenario == "read_only":
        mount_tmpfs(home, "4m", read_only=True)
        report["run"] = conclave(home, *consult)
    elif scenario == "full_at_start":
        mount_tmpfs(home, "1m")
        fill(home)
        report["run"] = conclave(home, *consult)
        report["journals"] = sorted(p.name for p in (home / "journal").glob("*")) if (home / "journal").is_dir() else []
        report["verify"] = conclave(home, "logs", "verify")
    elif scenario == "full_mid_run":
        mount_tmpfs(home, "16m")
        process = subprocess.Popen([sys.executable, "-m", "conclave", *consult], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env={**os.environ, "CONCLAVE_HOME": str(home)},
                                   cwd="/")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and '"round_number":2,"round_type":"synthesis"},"prev"' not in journal_text(home):
            time.sleep(0.02)
        filler = fill(home)  # round 2 is running: its end cannot be written
        out, err = process.communicate(timeout=120)
        report["run"] = {"code": process.returncode, "stdout": out, "stderr": err}
        report["verify"] = conclave(home, "logs", "verify")
        fill(home)  # what the stopped run cut back (a refused write, its index) freed: the disk is full again
        report["resume_full"] = conclave(home, "resume")
        filler.unlink()
        report["resume"] = conclave(home, "resume")
        report["verify_after"] = conclave(home, "logs", "verify")
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    if (home / "journal").is_dir():
        shutil.copytree(home / "journal", report_path.parent / "journal", dirs_exist_ok=True)
    if (home / "index.db").exists():
        source, copy = sqlite3.connect(home / "index.db"), sqlite3.connect(report_path.parent / "index.db")
        source.backup(copy)
        source.close()
        copy.close()
    report_path.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
