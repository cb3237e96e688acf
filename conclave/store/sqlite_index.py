"""The SQLite index (sqlite-utils): opening it migrated, write transactions safe across processes, rebuild.

Several processes write at once (Hydra multirun): every write takes ``BEGIN IMMEDIATE`` so it queues on the busy
timeout instead of failing when a deferred transaction tries to upgrade its lock.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.util
import os
import shutil
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from conclave.errors import StorageError, UsageError
from conclave.store.index_reader import READ_OPTIONAL
from conclave.store.indexer import Batch, build_batch, refresh_totals
from conclave.store.journal import live_status, os_cause, parse_records
from conclave.store.migrations import apply_all_but_deferred, migrations
from conclave.store.paths import StoreLayout, check_consultation_id
from conclave.store.rollups import refresh_days

BUSY_TIMEOUT_S = 30.0
# A consultation waits at most this long for the index lock at a round boundary (it blocks the event loop);
# on timeout the records stay pending for the next flush.
LIVE_BUSY_TIMEOUT_S = 2.0


def connect(path: Path, *, migrate: bool = True, busy_timeout_s: float | None = None) -> Any:
    """A sqlite-utils Database on ``path``: WAL, busy timeout, migrations applied (under the write lock).

    Raises :class:`IndexOpenError` (one line naming the path and the cause) when the index cannot be opened: a
    full disk, a read-only or missing home, something else where the file should be, a file that is not an index.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # what mkdir says when a file stands where a directory should be
        raise IndexOpenError(path, f"{exc.filename} is not a directory") from exc
    except OSError as exc:
        raise IndexOpenError(path, os_cause(exc)) from exc
    # isolation_level=None: we issue BEGIN IMMEDIATE ourselves; Python's implicit deferred BEGIN would deadlock
    # concurrent writers into "database is locked".
    timeout = BUSY_TIMEOUT_S if busy_timeout_s is None else busy_timeout_s
    try:
        conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None)
    except sqlite3.Error as exc:
        if _read_only_home(path):
            return _connect_read_only(path, exc, timeout)
        raise IndexOpenError(path, _sqlite_cause(exc, path)) from exc
    db = Database(conn)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        # The index can be rebuilt from the journal, so it does not need an fsync per commit.
        conn.execute("PRAGMA synchronous=NORMAL")
        if migrate and migrations.pending(db):
            with write_txn(db):
                migrations.apply(db)  # re-reads what is pending, now that this process holds the lock
    except sqlite3.Error as exc:
        db.close()
        if _read_only_home(path):
            return _connect_read_only(path, exc, timeout)
        raise IndexOpenError(path, _sqlite_cause(exc, path)) from exc
    except BaseException:
        db.close()
        raise
    return db


def _read_only_home(path: Path) -> bool:
    """The index exists in a directory this process may not write (a read-only mount, or its mode bits)."""
    return path.is_file() and not os.access(path.parent, os.W_OK)


def _connect_read_only(path: Path, failure: sqlite3.Error, timeout: float) -> Any:
    """The index of a read-only home, opened for reading: SQLite cannot create the files a WAL database is read
    through there, so it is opened as an unchanging file when no write-ahead log holds commits it would miss
    (nobody writes it while its directory is read-only, unless another user may write there: then a read can
    see a half-written commit, and says so as an error, never as data).
    Raises :class:`IndexOpenError` when neither works, or when the index needs migrating (which writes)."""
    wal = path.with_name(path.name + "-wal")
    modes = ["mode=ro"] + ([] if wal.exists() and wal.stat().st_size else ["immutable=1"])
    for mode in modes:
        conn = None
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?{mode}", uri=True, timeout=timeout,
                                   isolation_level=None)
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            db = Database(conn)
            pending = [m for m in migrations.pending(db) if m.name not in READ_OPTIONAL]
        except sqlite3.Error:
            if conn is not None:
                conn.close()
            continue
        if pending:
            db.close()
            raise IndexOpenError(path, "it needs upgrading, which writes, and its directory is read-only") from failure
        return db
    raise IndexOpenError(path, f"{_sqlite_cause(failure, path)} (its directory is read-only)") from failure


