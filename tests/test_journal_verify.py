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
from conclave.store.journal import JournalWriter, read_journal
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


# --- seal, heads log, keyed and anchored modes ----------------------------------------------------------------------

def finished(home: Path, status: str = "complete", key: bytes | None = None) -> JournalWriter:
    """A journal that ended with consultation:completed (``status``), its writer still open to append more."""
    layout = StoreLayout(home)
    w = JournalWriter(layout.journal_path(CID), CID, HeadsLog(layout.heads_path, key), Redactor([]))
    w.append("consultation:started", 1000.0, {"question": "q"})
    w.append("state:transition", 1001.0, {"from": "idle", "to": "complete"})
    w.append("consultation:completed", 1002.0, {"status": status, "result": {"status": status}})
    w.flush()
    return w


def test_a_record_appended_after_the_final_record_breaks_the_seal(tmp_path: Path) -> None:
    w = finished(tmp_path)
    w.append("consultation:completed", 1003.0, {"status": "aborted", "result": {"status": "aborted"}})
    w.close()  # correctly chained and with a head: only the seal shows it
    [problem] = verify_store(StoreLayout(tmp_path)).problems
    assert (problem.kind, problem.seq) == ("appended", 3)
    assert "sealed" in problem.detail


def test_logs_show_reports_the_sealed_status_not_an_appended_one(tmp_path: Path) -> None:
    w = finished(tmp_path)
    w.append("consultation:completed", 1003.0, {"status": "aborted", "result": {"status": "aborted"}})
    w.close()
    shown = subprocess.run([sys.executable, "-m", "conclave", "logs", "show", CID], capture_output=True, text=True,
                           env={"CONCLAVE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert shown.returncode == 0
    assert "\ncomplete ·" in shown.stdout and "aborted" not in shown.stdout
    assert f"{CID} fails verification: {CID}: appended (seq 3" in shown.stderr


def test_logs_show_without_a_heads_log_shows_the_journal_as_verify_judges_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """With no heads log every record is 'after the last head'; verify reports the missing log once, and `logs
    show` must not call each record an appended forgery."""
    from conclave.cli.main import main

    finished(tmp_path).close()
    StoreLayout(tmp_path).heads_path.unlink()
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path))
    assert main(["logs", "show", CID]) == 0
    shown = capsys.readouterr()
    assert "fails verification" not in shown.err and "consultation:completed" in shown.out


def test_a_partial_consultation_may_continue_only_with_a_resume(tmp_path: Path) -> None:
    w = finished(tmp_path, "partial")
    w.append("consultation:resumed", 1003.0, {"restored_rounds": [1]})
    w.append("consultation:started", 1004.0, {"question": "q"})
    w.flush()
    assert verify_store(StoreLayout(tmp_path)).ok
    w.append("consultation:completed", 1005.0, {"status": "partial", "result": {}})
    w.append("state:transition", 1006.0, {"from": "idle", "to": "estimating"})  # not a resume
    w.close()
    [problem] = verify_store(StoreLayout(tmp_path)).problems
    assert (problem.kind, problem.seq) == ("appended", 6)


def appended_without_heads(*added: tuple[str, dict]) -> Callable[[list[dict]], list[dict]]:
    """Correctly chained records added to the journal's end, as anyone with write access can (no heads)."""
    def change(records: list[dict]) -> list[dict]:
        for type_, data in added:
            last = records[-1]
            records.append(rehash({"consultation_id": CID, "data": data, "prev": last["hash"], "seq": last["seq"] + 1,
                                   "ts": last["ts"] + 1, "type": type_}))
        return records
    return change


