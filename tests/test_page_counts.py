"""What a table page and the provider_failures query count, they count from an index (issue 28: cold at 100k
consultations eleven pages took 0.51-1.04 s). Datasette counts a table page's rows with ``select count(*)`` and each
declared facet with a grouping query; SQLite reads the narrowest b-tree that has every row, or the table itself.
Real SQLite on an index the recorder wrote (query plans and answers), real Datasette for the pages."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import pytest
from index_queries import metadata
from index_queries import plan as plan_of

from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.sqlite_index import connect, rebuild
from conclave.testing.synthetic_events import record_synthetic, synthetic_events

#: tables of a few rows a consultation at most (an exit decision per cross-examination round; objection rounds and
#: substitutions only when a detector acts or a provider fails over): their facets may read the rows
SMALL = {"exit_decisions", "objection_rounds", "substitutions"}
M032_INDEXES = ("artifacts_count", "consultations_status", "consultations_judge", "calls_failures",
                "consultations_early_termination")


def record(home: Path, count: int = 8) -> Path:
    return record_synthetic(home, range(count))


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("home"))


def plan(index: Path, sql: str) -> list[str]:
    db = connect(index)
    try:
        return plan_of(db.conn, sql)
    finally:
        db.close()


def reads(steps: list[str]) -> list[str]:
    return [s for s in steps if s.startswith(("SCAN", "SEARCH"))]


def test_every_declared_facet_is_counted_from_an_index(index: Path) -> None:
    """Datasette's facet query, flattened by SQLite: a scan of the table read every row of history (safety_checks'
    five unindexed facets each ran into Datasette's 200 ms facet limit at 100k; warm, the page took 0.74 s)."""
    checked = 0
    for table, declared in metadata()["tables"].items():
        for column in declared.get("facets") or []:
            if table in SMALL:
                continue
            sql = (f"select {column} as value, count(*) as count from (select * from {table}) "
                   f"where {column} is not null group by {column}")
            steps = reads(plan(index, sql))
            assert steps and all("COVERING INDEX" in s for s in steps), (table, column, steps)
            checked += 1
    assert checked >= 9  # consultations (4), groupthink_checks (2), safety_checks, run_summary (2)


def test_the_artifacts_page_counts_from_an_index(index: Path) -> None:
    """The count read the whole artifacts table (370 MB at 100k; the page took 0.76 s cold)."""
    steps = reads(plan(index, "select count(*) from artifacts"))
    assert steps == ["SCAN artifacts USING COVERING INDEX artifacts_count"], steps


def test_provider_failures_reads_only_the_failed_calls(index: Path) -> None:
    sql = metadata()["queries"]["provider_failures"]["sql"]
    steps = reads(plan(index, sql))
    assert steps == ["SCAN calls USING COVERING INDEX calls_failures"], steps
    db = connect(index)
    try:
        found = db.conn.execute(sql).fetchall()
        raw = db.conn.execute(sql.replace("from calls where", "from calls not indexed where")).fetchall()
    finally:
        db.close()
    assert found and sorted(found) == sorted(raw)
    assert {r[2] for r in found} == {"rate_limited"}  # the synthetic runs' failed attempts


def schema(index: Path) -> list[Any]:
    db = connect(index)
    try:
        return db.conn.execute("select name, sql from sqlite_master where type = 'index' order by name").fetchall()
    finally:
        db.close()


def test_m032_m033_upgrade_an_index_written_before_and_rebuild_writes_them(tmp_path: Path) -> None:
    index = record(tmp_path, 3)
    live = schema(index)
    assert set(M032_INDEXES) <= {name for name, _ in live}
    db = connect(index)
    try:
        for name in M032_INDEXES:
            db.conn.execute(f"drop index {name}")
        db.conn.execute("delete from _sqlite_migrations where name in "
                        "('m032_page_counts', 'm033_early_termination_decisions')")
    finally:
        db.close()
    assert schema(index) == live  # connect() applied m032 and m033
    rebuild(StoreLayout(tmp_path), workers=0)
    assert schema(index) == live


