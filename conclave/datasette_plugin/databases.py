"""The conclave indexes among the databases Datasette serves, and the pieces every conclave page shares."""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

from datasette.database import Database
from markupsafe import Markup

from conclave.store.index_reader import MIGRATION_NAMES
from conclave.store.sqlite_index import IndexOpenError, connect

MIGRATION_SET = "conclave.index"

_INDEX_FILES: set[str] = set()  # paths known to be conclave indexes (a file never stops being one)
#: served index files left behind conclave's schema: why (an unchanging file, a read-only home), and the canned
#: queries that cannot answer there, each with SQLite's reason
_NOT_UPGRADED: dict[str, tuple[str, dict[str, str]]] = {}


def _is_index_file(path: str, mutable: bool = True) -> bool:
    """Whether ``path`` is a conclave index. One Datasette serves unchanging (``mutable`` false) is read as such:
    a mode=ro connection to a WAL file creates its -wal and -shm files beside it, which ``-i`` must not."""
    if path in _INDEX_FILES:
        return True
    found = _holds_index(path, "mode=ro") if mutable else None
    if found is None:  # in a directory this process may not write, a WAL file opens only as an unchanging one
        found = _holds_index(path, "immutable=1")
    if found:
        _INDEX_FILES.add(path)
    return bool(found)


def _holds_index(path: str, mode: str) -> bool | None:
    """Whether the SQLite file at ``path`` holds conclave's migration set, read with ``mode``; ``None`` when it
    cannot be read so."""
    try:
        conn = sqlite3.connect(f"{Path(path).resolve().as_uri()}?{mode}", uri=True)
    except sqlite3.Error:
        return None
    try:
        conn.execute("select count(*) from sqlite_master").fetchone()
    except sqlite3.Error:
        conn.close()
        return None
    try:
        return conn.execute("select 1 from _sqlite_migrations where migration_set = ? limit 1",
                            [MIGRATION_SET]).fetchone() is not None
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def conclave_databases(datasette: Any) -> list[str]:
    """Names of the served databases that are conclave indexes."""
    names = []
    for name, db in datasette.databases.items():
        path = getattr(db, "path", None)
        if not path or not Path(path).exists():
            continue
        if _is_index_file(str(path), getattr(db, "is_mutable", True)):
            names.append(name)
    return names


def upgrade_index(path: Path) -> str | None:
    """Apply the pending migrations of the index at ``path`` through conclave's own ``connect()``: the same notice
    on stderr for a big index, the same write lock and single transaction as any conclave command. ``None`` once
    done (or nothing was pending); the one-line reason when it cannot be (a read-only home, another upgrade
    holding the lock past the busy timeout)."""
    try:
        connect(path).close()
    except IndexOpenError as exc:
        return str(exc)
    return None


async def upgrade_served(datasette: Any) -> None:
    """Bring every conclave index Datasette serves up to conclave's schema before it answers a request: one it may
    write (served without ``--immutable``/``-i``) is upgraded on a worker thread (a big index takes seconds).
    One left behind (served unchanging, or in a read-only home) stays as it is, is said in one line on stderr,
    and is remembered so its pages can say why (:func:`not_upgraded`)."""
    for name in conclave_databases(datasette):
        db = datasette.databases[name]
        path = str(db.path)
        writable = db.is_mutable  # served without --immutable/-i
        failure = await asyncio.to_thread(upgrade_index, Path(path)) if writable else None
        if writable and not _in_writable_directory(path) and _holds_index(path, "mode=ro") is None:
            # Datasette reads a database it may write with mode=ro, which a WAL file in a directory nobody may
            # write to cannot be opened with (its check of the databases ended in a traceback): it is served
            # unchanging instead, as `datasette -i` and `conclave browse` serve it there.
            route = db.route
            db = Database(datasette, path=path, is_mutable=False)
            datasette.remove_database(name)
            datasette.add_database(db, name=name, route=route)
            print(f"conclave: {path} is in a directory Datasette may not write: served unchanging, as "
                  "`datasette -i` would", file=sys.stderr, flush=True)
        try:  # through Datasette's own read connection (mode=ro, or immutable=1 for an unchanging file)
            rows = (await db.execute("select name from _sqlite_migrations where migration_set = ?",
                                     [MIGRATION_SET])).rows
        except sqlite3.Error:
            continue
        applied = {row[0] for row in rows}
        missing = [m.split("_", 1)[0] for m in MIGRATION_NAMES if m not in applied]
        if not missing:
            _NOT_UPGRADED.pop(path, None)
            continue
        if failure is None:
            how = ("its directory is read-only" if writable else
                   "Datasette serves it unchanging (--immutable or -i)")
            failure = f"the index {path} needs upgrading, which writes, and {how}"
        why = f"{failure} (pending: {', '.join(missing)})"
        _NOT_UPGRADED[path] = why, await _failing_queries(datasette, name)
        print(f"conclave: {why}; Datasette serves it as it is, and the pages that read what the upgrade adds say "
              "so", file=sys.stderr, flush=True)


def _in_writable_directory(path: str) -> bool:
    """Whether this process may write the directory of the file at ``path`` (the file's own: a symlink to it may
    stand in a directory that is writable)."""
    return os.access(Path(path).resolve().parent, os.W_OK)


async def _failing_queries(datasette: Any, name: str) -> dict[str, str]:
    """The canned queries of ``name`` that SQLite cannot even prepare there (a table or column added since), each
    with its reason; ``explain`` prepares a statement without running it."""
    failing = {}
    for query, spec in (datasette.metadata("queries", database=name) or {}).items():
        sql = spec["sql"] if isinstance(spec, dict) else spec
        params = dict.fromkeys(re.findall(r"(?<!:):(\w+)", sql))
        try:
            await datasette.databases[name].execute(f"explain {sql}", params, log_sql_errors=False)
        except sqlite3.Error as exc:
            failing[query] = str(exc)
    return failing


def not_upgraded(datasette: Any, database: str | None) -> tuple[str, dict[str, str]] | None:
    """Why the served index ``database`` is still behind conclave's schema, and the canned queries that cannot
    answer there; ``None`` when it is current (or not an index)."""
    path = getattr(datasette.databases.get(database), "path", None) if database else None
    return _NOT_UPGRADED.get(str(path)) if path else None


def page(datasette: Any, title: str, body: str, request: Any) -> Any:
    """One page in the conclave layout of Datasette's templates."""
    return datasette.render_template("conclave_page.html", {"title": title, "body": Markup(body)}, request=request)


async def chart_rows(datasette: Any, database: str, query: str) -> list[dict[str, Any]]:
    """The rows of one of the canned queries the charts draw (the same SQL a user can open and edit)."""
    sql = datasette.metadata("queries", database=database)[query]["sql"]
    return [dict(r) for r in (await datasette.databases[database].execute(sql)).rows]