@pytest.mark.parametrize("status", ["partial", None])
def test_an_ending_forged_onto_a_partial_or_killed_journal_fails(tmp_path: Path, status: str | None) -> None:
    """A partial journal continued by a forged resume, or a killed one given a forged completion, used to verify
    (and `logs show` reported the forged status): every write records its head, so headless records show."""
    if status is None:
        path = build(tmp_path)  # no final record: a run killed mid-way
        forged = appended_without_heads(("consultation:completed", {"status": "complete", "result": {}}))
    else:
        finished(tmp_path, status).close()
        path = StoreLayout(tmp_path).journal_path(CID)
        forged = appended_without_heads(("consultation:resumed", {"restored_rounds": [1]}),
                                        ("consultation:completed", {"status": "complete", "result": {}}))
    before = len(path.read_text().splitlines())
    rewrite(path, forged, fmt=as_written)
    [problem] = verify_store(StoreLayout(tmp_path)).problems
    assert (problem.kind, problem.seq) == ("appended", before)
    assert "after the last recorded head" in problem.detail


def test_a_resume_drops_records_no_head_covers_instead_of_adopting_them(tmp_path: Path) -> None:
    """Continuing a journal must not cover forged (or never headed) records with a new head: they are cut off,
    and what resume restores is read without them."""
    finished(tmp_path, "partial").close()
    layout = StoreLayout(tmp_path)
    path = layout.journal_path(CID)
    headed = path.read_bytes()
    rewrite(path, appended_without_heads(("consultation:resumed", {"restored_rounds": [1, 2, 3]})), fmt=as_written)
    w = JournalWriter(path, CID, HeadsLog(layout.heads_path), Redactor([]))
    assert path.read_bytes() == headed and w.next_seq == 3
    w.append("consultation:resumed", 1003.0, {"restored_rounds": []})
    w.close()
    assert verify_store(layout).ok
    assert [r["data"]["restored_rounds"] for r in read_journal(path).records[3:]] == [[]]


def test_journals_without_a_heads_log_fail_verification(tmp_path: Path) -> None:
    """Deleting the heads log and re-hashing an edited journal used to verify as OK."""
    path = build(tmp_path)
    StoreLayout(tmp_path).heads_path.unlink()
    rewrite(path, rewrite_chain_from, fmt=as_written)
    problems = verify_store(StoreLayout(tmp_path)).problems
    assert [p.kind for p in problems] == ["missing"]
    assert "HEADS is missing while journals exist" in problems[0].detail


def forge_with_heads(home: Path) -> None:
    """Edit a record, re-hash the chain from there and rewrite the heads log to match: plain mode cannot tell."""
    layout = StoreLayout(home)
    rewrite(layout.journal_path(CID), rewrite_chain_from, fmt=as_written)
    records = [json.loads(line) for line in layout.journal_path(CID).read_text().splitlines()]
    others = [line for line in layout.heads_path.read_text().splitlines(keepends=True) if not line.startswith(CID + " ")]
    layout.heads_path.write_text("".join(others) + "".join(f"{CID} {seq} {records[seq]['hash']}\n"
                                                           for seq in sorted(FLUSH_AFTER)))


def test_a_journal_forged_with_its_heads_passes_plain_but_not_keyed_verification(tmp_path: Path) -> None:
    key = b"kept out of the data home"
    layout = StoreLayout(tmp_path)
    w = JournalWriter(layout.journal_path(CID), CID, HeadsLog(layout.heads_path, key), Redactor([]))
    for seq in range(10):
        w.append("state:transition", 1000.0 + seq, {"n": seq})
        if seq in FLUSH_AFTER:
            w.flush()
    w.close()
    assert verify_store(layout, key=key).ok
    forge_with_heads(tmp_path)
    assert verify_store(layout).ok  # what plain mode cannot prove (docs/records-and-tamper-evidence.md, "Tamper evidence")
    [problem] = verify_store(layout, key=key).problems
    assert problem.kind == "unkeyed" and "CONCLAVE_JOURNAL_KEY" in problem.detail
    assert not verify_store(layout, key=b"another key").ok