class IndexOpenError(StorageError):
    """The index cannot be opened. ``corrupt``: the file is not a SQLite database (``conclave index rebuild``
    recreates it from the journals)."""

    def __init__(self, path: Path, cause: str) -> None:
        self.path, self.corrupt = path, "not a database" in cause or "malformed" in cause
        hint = "; `conclave index rebuild` recreates it from the journals" if self.corrupt else ""
        super().__init__(f"cannot open the index {path}: {cause}{hint}")


def _sqlite_cause(exc: sqlite3.Error, path: Path) -> str:
    """SQLite's reason, saying so when the disk is full (SQLite often reports only "disk I/O error" then)."""
    cause = str(exc) or type(exc).__name__
    with contextlib.suppress(OSError):
        if shutil.disk_usage(path.parent).free == 0 and "full" not in cause:
            cause += " (the disk is full)"
    return cause


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


# Consultations with a round the index still calls running (the partial index m017 makes this a lookup).
_RUNNING_ROUNDS = "select distinct consultation_id from rounds where status = 'running'"
_KILLED_ROUNDS = "update rounds set status = 'interrupted', end_reason = 'killed' where consultation_id = ? " \
                 "and status = 'running'"


def settle_killed_rounds(db: Any, layout: StoreLayout) -> list[str]:
    """Record as ``interrupted`` (``end_reason`` ``killed``) every round the index still calls ``running`` whose
    consultation's journal no process writes (:func:`~conclave.store.journal_file.live_status`); returns those
    consultations.

    A process killed by SIGKILL (or a crash) cannot record its round's end, so whoever looks next records it:
    ``logs list``, ``index rebuild``, ``browse``. The consultation's own row keeps ``running`` (it is not over:
    ``resume`` continues it) and is shown ``interrupted`` by the same rule. A resumed consultation's round starts
    again as ``running`` and gets its real end from its own records. Writes only when there is such a round;
    the writers are checked again under the write lock, so a ``resume`` that took the journal meanwhile keeps its
    round running."""
    def killed() -> list[str]:
        return [cid for (cid,) in db.conn.execute(_RUNNING_ROUNDS).fetchall() if _nobody_writes(layout, cid)]

    if not killed():
        return []
    # best effort, never a wait: with the index busy (a rebuild, another writer), the next look settles them
    (busy_ms,) = db.conn.execute("PRAGMA busy_timeout").fetchone()
    db.conn.execute(f"PRAGMA busy_timeout={SETTLE_BUSY_MS}")
    try:
        with write_txn(db):
            ids = killed()
            db.conn.executemany(_KILLED_ROUNDS, [(cid,) for cid in ids])
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc) and "busy" not in str(exc):
            raise
        return []
    finally:
        db.conn.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
    return ids


#: how long settling killed rounds waits for the index's write lock (ms) before leaving it to the next look
SETTLE_BUSY_MS = 200


def _nobody_writes(layout: StoreLayout, cid: str) -> bool:
    try:
        path = layout.journal_path(cid)
    except UsageError:  # an id no journal can be named after: no process writes one
        return True
    return live_status("running", path) == "interrupted"


@dataclass(frozen=True)
class RebuildReport:
    consultations: int
    records: int
    seconds: float


# Writing a chunk takes about half as long as reading and folding it, so past this many workers more of them only
# queue for the write lock (each holding a chunk in memory and a page cache).
MAX_DEFAULT_WORKERS = 4


def _default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))  # the CPUs this process may run on
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_WORKERS))


# Pragmas for the connections that write a rebuild: no fsync at WAL checkpoints (an index lost to a power cut is
# rebuilt from the journal; rebuild() makes the result durable once at the end), a larger page cache, and freed
# pages not zeroed one by one (SQLite builds with secure_delete on in some distributions, Debian's among them:
# dropping the old tables then writes the whole old index again). Whatever the old index held is in the journal.
_BULK_PRAGMAS = ("PRAGMA synchronous=OFF", "PRAGMA cache_size=-65536", "PRAGMA secure_delete=FAST")


