"""``index rebuild`` in forked workers over many chunks gives every table's rows of live indexing (issue 28), and
the rows it writes are the rows that stay: a claim or piece of evidence restated by each debate state is written
once, as its latest state."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from test_index import SEARCHED
from test_rebuild_verify_scale import NEW_ID, age_journals, mixed_home, real_run_events

from conclave import events as ev
from conclave.store.indexer import build_batch
from conclave.store.paths import StoreLayout
from conclave.store.sqlite_index import rebuild

#: what differs between any two indexes by design: when each migration was applied
NOT_COMPARED = {"_sqlite_migrations"}


def every_table(home: Path) -> dict[str, Any]:
    """Every row of every table and view of the index (full-text search's own tables aside: they are compared
    through searches), sorted, and the consultations a few searches find."""
    conn = sqlite3.connect(StoreLayout(home).index_path)
    try:
        names = [name for (name, sql) in conn.execute(
            "select name, sql from sqlite_master where type in ('table', 'view') and name not like 'sqlite_%'")
            if name not in NOT_COMPARED and not name.startswith("consultations_fts")]
        rows: dict[str, Any] = {name: sorted(conn.execute(f"select * from [{name}]").fetchall(), key=repr)
                                for name in names}
        rows["search"] = [(term, cid) for term in SEARCHED for (cid,) in conn.execute(
            "select c.id from consultations_fts f join consultations c on c.rowid = f.rowid "
            "where consultations_fts match ? order by c.id", [term])]
        return rows
    finally:
        conn.close()


def test_a_forked_rebuild_over_many_chunks_gives_every_table_of_live_indexing(tmp_path: Path) -> None:
    # a home whose path means something in a URI: the rollups are summed from the scratch file attached by its URI
    tmp_path = tmp_path / "home #1 ?mode=rw&x=%41"
    mixed_home(tmp_path)
    age_journals(tmp_path)
    live = every_table(tmp_path)
    # what the comparison covers: the quality tables that the older dump leaves out hold rows here
    for table in ("claims", "evidence", "verification", "claim_checks", "safety_checks", "groupthink_checks",
                  "model_daily", "verification_daily", "consultation_daily", "provider_daily", "filter_daily",
                  "dissent_daily"):
        assert live[table], table
    layout = StoreLayout(tmp_path)
    report = rebuild(layout, chunk=2, workers=2)  # six chunks over two forked workers, in turns
    assert report.consultations == 12
    assert every_table(tmp_path) == live
    conn = sqlite3.connect(layout.index_path)
    try:  # no free pages left behind by rows written and replaced, or indexes built and dropped
        assert conn.execute("pragma freelist_count").fetchone() == (0,)
        assert conn.execute("pragma integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()
    assert sorted(path.name for path in layout.index_path.parent.glob("index.db*")) == ["index.db"]


def test_a_claim_restated_by_each_debate_state_is_written_once_as_its_latest_state() -> None:
    records = [{"consultation_id": e.consultation_id, "seq": e.seq, "ts": e.ts, "type": e.type, "data": e.data}
               for e in real_run_events(NEW_ID)]
    states = [r for r in records if r["type"] == ev.DEBATE_STATE]
    assert len(states) >= 2 and all(r["data"]["state"]["claims"] for r in states)
    batch = build_batch(records)
    statements = {sql.split(" (")[0].split()[-1]: rows for sql, rows in batch.statements()}
    claims, evidence = statements["claims"], statements.get("evidence", [])
    assert len({row[:2] for row in claims}) == len(claims)  # each (consultation, claim id) once
    assert len({row[:2] for row in evidence}) == len(evidence)
    latest = {c["id"]: c for r in states for c in r["data"]["state"]["claims"]}
    assert {row[1]: row[4] for row in claims} == {cid: c.get("status") for cid, c in latest.items()}


def test_a_packed_copy_left_by_a_rebuild_killed_while_writing_it_is_written_again(tmp_path: Path) -> None:
    mixed_home(tmp_path)
    age_journals(tmp_path)
    live = every_table(tmp_path)
    layout = StoreLayout(tmp_path)
    layout.index_path.with_name("index.db.packed").write_bytes(b"half of a database")
    rebuild(layout, chunk=4, workers=0)
    assert every_table(tmp_path) == live
    assert not layout.index_path.with_name("index.db.packed").exists()
