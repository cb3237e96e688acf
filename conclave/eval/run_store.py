"""Where evaluation runs live: ``$CONCLAVE_HOME/eval/<run_id>/`` (the truth) and the index tables (for browsing).

``run.json`` holds the run's definition and, once finished, its summary (written atomically); ``items.jsonl``
gets one fsynced line per finished item, so an interrupted run resumes with exactly the items it has not
finished. The process running a run holds an exclusive ``flock`` on its ``run.lock``; the operating system drops it
when that process ends, however it ends (SIGKILL too), so a reader tells a live run from a killed one however long
the live one has been quiet (a batch poll may wait an hour). Index writes take ``BEGIN IMMEDIATE`` like every
other index writer, so parallel processes (a joblib sweep) writing one home queue instead of losing rows.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from conclave.errors import UsageError
from conclave.store.journal import try_lock
from conclave.store.journal_file import NONBLOCKING
from conclave.store.sqlite_index import connect, write_txn

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_JSON_COLUMNS = ("answers", "overrides", "swept", "panel", "summary", "quality_layer", "quality_overrides")


def eval_dir(home: Path) -> Path:
    return Path(home) / "eval"


def check_run_id(run_id: str) -> str:
    if not _RUN_ID.fullmatch(run_id):
        raise UsageError(f"eval.run_id: invalid run id {run_id!r} (letters, digits, '_', '.', '-')")
    return run_id


def run_dir(home: Path, run_id: str) -> Path:
    return eval_dir(home) / check_run_id(run_id)


def run_ids(home: Path) -> list[str]:
    root = eval_dir(home)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "run.json").is_file())


def write_run(home: Path, run: dict[str, Any]) -> None:
    """Write ``run.json`` atomically (temp file, fsync, rename)."""
    directory = run_dir(home, run["run_id"])
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".run.", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(run, handle, ensure_ascii=False, indent=1, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, directory / "run.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_run(home: Path, run_id: str) -> dict[str, Any]:
    """The run's ``run.json``, its status as it stands: a run that says ``running`` while no process holds its
    lock was killed before it could say otherwise, and reads ``interrupted``."""
    data = _read_run_file(home, run_id)
    if data.get("status") in LIVE_STATUSES and ADVISORY_LOCKS and not is_being_run(home, run_id):
        # read again: the run may have ended (written its last status, then let go of the lock) meanwhile
        data = _read_run_file(home, run_id)
        if data.get("status") in LIVE_STATUSES:
            data["status"] = "interrupted"
    return data


def _read_run_file(home: Path, run_id: str) -> dict[str, Any]:
    path = run_dir(home, run_id) / "run.json"
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        known = run_ids(home)
        hint = f"; known runs: {', '.join(known[-5:])}" if known else "; no eval runs in this home"
        raise UsageError(f"eval run {run_id!r} not found under {eval_dir(home)}{hint}") from None
    return data


#: what ``run.json`` says while a process runs the run
LIVE_STATUSES = ("starting", "running")
#: where there is no flock (Windows), nothing tells a live run from a killed one: the file's status stands
ADVISORY_LOCKS = os.name == "posix"
LOCK_FILE = "run.lock"
#: how long a run's process waits for readers' momentary shared locks before saying another process runs it
LOCK_WAIT_S = 0.5


@contextmanager
def running(home: Path, run_id: str) -> Iterator[None]:
    """Hold the run's lock while this process runs it (released when the block ends or the process dies); a
    one-line :class:`UsageError` when another process runs it now."""
    directory = run_dir(home, run_id)
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while not try_lock(fd, exclusive=True):  # readers hold a shared lock for microseconds
            if time.monotonic() >= deadline:
                raise UsageError(f"eval.run_id: run {run_id} is being run by another process; wait for it to end, "
                                 f"or stop it and then `conclave eval resume {run_id}`")
            time.sleep(0.01)
        yield
    finally:
        os.close(fd)


def is_being_run(home: Path, run_id: str) -> bool:
    """True while some process holds the run's lock (is inside :func:`running`)."""
    try:
        fd = os.open(run_dir(home, run_id) / LOCK_FILE, os.O_RDONLY | NONBLOCKING)  # a FIFO there would block
    except OSError:  # no lock file: no process of this version ever ran it, none runs it now
        return False
    try:
        return not try_lock(fd, exclusive=False)
    finally:
        os.close(fd)