def rebuild(layout: StoreLayout, *, chunk: int = 500, workers: int | None = None) -> RebuildReport:
    """Recreate the index from every journal through the same indexing code path as live recording.

    The schema is dropped and migrated afresh in one transaction. Journals are then read, folded and written in
    chunks of ``chunk`` consultations, one ``BEGIN IMMEDIATE`` transaction each (rows and totals), so concurrent
    writers wait at most one chunk; the daily rollups are refreshed once at the end. ``workers`` forked processes
    (default: one per CPU, at most :data:`MAX_DEFAULT_WORKERS`) each read, fold and write whole chunks, taking
    turns at the write lock, so one parses while another writes (0 = everything in this process). Journals are
    not verified here: ``conclave logs verify`` does that. An index that is not a SQLite database is replaced.
    """
    started = time.perf_counter()
    _refuse_read_only(layout.index_path)
    db = _connect_or_recreate(layout.index_path)
    try:
        for pragma in _BULK_PRAGMAS:
            db.conn.execute(pragma)
        with _read_in_background(layout.index_path):  # dropping the old tables reads every page of them
            _recreate_schema(db)
        ids = layout.journal_ids()
        chunks = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
        records = 0
        days: dict[str, str] = {}  # day -> a consultation that started on it
        for count, chunk_days in _index_chunks(layout, chunks, _default_workers() if workers is None else workers):
            records += count
            for day, cid in chunk_days.items():
                days.setdefault(day, cid)
        with write_txn(db):  # search, views, rollup tables and indexes, built over the loaded rows
            migrations.apply(db)
        with write_txn(db):  # refresh_days() recomputes whole days: one consultation per day names them all
            refresh_days(db.conn, sorted(days.values()))
        settle_killed_rounds(db, layout)  # a journal records no end for a killed round: nobody writes it now
        db.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    finally:
        db.close()
    _fsync(layout.index_path)  # the rebuild's connections never fsync: make the new index durable once
    return RebuildReport(len(ids), records, time.perf_counter() - started)


def _refuse_read_only(path: Path) -> None:
    """A :class:`StorageError` naming the index when its directory may not be written: a rebuild writes it all."""
    if path.parent.is_dir() and not os.access(path.parent, os.W_OK):
        raise StorageError(f"cannot rebuild the index {path}: its directory {path.parent} is read-only")


