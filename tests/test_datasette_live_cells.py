"""Datasette's own pages (table pages, canned queries) of a conclave index show a consultation or eval run that the
index calls ``running`` as what it is now: ``interrupted`` once its process was killed with SIGKILL (it could not
record its end), ``running`` while a process still holds its lock, and a finished one as it finished.

Real processes throughout: ``conclave`` CLI runs against the fake provider server, killed with SIGKILL or left
waiting on a request the fake never answers, and a plain ``datasette serve`` of the index over HTTP."""

from __future__ import annotations

import fcntl
import html
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser_support import needs_browser, screenshot, serve_datasette
from cli_helpers import clean_env

from conclave.store.sqlite_index import connect
from conclave.testing.fake_server import FakeProviderServer, Fault, Reply, serving_in_a_thread
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

QUESTION = "Should we shard the database?"
PANEL = ["agents=openai_only", "cost.auto_approve=true", "hedging.enabled=false",
         "providers.openai.timeout_s=3600"]  # a request the fake never answers stays open all the test long
EVAL = ["eval", "arithmetic", "eval.n=2", "rounds=2", "selective.enabled=false"]


@dataclass
class Home:
    home: Path
    url: str  # the index database's URL on a plain `datasette serve`
    done: str  # consultation ids
    killed: str
    live: str
    run_done: str  # eval run ids
    run_killed: str
    run_live: str


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProviderServer]:
    """The fake server on an event loop of its own thread: it keeps the live runs' requests open meanwhile."""
    with serving_in_a_thread() as server:
        yield server


def _round_1_only(request: Any) -> Reply | Fault:
    title = str((request.schema or {}).get("title", ""))
    return Reply(json=instance_for(request.schema)) if title.startswith("Round 1") else Fault.hang()


def _start(home: Path, fake: FakeProviderServer, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "conclave", *args, *PANEL, *fake.overrides()],
                            env=clean_env(home, FAKE_KEYS), cwd=home, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _indexed_running(home: Path, sql: str, known: set[str], process: subprocess.Popen[bytes]) -> str:
    """The id of the row ``sql`` finds ``running`` in the index that is not in ``known``, once ``process`` wrote it."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        if (home / "index.db").exists():
            db = sqlite3.connect(f"file:{home / 'index.db'}?mode=ro", uri=True, timeout=5)
            try:
                found = {r[0] for r in db.execute(sql)}
            except sqlite3.OperationalError:  # the tables are still being created
                found = set()
            finally:
                db.close()
            if found - known:
                return (found - known).pop()
        time.sleep(0.1)
    pytest.fail(f"no new running row for: {sql}")


CONSULTATIONS = "select id from consultations where status = 'running'"
RUNS = "select run_id from eval_runs where status = 'running'"


def _kill(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGKILL)  # no handler runs: the index keeps saying "running"
    assert process.wait(timeout=30) == -signal.SIGKILL


@pytest.fixture(scope="module")
def served(fake: FakeProviderServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    home = tmp_path_factory.mktemp("home")
    env = clean_env(home, FAKE_KEYS)
    # finished first, while the fake answers every request
    done = subprocess.run([sys.executable, "-m", "conclave", QUESTION, "output.format=json", *PANEL,
                           *fake.overrides()], env=env, cwd=home, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    run_done = subprocess.run([sys.executable, "-m", "conclave", *EVAL, "eval.run_id=ev-done", *PANEL,
                               *fake.overrides()], env=env, cwd=home, capture_output=True, text=True, timeout=240)
    assert run_done.returncode == 0, run_done.stderr
    # from now on round 1 is answered and nothing after it: a run stays inside round 2 until it is killed or stopped
    # (a CLI consultation's index row is written once round 1 has ended)
    fake.script("gpt-4o", _round_1_only)
    started: list[subprocess.Popen[bytes]] = []
    try:
        killed = _start(home, fake, QUESTION)
        started.append(killed)
        killed_id = _indexed_running(home, CONSULTATIONS, set(), killed)
        _kill(killed)
        live = _start(home, fake, QUESTION)
        started.append(live)
        live_id = _indexed_running(home, CONSULTATIONS, {killed_id}, live)

        run_killed = _start(home, fake, *EVAL, "eval.run_id=ev-killed")
        started.append(run_killed)
        _indexed_running(home, RUNS, set(), run_killed)
        _kill(run_killed)
        run_live = _start(home, fake, *EVAL, "eval.run_id=ev-live")
        started.append(run_live)
        _indexed_running(home, RUNS, {"ev-killed"}, run_live)
        with serve_datasette(home / "index.db") as url:
            yield Home(home, f"{url}/index", json.loads(done.stdout)["consultation_id"], killed_id, live_id, "ev-done", "ev-killed", "ev-live")
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=30)


def _page(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.status == 200, url
        return response.read().decode()


def _status_cells(page: str, key: str) -> dict[str, tuple[str, str]]:
    """Each row of a Datasette HTML table: its ``key`` cell's text → (its status cell's text, that cell's title)."""
    rows = {}
    for row in re.findall(r"<tr>(.*?)</tr>", page, re.S):
        key_cell = re.search(rf'<td class="col-{key}[^"]*"[^>]*>(.*?)</td>', row, re.S)
        status = re.search(r'<td class="col-status[^"]*"[^>]*>(.*?)</td>', row, re.S)
        if key_cell and status:
            title = re.search(r'title="([^"]*)"', status.group(1))
            rows[_text(key_cell.group(1))] = (_text(status.group(1)), html.unescape(title.group(1)) if title else "")
    return rows


