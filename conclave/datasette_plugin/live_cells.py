"""A ``status`` cell on Datasette's own pages (table, row and query pages) of a conclave index shows what a
``running`` consultation or eval run is now, not what the index last recorded: a process killed with SIGKILL
cannot record its end, so the index would say ``running`` forever.

The rules are the ones every other view reads: :func:`~conclave.store.journal_file.live_status` (a process holds
the consultation journal's writer lock) and :func:`~conclave.eval.run_store.read_run` (a process holds the run's
lock). Only a cell whose value is a live status touches the disk (one lock attempt); every other cell is free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from conclave.errors import UsageError
from conclave.eval.run_store import LIVE_STATUSES, read_run, run_dir
from conclave.store.journal import live_status
from conclave.store.paths import check_consultation_id

#: table or view → the column holding the consultation id its ``status`` belongs to (a round's status is its
#: consultation's rule too: ``settle_killed_rounds`` reads it the same way)
CONSULTATION_KEY = {"consultations": "id", "run_summary": "id", "early_terminations": "id",
                    "rounds": "consultation_id", "eval_items": "consultation_id"}
#: tables whose ``status`` is an eval run's, keyed by ``run_id``
EVAL_TABLES = {"eval_runs"}


def home_of(db: Any) -> Path | None:
    """The conclave home a served index belongs to: the directory of its file (None for an in-memory one), the
    file's own and not that of a symlink to it, which SQLite follows too (``datasette ~/shortcut.db``)."""
    path = getattr(db, "path", None)
    return Path(path).resolve().parent if path else None


def valid_consultation_id(cid: Any) -> bool:
    try:
        return isinstance(cid, str) and bool(check_consultation_id(cid))
    except UsageError:
        return False


def shown_status(db: Any, cid: Any, status: Any) -> Any:
    """A consultation's status as ``logs list`` shows it: what the index calls ``running`` is interrupted once no
    process writes its journal (beside the index; one not there is written by nobody, and an id that cannot name a
    journal file names none)."""
    home = home_of(db)
    if status != "running" or home is None:
        return status
    if not valid_consultation_id(cid):
        return "interrupted"
    return live_status(status, home / "journal" / f"{cid}.jsonl")


def status_cell(row: Any, value: Any, table: str | None, db: Any) -> Markup | None:
    """The cell for a live ``status`` value, or None to leave the cell to the rest of ``render_cell``."""
    if value not in ("running", *LIVE_STATUSES):
        return None
    home = home_of(db)
    subject = _subject(row, table)
    if home is None or subject is None:
        return None
    kind, key = subject
    if kind == "run":
        return _run_cell(home, key, value)
    if value != "running":  # "starting" is an eval run's word only
        return None
    shown = shown_status(db, key, value)
    if shown == "running":
        return _cell(shown, f"a process is writing the journal of consultation {key} now")
    if not valid_consultation_id(key):
        return _cell(shown, f"the index says running, but {key!r} cannot name a journal: no process writes it")
    return _cell(shown, f"the index says running; no process writes the journal of consultation {key}, so it was "
                        f"killed: `conclave resume {key}` continues it")


def _subject(row: Any, table: str | None) -> tuple[str, Any] | None:
    """Whose status the row's ``status`` is: ("run", run id), ("consultation", id) or None (some other status:
    an HTTP status, an artifact's or a claim's, a rollup's count key)."""
    if table is not None:
        if table in EVAL_TABLES:
            return _keyed("run", _get(row, "run_id"))
        if table in CONSULTATION_KEY:
            return _keyed("consultation", _get(row, CONSULTATION_KEY[table]))
        return None
    # a query's row: a consultation's id (or its consultation_id, as an eval item's or a round's) wins over run_id
    cid = _get(row, "id")
    if cid is None:
        cid = _get(row, "consultation_id")
    if cid is not None:
        return _keyed("consultation", cid)
    return _keyed("run", _get(row, "run_id"))


def _keyed(kind: str, key: Any) -> tuple[str, Any] | None:
    if isinstance(key, dict):  # a foreign key Datasette expanded to its label
        key = key.get("value")
    return (kind, key) if isinstance(key, str) else None


def _get(row: Any, key: str) -> Any:
    try:
        return row[key]
    except (KeyError, IndexError, TypeError):
        return None


def _run_cell(home: Path, run_id: str, value: str) -> Markup:
    missing = _cell(value, f"the index says {value}, but this home holds no run.json for {run_id!r}")
    try:
        path = run_dir(home, run_id) / "run.json"
    except UsageError:  # not a run id: it names no file
        return missing
    if not path.is_file():  # looked for first: read_run's error for a missing run lists every run of the home
        return missing
    try:
        shown = read_run(home, run_id).get("status")
    except UsageError:  # removed meanwhile
        return missing
    except (OSError, ValueError, RecursionError, AttributeError):  # unreadable, not JSON, nested past Python's
        # recursion limit, or not a JSON object (read_run asks it for its status)
        return _cell(value, f"the index says {value}, but the run.json of {run_id} cannot be read")
    if shown in LIVE_STATUSES:
        return _cell(str(shown), f"a process is running eval run {run_id} now")
    if shown == "interrupted":
        return _cell("interrupted", f"the index says {value}; no process runs eval run {run_id}, so it was killed: "
                                    f"`conclave eval resume {run_id}` continues it")
    return _cell(str(shown), f"the index says {value}; the run's run.json says {shown}")


def _cell(shown: str, why: str) -> Markup:
    killed = " cv-killed" if shown == "interrupted" else ""
    return Markup(f'<span class="cv-live-status{killed}" title="{escape(why)}">{escape(shown)}</span>')
