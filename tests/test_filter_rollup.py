"""The savings_by_filter_limits and filter_savings canned queries sum the filter_daily rollup (m031; issue 28: at
100k consultations savings_by_filter_limits grouped every filters_applied row by its limits text and ran past
Datasette's 1 s limit, HTTP 400). Their answers are exactly what the old SQL over the raw rows gives, null limits and
null token counts included, live, after ``index rebuild`` and on an index written before m031 that a process
upgrades. Real SQLite on indexes the recorder wrote, real Datasette for the pages."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from index_queries import canned, plan, reads

from conclave import events as ev
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.sqlite_index import connect, rebuild
from conclave.testing.synthetic_events import synthetic_events

#: the canned queries as they were before m031, over the raw rows (ties ordered as the new one orders them)
OLD_SQL = {
    "savings_by_filter_limits": """
        select filter, round_number, artifact_type, limits, count(*) as applications,
               sum(tokens_before) as tokens_before, sum(tokens_saved) as tokens_saved,
               round(100.0 * sum(tokens_saved) / max(sum(tokens_before), 1), 1) as saved_pct
        from filters_applied group by filter, round_number, artifact_type, limits
        order by tokens_saved desc, filter, round_number, artifact_type, limits""",
    "filter_savings": """
        select filter, round_number, count(*) as applications, sum(tokens_before) as tokens_before,
               sum(tokens_saved) as tokens_saved,
               round(100.0 * sum(tokens_saved) / max(sum(tokens_before), 1), 1) as saved_pct
        from filters_applied group by filter, round_number order by filter, round_number""",
}
LIMITS = ({"consensus_points": 3, "tensions": 2}, {"consensus_points": 2, "tensions": 2}, None)


def varied(n: int) -> list[ev.Event]:
    """Synthetic consultation ``n`` (twelve hours apart, so the rows span several days) whose filter records vary:
    three limit settings (one absent), two artifact types, and now and then no token counts."""
    out = []
    for event in synthetic_events(n, spacing_s=43_200.0):
        if event.type == ev.FILTER_APPLIED:
            data = {**event.data, "limits": LIMITS[n % 3], "artifact_type": ("synthesis", "cross_exam")[n % 2]}
            if n % 5 == 4:
                data.pop("tokens_before")
            event = ev.Event(event.type, event.consultation_id, event.seq, event.ts, data)
        out.append(event)
    return out


def record(home: Path, count: int = 12) -> Path:
    recorder = Recorder(home)
    for n in range(count):
        for event in varied(n):
            recorder(event)
    recorder.close()
    return StoreLayout(home).index_path


def answers(index: Path) -> dict[str, Any]:
    db = connect(index)
    try:
        out: dict[str, Any] = {}
        for name, old in OLD_SQL.items():
            out[name] = db.conn.execute(canned(name)).fetchall()
            out[f"{name} raw"] = db.conn.execute(old).fetchall()
        out["filter_daily"] = db.conn.execute("select * from filter_daily order by 1, 2, 3, 4, 5").fetchall()
        out["indexes"] = {r[1] for r in db.conn.execute("pragma index_list(filters_applied)")}
        return out
    finally:
        db.close()


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("home"))


def test_the_queries_answer_what_the_raw_rows_give(index: Path) -> None:
    found = answers(index)
    for name in OLD_SQL:
        assert found[name] == found[f"{name} raw"], name
    groups = found["savings_by_filter_limits"]
    assert {r[3] for r in groups} == {None, '{"consensus_points": 3, "tensions": 2}',
                                      '{"consensus_points": 2, "tensions": 2}'}
    assert {r[2] for r in groups} == {"synthesis", "cross_exam"}
    assert len({r[0][:10] for r in found["filter_daily"]}) >= 4  # several days, each its own rollup rows


@pytest.mark.parametrize("name", list(OLD_SQL))
def test_the_queries_read_the_rollup_alone(index: Path, name: str) -> None:
    db = connect(index)
    try:
        steps = plan(db.conn, canned(name))
    finally:
        db.close()
    assert reads(steps) == {"filter_daily"}, steps


def test_rebuild_writes_the_same_rollup(tmp_path: Path) -> None:
    index = record(tmp_path)
    live = answers(index)
    assert "filters_saved" not in live["indexes"]  # m021's covering index for filter_savings is no longer needed
    rebuild(StoreLayout(tmp_path), workers=0)
    assert answers(index) == live


def test_live_indexing_in_several_batches_gives_the_same_rollup(tmp_path: Path) -> None:
    """One consultation at a time, as a running home indexes them: each batch recomputes only its days."""
    whole = answers(record(tmp_path / "whole"))
    home = tmp_path / "one-by-one"
    for n in range(12):
        recorder = Recorder(home)
        for event in varied(n):
            recorder(event)
        recorder.close()
    assert answers(StoreLayout(home).index_path) == whole


def test_m031_upgrades_an_index_written_before(tmp_path: Path) -> None:
    index = record(tmp_path)
    live = answers(index)
    db = connect(index)
    try:  # as m030 left it: no rollup, m021's covering index
        db.conn.execute("drop table filter_daily")
        db.conn.execute("create index filters_saved on filters_applied "
                        "(filter, round_number, tokens_before, tokens_saved)")
        db.conn.execute("delete from _sqlite_migrations where name = 'm031_filter_rollup'")
    finally:
        db.close()
    assert answers(index) == live  # connect() applied m031


def test_datasette_serves_the_queries(index: Path) -> None:
    from datasette.app import Datasette  # an optional extra, imported where the test needs it

    async def fetch(path: str) -> Any:
        return await Datasette([str(index)]).client.get(path)

    expected = answers(index)
    for name in OLD_SQL:
        page = asyncio.run(fetch(f"/index/{name}.json?_shape=array"))
        assert page.status_code == 200, name
        assert [tuple(row.values()) for row in page.json()] == expected[f"{name} raw"], name
    assert asyncio.run(fetch("/index/savings_by_filter_limits")).status_code == 200
    assert asyncio.run(fetch("/-/conclave")).status_code == 200  # its filter chart reads filter_savings
