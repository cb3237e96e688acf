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
import sys
import time
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlite_utils import Database

from conclave.errors import StorageError, UsageError
from conclave.store.cores import default_workers
from conclave.store.index_reader import READ_OPTIONAL
from conclave.store.indexer import Batch, build_batch, refresh_totals
from conclave.store.journal import live_status, os_cause, parse_records, read_records, try_lock
from conclave.store.migrations import migrations, page_bytes, upgrade_notice
from conclave.store.paths import StoreLayout, check_consultation_id
from conclave.store.rollups import sum_all_days, write_sums

BUSY_TIMEOUT_S = 30.0
# A consultation waits at most this long for the index lock at a round boundary (it blocks the event loop);
# on timeout the records stay pending for the next flush.
LIVE_BUSY_TIMEOUT_S = 2.0
#: after an upgrade said so, free pages from this many bytes are worth a VACUUM, and the user is told how
RECLAIM_NOTICE_BYTES = 16 * 1024 * 1024


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
            _upgrade(db, path)
    except sqlite3.Error as exc:
        db.close()
        if _read_only_home(path):
            return _connect_read_only(path, exc, timeout)
        raise IndexOpenError(path, _sqlite_cause(exc, path)) from exc
    except BaseException:
        db.close()
        raise
    return db


def _upgrade(db: Any, path: Path) -> None:
    """Apply the pending migrations in one write transaction: a process killed or interrupted meanwhile leaves the
    index as it was, and the next to connect applies them; readers see the old schema until the commit. On a big
    index, a line on stderr before a migration that rewrites tables, and one after saying how to give the disk
    back the pages the rewrite left free. Raises :class:`IndexOpenError` when another process holds the write lock
    past the busy timeout (at 100,000 consultations, another process's upgrade can)."""
    try:
        _apply_pending(db)
    except sqlite3.OperationalError as exc:
        if "database is locked" not in str(exc):
            raise
        raise IndexOpenError(path, "another process is writing it, as an upgrade of a big index after an update "
                                   "of conclave does for a while; try again when it is done") from exc


def _apply_pending(db: Any) -> None:
    with write_txn(db):
        notice = upgrade_notice(db)  # what is pending, now that this process holds the lock
        if notice:
            print(notice, file=sys.stderr, flush=True)
        started = time.perf_counter()
        # What an upgrade frees is what it copied elsewhere or the journal keeps: zeroing those pages, as SQLite
        # builds with SECURE_DELETE do on every delete, wrote each dropped table once more (10-15% of the
        # upgrade at 10k). (A page cache of 32 or 128 MiB instead of the default 2 MiB saved nothing measurable:
        # it moved the writing from the rewrite to the commit.)
        (secure_delete,) = db.conn.execute("PRAGMA secure_delete").fetchone()
        db.conn.execute("PRAGMA secure_delete=0")
        try:
            migrations.apply(db)
        finally:
            db.conn.execute(f"PRAGMA secure_delete={int(secure_delete)}")
    if notice:
        free = page_bytes(db)[1]
        reclaim = (f"; `conclave index vacuum` gives its {free / 1e6:,.0f} MB of free pages back to the disk"
                   if free >= RECLAIM_NOTICE_BYTES else "")
        print(f"conclave: index upgraded in {time.perf_counter() - started:.1f} s{reclaim}", file=sys.stderr,
              flush=True)


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


# Pragmas of the connections that load a rebuild's scratch file: no rollback journal and no fsync (a scratch file
# that anything fails to finish is thrown away; rebuild() makes the finished one durable once), a larger page cache.
_SCRATCH_PRAGMAS = ("PRAGMA journal_mode=OFF", "PRAGMA synchronous=OFF", "PRAGMA cache_size=-65536")
#: how long installing a rebuilt index waits for other connections to the old one to finish a transaction
INSTALL_BUSY_TIMEOUT_S = 1.0


#: consultations per chunk of a rebuild, at most: a transaction's worth of rows held in memory
MAX_CHUNK = 500
#: chunks per worker, at least, when there are enough consultations: while one worker writes its chunk the
#: others parse theirs, so a home split into as many chunks as workers would leave them queueing at the end
CHUNKS_PER_WORKER = 4


