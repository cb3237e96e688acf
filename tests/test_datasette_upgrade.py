"""A plain ``datasette index.db`` (conclave's plugin loads from Datasette's entry point) upgrades an index written
by an earlier release before it answers: the canned queries over the tables added since answer 200 with the right
rows on the first request, as they do after ``conclave browse``. An index Datasette serves unchanging
(``--immutable``) is left byte for byte as it was, and its pages say why they cannot answer instead of a 500; a
SQLite file that is no conclave index is never touched. Real ``datasette serve`` processes on 127.0.0.1, real
SQLite, a small index the recorder wrote and taken back to m027's schema without m031-m034's rollups."""

from __future__ import annotations

import hashlib
import html
import json
import re
import shutil
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from fs_faults import unshare_available
from test_index_upgrade import applied, env, old_index

from conclave.cli.commands.browse import free_port, wait_until_up
from conclave.store.index_reader import MIGRATION_NAMES
from conclave.store.sqlite_index import connect

METADATA = Path(__file__).parent.parent / "conclave" / "store" / "datasette_metadata.yaml"
#: the canned queries that read tables m031 and m034 add
QUERIES = ("filter_savings", "savings_by_filter_limits", "dissent_by_agent")
LATER = ("m031_filter_rollup", "m032_page_counts", "m033_early_termination_decisions", "m034_dissent_rollup")


def behind(home: Path) -> Path:
    """A small index as a release before m028 left it: m028-m034 unapplied, no filter or dissent rollups."""
    index = old_index(home, 0)
    conn = sqlite3.connect(index, isolation_level=None)
    try:
        conn.execute("drop table filter_daily")
        conn.execute("drop table dissent_daily")
        conn.execute(f"delete from _sqlite_migrations where name in ({', '.join('?' for _ in LATER)})", LATER)
    finally:
        conn.close()
    return index


