"""The conclave indexes among the databases Datasette serves, and the pieces every conclave page shares."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from markupsafe import Markup

MIGRATION_SET = "conclave.index"

_INDEX_FILES: set[str] = set()  # paths known to be conclave indexes (a file never stops being one)


def _is_index_file(path: str) -> bool:
    if path in _INDEX_FILES:
        return True
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        row = conn.execute("select 1 from _sqlite_migrations where migration_set = ? limit 1",
                           [MIGRATION_SET]).fetchone()
    except sqlite3.Error:
        return False
    finally:
        conn.close()
    if row is not None:
        _INDEX_FILES.add(path)
    return row is not None


def conclave_databases(datasette: Any) -> list[str]:
    """Names of the served databases that are conclave indexes."""
    names = []
    for name, db in datasette.databases.items():
        path = getattr(db, "path", None)
        if not path or not Path(path).exists():
            continue
        if _is_index_file(str(path)):
            names.append(name)
    return names


def page(datasette: Any, title: str, body: str, request: Any) -> Any:
    """One page in the conclave layout of Datasette's templates."""
    return datasette.render_template("conclave_page.html", {"title": title, "body": Markup(body)}, request=request)


async def chart_rows(datasette: Any, database: str, query: str) -> list[dict[str, Any]]:
    """The rows of one of the canned queries the charts draw (the same SQL a user can open and edit)."""
    sql = datasette.metadata("queries", database=database)[query]["sql"]
    return [dict(r) for r in (await datasette.databases[database].execute(sql)).rows]
