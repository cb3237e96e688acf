"""Threads of follow-up questions: a consultation, the ones it follows up on, and the follow-ups of it.

The index links each follow-up to its parent (``consultations.parent_id``); :data:`THREAD_SQL` walks up to the
thread's first consultation and back down through every follow-up (Datasette's ``thread`` query is the same).
A consultation the index does not hold yet is linked through its journal's ``consultation:started`` record.
"""

from __future__ import annotations

import contextlib
import sqlite3
from typing import Any

from conclave import events as ev
from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout
from conclave.store.sqlite_index import IndexOpenError, connect

#: the thread of ``:id``, from its first consultation down, each row with its depth (0: the first question)
THREAD_SQL = """
with recursive
  up(id, parent_id, depth) as (
    select id, parent_id, 0 from consultations where id = :id
    union all
    select c.id, c.parent_id, up.depth - 1 from consultations c join up on c.id = up.parent_id
  ),
  root(id) as (select id from up order by depth limit 1),
  down(id, depth) as (
    select id, 0 from root
    union all
    select c.id, down.depth + 1 from consultations c join down on c.parent_id = down.id
  )
select down.depth, c.id, c.parent_id, c.started_at, c.status, c.question
from down join consultations c on c.id = down.id order by down.depth, c.started_at
"""


def journal_parent(layout: StoreLayout, cid: str) -> str | None:
    """The parent a consultation's journal names (None for a fresh question or an unreadable journal)."""
    try:
        records = read_records(layout.journal_path(cid))
    except (OSError, ValueError):
        return None
    started = next((r for r in records if r.get("type") == ev.CONSULTATION_STARTED), None)
    parent = ((started or {}).get("data") or {}).get("parent")
    return parent if isinstance(parent, str) else None


def thread(layout: StoreLayout, cid: str) -> list[dict[str, Any]]:
    """The thread ``cid`` belongs to: ``{depth, id, parent_id, started_at, status, question}`` rows from its first
    consultation down; empty when ``cid`` is no follow-up and has none."""
    rows: list[dict[str, Any]] = []
    if layout.index_path.exists():
        with contextlib.suppress(IndexOpenError, sqlite3.Error):
            db = connect(layout.index_path)
            try:
                rows = [dict(r) for r in db.query(THREAD_SQL, {"id": cid})]
            finally:
                db.close()
    if not any(r["id"] == cid for r in rows):  # not indexed yet: its ancestors from the journals
        rows, seen, current = [], {cid}, journal_parent(layout, cid)
        rows.append({"depth": 0, "id": cid, "parent_id": current, "started_at": None, "status": None,
                     "question": None})
        while current is not None and current not in seen:
            seen.add(current)
            parent = journal_parent(layout, current)
            rows.insert(0, {"depth": 0, "id": current, "parent_id": parent, "started_at": None, "status": None,
                            "question": None})
            current = parent
        for depth, row in enumerate(rows):
            row["depth"] = depth
    return rows if len(rows) > 1 else []
