"""A lean journal (issue 28 item 1): a value a record repeats from an earlier record of the same journal is written
once and referred to; every reader reads the record whole; ``logs verify`` still proves it; journals written
before references existed (``tests/fixtures/journals/pre_refs_quick.jsonl``) still verify, show, index and
resume. CLI runs are ``python -m conclave`` subprocesses against the fake provider server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

from cli_helpers import run_conclave

from conclave.store.heads import HeadsLog
from conclave.store.journal import JournalWriter, last_record, read_journal, read_records
from conclave.store.journal_file import REFS
from conclave.store.paths import StoreLayout
from conclave.store.redact import Redactor
from conclave.store.resume_points import load_resume_point
from conclave.testing.fake_server import FakeProviderServer

FIXTURES = Path(__file__).parent / "fixtures" / "journals"
OLD_ID = "c-mx006yi6z1ex"
ARTIFACT = {"recommendation": "Adopt an outbox table. " * 20, "points": [f"point {i} " * 10 for i in range(6)]}


def write(home: Path, cid: str, records: list[tuple[str, dict[str, Any]]]) -> Path:
    layout = StoreLayout(home)
    writer = JournalWriter(layout.journal_path(cid), cid, HeadsLog(layout.heads_path), Redactor([]))
    for i, (type_, data) in enumerate(records):
        writer.append_line(type_, 1_790_000_000.0 + i, data)
    writer.close()
    return layout.journal_path(cid)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_repeated_value_is_written_once_and_read_back_whole(tmp_path: Path) -> None:
    stream = [("consultation:round_artifact", {"agent": "a", "artifact": ARTIFACT}),
              ("consultation:completed", {"status": "complete",
                                          "result": {"verdict": ARTIFACT, "rounds": [{"agents": {"a": ARTIFACT}}]}})]
    path = write(tmp_path, "c-lean1", stream)
    raw = lines(path)
    assert REFS not in raw[0]
    assert raw[1][REFS] == [[["result", "verdict"], 0, ["artifact"]],
                            [["result", "rounds", 0, "agents", "a"], 0, ["artifact"]]]
    assert raw[1]["data"]["result"]["verdict"] is None
    assert path.read_text().count("Adopt an outbox table.") == 20  # the artifact is in the file once, not thrice
    expected = [data for _, data in stream]
    assert [r["data"] for r in read_records(path)] == expected
    assert [r["data"] for r in read_journal(path).records] == expected
    assert all(REFS not in r for r in read_records(path))
    assert (last_record(path) or {})["data"] == expected[-1]
    assert lines(path) == raw  # reading fills in copies; the parsed lines keep what their hashes cover
    done = run_conclave("logs", "verify", home=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_editing_a_referred_value_is_caught_by_verify(tmp_path: Path) -> None:
    stream = [("consultation:round_artifact", {"agent": "a", "artifact": ARTIFACT}),
              ("consultation:completed", {"status": "complete", "result": {"verdict": ARTIFACT}})]
    path = write(tmp_path, "c-lean2", stream)
    text = path.read_text()
    assert text.count("Adopt an outbox table.") == 20  # once: the completed record refers to it
    path.write_text(text.replace("Adopt an outbox", "Reject an outbox", 1))
    done = run_conclave("logs", "verify", home=tmp_path)
    assert done.returncode == 1
    assert "c-lean2" in done.stdout + done.stderr and "edited" in done.stdout + done.stderr


def old_home(tmp_path: Path) -> Path:
    home = tmp_path / "home"
    layout = StoreLayout(home)
    layout.journal_dir.mkdir(parents=True)
    shutil.copy(FIXTURES / "pre_refs_quick.jsonl", layout.journal_path(OLD_ID))
    shutil.copy(FIXTURES / "pre_refs_quick.HEADS", layout.heads_path)
    return home


def test_a_journal_written_before_references_verifies_shows_and_indexes(tmp_path: Path) -> None:
    home = old_home(tmp_path)
    path = StoreLayout(home).journal_path(OLD_ID)
    assert REFS.encode() not in path.read_bytes().replace(b'"refs":', b"")  # no reference anywhere
    verify = run_conclave("logs", "verify", home=home)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    shown = run_conclave("show", OLD_ID, "--format", "json", home=home)
    assert shown.returncode == 0, shown.stderr
    final = [r for r in lines(path) if r["type"] == "consultation:completed"][-1]["data"]["result"]
    assert json.loads(shown.stdout)["verdict"] == final["verdict"]
    rebuild = run_conclave("index", "rebuild", home=home)
    assert rebuild.returncode == 0, rebuild.stderr
    with sqlite3.connect(StoreLayout(home).index_path) as conn:
        status, recommendation = conn.execute("select status, recommendation from consultations").fetchone()
    assert (status, recommendation) == ("complete", final["verdict"]["recommendation"])


def test_resume_reads_an_old_journal_cut_after_round_one(tmp_path: Path) -> None:
    # The old journal cut back to its first round's end, as a run killed there leaves it: resume reads it.
    home = old_home(tmp_path)
    path = StoreLayout(home).journal_path(OLD_ID)
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        kept.append(line)
        if json.loads(line)["type"] == "round:completed":
            break
    path.write_text("".join(kept))
    last = json.loads(kept[-1])
    StoreLayout(home).heads_path.unlink()  # its heads as a run killed there leaves them: the last one is here
    HeadsLog(StoreLayout(home).heads_path).append(OLD_ID, last["seq"], last["hash"], sync=True)
    point = load_resume_point(StoreLayout(home), OLD_ID)
    assert point.next_seq == len(kept)
    assert point.restored_rounds == [1]  # round 1's answers are restored, not asked for again


async def _consult(fake: FakeProviderServer, home: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(home), CONCLAVE_PROGRESS="0")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", *args, "cost.auto_approve=true", *fake.overrides(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(home), env=env)
    out, err = await asyncio.wait_for(process.communicate(), timeout=180)
    return process.returncode or 0, out.decode(), err.decode()


async def test_a_cli_run_journals_its_result_by_reference_and_reads_whole(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    code, out, err = await _consult(fake_provider_server, conclave_env, "Lean?", "rounds=4", "output.format=json")
    assert code == 0, err
    layout = StoreLayout(conclave_env)
    (cid,) = layout.journal_ids()
    path = layout.journal_path(cid)
    completed = [r for r in lines(path) if r["type"] == "consultation:completed"][-1]
    assert completed[REFS]  # the result repeats the round artifacts: referred to, not written again
    result = json.loads(out)
    recorded = [r for r in read_records(path) if r["type"] == "consultation:completed"][-1]["data"]["result"]
    for key in ("verdict", "artifacts", "rounds", "quality"):
        assert recorded[key] == result[key], key
    shown = run_conclave("show", cid, "--format", "json", home=conclave_env)
    assert shown.returncode == 0 and json.loads(shown.stdout) == result
    with sqlite3.connect(layout.index_path) as conn:  # the live index read the record whole
        live = conn.execute("select recommendation, confidence from consultations").fetchone()
    assert live == (result["verdict"]["recommendation"], result["verdict"]["confidence"])
    verify = run_conclave("logs", "verify", home=conclave_env)
    assert verify.returncode == 0, verify.stdout + verify.stderr
