"""The SQLite index (sqlite-utils): opening it migrated, write transactions safe across processes, rebuild.

Several processes write at once (Hydra multirun): every write takes ``BEGIN IMMEDIATE`` so it queues on the busy
timeout instead of failing when a deferred transaction tries to upgrade its lock.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import sqlite3
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conclave.store.indexer import Batch, build_batch
from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout

BUSY_TIMEOUT_S = 30.0
# A consultation waits at most this long for the index lock at a round boundary (it blocks the event loop);
# on timeout the records stay pending for the next flush.
LIVE_BUSY_TIMEOUT_S = 2.0


def connect(path: Path, *, migrate: bool = True, busy_timeout_s: float | None = None) -> Any:
    """A sqlite-utils Database on ``path``: WAL, busy timeout, migrations applied (under the write lock)."""
    from sqlite_utils import Database

    from conclave.store.migrations import migrations

    path.parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: we issue BEGIN IMMEDIATE ourselves; Python's implicit deferred BEGIN would deadlock
    # concurrent writers into "database is locked".
    timeout = BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
    conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
    db = Database(conn)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        # The index can be rebuilt from the journal, so it does not need an fsync per commit.
        conn.execute("PRAGMA synchronous=NORMAL")
        if migrate and migrations.pending(db):
            with write_txn(db):
                migrations.apply(db)  # re-reads what is pending, now that this process holds the lock
    except BaseException:
        db.close()
        raise
    return db


@contextlib.contextmanager
def write_txn(db: Any) -> Iterator[Any]:
    """One write transaction that takes the write lock up front (waiting up to the busy timeout)."""
    db.conn.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.conn.execute("COMMIT")
    except BaseException:
        if db.conn.in_transaction:  # SQLite may already have rolled back (e.g. disk full)
            db.conn.execute("ROLLBACK")
        raise


class IndexWriter:
    """Writes journal records to the index, one transaction per call. Connects lazily; reconnects after errors."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: Any = None

    def write(self, records: list[dict[str, Any]]) -> None:
        if not records:
            return
        batch = build_batch(records)
        if self._db is None:
            self._db = connect(self.path, busy_timeout_s=LIVE_BUSY_TIMEOUT_S)
        try:
            with write_txn(self._db):
                batch.write(self._db)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            with contextlib.suppress(sqlite3.Error):
                db.close()


@dataclass(frozen=True)
class RebuildReport:
    consultations: int
    records: int
    seconds: float


def rebuild(layout: StoreLayout, *, chunk: int = 500, workers: int | None = None) -> RebuildReport:
    """Recreate the index from every journal through the same indexing code path as live recording.

    The schema is dropped and migrated afresh in one transaction; journals are then replayed in chunks of
    ``chunk`` consultations, one ``BEGIN IMMEDIATE`` transaction each, so concurrent writers wait at most one
    chunk. Reading and parsing runs in ``workers`` other processes (default: one per CPU but this one, which
    writes meanwhile; 0 = read here too). An index that is not a SQLite database is replaced.
    """
    started = time.perf_counter()
    db = _connect_or_recreate(layout.index_path)
    try:
        _recreate_schema(db)
        ids = layout.journal_ids()
        chunks = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
        records = 0
        if workers is None:
            workers = max(1, (os.cpu_count() or 1) - 1)
        for batch, count in _load_batches(layout, chunks, workers):
            with write_txn(db):
                batch.write(db)
            records += count
    finally:
        db.close()
    return RebuildReport(len(ids), records, time.perf_counter() - started)


def _recreate_schema(db: Any) -> None:
    from conclave.store.migrations import migrations

    with write_txn(db):
        conn = db.conn
        for (view,) in conn.execute("select name from sqlite_master where type = 'view'").fetchall():
            conn.execute(f"drop view [{view}]")
        conn.execute("drop table if exists consultations_fts")  # takes its shadow tables with it
        # Everything else, whatever schema version (or damage) it is at, is dropped and migrated afresh.
        tables = conn.execute(
            "select name from sqlite_master where type = 'table' and name not like 'sqlite_%' "
            "and name != ?", [migrations.migrations_table]).fetchall()
        for (table,) in tables:
            conn.execute(f"drop table [{table}]")
        if db[migrations.migrations_table].exists():
            conn.execute(f"delete from {migrations.migrations_table} where migration_set = ?", [migrations.name])
        migrations.apply(db)


def _load_chunk(home: str, ids: list[str]) -> tuple[Batch, int]:
    """Read and fold the journals of ``ids`` (runs in a worker process)."""
    layout = StoreLayout(Path(home))
    batch = Batch()
    count = 0
    for cid in ids:
        records = read_records(layout.journal_path(cid))
        build_batch(records, batch)
        count += len(records)
    return batch, count


def _load_batches(layout: StoreLayout, chunks: list[list[str]], workers: int) -> Iterator[tuple[Batch, int]]:
    """Batches in chunk order; with workers, at most two chunks per worker are in flight (bounded memory)."""
    # fork only: a spawned worker would re-import ``python -m conclave``'s __main__ and run the CLI again.
    if workers < 1 or len(chunks) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        for ids in chunks:
            yield _load_chunk(str(layout.home), ids)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        pending: deque[Future[tuple[Batch, int]]] = deque()
        queue = iter(chunks)
        for ids in itertools.islice(queue, 2 * workers):
            pending.append(pool.submit(_load_chunk, str(layout.home), ids))
        while pending:
            result = pending.popleft().result()
            for ids in itertools.islice(queue, 1):
                pending.append(pool.submit(_load_chunk, str(layout.home), ids))
            yield result


def _connect_or_recreate(path: Path) -> Any:
    """The index without migrating it (its schema is about to be recreated); a file that is not a SQLite
    database is deleted first."""
    try:
        return connect(path, migrate=False)
    except sqlite3.DatabaseError as exc:
        if "not a database" not in str(exc) and "malformed" not in str(exc):
            raise
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    return connect(path, migrate=False)
