"""``logs verify``: OK for an intact store, otherwise the first edited, inserted, dropped or truncated record."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from conclave.store.chain import canonical_json, record_hash
from conclave.store.heads import HeadsLog
from conclave.store.journal import JournalWriter
from conclave.store.paths import StoreLayout
from conclave.store.redact import Redactor
from conclave.store.verify import verify_store

CID = "c-verify"
FLUSH_AFTER = {2, 5, 9}  # heads recorded at these seqs


def build(home: Path) -> Path:
    layout = StoreLayout(home)
    w = JournalWriter(layout.journal_path(CID), CID, HeadsLog(layout.heads_path), Redactor([]))
    for seq in range(10):
        w.append("state:transition", 1000.0 + seq, {"n": seq})
        if seq in FLUSH_AFTER:
            w.flush()
    w.close()
    return layout.journal_path(CID)


def as_written(record: dict) -> str:
    """The line JournalWriter would write, whatever the record's (possibly stale) hash."""
    body = canonical_json({k: v for k, v in record.items() if k != "hash"})
    return f'{body[:-1]},"hash":"{record["hash"]}"}}'


def rewrite(path: Path, change: Callable[[list[dict]], list[dict]], fmt: Callable[[dict], str] = json.dumps) -> None:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(fmt(r) + "\n" for r in change(records)))


def rehash(record: dict) -> dict:
    record["hash"] = record_hash(record)
    return record


def edit(records: list[dict]) -> list[dict]:
    records[4]["data"]["n"] = 40
    return records


def edit_and_rehash(records: list[dict]) -> list[dict]:
    records[4]["data"]["n"] = 40
    rehash(records[4])
    return records


def rewrite_chain_from(records: list[dict]) -> list[dict]:
    """Edit seq 4 and forge every later link so the chain itself is consistent: only the heads can tell."""
    records[4]["data"]["n"] = 40
    for i in range(4, len(records)):
        if i > 4:
            records[i]["prev"] = records[i - 1]["hash"]
        rehash(records[i])
    return records


def insert_linked(records: list[dict]) -> list[dict]:
    forged = rehash({**records[3], "data": {"n": 99}, "seq": 4, "prev": records[3]["hash"]})
    return [*records[:4], forged, *records[4:]]


def insert_unlinked(records: list[dict]) -> list[dict]:
    forged = rehash({**records[3], "data": {"n": 99}, "seq": 4, "prev": "f" * 64})
    return [*records[:4], forged, *records[4:]]


def drop(records: list[dict]) -> list[dict]:
    return records[:4] + records[5:]


def truncate(records: list[dict]) -> list[dict]:
    return records[:7]  # seq 9 was recorded durable


@pytest.mark.parametrize(
    ("tamper", "kind", "seq", "line"),
    [
        (edit, "edited", 4, 5),
        (edit_and_rehash, "edited", 4, 5),
        (rewrite_chain_from, "edited", 5, 6),  # the first recorded head at or after the edit
        (insert_linked, "inserted", 4, 5),
        (insert_unlinked, "inserted", 4, 5),
        (drop, "dropped", 4, 5),
        (truncate, "truncated", 7, None),
    ],
)
@pytest.mark.parametrize("fmt", [as_written, json.dumps], ids=["as-written", "reformatted"])
def test_names_the_first_bad_record(
    tmp_path: Path, tamper: Callable, kind: str, seq: int, line: int | None, fmt: Callable[[dict], str]
) -> None:
    rewrite(build(tmp_path), tamper, fmt)
    report = verify_store(StoreLayout(tmp_path))
    assert [(p.kind, p.seq, p.line) for p in report.problems] == [(kind, seq, line)]


def test_an_intact_store_verifies(tmp_path: Path) -> None:
    build(tmp_path)
    report = verify_store(StoreLayout(tmp_path))
    assert report.ok and (report.journals, report.records) == (1, 10)


def test_reformatting_a_record_without_changing_it_is_not_tampering(tmp_path: Path) -> None:
    rewrite(build(tmp_path), lambda records: records, lambda r: json.dumps(r, indent=None, sort_keys=False))
    assert verify_store(StoreLayout(tmp_path)).ok


def test_a_missing_journal_with_a_recorded_head_is_reported(tmp_path: Path) -> None:
    build(tmp_path).unlink()
    [problem] = verify_store(StoreLayout(tmp_path)).problems
    assert problem.kind == "missing" and "seq 9" in str(problem)


def test_a_line_that_is_not_a_record_counts_as_an_edit(tmp_path: Path) -> None:
    path = build(tmp_path)
    lines = path.read_text().splitlines(keepends=True)
    lines[6] = "not json at all\n"
    path.write_text("".join(lines))
    [problem] = verify_store(StoreLayout(tmp_path)).problems
    assert (problem.kind, problem.line) == ("edited", 7)


def test_a_torn_last_line_from_a_crash_is_not_tampering(tmp_path: Path) -> None:
    path = build(tmp_path)
    with open(path, "ab") as f:
        f.write(b'{"consultation_id": "c-verify", "da')
    report = verify_store(StoreLayout(tmp_path))
    assert report.ok and report.torn == [CID]


def run_verify(home: Path) -> subprocess.CompletedProcess[str]:
    env = {"CONCLAVE_HOME": str(home), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "conclave", "logs", "verify"], capture_output=True, text=True,
                          env=env, timeout=60)


def test_cli_exits_0_with_ok_and_1_naming_the_record(tmp_path: Path) -> None:
    path = build(tmp_path)
    ok = run_verify(tmp_path)
    assert ok.returncode == 0 and ok.stdout.startswith("OK: 1 journal(s), 10 record(s)")
    rewrite(path, drop)
    bad = run_verify(tmp_path)
    assert bad.returncode == 1
    assert f"FAIL {CID}: dropped (seq 4, line 5)" in bad.stdout