@pytest.fixture(scope="module")
def old(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return behind(tmp_path_factory.mktemp("old"))


@pytest.fixture(scope="module")
def expected(old: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each canned query's rows on a copy of the index upgraded by conclave itself."""
    copy = tmp_path_factory.mktemp("upgraded") / "index.db"
    shutil.copy(old, copy)
    queries = yaml.safe_load(METADATA.read_text())["databases"]["index"]["queries"]
    db = connect(copy)
    try:
        db.conn.row_factory = sqlite3.Row
        return {q: [dict(r) for r in db.conn.execute(queries[q]["sql"])] for q in QUERIES}
    finally:
        db.close()


@pytest.fixture
def home(tmp_path: Path, old: Path) -> Path:
    shutil.copy(old, tmp_path / "index.db")
    return tmp_path


def other_sqlite(path: Path) -> Path:
    """A SQLite file of another sqlite-utils application: its own migration set, pending nothing of ours."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("create table _sqlite_migrations (id integer primary key, migration_set text, name text, "
                     "applied_at text)")
        conn.execute("insert into _sqlite_migrations (migration_set, name, applied_at) "
                     "values ('another.app', 'm001_start', '2025-01-01')")
        conn.execute("create table notes (id integer primary key, text text)")
        conn.execute("insert into notes (text) values ('kept as it is')")
    finally:
        conn.close()
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@contextmanager
def datasette(home: Path, *args: str) -> Iterator[tuple[str, list[str]]]:
    """A real ``datasette serve ARGS`` in ``home`` on 127.0.0.1; yields its base URL and, once it has stopped,
    the lines it wrote on stderr."""
    port = free_port()
    stderr: list[str] = []
    with (home / "datasette.err").open("w") as err:
        process = subprocess.Popen([sys.executable, "-m", "datasette", "serve", *args, "--host", "127.0.0.1",
                                    "--port", str(port)], cwd=home, env=env(home), stdout=subprocess.DEVNULL,
                                   stderr=err, text=True)
        try:
            wait_until_up(f"http://127.0.0.1:{port}/-/versions.json", process, timeout_s=120)
            yield f"http://127.0.0.1:{port}", stderr
        finally:
            process.terminate()
            process.wait(timeout=30)
    stderr += (home / "datasette.err").read_text().splitlines()


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def text(page: str) -> str:
    """What a reader sees of an HTML page: no tags, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_plain_datasette_upgrades_the_index_and_answers_the_first_request(
        home: Path, expected: dict[str, list[dict[str, Any]]]) -> None:
    index = home / "index.db"
    assert not set(LATER) & set(applied(index))
    with datasette(home, "index.db") as (url, stderr):
        # the first request of each page, in the order a user opening the links would make them
        for query in QUERIES:
            status, body = get(f"{url}/index/{query}.json?_shape=array")
            assert status == 200, body
            assert json.loads(body) == expected[query], query
        status, dashboard = get(f"{url}/-/conclave")
    assert all(expected[q] for q in QUERIES)  # the rows compared are there to compare
    assert status == 200, dashboard
    assert "Tokens saved by artifact filtering" in dashboard and "top_n r3" in text(dashboard)
    assert "earlier release" not in dashboard
    assert applied(index) == list(MIGRATION_NAMES)
    assert not any("Traceback" in line or line.startswith("ERROR") for line in stderr), stderr


def test_an_immutable_index_is_left_as_it_is_and_its_pages_say_why(home: Path) -> None:
    index = home / "index.db"
    before = digest(index)
    with datasette(home, "--immutable", "index.db") as (url, stderr):
        dash_status, dashboard = get(f"{url}/-/conclave")
        query_status, query_page = get(f"{url}/index/filter_savings")
        db_status, db_page = get(f"{url}/index")
    assert digest(index) == before
    assert not set(LATER) & set(applied(index))
    assert dash_status == 200, dashboard
    dashboard = text(dashboard)
    assert "This index was written by an earlier release of conclave and is served as it is" in dashboard
    assert "Datasette serves it unchanging (--immutable or -i) (pending: m028, m029, m030, m031, m032, m033, m034)" \
        in dashboard
    assert "filter_savings cannot answer on this index (no such table: filter_daily)" in dashboard
    assert query_status == 400  # Datasette's own answer to SQL that cannot run; the page says why
    assert "this query cannot answer until then (no such table: filter_daily)" in text(query_page)
    said = re.search(r"(\d+) of its canned queries cannot answer until then", text(db_page))
    assert db_status == 200 and said and int(said[1]) >= len(QUERIES), text(db_page)
    notes = [line for line in stderr if line.startswith("conclave: ")]
    assert len(notes) == 1 and "serves it unchanging" in notes[0] and "Traceback" not in "\n".join(stderr), stderr


def test_a_sqlite_file_that_is_no_index_is_untouched(home: Path) -> None:
    other = other_sqlite(home / "notes.db")
    before = digest(other)
    with datasette(home, "notes.db", "index.db") as (url, stderr):
        notes_status, notes = get(f"{url}/notes/notes.json?_shape=array")
        status, body = get(f"{url}/index/dissent_by_agent.json?_shape=array")
    assert notes_status == 200 and json.loads(notes) == [{"id": 1, "text": "kept as it is"}]
    assert status == 200, body  # the index served beside it was upgraded
    assert digest(other) == before
    conn = sqlite3.connect(f"{other.resolve().as_uri()}?mode=ro", uri=True)
    try:
        assert conn.execute("pragma journal_mode").fetchone()[0] == "delete"  # conclave's connect() sets WAL
    finally:
        conn.close()
    assert not any("Traceback" in line for line in stderr), stderr


#: run under ``unshare -rm``: the index on a tmpfs made read-only, each page asked of ``datasette index.db --get``
READ_ONLY_HOME = """
import json, shutil, subprocess, sys
from pathlib import Path
home, index, report = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
home.mkdir()
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(home)], check=True)
shutil.copy(index, home / "index.db")
subprocess.run(["mount", "-o", "remount,ro", str(home)], check=True)
out = {}
for page in sys.argv[4:]:
    done = subprocess.run([sys.executable, "-m", "datasette", "index.db", "--get", page], cwd=home,
                          capture_output=True, text=True, timeout=120)
    out[page] = [done.returncode, done.stdout, done.stderr]
report.write_text(json.dumps(out))
"""


@pytest.mark.skipif(not unshare_available(), reason="needs `unshare -rm` to mount a read-only tmpfs")
def test_an_index_in_a_read_only_home_is_served_as_it_is_and_its_pages_say_why(tmp_path: Path, old: Path) -> None:
    """Datasette reads a database it may write with mode=ro, which a WAL file in a read-only directory cannot be
    opened with: its start ended in a traceback. The plugin serves it unchanging, as ``datasette -i`` would."""
    report = tmp_path / "report.json"
    pages = ("/-/conclave", "/index/filter_savings", "/index/consultations.json?_shape=array&_col=id")
    done = subprocess.run(["unshare", "-rm", sys.executable, "-c", READ_ONLY_HOME, str(tmp_path / "home"), str(old),
                           str(report), *pages], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    answers = json.loads(report.read_text())
    for page in pages:
        assert "Traceback" not in answers[page][2], answers[page][2]
    code, dashboard, stderr = answers["/-/conclave"]
    assert code == 0, stderr  # 200
    assert "and its directory is read-only (pending: m028, m029, m030, m031" in text(dashboard)
    assert "conclave: index.db is in a directory Datasette may not write: served unchanging" in stderr
    code, query_page, _ = answers["/index/filter_savings"]
    assert code == 1 and "this query cannot answer until then (no such table: filter_daily)" in text(query_page)
    code, rows, _ = answers["/index/consultations.json?_shape=array&_col=id"]
    assert code == 0 and len(json.loads(rows)) == 6


def test_a_canned_query_of_the_users_own_metadata_keeps_datasettes_answer(home: Path) -> None:
    """The user's own ``-m metadata.json`` may add queries over tables an index left behind lacks: Datasette's own
    error answers them, and every other page still works."""
    (home / "mine.json").write_text(json.dumps(
        {"databases": {"index": {"queries": {"mine": "select count(*) as n from filter_daily"}}}}))
    with datasette(home, "--immutable", "index.db", "-m", "mine.json") as (url, stderr):
        mine_status, mine = get(f"{url}/index/mine")
        db_status, db_page = get(f"{url}/index")
        dash_status, _ = get(f"{url}/-/conclave")
    assert mine_status == 400 and "no such table: filter_daily" in text(mine)
    assert "this query cannot answer until then" not in text(mine)  # the note is for conclave's own queries
    assert db_status == 200 and "of its canned queries cannot answer until then" in text(db_page)
    assert dash_status == 200
    assert not any("Traceback" in line for line in stderr), stderr
