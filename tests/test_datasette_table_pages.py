"""Table pages of a conclave index answer without suggesting facets (issue 28: at 10k consultations suggesting
them, a counting query per column and facet type, was 2 s of a 2.4 s calls page, warm or cold): the declared
facets still show, a facet picked in the URL still counts, and JSON and canned queries are left as Datasette
serves them. Real Datasette, the plugin loaded from its entry point, on an index the recorder wrote."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.sqlite_index import connect
from conclave.testing.synthetic_events import synthetic_events

SUGGESTED = 'class="suggested-facets"'


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("home")
    recorder = Recorder(home)
    for n in range(8):
        for event in synthetic_events(n):
            recorder(event)
    recorder.close()
    return StoreLayout(home).index_path


def get(index: Path, path: str) -> Any:
    from datasette.app import Datasette  # an optional extra, imported where the test needs it

    async def fetch() -> Any:
        return await Datasette([str(index)]).client.get(path)

    return asyncio.run(fetch())


def test_table_pages_suggest_no_facets_and_keep_the_declared_ones(index: Path) -> None:
    tables = [t["name"] for t in get(index, "/index.json").json()["tables"] if not t.get("hidden")]
    assert {"calls", "consultations", "artifacts", "verification"} <= set(tables)
    for table in tables:
        page = get(index, f"/index/{table}")
        assert page.status_code == 200, table
        assert SUGGESTED not in page.text, table
    consultations = get(index, "/index/consultations").text
    assert 'data-column="mode"' in consultations and 'id="facet-mode"' in consultations  # declared in the metadata
    picked = get(index, "/index/calls?_facet=agent").text
    assert 'id="facet-agent"' in picked


def test_json_is_served_as_datasette_serves_it(index: Path) -> None:
    data = get(index, "/index/calls.json").json()
    assert data["suggested_facets"], "a JSON client asked for nothing: Datasette's own defaults apply"


@pytest.mark.parametrize("sql", [
    "select * from dissent_log limit 101",
    "select agent, count(*) as dissents, count(distinct consultation_id) as consultations from dissent_log "
    "group by agent order by dissents desc",
])
def test_the_dissent_views_read_the_verdicts_index_alone(index: Path, sql: str) -> None:
    """Every artifact row of history was read to find the verdicts (dissent_by_agent: 2.2 s cold at 10k, 400)."""
    db = connect(index)
    try:
        steps = [row[3] for row in db.conn.execute(f"explain query plan {sql}")]
        assert db.conn.execute("select count(*) from dissent_log").fetchone()[0] > 0
    finally:
        db.close()
    artifacts = [s for s in steps if s.split()[1] in ("a", "v")]
    assert artifacts and all("COVERING INDEX artifacts_verdicts" in s for s in artifacts), steps


def test_cost_by_provider_reads_the_model_rollup(index: Path) -> None:
    """It grouped every call of history (0.6 s cold at 10k); now it sums the model_daily rollup (m028), with the
    same figures as the calls give."""
    db = connect(index)
    try:
        steps = [row[3] for row in db.conn.execute("explain query plan select * from cost_by_provider")]
        by_model = db.conn.execute("select * from cost_by_provider order by provider, model").fetchall()
        expected = db.conn.execute("""
            select provider, model, count(*), sum(outcome = 'ok'), sum(outcome not in ('ok', 'cancelled')),
                   sum(hedge), sum(input_tokens), sum(output_tokens), round(total(cost), 6), round(avg(latency_s), 3)
            from calls group by provider, model order by provider, model""").fetchall()
    finally:
        db.close()
    tables = {step.split()[1] for step in steps if step.startswith(("SCAN", "SEARCH"))}
    assert tables - {"cost_by_provider"} == {"model_daily"}, steps  # the view's own co-routine, then the rollup
    assert by_model == expected and by_model


def test_the_groupthink_query_reads_only_the_rows_it_shows(index: Path) -> None:
    """It sorted every consultation and counted each one's firings through the (detector, fired) index, every
    firing of history per consultation (1.3 s cold at 10k); now it walks an index in its order and counts by key."""
    metadata = Path(__file__).parent.parent / "conclave" / "store" / "datasette_metadata.yaml"
    sql = yaml.safe_load(metadata.read_text())["databases"]["index"]["queries"]["groupthink"]["sql"]
    db = connect(index)
    try:
        steps = [row[3] for row in db.conn.execute(f"explain query plan {sql}")]
        shown = db.conn.execute(sql).fetchall()
    finally:
        db.close()
    assert steps[0] == "SCAN c USING INDEX consultations_groupthink" and not any("TEMP B-TREE" in s for s in steps)
    assert all("(consultation_id=?)" in s for s in steps if s.startswith("SEARCH g"))
    assert len(shown) == 8
    def order(row: tuple) -> tuple:  # escalated, firings, start: descending, nulls last
        return (-1 if row[9] is None else row[9], -1 if row[4] is None else row[4], row[1])

    assert shown == sorted(shown, key=order, reverse=True)
