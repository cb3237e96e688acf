"""Opening a big index written before m028 (issue 28: upgrading a 10k index rewrote tables for 3.3 s, silently).

The upgrade says so on stderr when it rewrites tables of a big index, never on stdout; it runs in one
transaction, so a process killed or interrupted in the middle leaves the index as it was, the next open finishes
it, and readers meanwhile see the old schema or the new one, whole; ``conclave index vacuum`` gives the disk back
the pages the rewrite left free. Real SQLite, real ``python -m conclave`` processes, an index the recorder wrote
(its consultations copied in SQL until the index is big enough to be announced), taken back to m027's schema.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conclave.store.migrations import KEY_ORDERED, NOTICE_BYTES
from conclave.store.rollups import refresh_all_days
from conclave.store.sqlite_index import IndexOpenError, connect
from conclave.testing.synthetic_events import record_synthetic

NOTICE = "conclave: upgrading the index (m028, m029, one time) …"
UPGRADES = ("m028_model_and_verification_rollups", "m029_child_tables_in_key_order", "m030_no_artifact_type_index")
#: copies of the six recorded consultations, each with its rows: an index over NOTICE_BYTES
COPIES = 2000


def record(home: Path, count: int = 6) -> Path:
    return record_synthetic(home, range(count))


def copy_consultations(conn: sqlite3.Connection, copies: int) -> None:
    """Each consultation ``copies`` more times, with all its rows, under ids ``<id>-copy<k>``."""
    originals = [cid for (cid,) in conn.execute("select id from consultations")]
    conn.execute("create temp table copies (k integer primary key)")
    conn.executemany("insert into temp.copies values (?)", [(k,) for k in range(1, copies + 1)])
    conn.execute("create temp table originals (id text primary key)")
    conn.executemany("insert into temp.originals values (?)", [(cid,) for cid in originals])
    tables = [name for (name,) in conn.execute(
        "select name from sqlite_master where type = 'table' and name not like '%fts%' and name not like '%daily'")]
    for table in tables:
        columns = [row[1] for row in conn.execute(f'pragma table_info("{table}")')]
        key = "id" if table == "consultations" else "consultation_id"
        if key not in columns:
            continue
        values = ", ".join(f"t.{key} || '-copy' || c.k" if col == key else f't."{col}"' for col in columns)
        names = ", ".join(f'"{col}"' for col in columns)
        conn.execute(f'insert into "{table}" ({names}) select {values} from "{table}" t, temp.copies c '
                     f"where t.{key} in (select id from temp.originals)")
    conn.execute("drop table temp.copies")
    conn.execute("drop table temp.originals")


def as_before_m028(index: Path) -> None:
    """Take the index back to m027's schema: no model and verification rollups, m022's covering index, the view
    over every call, the child tables with a rowid, the artifact_type index; m028–m030 unapplied."""
    conn = sqlite3.connect(index, isolation_level=None)
    try:
        conn.execute("drop table model_daily")
        conn.execute("drop table verification_daily")
        conn.execute("create index verification_pass_rate on verification (question_id, answered_by, passed)")
        conn.execute("drop view cost_by_provider")
        conn.execute("create view cost_by_provider as select provider, model, count(*) as calls from calls "
                     "group by provider, model")
        for table in KEY_ORDERED:
            (sql,) = conn.execute("select sql from sqlite_master where name = ?", [table]).fetchone()
            indexes = [s for (s,) in conn.execute(
                "select sql from sqlite_master where type = 'index' and tbl_name = ? and sql is not null", [table])]
            conn.execute(f"create table old_copy as select * from {table}")
            conn.execute(f"drop table {table}")
            conn.execute(sql[:sql.upper().rindex("WITHOUT ROWID")])
            conn.execute(f"insert into {table} select * from old_copy")
            conn.execute("drop table old_copy")
            for s in indexes:
                conn.execute(s)
        conn.execute("create index idx_artifacts_artifact_type on artifacts (artifact_type)")
        conn.execute("delete from _sqlite_migrations where name in (?, ?, ?)", UPGRADES)
        conn.execute("vacuum")
    finally:
        conn.close()


def old_index(home: Path, copies: int) -> Path:
    index = record(home)
    conn = sqlite3.connect(index, isolation_level=None)
    try:
        conn.execute("begin")
        copy_consultations(conn, copies)
        refresh_all_days(conn)
        conn.execute("commit")
    finally:
        conn.close()
    as_before_m028(index)
    return index


@pytest.fixture(scope="module")
def big_old_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return old_index(tmp_path_factory.mktemp("big"), COPIES)


@pytest.fixture
def home(tmp_path: Path, big_old_index: Path) -> Path:
    shutil.copy(big_old_index, tmp_path / "index.db")
    return tmp_path


def child_tables(index: Path) -> dict[str, Any]:
    """Per child table m029 rewrites: stored without rowid?, its row count, and a digest of its rows."""
    conn = sqlite3.connect(f"{index.resolve().as_uri()}?mode=ro", uri=True)
    try:
        out: dict[str, Any] = {}
        for table in KEY_ORDERED:
            (sql,) = conn.execute("select sql from sqlite_master where name = ?", [table]).fetchone()
            rows = sorted(map(repr, conn.execute(f"select * from {table}")))
            out[table] = ("WITHOUT ROWID" in sql.upper(), len(rows), hash(tuple(rows)))
        return out
    finally:
        conn.close()


def applied(index: Path) -> list[str]:
    conn = sqlite3.connect(index)
    try:
        return [name for (name,) in conn.execute("select name from _sqlite_migrations order by id")]
    finally:
        conn.close()


def env(home: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    return {**clean, "CONCLAVE_HOME": str(home)}


def conclave(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conclave", *args], env=env(home), cwd=home, capture_output=True,
                          text=True, timeout=300)


def start(home: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "conclave", *args], env=env(home), cwd=home, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def upgrading(process: subprocess.Popen[str]) -> None:
    """Wait until ``process`` says it is upgrading the index."""
    assert process.stderr is not None
    line = process.stderr.readline()
    assert line.rstrip("\n") == NOTICE, line


def in_new_form(tables: dict[str, Any], before: dict[str, Any]) -> bool:
    return all(tables[t] == (True, *before[t][1:]) for t in KEY_ORDERED)


def test_the_fixture_is_big_and_old(home: Path) -> None:
    index = home / "index.db"
    conn = sqlite3.connect(index)
    try:
        (pages,) = conn.execute("pragma page_count").fetchone()
        (page_size,) = conn.execute("pragma page_size").fetchone()
    finally:
        conn.close()
    assert pages * page_size >= NOTICE_BYTES
    tables = child_tables(index)
    assert not any(flag for flag, _, _ in tables.values())
    assert tables["artifacts"][1] == 49 * (COPIES + 1)
    assert not set(UPGRADES) & set(applied(index))


def test_a_big_upgrade_says_so_on_stderr_once_and_json_stays_clean(home: Path) -> None:
    before = child_tables(home / "index.db")
    done = conclave(home, "stats", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["consultations"] == 6 * (COPIES + 1)  # stdout is the JSON alone
    lines = done.stderr.splitlines()
    assert lines[0] == NOTICE
    assert lines[1].startswith("conclave: index upgraded in ") and "`conclave index vacuum` gives its" in lines[1]
    assert len(lines) == 2
    assert in_new_form(child_tables(home / "index.db"), before)
    again = conclave(home, "stats", "--json")
    assert again.returncode == 0 and again.stderr == "" and again.stdout == done.stdout


def test_a_small_index_upgrades_silently(tmp_path: Path) -> None:
    index = old_index(tmp_path, 0)
    done = conclave(tmp_path, "stats")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert set(UPGRADES) <= set(applied(index))
    assert all(flag for flag, _, _ in child_tables(index).values())


def test_index_vacuum_gives_back_the_pages_the_upgrade_left_free(home: Path) -> None:
    index = home / "index.db"
    assert conclave(home, "logs", "list").returncode == 0
    before = child_tables(index)
    grown = index.stat().st_size
    done = conclave(home, "index", "vacuum")
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    said = done.stderr.splitlines()
    assert len(said) == 2 and said[0].startswith(f"conclave index: vacuuming {index} (") and said[1].startswith(
        f"vacuumed {index}: ")
    assert index.stat().st_size < grown
    conn = sqlite3.connect(index)
    try:
        assert conn.execute("pragma freelist_count").fetchone()[0] == 0
        assert conn.execute("pragma journal_mode").fetchone()[0] == "wal"
        assert conn.execute("pragma integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert child_tables(index) == before


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "SIGINT"])
def test_an_upgrade_stopped_half_way_leaves_the_old_index_and_the_next_open_finishes_it(
        home: Path, stop: signal.Signals) -> None:
    index = home / "index.db"
    before = child_tables(index)
    process = start(home, "logs", "list")
    upgrading(process)
    time.sleep(0.3)  # into the rewrite
    assert process.poll() is None, "the upgrade ended before it could be stopped"
    process.send_signal(stop)
    _, err = process.communicate(timeout=120)
    if stop == signal.SIGINT:
        assert process.returncode == 130
        assert "Traceback" not in err and len(err.splitlines()) <= 1, err
    else:
        assert process.returncode == -signal.SIGKILL
    assert child_tables(index) == before  # the old index, whole
    assert not set(UPGRADES) & set(applied(index))
    conn = sqlite3.connect(index)
    try:
        assert conn.execute("pragma integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    done = conclave(home, "stats")
    assert done.returncode == 0 and done.stderr.splitlines()[0] == NOTICE, done.stderr
    assert in_new_form(child_tables(index), before)
    assert applied(index)[-3:] == list(UPGRADES)


READER = """
import json, sqlite3, sys, time
tables = json.loads(sys.argv[2])
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
seen = []
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    conn.execute("begin")
    flags = [("without rowid" in sql.lower()) for (sql,) in conn.execute(
        "select sql from sqlite_master where type = 'table' and name in (select value from json_each(?))",
        [json.dumps(tables)])]
    artifacts = conn.execute("select count(*) from artifacts").fetchone()[0]
    dissent = conn.execute("select count(*) from dissent_log").fetchone()[0]
    rollups = conn.execute("select count(*) from sqlite_master where name = 'model_daily'").fetchone()[0]
    conn.execute("commit")
    seen.append([sum(flags), len(flags), artifacts, dissent, rollups])
    print(json.dumps(seen[-1]), flush=True)
    if seen[-1][0] == len(tables):
        break
