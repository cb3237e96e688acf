"""A batched evaluation writes an item's row to items.jsonl without fsync (one fsync per round barrier, issue 29):
the row must still survive the process being killed right after, and read back whole."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from conclave.eval import run_store as store


def test_an_unsynced_row_survives_sigkill_and_sync_makes_it_durable(tmp_path: Path) -> None:
    (store.run_dir(tmp_path, "r-unsynced")).mkdir(parents=True)
    store.sync_items(tmp_path, "r-unsynced")  # nothing written yet: nothing to do, no error
    script = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from conclave.eval import run_store as store
        home = Path({str(tmp_path)!r})
        store.append_item(home, "r-unsynced", {{"item_id": "a", "status": "complete"}}, durable=False)
        store.append_item(home, "r-unsynced", {{"item_id": "b", "status": "complete"}}, durable=False)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == -9, done.stderr
    assert [r["item_id"] for r in store.read_items(tmp_path, "r-unsynced")] == ["a", "b"]
    store.sync_items(tmp_path, "r-unsynced")
    store.append_item(tmp_path, "r-unsynced", {"item_id": "a", "status": "complete", "again": True})
    assert store.read_items(tmp_path, "r-unsynced")[0].get("again") is True  # a later line wins, as before