def rebuild(layout: StoreLayout, *, chunk: int | None = None, workers: int | None = None) -> RebuildReport:
    """Recreate the index from every journal through the same indexing code path as live recording.

    The rows are loaded into a scratch file beside the index (``index.db.rebuild``), in chunks of ``chunk``
    consultations (default: up to :data:`MAX_CHUNK`, :data:`CHUNKS_PER_WORKER` per worker at least), one
    transaction each (rows and totals); then search, views and indexes are built over them
    once. ``workers`` forked processes (default:
    :func:`~conclave.store.cores.default_workers`) each read, fold and write whole chunks, taking turns at the
    write lock, so one parses while another writes (0 = everything in this process). The finished rows are then
    copied in key order into a second file (``index.db.packed``, SQLite's ``VACUUM INTO``), the daily rollups
    summed on a thread meanwhile (:func:`~conclave.store.rollups.sum_all_days`) and added to it, and it replaces the
    index in one step (:func:`_install`): a rebuild that dies at any point leaves the old index as it was.
    Journals written to while it ran are indexed again over the result (:func:`_catch_up`). Journals are not
    verified here: ``conclave logs verify`` does that. An index that is not a SQLite database is replaced.
    """
    started = time.perf_counter()
    target = layout.index_path
    _refuse_read_only(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise IndexOpenError(target, os_cause(exc)) from exc
    scratch = target.with_name(target.name + ".rebuild")
    packed = target.with_name(target.name + ".packed")
    since = time.time()
    with _only_rebuild(scratch) as fd:
        try:
            ids, records = _build(layout, scratch, packed, chunk, default_workers() if workers is None else workers)
            _install(packed, target)
        finally:  # (both are this rebuild's alone while it holds the scratch file's lock)
            packed.unlink(missing_ok=True)  # not renamed into place (copied into an index held open, or failed)
            if _is_file(fd, scratch):
                scratch.unlink()
    _catch_up(layout, since)
    return RebuildReport(len(ids), records, time.perf_counter() - started)


@contextlib.contextmanager
def _only_rebuild(scratch: Path) -> Iterator[int]:
    """Hold an advisory lock on the scratch file (a descriptor of it) for the whole rebuild: two rebuilds would
    load one file. The lock dies with its process, so a rebuild killed half way never blocks the next one."""
    try:
        fd = os.open(scratch, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StorageError(f"cannot rebuild the index: cannot create {scratch}: {os_cause(exc)}") from None
    try:
        if not try_lock(fd, exclusive=True):
            raise StorageError(f"cannot rebuild the index: another `conclave index rebuild` is writing {scratch}")
        os.ftruncate(fd, 0)  # what a rebuild killed half way left
        yield fd
    finally:
        os.close(fd)  # after every SQLite connection to the file is closed (closing a file drops POSIX locks)


def _is_file(fd: int, path: Path) -> bool:
    """True when ``path`` names the file open as ``fd``."""
    try:
        found, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def _build(layout: StoreLayout, scratch: Path, packed: Path, chunk: int | None,
           workers: int) -> tuple[list[str], int]:
    """Load every journal into ``scratch``, finish it as an index and copy that into ``packed``, made durable;
    the ids indexed and the record count."""
    db = _connect_scratch(scratch)
    try:
        with write_txn(db):
            migrations.apply(db)  # the whole schema, over empty tables: quick, and nothing built that is dropped
            later = _set_aside(db.conn)
        ids = layout.journal_ids()
        if chunk is None:
            chunk = max(1, min(MAX_CHUNK, -(-len(ids) // (CHUNKS_PER_WORKER * max(1, workers)))))
        chunks = [ids[i : i + chunk] for i in range(0, len(ids), chunk)]
        records = sum(_index_chunks(layout, scratch, chunks, workers))
        with write_txn(db):  # indexes and search, built once over the loaded rows
            for sql in later:
                db.conn.execute(sql)
            db.conn.execute("INSERT INTO consultations_fts (consultations_fts) VALUES ('rebuild')")
        settle_killed_rounds(db, layout)  # a journal records no end for a killed round: nobody writes it now
        # Rows inserted one at a time leave the pages of keyed tables (WITHOUT ROWID) and unique indexes about 12%
        # empty (dbstat, 10k home): copied in key order, the index holds full pages (at 100k: 14.8 KB a
        # consultation instead of 15.9). VACUUM INTO writes that copy once, where VACUUM writes it and then copies
        # it back. The daily rollups are summed from the same rows meanwhile, on the other core (both only read
        # the file), and written into the copy: at 100k they took 3.8 s of a serial tail of 16.
        packed.unlink(missing_ok=True)  # what a rebuild killed half way left (VACUUM INTO wants no file there)
        with ThreadPoolExecutor(1) as rollups:
            summing = rollups.submit(sum_all_days, scratch)
            db.conn.execute("VACUUM INTO ?", [str(packed)])
            sums = summing.result()
    finally:
        db.close()
    try:
        conn = sqlite3.connect(str(packed), isolation_level=None)
        try:
            conn.execute("BEGIN")
            write_sums(conn, sums)
            conn.execute("COMMIT")
            conn.execute("PRAGMA journal_mode=WAL")  # what the index is opened in (kept in the file)
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise IndexOpenError(packed, _sqlite_cause(exc, packed)) from exc
    _fsync(packed)  # nothing fsynced it (nor the loading connections): make the new index durable once, now
    return ids, records


def _set_aside(conn: Any) -> list[str]:
    """Drop the index's secondary indexes and its triggers (the search index's), and return the SQL that makes
    them again, in the order they were made: over loaded rows an index is built once, sorted, instead of kept up
    row by row, and the search index is filled in one pass. The unique indexes stay (upserts rely on them).
    Rebuilding with the whole schema made first, rather than deferring the migrations that build indexes, builds
    no index that a later migration drops (at 100k: m004's, m021's and m022's, 6.6 s and 170 MB of free pages)."""
    rows = conn.execute(
        "select type, name, sql from sqlite_master where sql is not null "
        "and (type = 'trigger' or (type = 'index' and sql not like 'create unique%')) order by rowid").fetchall()
    for type_, name, _sql in rows:
        conn.execute(f'DROP {type_.upper()} "{name}"')
    return [sql for _type, _name, sql in rows]


def _connect_scratch(path: Path) -> Any:
    """A sqlite-utils Database on a rebuild's scratch file, set for loading (:data:`_SCRATCH_PRAGMAS`)."""
    try:
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        for pragma in _SCRATCH_PRAGMAS:
            conn.execute(pragma)
    except sqlite3.Error as exc:
        raise IndexOpenError(path, _sqlite_cause(exc, path)) from exc
    return Database(conn)


def _install(scratch: Path, target: Path) -> None:
    """Put the finished ``scratch`` index in the place of ``target``, all at once.

    Renamed over it when no other connection has it open (its write-ahead log is emptied and removed first,
    under its lock: a leftover log would be read as the new file's). Otherwise (``browse``, ``serve``, a
    consultation being recorded) copied into it with SQLite's backup API: one write transaction, which those
    connections see as any other commit, and which a crash rolls back. An old index that is not a SQLite
    database is simply replaced."""
    if not target.exists():
        _remove_database(target)  # a log or shared-memory file left without its database
        _replace(scratch, target)
        return
    try:
        old = sqlite3.connect(str(target), timeout=INSTALL_BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.Error as exc:  # a directory where the index should be, no permission
        raise IndexOpenError(target, _sqlite_cause(exc, target)) from exc
    try:
        try:
            old.execute("PRAGMA journal_mode=DELETE")  # refused while another connection has it open
            old.execute("BEGIN EXCLUSIVE")  # no process opens the old file between the check and the rename
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise IndexOpenError(target, _sqlite_cause(exc, target)) from exc
            new = sqlite3.connect(str(scratch), isolation_level=None)
            try:
                old.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
                new.backup(old)
            finally:
                new.close()
            return
        except sqlite3.DatabaseError as exc:
            if "not a database" not in str(exc) and "malformed" not in str(exc):
                raise IndexOpenError(target, _sqlite_cause(exc, target)) from exc
            old.close()
            _remove_database(target)
        _replace(scratch, target)
    finally:
        old.close()


def _replace(scratch: Path, target: Path) -> None:
    try:
        os.replace(scratch, target)
    except OSError as exc:
        raise IndexOpenError(target, os_cause(exc)) from exc
    with contextlib.suppress(OSError):  # the rename made durable (not where directories cannot be opened)
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove_database(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        path.with_name(path.name + suffix).unlink(missing_ok=True)


def _catch_up(layout: StoreLayout, since: float) -> None:
    """Index again, over the installed index, every journal written to since ``since`` (epoch seconds): a
    consultation recorded while the rebuild ran wrote its later rows to the old index, and the rebuild read its
    journal as it was then. Indexing is idempotent, so a journal indexed twice gives the same rows."""
    changed = []
    margin = 1.0  # file times come from a clock coarser than time.time()
    with contextlib.suppress(OSError), os.scandir(layout.journal_dir) as entries:  # (Path objects: 2 s at 100k)
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.name.endswith(".jsonl") and entry.stat().st_mtime >= since - margin:
                    changed.append(entry.name[: -len(".jsonl")])
    changed.sort()
    if not changed:
        return
    batch = Batch()
    for cid in changed:
        with contextlib.suppress(OSError):
            build_batch(read_records(layout.journal_path(cid)), batch)
    db = connect(layout.index_path)
    try:
        with write_txn(db):
            batch.write(db)
        settle_killed_rounds(db, layout)  # as the rebuild did: a round of a journal nobody writes was killed
    finally:
        db.close()


def _refuse_read_only(path: Path) -> None:
    """A :class:`StorageError` naming the index when its directory may not be written: a rebuild writes it all."""
    if path.parent.is_dir() and not os.access(path.parent, os.W_OK):
        raise StorageError(f"cannot rebuild the index {path}: its directory {path.parent} is read-only")


def _fsync(index_path: Path) -> None:
    """fsync the database file."""
    fd = os.open(index_path, os.O_RDWR)  # (Windows flushes only what is open for writing)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _ChunkWriter:
    """Reads, folds and writes chunks of consultations (rows and totals; not rollups) on its own connection to
    the scratch file ``path``."""

    def __init__(self, layout: StoreLayout, path: Path, lock: Any = None) -> None:
        self.layout = layout
        self.path = path
        self.lock = lock  # taken around each write transaction, so writer processes queue without polling
        self._db: Any = None

    def __call__(self, ids: list[str]) -> int:
        """Index the consultations ``ids`` (rows and totals; the caller fills the rollups); their record count."""
        batch = Batch()
        count = 0
        journal_dir = str(self.layout.journal_dir)
        paths = [f"{journal_dir}/{check_consultation_id(cid)}.jsonl" for cid in ids]
        for path, data in _read_ahead(paths):
            records = parse_records(data, path)
            build_batch(records, batch)
            count += len(records)
        if self._db is None:
            self._db = _connect_scratch(self.path)
        turn = self.lock if self.lock is not None else contextlib.nullcontext()
        with turn, write_txn(self._db):
            batch.write_rows(self._db.conn)
            refresh_totals(self._db.conn, sorted(batch.consultations))
        return count

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


def _start_worker(layout: StoreLayout, path: Path, lock: Any) -> None:
    global _worker
    _worker = _ChunkWriter(layout, path, lock)
    multiprocessing.util.Finalize(_worker, _worker.close, exitpriority=10)


def _write_chunk(ids: list[str]) -> int:
    assert _worker is not None
    return _worker(ids)


def _index_chunks(layout: StoreLayout, path: Path, chunks: list[list[str]],
                  workers: int) -> Iterator[int]:
    """Index every chunk; yields what :meth:`_ChunkWriter.__call__` returns for each (chunk order in this process,
    completion order with workers)."""
    # fork only: a spawned worker would re-import ``python -m conclave``'s __main__ and run the CLI again.
    if workers < 1 or len(chunks) < 2 or "fork" not in multiprocessing.get_all_start_methods():
        writer = _ChunkWriter(layout, path)
        try:
            for ids in chunks:
                yield writer(ids)
        finally:
            writer.close()
        return
    context = multiprocessing.get_context("fork")
    lock = context.Lock()
    with ProcessPoolExecutor(min(workers, len(chunks)), mp_context=context, initializer=_start_worker,
                             initargs=(layout, path, lock)) as pool:
        futures = [pool.submit(_write_chunk, ids) for ids in chunks]
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:
            for future in futures:
                future.cancel()