"""


def test_readers_during_an_upgrade_see_the_old_schema_or_the_new_one_whole(home: Path) -> None:
    index = home / "index.db"
    before = child_tables(index)
    upgrader = start(home, "logs", "list")
    upgrading(upgrader)
    reader = subprocess.Popen([sys.executable, "-c", READER, str(index), json.dumps(KEY_ORDERED)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    other = start(home, "logs", "list")  # a second process that would upgrade waits for the first, then reads
    stats = start(home, "stats", "--json")  # so does stats (it reads m028's rollups)
    out, err = reader.communicate(timeout=180)
    assert reader.returncode == 0, err
    upgrader_out, _ = upgrader.communicate(timeout=180)
    other_out, other_err = other.communicate(timeout=180)
    assert upgrader.returncode == 0 and other.returncode == 0, other_err
    assert other_err == "" and other_out == upgrader_out  # it did not upgrade again, and read the same rows
    stats_out, stats_err = stats.communicate(timeout=180)
    assert stats.returncode == 0 and stats_err == "", stats_err
    assert json.loads(stats_out)["consultations"] == 6 * (COPIES + 1)
    seen = [json.loads(line) for line in out.splitlines()]
    artifacts = before["artifacts"][1]
    old = [s for s in seen if s[0] == 0]
    assert old, "the reader saw no snapshot before the upgrade's commit"
    assert seen[-1][0] == len(KEY_ORDERED)
    for flags, count, rows, dissent, rollups in seen:
        assert count == len(KEY_ORDERED) and flags in (0, len(KEY_ORDERED))
        assert rollups == (1 if flags else 0) and rows == artifacts and dissent == seen[0][3]
    assert in_new_form(child_tables(index), before)
    assert applied(index).count("m029_child_tables_in_key_order") == 1


DATASETTE_PAGES = ("/index/artifacts", "/index/artifacts.json?_size=5", "/index/rounds", "/index/dissent_log",
                   "/index/cost_by_provider", "/index/claims.json")


def test_datasette_serving_the_index_answers_before_during_and_after_an_upgrade(home: Path) -> None:
    from datasette.app import Datasette  # an optional extra, imported where the test needs it

    async def watch() -> tuple[list[tuple[str, int]], list[tuple[str, int]], list[tuple[str, int]]]:
        # A Datasette that started before this release was installed (as one serving while the user updates
        # conclave): its startup found nothing to upgrade. One started on the old index upgrades it itself
        # (tests/test_datasette_upgrade.py); here the index is out of its sight while it starts.
        index, aside = home / "index.db", home / "aside.db"
        index.rename(aside)
        datasette = Datasette([str(index)])
        await datasette.invoke_startup()
        aside.rename(index)

        async def statuses() -> list[tuple[str, int]]:
            return [(page, (await datasette.client.get(page)).status_code) for page in DATASETTE_PAGES]

        before = await statuses()
        upgrader = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "conclave", "logs", "list", env=env(home), cwd=home,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        assert upgrader.stderr is not None
        assert (await upgrader.stderr.readline()).decode().rstrip("\n") == NOTICE
        during: list[tuple[str, int]] = []
        while upgrader.returncode is None:
            during += await statuses()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(upgrader.wait(), 0.05)
        assert upgrader.returncode == 0
        return before, during, await statuses()

    before, during, after = asyncio.run(watch())
    assert before == after == [(page, 200) for page in DATASETTE_PAGES]
    assert during and all(status == 200 for _, status in during), during
    assert all(flag for flag, _, _ in child_tables(home / "index.db").values())


def test_a_plain_datasette_upgrades_a_big_index_with_the_same_notice_before_it_serves(home: Path) -> None:
    """conclave's Datasette plugin upgrades the index at startup through conclave's own connect(): the same two
    lines on stderr as any conclave command, then the tables m028 adds answer."""
    before = child_tables(home / "index.db")
    done = subprocess.run([sys.executable, "-m", "datasette", "index.db", "--get",
                           "/index/model_daily.json?_size=1&_shape=array"], env=env(home), cwd=home,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr  # 200
    lines = done.stderr.splitlines()
    assert lines[0] == NOTICE and lines[1].startswith("conclave: index upgraded in ") and len(lines) == 2, lines
    assert len(json.loads(done.stdout)) == 1
    assert in_new_form(child_tables(home / "index.db"), before)


HOLD_THE_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("begin immediate")
print("locked", flush=True)
sys.stdin.readline()
conn.execute("rollback")
"""


def test_an_opener_that_cannot_get_the_lock_to_upgrade_says_why_in_one_line(tmp_path: Path) -> None:
    """At 100,000 consultations an upgrade can outlast the 30 s a second opener waits for the write lock."""
    index = old_index(tmp_path, 0)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(index)], text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        with pytest.raises(IndexOpenError) as raised:
            connect(index, busy_timeout_s=0.2)
    finally:
        holder.communicate("\n", timeout=60)
    message = str(raised.value)
    assert message == (f"cannot open the index {index}: another process is writing it, as an upgrade of a big index "
                       "after an update of conclave does for a while; try again when it is done")
    assert not set(UPGRADES) & set(applied(index))
    connect(index).close()  # once it is free, the upgrade is done
    assert set(UPGRADES) <= set(applied(index))
