"""A data home that refuses writes — a file where the directory should be, read-only, a full disk at start or
in the middle of a run — ends the consultation with one stderr line naming the path and the cause, exit 1, and a
journal that verifies and resumes. Full and read-only disks are real: a small tmpfs in a private mount namespace
(``unshare -rm``), where the kernel itself refuses the writes."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import clean_env
from fs_faults import unshare_available

from conclave import events as ev
from conclave.store.journal import read_journal
from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

CLI = [sys.executable, "-m", "conclave"]
DRIVER = str(Path(__file__).with_name("fs_faults.py"))
needs_namespace = pytest.mark.skipif(not unshare_available(), reason="cannot mount a tmpfs in a user namespace here")


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


async def consult(home: Path, fake: FakeProviderServer) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *CLI, "Should we shard the database?", *fake.overrides(), "cost.auto_approve=true",
        env=clean_env(home, FAKE_KEYS), cwd=home.parent,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def in_namespace(tmp_path: Path, fake: FakeProviderServer, scenario: str) -> dict[str, Any]:
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    process = await asyncio.create_subprocess_exec(
        "unshare", "-rm", sys.executable, DRIVER, scenario, str(tmp_path / "home"), str(report),
        json.dumps(fake.overrides()), env=clean_env(tmp_path / "home", FAKE_KEYS), cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, (out + err).decode()
    result: dict[str, Any] = json.loads(report.read_text())
    return result


async def test_a_home_that_is_a_file_is_one_line_naming_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.write_text("not a directory\n")
    async with FakeProviderServer() as fake:
        code, _, err = await consult(home, fake)
        assert not fake.requests  # nothing was spent
    assert code == 1
    assert one_line(err) == f"conclave: cannot create the journal directory {home}: Not a directory"


def test_an_index_that_cannot_be_opened_is_one_line_naming_it(tmp_path: Path) -> None:
    # SQLite refuses to open the index (here: a directory where the file should be; a full disk fails the same
    # way at "PRAGMA journal_mode"): reading commands say so in one line instead of a traceback
    import subprocess

    home = tmp_path / "home"
    (home / "index.db").mkdir(parents=True)
    done = subprocess.run([*CLI, "logs", "list"], env=clean_env(home), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert one_line(done.stderr) == f"conclave logs: cannot open the index {home / 'index.db'}: unable to open database file"


def test_a_home_that_is_a_file_is_one_line_for_the_commands_that_read_it(tmp_path: Path) -> None:
    from conclave.errors import StorageError
    from conclave.store.heads import HeadsLog
    from conclave.store.paths import StoreLayout
    from conclave.store.sqlite_index import IndexOpenError, connect

    home = tmp_path / "home"
    home.write_text("not a directory\n")
    layout = StoreLayout(home)
    heads = HeadsLog(layout.heads_path)
    for read in (heads.entries, heads.anchor):  # `logs verify` and `logs head`
        with pytest.raises(StorageError, match=f"^cannot read the heads log {layout.heads_path}: Not a directory$"):
            read()
    with pytest.raises(IndexOpenError, match=f"^cannot open the index {layout.index_path}: {home} is not a directory$"):
        connect(layout.index_path)  # `logs list`, `stats`: it said "File exists"


def test_an_index_that_is_not_a_database_says_how_to_recreate_it(tmp_path: Path) -> None:
    from conclave.store.sqlite_index import IndexOpenError, connect

    path = tmp_path / "index.db"
    path.write_text("not a database, but long enough to look like a file header\n" * 4)
    with pytest.raises(IndexOpenError, match=r"index\.db: file is not a database; `conclave index rebuild` recreates"):
        connect(path)


@needs_namespace
async def test_a_read_only_home_is_one_line_naming_it(tmp_path: Path) -> None:
    async with FakeProviderServer() as fake:
        report = await in_namespace(tmp_path, fake, "read_only")
        assert not fake.requests
    run = report["run"]
    assert run["code"] == 1
    line = one_line(run["stderr"])
    assert str(tmp_path / "home" / "journal") in line and "Read-only file system" in line


@needs_namespace
async def test_a_full_disk_at_start_is_one_line_and_leaves_no_journal(tmp_path: Path) -> None:
    async with FakeProviderServer() as fake:
        report = await in_namespace(tmp_path, fake, "full_at_start")
        assert not fake.requests  # the start could not be made durable: no provider was called
    run = report["run"]
    assert run["code"] == 1 and run["stdout"] == ""  # nothing was asked: no summary to print
    line = one_line(run["stderr"])
    assert str(tmp_path / "home" / "journal") in line and "No space left on device" in line
    assert "nothing was recorded" in line
    assert report["journals"] == []  # no empty journal that could never be resumed
    assert report["verify"]["code"] == 0, report["verify"]


def slow_replies(fake: FakeProviderServer, latency: float = 0.6) -> None:
    for model in ("gpt-4o", "claude-sonnet-4-5", "gemini-2.5-pro"):
        fake.script(model, lambda request: Reply(json=instance_for(request.schema), latency=latency))


@needs_namespace
@pytest.mark.slow
async def test_a_disk_filling_mid_run_stops_in_one_line_and_resumes_once_there_is_space(tmp_path: Path) -> None:
    async with FakeProviderServer() as fake:
        slow_replies(fake)
        report = await in_namespace(tmp_path, fake, "full_mid_run")
    run = report["run"]
    assert run["code"] == 1
    line = one_line(run["stderr"])
    assert "No space left on device" in line and str(tmp_path / "home" / "journal") in line
    assert "conclave resume" in line
    # the partial result is still printed: round 1 was complete and durable before the disk filled
    assert "Partial result" in run["stdout"] and "Independent positions" in run["stdout"]
    assert report["verify"]["code"] == 0, report["verify"]
    # still full: resume says so plainly, and nothing was spent meanwhile
    full = report["resume_full"]
    assert full["code"] == 1 and full["stdout"] == ""
    assert full["stderr"].splitlines()[-1].startswith("conclave resume: cannot write the journal ")
    assert "No space left on device" in full["stderr"] and "Stopped after" not in full["stderr"]
    assert "Traceback" not in full["stderr"]
    assert report["resume"]["code"] == 0, report["resume"]
    assert report["verify_after"]["code"] == 0, report["verify_after"]
    # the index caught up with the journal: every round and call the journal holds
    [journal] = (tmp_path / "out" / "journal").glob("*.jsonl")
    records = read_journal(journal).records
    assert records[-1]["type"] == ev.CONSULTATION_COMPLETED and records[-1]["data"]["status"] == "complete"
    db = sqlite3.connect(tmp_path / "out" / "index.db")
    calls, rounds_ok, status = db.execute(
        "select calls, (select count(*) from rounds where status = 'ok'), status from consultations").fetchone()
    db.close()
    assert calls == sum(r["type"] == ev.PROVIDER_ATTEMPT for r in records)
    assert rounds_ok == 4 and status == "complete"


def test_the_start_of_a_consultation_is_durable_before_anything_is_spent(tmp_path: Path) -> None:
    """A run killed right after it started leaves its question and configuration on disk, with a head: no empty
    journal that could never be resumed. The write runs on the recorder's I/O thread; every provider request
    awaits ``until_durable`` first (and the consent prompt flushes before it asks)."""
    from conclave.store.heads import HeadsLog
    from conclave.store.paths import StoreLayout
    from conclave.store.recorder import Recorder
    from conclave.testing.synthetic_events import synthetic_events

    started = synthetic_events(1)[0]
    assert started.type == ev.CONSULTATION_STARTED
    recorder = Recorder(tmp_path, index=False)
    recorder(started)  # and nothing else: no flush, no close, as if the process died here
    asyncio.run(recorder.until_durable())  # what a request waits for before it is sent
    layout = StoreLayout(tmp_path)
    on_disk = read_journal(layout.journal_path(started.consultation_id)).records
    assert [r["type"] for r in on_disk] == [ev.CONSULTATION_STARTED]
    assert on_disk[0]["data"]["question"] == started.data["question"]
    assert HeadsLog(layout.heads_path).load()[started.consultation_id] == [(0, on_disk[0]["hash"])]
    recorder.close()


async def test_a_journal_the_disk_refuses_mid_run_still_ends_run_with_the_partial_result(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    """Once round 2's request reaches the provider (round 1 is durable by then: a request waits for the journal's
    writes before it is sent), the journal's file descriptor points at /dev/full, which refuses every write with
    ENOSPC as a full disk does: run() returns the partial result and says which file and why, it never raises
    from its own error handler."""
    import os

    from test_engine_support import JUDGE_MODEL, by_schema, script_panel

    from conclave.api import compose_settings
    from conclave.engine.run import Consultation
    from conclave.store.paths import StoreLayout
    from conclave.store.recorder import Recorder
    from conclave.store.verify import verify_store
    from conclave.testing.fake_server import RecordedRequest

    fake = fake_provider_server
    script_panel(fake)
    settings = compose_settings("q", [*fake.overrides(), "cost.auto_approve=true", f"judge.model={JUDGE_MODEL}"])
    recorder = Recorder(settings.home)
    answer = by_schema()  # as script_panel scripts the judge

    def fill_the_disk(request: RecordedRequest) -> Reply:
        for writer in recorder._writers.values():  # round 2's synthesis: the judge's first request
            full = os.open("/dev/full", os.O_WRONLY)
            os.dup2(full, writer._fd)
            os.close(full)
        return answer(request)

    fake.script(JUDGE_MODEL, fill_the_disk)
    consultation = Consultation(settings, recorder=recorder)
    result = await consultation.run()
    recorder.close()
    path = StoreLayout(settings.home).journal_path(consultation.id)
    # round 2's synthesis was paid for and arrived, but could not be recorded: nothing more is asked
    assert result.status == "partial" and result.completed_rounds == 2
    assert len(fake.requests) == 4  # round 1's three answers and the synthesis
    assert result.abort_reason is not None
    assert result.abort_reason.startswith(f"cannot write the journal {path}: No space left on device")
    assert set(result.artifacts.round_1) == {"security", "architect", "pragmatist"}
    records = read_journal(path).records
    assert records[-1]["type"] == ev.ROUND_STARTED and records[-1]["data"]["round_number"] == 2
    assert verify_store(StoreLayout(settings.home)).ok


# ------------------------------------------------------------------- a home whose mode bits forbid writing
# Root writes wherever the mode bits say no (CAP_DAC_OVERRIDE), and the interpreter may live where another user
# cannot read it (/root/.pyenv): the CLI runs as this user without the capabilities that override the mode bits.

def mode_bits_bind() -> list[str] | None:
    """The command prefix under which a directory of mode 0o555 refuses writes (None: none here)."""
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        return None
    prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", "--"]
    with tempfile.TemporaryDirectory() as probe:
        Path(probe).chmod(0o555)
        done = subprocess.run([*prefix, "sh", "-c", f"touch {probe}/x"], capture_output=True, timeout=30)
        Path(probe).chmod(0o755)
    return prefix if done.returncode != 0 else None


WITHOUT_OVERRIDE = mode_bits_bind()
needs_mode_bits = pytest.mark.skipif(WITHOUT_OVERRIDE is None, reason="running as root without setpriv (or a setpriv "
                                     "that cannot drop CAP_DAC_OVERRIDE): mode bits would not bind")


def tree_mode(home: Path, *, writable: bool) -> None:
    for path in [home, *home.rglob("*")]:
        path.chmod((0o755 if path.is_dir() else 0o644) if writable else (0o555 if path.is_dir() else 0o444))


async def test_a_home_the_user_may_not_write_is_one_line_naming_it(tmp_path: Path) -> None:
    if WITHOUT_OVERRIDE is None:
        pytest.skip("running as root without setpriv: mode bits would not bind")
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o555)
    async with FakeProviderServer() as fake:
        process = await asyncio.create_subprocess_exec(
            *WITHOUT_OVERRIDE, *CLI, "Should we shard the database?", *fake.overrides(), "cost.auto_approve=true",
            env=clean_env(home, FAKE_KEYS), cwd=tmp_path, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        _, err = await process.communicate()
        assert not fake.requests  # nothing was spent
    assert process.returncode == 1
    line = one_line(err.decode())
    assert str(home / "journal") in line and "Permission denied" in line


async def test_a_read_only_home_still_lists_and_counts_its_consultations(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    from test_engine_support import JUDGE_MODEL, script_panel

    from conclave.api import compose_settings
    from conclave.engine.run import Consultation
    from conclave.store.recorder import Recorder

    if WITHOUT_OVERRIDE is None:
        pytest.skip("running as root without setpriv: mode bits would not bind")
    script_panel(fake_provider_server)
    settings = compose_settings("q", [*fake_provider_server.overrides(), "cost.auto_approve=true",
                                      f"judge.model={JUDGE_MODEL}"])
    recorder = Recorder(settings.home)
    consultation = Consultation(settings, recorder=recorder)
    result = await consultation.run()
    recorder.close()
    assert result.status == "complete"
    home = Path(conclave_env)
    index = sqlite3.connect(home / "index.db", isolation_level=None)
    # an index written before m017 (it only adds an index for speed): a reader needs no upgrade to read it
    index.execute("drop index rounds_running")
    index.execute("delete from _sqlite_migrations where name = 'm017_running_rounds'")
    index.close()
    tree_mode(home, writable=False)
    try:
        for command in (["logs", "list"], ["stats"]):
            process = await asyncio.create_subprocess_exec(
                *WITHOUT_OVERRIDE, *CLI, *command, env=clean_env(home), cwd=home.parent,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await process.communicate()
            assert "Traceback" not in err.decode(), err.decode()
            assert process.returncode == 0, (command, err.decode())  # was: "attempt to write a readonly database"
            if command == ["logs", "list"]:
                assert consultation.id in out.decode()
            else:
                assert "consultations      1 (complete 1)" in out.decode()
    finally:
        tree_mode(home, writable=True)


def test_a_recorder_shared_by_consultations_stops_only_the_one_whose_journal_fails(tmp_path: Path) -> None:
    """The web server, the eval runner and the API share one Recorder: a full disk under one consultation's journal
    stops that consultation, not the others; the failed journal is let go when it ends; what it made durable
    before is indexed."""
    import os
    import sqlite3

    from conclave.store.journal import JournalError
    from conclave.store.recorder import Recorder
    from conclave.testing.synthetic_events import synthetic_events

    a, b, c = synthetic_events(1), synthetic_events(2), synthetic_events(3)
    start = next(i for i, e in enumerate(b) if e.type == ev.ROUND_STARTED) + 1
    recorder = Recorder(tmp_path)
    for event in a[:start] + b[:start]:
        recorder(event)
    recorder.flush(consultation_id=a[0].consultation_id)
    full = os.open("/dev/full", os.O_WRONLY)
    os.dup2(full, recorder._writers[b[0].consultation_id]._fd)  # B's disk is full from here on
    os.close(full)
    for event in b[start:start + 3]:
        recorder(event)
    recorder.write_out()
    with pytest.raises(JournalError):
        recorder.flush(consultation_id=b[0].consultation_id)
    recorder.flush(consultation_id=a[0].consultation_id)  # A is not stopped by B's disk
    asyncio.run(recorder.until_durable(a[0].consultation_id))
    with pytest.raises(JournalError):
        recorder(b[-1])  # B ends: its record is refused, and its journal let go
    assert b[0].consultation_id not in recorder._writers
    for event in c:  # a consultation after it runs as usual
        recorder(event)
    recorder.close()
    db = sqlite3.connect(tmp_path / "index.db")
    indexed = {cid for (cid,) in db.execute("select distinct consultation_id from rounds")}
    db.close()
    # B's first round start was durable before its disk filled: it is indexed like A's and C's rounds
    assert indexed == {a[0].consultation_id, b[0].consultation_id, c[0].consultation_id}


@needs_mode_bits
def test_rebuilding_the_index_of_a_read_only_home_is_one_line_naming_it(tmp_path: Path) -> None:
    import subprocess

    assert WITHOUT_OVERRIDE is not None
    home = tmp_path / "home"
    other = tmp_path / "other"
    (other / "journal").mkdir(parents=True)
    (other / "journal" / "c-mwzp0000abcd.jsonl").write_text("{}\n")  # something to copy: merge writes it first
    made = subprocess.run([*CLI, "index", "rebuild"], env=clean_env(home), cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    tree_mode(home, writable=False)
    try:
        runs = [subprocess.run([*WITHOUT_OVERRIDE, *CLI, "index", *command], env=clean_env(home), cwd=tmp_path,
                               capture_output=True, text=True, timeout=120)
                for command in (["rebuild"], ["merge", str(other)])]
    finally:
        tree_mode(home, writable=True)
    rebuilt, merged = runs
    assert rebuilt.returncode == 1, rebuilt.stderr  # was: a traceback ending "attempt to write a readonly database"
    assert one_line(rebuilt.stderr) == (f"conclave index: cannot rebuild the index {home / 'index.db'}: "
                                        f"its directory {home} is read-only")
    assert merged.returncode == 1, merged.stderr  # was: a traceback from copying the journal
    assert one_line(merged.stderr) == f"conclave index: cannot merge into {home}: the directory is read-only"


@needs_mode_bits
async def test_browse_serves_the_index_of_a_read_only_home(tmp_path: Path) -> None:
    import re
    import urllib.request

    assert WITHOUT_OVERRIDE is not None
    home = tmp_path / "home"
    made = await asyncio.create_subprocess_exec(*CLI, "index", "rebuild", env=clean_env(home), cwd=tmp_path,
                                                stderr=asyncio.subprocess.PIPE)
    assert await made.wait() == 0
    tree_mode(home, writable=False)
    process = await asyncio.create_subprocess_exec(
        *WITHOUT_OVERRIDE, *CLI, "browse", "--no-open", "--port", "0", env=clean_env(home), cwd=tmp_path,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert process.stderr is not None
    try:
        url = None
        while url is None:  # was: Datasette's traceback, "attempt to write a readonly database", exit 1
            line = (await asyncio.wait_for(process.stderr.readline(), 60)).decode()
            assert line, "conclave browse exited before serving"
            found = re.search(r"at (http://127\.0\.0\.1:\d+/index) ", line)
            url = found.group(1) if found else None
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"{url}/consultations.json", timeout=30).read())
        assert b"rows" in body
    finally:
        process.terminate()
        await process.wait()
        tree_mode(home, writable=True)


UNREADABLE_HOME_COMMANDS = [["logs", "list"], ["stats"], ["show", "c-x"], ["resume"], ["Should we shard?"],
                            ["show-prompt", "1", "Should we shard?"], ["doctor"], ["eval", "report", "latest"],
                            ["browse", "--no-open"], ["mcp", "rounds=1"]]


@needs_mode_bits
@pytest.mark.parametrize("command", UNREADABLE_HOME_COMMANDS, ids=" ".join)
def test_a_home_the_user_may_not_read_is_one_line_naming_the_path(tmp_path: Path, command: list[str]) -> None:
    import subprocess

    assert WITHOUT_OVERRIDE is not None
    home = tmp_path / "home"
    (home / "journal").mkdir(parents=True)
    home.chmod(0o000)
    try:
        done = subprocess.run([*WITHOUT_OVERRIDE, *CLI, *command], env=clean_env(home, FAKE_KEYS), cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    finally:
        home.chmod(0o755)
    assert done.returncode == 1, done.stderr  # was: a PermissionError traceback
    line = one_line(done.stderr)
    assert line.startswith(f"conclave: cannot access {home}/") and line.endswith(": Permission denied"), line