def append_item(home: Path, run_id: str, row: dict[str, Any], *, durable: bool = True) -> None:
    """Append one finished item's row; durable when this returns, or with ``durable=False`` only handed to the
    operating system (it survives the process being killed) until :func:`sync_items` (a batched run syncs the
    rows once per round barrier, before the next batch spends anything, not once per item)."""
    path = run_dir(home, run_id) / "items.jsonl"
    if durable:
        append_durably(path, row)
    else:
        _append(path, row, sync=False)


def sync_items(home: Path, run_id: str) -> None:
    """Make every row :func:`append_item` wrote so far durable (one fsync; nothing to do before the first)."""
    try:
        fd = os.open(run_dir(home, run_id) / "items.jsonl", os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def append_batch(home: Path, run_id: str, record: dict[str, Any]) -> None:
    """Append one record of the run's provider batches (submitted, answers, ended) to ``batches.jsonl``;
    durable when this returns, so a batch id is on disk before its polling starts."""
    path = run_dir(home, run_id) / "batches.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    append_durably(path, record)


def append_durably(path: Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line and fsync it: on disk when this returns."""
    _append(path, record, sync=True)


def _append(path: Path, record: dict[str, Any], *, sync: bool) -> None:
    line = (json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_batches(home: Path, run_id: str) -> list[dict[str, Any]]:
    """The run's batch records in order (a line cut off by a kill is skipped)."""
    path = run_dir(home, run_id) / "batches.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def read_items(home: Path, run_id: str) -> list[dict[str, Any]]:
    """Finished items of a run, one per item id (a later line wins); a torn last line is ignored."""
    path = run_dir(home, run_id) / "items.jsonl"
    rows: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows[str(row["item_id"])] = row
    return list(rows.values())


# ------------------------------------------------------------------------------------------------ the index

def _flat(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (json.dumps(v, ensure_ascii=False, sort_keys=True) if k in _JSON_COLUMNS and v is not None
                and not isinstance(v, str) else v) for k, v in row.items()}


def index_run(home: Path, run: dict[str, Any], items: list[dict[str, Any]] | None = None) -> None:
    """Upsert the run's row (and ``items``) into the index, in one write transaction."""
    db = connect(Path(home) / "index.db")
    try:
        with write_txn(db):
            _upsert_run(db, run)
            for row in items or []:
                _upsert_item(db, run["run_id"], row)
    finally:
        db.close()


def _upsert_run(db: Any, run: dict[str, Any]) -> None:
    _replace(db, "eval_runs", run)


def _upsert_item(db: Any, run_id: str, row: dict[str, Any]) -> None:
    _replace(db, "eval_items", {**row, "run_id": run_id})


def _replace(db: Any, table: str, row: dict[str, Any]) -> None:
    # Plain SQL inside the caller's BEGIN IMMEDIATE: sqlite-utils' upsert would commit it early. Rows are always
    # written whole, so replacing is an upsert.
    columns = [c for c in db[table].columns_dict if c in row]
    data = _flat({c: row[c] for c in columns})
    names = ", ".join(f"[{c}]" for c in columns)
    marks = ", ".join("?" * len(columns))
    db.conn.execute(f"insert or replace into [{table}] ({names}) values ({marks})", [data[c] for c in columns])


def index_item(home: Path, run_id: str, row: dict[str, Any], db: Any = None) -> None:
    owned = db is None
    db = connect(Path(home) / "index.db") if owned else db
    try:
        with write_txn(db):
            _upsert_item(db, run_id, row)
    finally:
        if owned:
            db.close()


def reindex(home: Path) -> int:
    """Refill ``eval_runs`` and ``eval_items`` from the run files (after ``conclave index rebuild``); the number
    of runs indexed."""
    ids = run_ids(home)
    if not ids:
        return 0

    db = connect(Path(home) / "index.db")
    try:
        with write_txn(db):
            for run_id in ids:
                _upsert_run(db, read_run(home, run_id))
                for row in read_items(home, run_id):
                    _upsert_item(db, run_id, row)
    finally:
        db.close()
    return len(ids)