def test_the_pages_show_their_counts_and_facets(index: Path) -> None:
    from datasette.app import Datasette  # an optional extra, imported where the test needs it

    async def fetch(path: str) -> Any:
        return await Datasette([str(index)]).client.get(path)

    db = connect(index)
    try:
        counts = {t: db.conn.execute(f"select count(*) from {t}").fetchone()[0]
                  for t in ("artifacts", "safety_checks", "consultations", "agents")}
    finally:
        db.close()
    for table, count in counts.items():
        page = asyncio.run(fetch(f"/index/{table}"))
        assert page.status_code == 200, table
        assert re.search(rf"\b{count:,} rows?\b", page.text), table  # the row count is shown, not hidden
        assert "facets-timed-out" not in page.text, table
        for column in metadata()["tables"][table].get("facets") or []:
            assert f'id="facet-{column}"' in page.text, (table, column)
    assert 'id="facet-tier_name"' in asyncio.run(fetch("/index/safety_checks?_facet=tier_name")).text
    failures = asyncio.run(fetch("/index/provider_failures.json?_shape=array"))
    assert failures.status_code == 200 and failures.json()


RAW_SPENDING_PER_DAY = """
select substr(started_at, 1, 10) as day, count(*) as consultations, round(total(total_cost), 6) as cost,
       total(total_tokens) as tokens
from consultations where started_at is not null group by day order by day
"""
RAW_TOTALS = """
select count(*) as n, total(total_cost) as cost, total(total_tokens) as tokens, total(early_terminated) as early,
       total(cost_saved) as saved, total(filter_tokens_saved) as filtered
from consultations
"""


def test_the_dashboard_sums_the_daily_rollup(tmp_path: Path) -> None:
    """spending_per_day and the dashboard's totals read every consultation's index entry (0.16 s and 75 ms cold at
    100k); the consultation_daily rollup gives the same figures in a few rows a day."""
    from conclave.datasette_plugin import DASHBOARD_TOTALS

    recorder = Recorder(tmp_path)
    for n in range(12):  # twelve hours apart: several days
        for event in synthetic_events(n, spacing_s=43_200.0):
            recorder(event)
    recorder.close()
    index = StoreLayout(tmp_path).index_path
    spending = metadata()["queries"]["spending_per_day"]["sql"]
    db = connect(index)
    try:
        assert db.conn.execute(spending).fetchall() == db.conn.execute(RAW_SPENDING_PER_DAY).fetchall()
        assert len(db.conn.execute(spending).fetchall()) >= 4
        got, raw = db.conn.execute(DASHBOARD_TOTALS).fetchone(), db.conn.execute(RAW_TOTALS).fetchone()
        assert got[0] == raw[0] == 12 and got[2:] == raw[2:]
        assert round(got[1], 9) == round(raw[1], 9)  # summed per day, then over the days
        assert db.conn.execute("select early_terminated from consultations where early_terminated = 1").fetchall()
    finally:
        db.close()
    for sql in (spending, DASHBOARD_TOTALS):
        assert {s.split()[1] for s in reads(plan(index, sql))} == {"consultation_daily"}, sql
    empty = connect(tmp_path / "empty" / "index.db")
    try:
        assert empty.conn.execute(DASHBOARD_TOTALS).fetchone() == (0, 0.0, 0.0, 0.0, 0.0, 0.0)
    finally:
        empty.close()


def test_each_sorted_page_reads_its_first_rows_in_an_index_order(index: Path) -> None:
    """A table page opens on ``order by <sort_desc> desc limit 101``: safety_checks sorted every screening of history
    by seq (0.32 s cold at 100k); each now walks an index or its key backwards, with no sort."""
    sorted_pages = {table: declared["sort_desc"] for table, declared in metadata()["tables"].items()
                    if declared.get("sort_desc")}
    assert {"consultations", "calls", "safety_checks", "run_summary"} <= set(sorted_pages)
    for table, column in sorted_pages.items():
        steps = plan(index, f"select * from {table} order by {column} desc limit 101")
        assert not any("TEMP B-TREE" in s for s in steps), (table, steps)


def test_early_terminations_by_threshold_reads_its_partial_index(index: Path) -> None:
    """It read every consultation's row (0.34 s cold at 100k): m033's partial index holds what it sums."""
    sql = metadata()["queries"]["early_terminations_by_threshold"]["sql"]
    assert reads(plan(index, sql)) == ["SCAN consultations USING COVERING INDEX consultations_early_termination"]
    assert not any("TEMP B-TREE" in s for s in plan(index, sql))
    db = connect(index)
    try:
        found = db.conn.execute(sql).fetchall()
        raw = db.conn.execute(sql.replace("from consultations where", "from consultations not indexed where")
                              ).fetchall()
    finally:
        db.close()
    assert found and found == raw
