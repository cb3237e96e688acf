"""The recent-consultations list both doors show (MCP's ``conclave_sessions``, the live view's list page): read
from the index, newest first, with the journal telling a running consultation from one nobody writes any more."""

from __future__ import annotations

from typing import Any

from conclave.errors import UsageError
from conclave.store.journal_file import live_status
from conclave.store.paths import StoreLayout
from conclave.store.sqlite_index import connect
from conclave.store.verify import RESUMABLE_STATUSES

SESSION_COLUMNS = ("id", "started_at", "status", "mode", "question", "rounds_completed", "planned_rounds",
                   "total_cost", "total_tokens", "confidence", "recommendation", "origin", "client_name")
#: ``interrupted``: the index says running but no process writes its journal any more (killed; see
#: :func:`~conclave.store.journal_file.live_status`): ``conclave_resume`` continues it
STATUSES = ("running", "interrupted", "complete", "completed_degraded", "partial", "aborted", "blocked")



def sessions(layout: StoreLayout, limit: int = 10, status: str | None = None,
             mode: str | None = None) -> list[dict[str, Any]]:
    """Recent consultations from the index, newest first; one the index calls running that no process writes any
    more reads ``interrupted``. The ``interrupted`` filter lists every consultation ``conclave_resume`` can
    continue: those killed, and those cancelled or failed (``partial``, ``aborted``)."""
    if status is not None and status not in STATUSES:
        raise UsageError(f"status: {status!r} is not one of: {', '.join(STATUSES)}")
    where, args = [], []
    if status == "interrupted":
        where.append(f"status in ({', '.join('?' * (1 + len(RESUMABLE_STATUSES)))})")
        args += ["running", *RESUMABLE_STATUSES]
    elif status is not None:
        where.append("status = ?")
        args.append(status)
    if mode is not None:
        where.append("mode = ?")
        args.append(mode)
    clause = f" where {' and '.join(where)}" if where else ""
    limit = max(1, min(int(limit), 500))
    # running and interrupted share the index's status: the journal tells them apart, after the query (the
    # running rows are few, so they are all read)
    cap = "" if status in ("running", "interrupted") else " limit ?"
    db = connect(layout.index_path)
    try:
        rows = db.conn.execute(
            f"select {', '.join(SESSION_COLUMNS)} from consultations{clause} order by started_at desc{cap}",
            [*args, *([limit] if cap else [])],
        ).fetchall()
    finally:
        db.close()
    out = []
    for row in rows:
        session = dict(zip(SESSION_COLUMNS, row, strict=True))
        if session["status"] == "running":
            try:
                session["status"] = live_status("running", layout.journal_path(session["id"]))
            except UsageError:  # an id no journal can be named after: nobody writes it
                session["status"] = "interrupted"
        wanted = (status is None or session["status"] == status
                  or (status == "interrupted" and session["status"] in RESUMABLE_STATUSES))
        if wanted:
            out.append(session)
    return out[:limit]