def test_a_forgery_after_the_anchor_was_taken_fails_verify_against_it(tmp_path: Path) -> None:
    env = {"CONCLAVE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def logs(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "conclave", "logs", *args], capture_output=True, text=True,
                              env=env, timeout=60)

    build(tmp_path)
    head = logs("head")
    assert head.returncode == 0 and head.stdout.startswith("heads-v1:")
    digest = head.stdout.strip()
    # more consultations later keep the anchor valid: the heads log only grows
    w = JournalWriter(StoreLayout(tmp_path).journal_path("c-later"), "c-later",
                      HeadsLog(StoreLayout(tmp_path).heads_path), Redactor([]))
    w.append("state:transition", 2000.0, {"n": 1})
    w.close()
    assert logs("verify", "--against", digest).returncode == 0
    forge_with_heads(tmp_path)
    assert logs("verify").returncode == 0
    anchored = logs("verify", "--against", digest)
    assert anchored.returncode == 1 and "FAIL (heads log): anchor" in anchored.stdout
    bad = logs("verify", "--against", "not-a-digest")
    assert bad.returncode == 2 and "not a heads digest" in bad.stderr


def test_verify_and_the_journal_writer_do_not_import_each_other() -> None:
    """Both read journals through journal_file.py: the writer uses verify, verify never loads the writer."""
    code = ("import sys, conclave.store.verify; "
            "assert 'conclave.store.journal' not in sys.modules, 'verify imports the journal writer'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_a_resume_indexes_only_the_records_a_head_covers(tmp_path: Path) -> None:
    """``conclave resume`` catches the index up from the journal after its writer has cut off records no head
    covers: a forged transition appended to a partial journal never reaches the index."""
    from conclave.store.recorder import Recorder
    from conclave.store.sqlite_index import connect

    finished(tmp_path, "partial").close()
    layout = StoreLayout(tmp_path)
    rewrite(layout.journal_path(CID), appended_without_heads(
        ("consultation:resumed", {"restored_rounds": []}),
        ("state:transition", {"from": "partial", "to": "complete", "reason": "forged"})), fmt=as_written)
    recorder = Recorder(tmp_path)
    try:
        recorder.resume(CID, {"restored_rounds": [], "spent": {}, "from_seq": 3})
        recorder.flush()
    finally:
        recorder.close()
    db = connect(layout.index_path)
    reasons = [row[0] for row in db.conn.execute("select reason from transitions where consultation_id = ?", [CID])]
    db.close()
    assert "forged" not in reasons and len(reasons) == 1


def test_an_ending_and_its_head_forged_onto_a_run_killed_before_the_anchor_fail_verify_against_it(
        tmp_path: Path) -> None:
    """A run killed before the digest, given afterwards a correctly chained ending and a head line for it: the
    heads recorded before the digest are untouched, so only what the digest says about that journal shows it."""
    env = {"CONCLAVE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}

    def logs(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "conclave", "logs", *args], capture_output=True, text=True,
                              env=env, timeout=60)

    layout = StoreLayout(tmp_path)
    path = build(tmp_path)  # no final record, nobody writes it: a run killed mid-way
    digest = logs("head").stdout.strip()
    assert logs("verify", "--against", digest).returncode == 0
    original = path.read_bytes()
    rewrite(path, appended_without_heads(("consultation:completed", {"status": "complete", "result": {}})),
            fmt=as_written)
    forged = json.loads(path.read_text().splitlines()[-1])
    HeadsLog(layout.heads_path, None).append(CID, forged["seq"], forged["hash"])  # the head line, appended too
    assert logs("verify").returncode == 0  # plain mode cannot tell (docs/records-and-tamper-evidence.md, "Tamper evidence")
    anchored = logs("verify", "--against", digest)
    assert anchored.returncode == 1, anchored.stdout
    assert f"FAIL {CID}: appended (seq 10" in anchored.stdout and "conclave resume" in anchored.stdout

    # a real resume after the digest continues the same journal and still verifies against it
    path.write_bytes(original)
    heads = [line for line in layout.heads_path.read_text().splitlines(keepends=True)
             if not line.startswith(f"{CID} 10 ")]
    layout.heads_path.write_text("".join(heads))
    assert logs("verify", "--against", digest).returncode == 0
    w = JournalWriter(path, CID, HeadsLog(layout.heads_path, None), Redactor([]))
    w.append("consultation:resumed", 1010.0, {"restored_rounds": []})
    w.append("consultation:completed", 1011.0, {"status": "complete", "result": {}})
    w.close()
    resumed = logs("verify", "--against", digest)
    assert resumed.returncode == 0, resumed.stdout