def _fsync(index_path: Path) -> None:
    """fsync the database file and its write-ahead log (whatever part of it was not checkpointed)."""
    for path in (index_path, index_path.with_name(index_path.name + "-wal")):
        try:
            fd = os.open(path, os.O_RDWR)  # (Windows flushes only what is open for writing)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _read_in_background(path: Path) -> Iterator[None]:
    """Read ``path`` through the page cache in another thread meanwhile, when it fits in a quarter of memory.

    Dropping a table reads each of its pages, one at a time and out of order: when the old index is no longer
    in the page cache (it is usually cold when it is rebuilt), that costs several times a sequential read."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        size = path.stat().st_size
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows), or no index yet
        yield
        return
    if not 0 < size <= memory // 4:
        yield
        return
    stop = threading.Event()

    def read() -> None:
        with contextlib.suppress(OSError), open(path, "rb", buffering=0) as f:
            while not stop.is_set() and f.read(1 << 20):
                pass

    reader = threading.Thread(target=read, name="conclave-index-read", daemon=True)
    reader.start()
    try:
        yield
    finally:
        stop.set()
        reader.join()  # before any worker is forked


def _recreate_schema(db: Any) -> None:
    """Drop everything and apply every migration but :data:`~conclave.store.migrations.REBUILD_DEFERRED`: the
    tables rows go to. Those stay pending until the rows are loaded; a process that connects meanwhile (or after
    a rebuild that died) applies them itself, so the index is never left without them."""
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
        apply_all_but_deferred(db)


class _ChunkWriter:
    """Reads, folds and writes chunks of consultations (rows and totals; not rollups) on its own connection."""

    def __init__(self, layout: StoreLayout, lock: Any = None) -> None:
        self.layout = layout
        self.lock = lock  # taken around each write transaction, so writer processes queue without polling
        self._db: Any = None

    def __call__(self, ids: list[str]) -> tuple[int, dict[str, str]]:
        """Index the consultations ``ids``; their record count and the days they started on (day -> one of
        them), whose rollups the caller refreshes."""
        batch = Batch()
        count = 0
        journal_dir = str(self.layout.journal_dir)
        paths = [f"{journal_dir}/{check_consultation_id(cid)}.jsonl" for cid in ids]
        for path, data in _read_ahead(paths):
            records = parse_records(data, path)
            build_batch(records, batch)
            count += len(records)
        if self._db is None:
            self._db = connect(self.layout.index_path, migrate=False)
            for pragma in _BULK_PRAGMAS:
                self._db.conn.execute(pragma)
        turn = self.lock if self.lock is not None else contextlib.nullcontext()
        with turn, write_txn(self._db):
            batch.write_rows(self._db.conn)
            refresh_totals(self._db.conn, sorted(batch.consultations))
        days: dict[str, str] = {}
        for cid, columns in batch.consultations.items():
            started = columns.get("started_at")
            if isinstance(started, str):
                days.setdefault(started[:10], cid)
        return count, days

    def close(self) -> None:
        if self._db is not None:
            db, self._db = self._db, None
            db.close()


# Journals not read since they were written are often no longer in the page cache: ask the kernel to read this
# many files ahead of the one being parsed, so parsing does not wait for the disk.
READ_AHEAD = 32


def _read_ahead(paths: list[str], window: int = READ_AHEAD) -> Generator[tuple[str, bytes], None, None]:
    """``(path, contents)`` of each file in order, the next ``window`` files opened and their reading started."""
    advise = getattr(os, "posix_fadvise", None)
    opened: deque[tuple[str, int]] = deque()
    pending = iter(paths)

    def open_next() -> None:
        path = next(pending, None)
        if path is not None:
            fd = os.open(path, os.O_RDONLY)
            opened.append((path, fd))
            if advise is not None:
                advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)

    try:
        for _ in range(max(1, window)):
            open_next()
        while opened:
            path, fd = opened.popleft()
            with open(fd, "rb", buffering=0) as f:  # closes fd
                data = f.readall()
            open_next()
            yield path, data
    finally:
        for _, fd in opened:
            os.close(fd)


_worker: _ChunkWriter | None = None  # in a worker process


def _start_worker(layout: StoreLayout, lock: Any) -> None:
    global _worker
    _worker = _ChunkWriter(layout, lock)
    multiprocessing.util.Finalize(_worker, _worker.close, exitpriority=10)


def _write_chunk(ids: list[str]) -> tuple[int, dict[str, str]]:
    assert _worker is not None
    return _worker(ids)


def _index_chunks(layout: StoreLayout, chunks: list[list[str]], workers: int) -> Iterator[tuple[int, dict[str, str]]]:
    """Index every chunk; yields what :meth:`_ChunkWriter.__call__` returns for each (chunk order in this process,
    completion order with workers)."""
    # fork only: a spawned worker would re-import ``python -m conclave``'s __main__ and run the CLI again.
    if workers < 1 or len(chunks) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        writer = _ChunkWriter(layout)
        try:
            for ids in chunks:
                yield writer(ids)
        finally:
            writer.close()
        return
    context = multiprocessing.get_context("fork")
    lock = context.Lock()
    with ProcessPoolExecutor(min(workers, len(chunks)), mp_context=context, initializer=_start_worker,
                             initargs=(layout, lock)) as pool:
        futures = [pool.submit(_write_chunk, ids) for ids in chunks]
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:
            for future in futures:
                future.cancel()


def _connect_or_recreate(path: Path) -> Any:
    """The index without migrating it (its schema is about to be recreated); a file that is not a SQLite
    database is deleted first."""
    try:
        return connect(path, migrate=False)
    except IndexOpenError as exc:
        if not exc.corrupt:
            raise
    for suffix in ("", "-wal", "-shm"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    return connect(path, migrate=False)
