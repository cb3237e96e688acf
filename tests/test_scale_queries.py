"""What the Datasette dashboard and the calls page ask of the index reads only what it needs (issue 28 item 2):
SQLite's own query plans, on an index migrated by conclave, show each of those queries reading a narrow covering
index or a rollup, never the wide rows of every consultation or every call. At 100k consultations a full scan of
either ran past Datasette's time limit (HTTP 500)."""

from __future__ import annotations

from pathlib import Path

import pytest
from index_queries import canned, plan

from conclave.datasette_plugin import CHARTS, DASHBOARD_TOTALS
from conclave.store.sqlite_index import connect

#: the dashboard's own totals and recent-consultations queries (conclave/datasette_plugin/__init__.py)
DASHBOARD = {
    "totals": DASHBOARD_TOTALS,
    "recent": "select id, started_at, status, mode, question, confidence, total_cost from consultations "
              "order by started_at desc limit 25",
    "calls page": "select * from calls order by started_at desc limit 101",
}


def canned_charts() -> dict[str, str]:
    return {name: canned(name) for name in (*(name for name, *_ in CHARTS), "verification_pass_rate")}


@pytest.mark.parametrize("name", [*(name for name, *_ in CHARTS), "verification_pass_rate", *DASHBOARD])
def test_each_dashboard_query_reads_an_index_or_a_rollup(tmp_path: Path, name: str) -> None:
    db = connect(tmp_path / "index.db")
    sql = {**canned_charts(), **DASHBOARD}[name]
    steps = plan(db.conn, sql)
    assert steps, sql
    for step in steps:
        if step.startswith(("SCAN", "SEARCH")):
            table = step.split()[1]
            narrow = "COVERING INDEX" in step or table.endswith("_daily") or (
                name in ("recent", "calls page") and "USING INDEX" in step)  # a walk down the sort order, limit
            assert narrow, f"{name}: {step}"
    db.close()
