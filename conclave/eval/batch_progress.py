"""``eval:batch_progress``: where one provider batch of an evaluation run stands — provider, id, status, counts
done/failed/total — recorded each time its status or counts change.

Every door shows the same record: the terminal prints its line, which ``conclave_eval`` over MCP relays as its
progress (the task's status message, or a progress notification); the web view's run page streams the records
from the run's ``progress.jsonl``. That file is progress, not truth (``batches.jsonl`` is): it is appended without
fsync, and a line cut off by a kill is skipped.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from conclave.eval import run_store as store

TYPE = "eval:batch_progress"
STATES = ("in_progress", "completed", "expired", "cancelled", "failed")


@dataclass(frozen=True)
class BatchProgress:
    run_id: str
    provider: str
    batch_id: str
    #: the provider's own word for where the batch stands (``submitted`` when it was just accepted)
    status: str
    #: one of :data:`STATES`
    state: str
    done: int
    failed: int
    total: int
    #: the barrier the batch belongs to (every unfinished item waited on it), and the rounds its requests play
    wave: int
    rounds: tuple[int, ...]
    at: float

    def as_dict(self) -> dict[str, Any]:
        return {"type": TYPE, **asdict(self), "rounds": list(self.rounds)}

    def line(self) -> str:
        """The terminal's line (and MCP's progress message)."""
        return (f"conclave eval: batch {self.batch_id} ({self.provider}, round {'/'.join(map(str, self.rounds))}): "
                f"{self.status} {self.done}/{self.total} done, {self.failed} failed")

    @classmethod
    def from_dict(cls, data: Any) -> BatchProgress | None:
        """The record, or None when ``data`` is not a well-formed one."""
        if not isinstance(data, dict) or data.get("type") != TYPE or data.get("state") not in STATES:
            return None
        try:
            return cls(str(data["run_id"]), str(data["provider"]), str(data["batch_id"]), str(data["status"]),
                       str(data["state"]), int(data["done"]), int(data["failed"]), int(data["total"]),
                       int(data["wave"]), tuple(int(r) for r in data["rounds"]), float(data["at"]))
        except (KeyError, TypeError, ValueError):
            return None


def progress_path(home: Path, run_id: str) -> Path:
    return store.run_dir(home, run_id) / "progress.jsonl"


def record_progress(home: Path, progress: BatchProgress) -> None:
    """Append the record to the run's ``progress.jsonl`` (no fsync: a lost line is a stale view, not a lost fact)."""
    path = progress_path(home, progress.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(progress.as_dict(), ensure_ascii=False, sort_keys=True) + "\n")


def read_progress(home: Path, run_id: str, offset: int = 0) -> tuple[list[BatchProgress], int]:
    """The records after byte ``offset`` of the run's ``progress.jsonl``, and the offset after the last whole line
    (a line still being written is read next time)."""
    path = progress_path(home, run_id)
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    records = []
    for raw in data[:end].splitlines():
        try:
            record = BatchProgress.from_dict(json.loads(raw))
        except ValueError:
            record = None
        if record is not None:
            records.append(record)
    return records, offset + end
