"""The calls and artifacts pages, cost_by_provider and the verification pass rate at scale (issue 28: cold at 10k
the pages took 0.75 s, 0.68 s and 0.60 s, and m022's covering index for the pass rate was 1.4 KB of a
consultation's 19 KB). The declared facets of the per-call and per-artifact tables are each counted from an index;
cost_by_provider and verification_pass_rate sum daily rollups (m028) kept as consultations are indexed, with the
figures the raw rows give; an index written before m028 is upgraded when a process next connects, and ``index
rebuild`` writes the same rollups. Real SQLite on indexes the recorder wrote, real Datasette for the pages."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.sqlite_index import connect, rebuild
from conclave.testing.synthetic_events import synthetic_events

METADATA = Path(__file__).parent.parent / "conclave" / "store" / "datasette_metadata.yaml"
RAW_PASS_RATE = """
select question_id, answered_by, count(*), sum(passed), round(100.0 * sum(passed) / count(*), 1)
from verification where passed is not null group by question_id, answered_by order by question_id, answered_by
"""
RAW_COST = """
select provider, model, count(*), sum(outcome = 'ok'), sum(outcome not in ('ok', 'cancelled')), sum(hedge),
       sum(input_tokens), sum(output_tokens), round(total(cost), 6), round(avg(latency_s), 3)
from calls group by provider, model order by provider, model
"""


def record(home: Path, count: int = 6) -> Path:
    recorder = Recorder(home)
    for n in range(count):
        for event in synthetic_events(n):
            recorder(event)
    recorder.close()
    return StoreLayout(home).index_path


def metadata() -> dict[str, Any]:
    index: dict[str, Any] = yaml.safe_load(METADATA.read_text())["databases"]["index"]
    return index


def pass_rate_sql() -> str:
    return metadata()["queries"]["verification_pass_rate"]["sql"] + ", answered_by"


def figures(index: Path) -> dict[str, Any]:
    db = connect(index)
    try:
        return {
            "cost_by_provider": db.conn.execute("select * from cost_by_provider order by provider, model").fetchall(),
            "pass_rate": db.conn.execute(pass_rate_sql()).fetchall(),
            "raw_cost": db.conn.execute(RAW_COST).fetchall(),
            "raw_pass_rate": db.conn.execute(RAW_PASS_RATE).fetchall(),
            "model_daily": db.conn.execute("select * from model_daily order by 1, 2, 3").fetchall(),
            "verification_daily": db.conn.execute("select * from verification_daily order by 1, 2, 3").fetchall(),
            "indexes": {row[1] for row in db.conn.execute("pragma index_list(verification)")},
        }
    finally:
        db.close()


@pytest.mark.parametrize("table", ["calls", "artifacts"])
def test_each_declared_facet_of_the_big_tables_is_counted_from_an_index(tmp_path: Path, table: str) -> None:
    """Datasette counts a facet with this query; a table scan of every call or artifact took the page past 0.5 s."""
    index = record(tmp_path, 2)
    facets = metadata()["tables"][table]["facets"]
    db = connect(index)
    try:
        for column in facets:
            sql = (f"select {column} as value, count(*) as count from (select * from {table}) "
                   f"where {column} is not null group by {column}")
            steps = [row[3] for row in db.conn.execute(f"explain query plan {sql}")]
            reads = [s for s in steps if s.startswith(("SCAN", "SEARCH"))]
            assert reads and all("COVERING INDEX" in s for s in reads), (column, steps)
            assert db.conn.execute(sql).fetchall(), column
    finally:
        db.close()


def test_the_pages_show_the_indexed_facets(tmp_path: Path) -> None:
    from datasette.app import Datasette  # an optional extra, imported where the test needs it

    index = record(tmp_path, 2)

    async def fetch(path: str) -> Any:
        return await Datasette([str(index)]).client.get(path)

    for path, shown, gone in (("/index/calls", ["provider", "model"], ["outcome", "round_number"]),
                              ("/index/artifacts", ["artifact_type"], ["status", "round_number"])):
        page = asyncio.run(fetch(path))
        assert page.status_code == 200
        assert all(f'id="facet-{c}"' in page.text for c in shown), path
        assert not any(f'id="facet-{c}"' in page.text for c in gone), path
    picked = asyncio.run(fetch("/index/calls?_facet=outcome"))
    assert 'id="facet-outcome"' in picked.text  # still a facet from the column menu


def test_the_rollups_give_what_the_raw_rows_give(tmp_path: Path) -> None:
    found = figures(record(tmp_path))
    assert found["cost_by_provider"] == found["raw_cost"] and found["cost_by_provider"]
    assert found["pass_rate"] == found["raw_pass_rate"] and found["pass_rate"]
    assert "verification_pass_rate" not in found["indexes"]
    db = connect(StoreLayout(tmp_path).index_path)
    try:
        steps = [row[3] for row in db.conn.execute(f"explain query plan {pass_rate_sql()}")]
    finally:
        db.close()
    assert {s.split()[1] for s in steps if s.startswith(("SCAN", "SEARCH"))} == {"verification_daily"}, steps


def test_rebuild_writes_the_same_rollups(tmp_path: Path) -> None:
    index = record(tmp_path)
    live = figures(index)
    rebuild(StoreLayout(tmp_path), workers=0)
    assert figures(index) == live


def test_m028_upgrades_an_index_written_before(tmp_path: Path) -> None:
    index = record(tmp_path)
    live = figures(index)
    db = connect(index)
    try:  # as m027 left it: no rollups by model or question, the view over calls, m022's covering index
        db.conn.execute("drop table model_daily")
        db.conn.execute("drop table verification_daily")
        db.conn.execute("create index verification_pass_rate on verification (question_id, answered_by, passed)")
        db.conn.execute("drop view cost_by_provider")
        db.conn.execute("create view cost_by_provider as select provider, model, count(*) as calls from calls "
                        "group by provider, model")
        db.conn.execute("delete from _sqlite_migrations where name = 'm028_model_and_verification_rollups'")
    finally:
        db.close()
    assert figures(index) == live  # connect() applied m028
