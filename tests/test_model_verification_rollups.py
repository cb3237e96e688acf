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

from index_queries import canned, metadata, plan, reads

from conclave.store.paths import StoreLayout
from conclave.store.sqlite_index import connect, rebuild
from conclave.testing.synthetic_events import record_synthetic

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
    return record_synthetic(home, range(count))


def pass_rate_sql() -> str:
    return canned("verification_pass_rate") + ", answered_by"


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


def test_each_declared_facet_of_the_big_tables_is_counted_from_an_index(tmp_path: Path) -> None:
    """Datasette counts a facet with this query; a table scan of every call or artifact took the page past 0.5 s.
    The artifacts page declares none (an index for one cost 200 bytes a consultation), nor the calls page (at 100k
    even its indexed provider and model facets ran past Datasette's facet limit); consultations' are indexed."""
    index = record(tmp_path, 2)
    assert not metadata()["tables"]["artifacts"]["facets"]
    assert not metadata()["tables"]["calls"]["facets"]
    table, facets = "consultations", metadata()["tables"]["consultations"]["facets"]
    assert facets
    db = connect(index)
    try:
        for column in facets:
            sql = (f"select {column} as value, count(*) as count from (select * from {table}) "
                   f"where {column} is not null group by {column}")
            steps = [s for s in plan(db.conn, sql) if s.startswith(("SCAN", "SEARCH"))]
            assert steps and all("COVERING INDEX" in s for s in steps), (column, steps)
            assert db.conn.execute(sql).fetchall(), column
    finally:
        db.close()


def test_the_pages_show_the_indexed_facets(tmp_path: Path) -> None:
    from datasette.app import Datasette  # an optional extra, imported where the test needs it

    index = record(tmp_path, 2)

    async def fetch(path: str) -> Any:
        return await Datasette([str(index)]).client.get(path)

    for path, shown, gone in (("/index/calls", [], ["provider", "model", "outcome", "round_number"]),
                              ("/index/artifacts", [], ["artifact_type", "status", "round_number"])):
        page = asyncio.run(fetch(path))
        assert page.status_code == 200
        assert all(f'id="facet-{c}"' in page.text for c in shown), path
        assert not any(f'id="facet-{c}"' in page.text for c in gone), path
    for path, column in (("/index/calls?_facet=outcome", "outcome"), ("/index/artifacts?_facet=status", "status")):
        assert f'id="facet-{column}"' in asyncio.run(fetch(path)).text  # still a facet from the column menu


def test_the_rollups_give_what_the_raw_rows_give(tmp_path: Path) -> None:
    found = figures(record(tmp_path))
    assert found["cost_by_provider"] == found["raw_cost"] and found["cost_by_provider"]
    assert found["pass_rate"] == found["raw_pass_rate"] and found["pass_rate"]
    assert "verification_pass_rate" not in found["indexes"]
    db = connect(StoreLayout(tmp_path).index_path)
    try:
        steps = plan(db.conn, pass_rate_sql())
    finally:
        db.close()
    assert reads(steps) == {"verification_daily"}, steps


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


KEY_ORDERED_TABLES = ["agent_rounds", "claim_checks", "transitions", "claims", "context_rounds", "synthesis_coverage",
                      "evidence", "exit_decisions", "rounds", "artifacts", "filters_applied", "safety_checks",
                      "groupthink_checks"]


def child_rows(index: Path) -> dict[str, Any]:
    db = connect(index)
    try:
        out: dict[str, Any] = {}
        for table in KEY_ORDERED_TABLES:
            sql = db.conn.execute("select sql from sqlite_master where name = ?", [table]).fetchone()[0]
            out[table] = ("WITHOUT ROWID" in sql.upper(),
                          sorted(db.conn.execute(f"select * from {table}").fetchall(), key=repr))
        out["indexes"] = sorted(r[0] for r in db.conn.execute(
            "select name from sqlite_master where type = 'index' and sql is not null"))
        return out
    finally:
        db.close()


def test_m029_stores_child_tables_in_key_order_live_upgraded_and_rebuilt(tmp_path: Path) -> None:
    """Each kept its key a second time in the primary key's own index (1.8 KB of 17 KB a consultation at 10k)."""
    index = record(tmp_path)
    live = child_rows(index)
    assert all(live[t][0] for t in KEY_ORDERED_TABLES)
    assert all(live[t][1] for t in ("agent_rounds", "claim_checks", "transitions", "rounds", "artifacts",
                                    "filters_applied"))  # the tables the synthetic runs write
    assert "idx_artifacts_artifact_type" not in live["indexes"] and "artifacts_verdicts" in live["indexes"]
    rebuild(StoreLayout(tmp_path), workers=0)
    assert child_rows(index) == live
    db = connect(index)
    try:  # as m028 left it: rowid tables, the artifact_type index
        for table in KEY_ORDERED_TABLES:
            sql = db.conn.execute("select sql from sqlite_master where name = ?", [table]).fetchone()[0]
            indexes = [s for (s,) in db.conn.execute(
                "select sql from sqlite_master where type = 'index' and tbl_name = ? and sql is not null", [table])]
            db.conn.execute(f"create table old_copy as select * from {table}")
            db.conn.execute(f"drop table {table}")
            db.conn.execute(sql[:sql.upper().rindex("WITHOUT ROWID")])
            db.conn.execute(f"insert into {table} select * from old_copy")
            db.conn.execute("drop table old_copy")
            for s in indexes:
                db.conn.execute(s)
        db.conn.execute("create index idx_artifacts_artifact_type on artifacts (artifact_type)")
        db.conn.execute("delete from _sqlite_migrations where name in "
                        "('m029_child_tables_in_key_order', 'm030_no_artifact_type_index')")
        assert not any("WITHOUT ROWID" in s.upper() for (s,) in db.conn.execute(
            "select sql from sqlite_master where name = 'artifacts'"))
    finally:
        db.close()
    assert child_rows(index) == live  # connect() applied m029 and m030


def test_rebuild_leaves_no_free_pages(tmp_path: Path) -> None:
    """Indexes deferred migrations build and later ones drop (m022 then m028, m004 then m030) left their pages
    free in the rebuilt file (1.7 KB a consultation at 10k)."""
    index = record(tmp_path)
    rebuild(StoreLayout(tmp_path), workers=0)
    db = connect(index)
    try:
        assert db.conn.execute("pragma freelist_count").fetchone()[0] == 0
        assert db.conn.execute("pragma journal_mode").fetchone()[0] == "wal"
    finally:
        db.close()