def _text(cell: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", cell)).strip()


def test_the_consultations_table_page_shows_a_killed_consultation_interrupted(served: Home) -> None:
    cells = _status_cells(_page(f"{served.url}/consultations?_col=status&_size=100"), "id")
    assert cells[served.killed][0] == "interrupted"
    assert f"conclave resume {served.killed}" in cells[served.killed][1]
    assert cells[served.live][0] == "running"
    assert cells[served.done] == ("complete", "")  # a finished one: as the index says, no title added


def test_canned_queries_and_views_over_consultations_show_the_same(served: Home) -> None:
    for path in ("recent_consultations", "costliest_consultations", "run_summary?_size=100",
                 f"thread?id={served.killed}"):
        cells = _status_cells(_page(f"{served.url}/{path}"), "id")
        assert cells[served.killed][0] == "interrupted", path
        if "thread" not in path:
            assert cells[served.live][0] == "running", path
            assert cells[served.done][0] == "complete", path


def test_the_row_pages_show_what_the_table_pages_show(served: Home) -> None:
    for path, key, expected in ((f"consultations/{served.killed}", "id", "interrupted"),
                                (f"consultations/{served.live}", "id", "running"),
                                (f"eval_runs/{served.run_killed}", "run_id", "interrupted"),
                                (f"eval_runs/{served.run_live}", "run_id", "running")):
        cells = _status_cells(_page(f"{served.url}/{path}"), key)
        assert [status for status, _ in cells.values()] == [expected], path


def test_the_eval_runs_table_page_shows_a_killed_run_interrupted(served: Home) -> None:
    cells = _status_cells(_page(f"{served.url}/eval_runs?_size=100"), "run_id")
    assert cells[served.run_killed][0] == "interrupted"
    assert f"conclave eval resume {served.run_killed}" in cells[served.run_killed][1]
    assert cells[served.run_live][0] == "running"
    assert cells[served.run_done] == ("complete", "")


def test_the_eval_runs_overview_query_shows_a_killed_run_interrupted(served: Home) -> None:
    cells = _status_cells(_page(f"{served.url}/eval_runs_overview"), "run_id")
    assert cells[served.run_killed][0] == "interrupted"
    assert cells[served.run_live][0] == "running"
    assert cells[served.run_done][0] == "complete"


def test_the_rounds_of_a_killed_consultation_read_interrupted(served: Home) -> None:
    """A plain ``datasette serve`` settles nothing in the index: the round the process was killed in reads as its
    consultation does, and a finished round as it finished."""
    rounds = "rounds?_col=round_number&_col=status&_sort=round_number&consultation_id="
    killed = _status_cells(_page(f"{served.url}/{rounds}{served.killed}"), "round_number")
    assert {n: status for n, (status, _) in killed.items()} == {"1": "ok", "2": "interrupted"}
    assert f"conclave resume {served.killed}" in killed["2"][1]
    live = _status_cells(_page(f"{served.url}/{rounds}{served.live}"), "round_number")
    assert {n: status for n, (status, _) in live.items()} == {"1": "ok", "2": "running"}


@needs_browser
def test_screenshot_of_the_consultations_page_with_a_killed_consultation(served: Home, browser: Any) -> None:
    browser.get(f"{served.url}/consultations")
    cell = browser.find_element("css selector", "td.col-status .cv-live-status")
    assert cell.text in {"interrupted", "running"}
    shown = {e.text for e in browser.find_elements("css selector", "td.col-status")}
    assert {"interrupted", "running", "complete"} <= shown
    assert screenshot(browser, "datasette-consultations-killed").stat().st_size > 0


# ------------------------------------------------------------------------ ids from the database are data, not paths

ESCAPING = "../held"  # journal/../held.jsonl: a file beside the journal dir, held by this test
SCRIPT = '"><script>alert(1)</script>'


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """An index whose rows say ``running`` under ids no conclave writes: one naming a path out of the journal dir
    whose file a process holds locked, one carrying markup, and an eval run id out of the eval dir whose run.json
    says ``complete``."""
    home = tmp_path_factory.mktemp("hostile")
    db = connect(home / "index.db")
    for cid in (ESCAPING, SCRIPT):
        db["consultations"].insert({"id": cid, "status": "running", "question": "q", "mode": "converge",
                                    "started_at": "2026-01-01T00:00:00+00:00"})
    for run_id in (ESCAPING, SCRIPT, "ev-gone"):
        db["eval_runs"].insert({"run_id": run_id, "status": "running", "started_at": "2026-01-01T00:00:00+00:00"})
    db.close()
    (home / "journal").mkdir()  # so that journal/../held.jsonl resolves
    (home / "held").mkdir()
    (home / "held" / "run.json").write_text(json.dumps({"run_id": "held", "status": "complete"}))
    held = os.open(home / "held.jsonl", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a live writer holds a journal: read through the id, it would say running
    try:
        with serve_datasette(home / "index.db") as url:
            yield f"{url}/index", home
    finally:
        os.close(held)


def test_a_consultation_id_that_is_not_one_reaches_no_file_and_injects_nothing(hostile: tuple[str, Path]) -> None:
    url, _ = hostile
    page = _page(f"{url}/consultations?_col=status")
    assert "<script>alert(1)" not in page
    cells = _status_cells(page, "id")
    assert cells[ESCAPING][0] == "interrupted"  # no journal can have that name: nobody writes it
    assert "cannot name a journal" in cells[ESCAPING][1]
    assert cells[SCRIPT][0] == "interrupted" and SCRIPT in cells[SCRIPT][1]


def test_a_run_id_that_is_not_one_reaches_no_file_and_injects_nothing(hostile: tuple[str, Path]) -> None:
    url, _ = hostile
    for path in ("eval_runs?_col=status", "eval_runs_overview"):
        page = _page(f"{url}/{path}")
        assert "<script>alert(1)" not in page, path
        cells = _status_cells(page, "run_id")
        # read through the id, ../held/run.json would say complete: the index's word stands, with why
        assert cells[ESCAPING] == ("running", f"the index says running, but this home holds no run.json for "
                                              f"{ESCAPING!r}"), path
        assert cells[SCRIPT][0] == "running" and SCRIPT in cells[SCRIPT][1], path
        assert cells["ev-gone"][0] == "running" and "no run.json" in cells["ev-gone"][1], path
