"""The graded history the ``learned`` aggregator fits its weights to: seat -> (right, graded) over the eval items in
a home's index that have a gold answer (of one task kind when given).

:func:`graded_history` reads it whole. An evaluation scores hundreds of items and each one's learned vote needs the
history as it stands then (every earlier run, plus this run's items indexed so far), so it keeps a
:class:`GradedHistory` instead: read once, then told of each item it indexes. It holds what
:func:`graded_history` would read at the same moment, without re-reading the whole history for every item."""

from __future__ import annotations

import functools
import sqlite3
from pathlib import Path
from typing import Any

from conclave.eval.scoring import is_correct

# SQLite picks each agent's round-1 answer out of the row's JSON (``answers`` holds every protocol's), not Python; a
# row whose JSON is unreadable, or whose round 1 is not an object, is skipped. Identical rows (same seat, gold and
# answer) are graded once, and counted as often as they occur.
_GRADED = ("select e.kind, e.expected, json_extract(e.answers, '$.round_1.\"' || a.agent || '\"') as given, "
           "a.persona, a.provider, a.model, count(*) from eval_items e "
           "join agents a on a.consultation_id = e.consultation_id "
           "where e.expected is not null and json_valid(e.answers) "
           "and json_type(e.answers, '$.round_1') = 'object'")
_GROUPS = " group by e.kind, e.expected, given, a.persona, a.provider, a.model"

Tallies = dict[str | None, dict[str, list[int]]]  # kind -> seat -> [right, graded]


def graded_history(home: Path, kind: str | None) -> dict[str, tuple[int, int]]:
    """seat -> (right, graded) over the eval items in ``home``'s index (of task ``kind`` when given)."""
    where, params = ("", ()) if kind is None else (" and e.kind = ?", (kind,))
    tallies: Tallies = {}
    db = _open(home)
    if db is not None:
        try:
            _tally(tallies, _graded(db, where, params), 1)
        finally:
            db.close()
    return _of_kind(tallies, kind)


class GradedHistory:
    """:func:`graded_history` of every kind, read from ``home``'s index once and kept current by :meth:`forget` and
    :meth:`learn` around each write of an item's row: callable as ``history(kind)``."""

    def __init__(self, home: Path) -> None:
        self.home = Path(home)
        self._tallies: Tallies = {}
        self._db = _open(self.home)
        if self._db is not None:
            _tally(self._tallies, _graded(self._db, "", ()), 1)

    def __call__(self, kind: str | None) -> dict[str, tuple[int, int]]:
        return _of_kind(self._tallies, kind)

    def forget(self, run_id: str, item_id: str) -> None:
        """Before the item's row is written: take out what its earlier row (a re-run replaces it) counted."""
        _tally(self._tallies, self._item(run_id, item_id), -1)

    def learn(self, run_id: str, item_id: str) -> None:
        """After the item's row was written (or failed to be): count what the index now holds for it."""
        _tally(self._tallies, self._item(run_id, item_id), 1)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _item(self, run_id: str, item_id: str) -> list[tuple[Any, ...]]:
        if self._db is None:  # the index (or its eval tables) did not exist yet: it may now
            self._db = _open(self.home)
        if self._db is None:
            return []
        return _graded(self._db, " and e.run_id = ? and e.item_id = ?", (run_id, item_id))


def _open(home: Path) -> sqlite3.Connection | None:
    """A read-only connection to ``home``'s index once it has the tables the history reads, else None."""
    path = Path(home) / "index.db"
    if not path.exists():
        return None
    db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    tables = {r[0] for r in db.execute("select name from sqlite_master where type = 'table'")}
    if {"eval_items", "agents"} <= tables:
        return db
    db.close()
    return None


def _graded(db: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    return db.execute(_GRADED + where + _GROUPS, params).fetchall()


def _tally(tallies: Tallies, rows: list[tuple[Any, ...]], sign: int) -> None:
    for item_kind, expected, given, persona, provider, model, count in rows:
        if given is None:
            continue
        tally = tallies.setdefault(item_kind, {}).setdefault(f"{persona}@{provider}/{model}", [0, 0])
        tally[0] += sign * count * int(_right(given, item_kind or "exact", expected))
        tally[1] += sign * count


def _of_kind(tallies: Tallies, kind: str | None) -> dict[str, tuple[int, int]]:
    out: dict[str, list[int]] = {}
    for item_kind, seats in tallies.items():
        if kind is not None and item_kind != kind:
            continue
        for seat, (right, graded) in seats.items():
            tally = out.setdefault(seat, [0, 0])
            tally[0] += right
            tally[1] += graded
    return {seat: (right, graded) for seat, (right, graded) in out.items() if graded}


@functools.lru_cache(maxsize=1 << 16)
def _right(given: Any, kind: str, expected: Any) -> bool:
    """:func:`is_correct` of one graded answer, remembered: the same rows are graded again and again."""
    return is_correct(given, {"kind": kind, "answer": expected})
