"""``conclave logs path | list | show ID | verify [ID ...] | head``: where the records are, what they hold, and
whether they are intact (``verify`` exits 1 naming the first edited, inserted, dropped, truncated or appended
record; ``head`` prints a digest to keep elsewhere and check later with ``verify --against``)."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import sys
from typing import Any

from conclave.cli.commands.arguments import CommandParser
from conclave.errors import UsageError
from conclave.store.heads import HeadsLog, key_from_env
from conclave.store.indexer import iso
from conclave.store.journal import live_status, read_journal, read_records
from conclave.store.paths import StoreLayout, default_home
from conclave.store.resume_points import spent
from conclave.store.sqlite_index import connect, settle_killed_rounds
from conclave.store.threads import thread
from conclave.store.verify import check_headed, check_journal, mark_closed_journals, verify_store


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave logs", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    path = sub.add_parser("path", help="print the index path (open it with Datasette or sqlite3)")
    path.add_argument("--journal", action="store_true", help="print the journal directory instead")
    listing = sub.add_parser("list", help="recent consultations, newest first")
    listing.add_argument("-n", "--count", type=int, default=20, help="how many (default 20)")
    listing.add_argument("--json", action="store_true")
    show = sub.add_parser("show", help="one consultation's journal, as a timeline")
    show.add_argument("id", help="consultation id (a unique prefix is enough)")
    show.add_argument("--json", action="store_true", help="print the raw journal records")
    verify = sub.add_parser("verify", help="check every journal's hash chain against the recorded heads")
    verify.add_argument("ids", nargs="*", help="only these consultations")
    verify.add_argument("--against", metavar="DIGEST",
                        help="also check that the heads log still starts with what `conclave logs head` printed")
    sub.add_parser("head", help="print a digest of the heads log as it is now; keep it elsewhere and check it later "
                                "with `conclave logs verify --against DIGEST`")
    args = parser.parse_args(argv)
    layout = StoreLayout(default_home())
    if args.command == "path":
        print(layout.journal_dir if args.journal else layout.index_path)
        return 0
    if args.command == "list":
        return _list(layout, args.count, args.json)
    if args.command == "show":
        return _show(layout, resolve_id(layout, args.id), args.json)
    if args.command == "head":
        try:
            mark_closed_journals(layout)
        except OSError as exc:  # a read-only home: nothing can continue its journals either
            print(f"conclave logs head: journals not marked closed ({exc.strerror or exc}); the digest covers the "
                  "heads log as it is", file=sys.stderr)
        print(HeadsLog(layout.heads_path).anchor())
        return 0
    return _verify(layout, [resolve_id(layout, i) for i in args.ids] or None, args.against)


def resolve_id(layout: StoreLayout, prefix: str) -> str:
    """The consultation whose id is ``prefix`` or starts with it; a usage error when none or several match."""
    return layout.resolve_id(prefix)


def _list(layout: StoreLayout, count: int, as_json: bool) -> int:
    db = connect(layout.index_path)
    try:
        with contextlib.suppress(sqlite3.Error):  # a read-only index stays as it is; the rows below say the same
            settle_killed_rounds(db, layout)
        rows = [dict(r) for r in db.query(
            "select id, started_at, status, mode, total_cost, total_tokens, confidence, question "
            "from consultations order by started_at desc limit ?", [count])]
        indexed = {r[0] for r in db.conn.execute("select id from consultations")}
    finally:
        db.close()

    for r in rows:
        # The index says running until the final record; a run that no process is writing any more was killed.
        r["status"] = live_status(r["status"], layout.journal_path(r["id"]))
    unindexed = _unindexed(layout, indexed)
    if unindexed:
        rows = sorted([*rows, *unindexed], key=lambda r: r["started_at"] or "", reverse=True)[:count]
        if any(r["status"] == "interrupted" for r in unindexed):
            print("conclave logs: not in the index yet, listed from their journals: "
                  + ", ".join(r["id"] for r in unindexed if r["status"] == "interrupted")
                  + " (`conclave resume ID` continues one; `conclave index rebuild` indexes them)", file=sys.stderr)
    if as_json:
        json.dump(rows, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print(f"no consultations recorded in {layout.home} yet", file=sys.stderr)
        return 0
    width = max(len(r["id"]) for r in rows)
    print(_list_line("ID".ljust(width), "STARTED", "STATUS", "MODE", "COST", "CONF", "QUESTION"))
    for r in rows:
        cost = "-" if r["total_cost"] is None else f"${r['total_cost']:.4f}"
        conf = "-" if r["confidence"] is None else f"{r['confidence']:.0%}"
        question = (r["question"] or "").replace("\n", " ")
        question = question[:60] + ("…" if len(question) > 60 else "")
        print(_list_line(r["id"].ljust(width), (r["started_at"] or "")[:19], r["status"] or "-", r["mode"] or "-",
                         cost, conf, question))
    return 0


def _unindexed(layout: StoreLayout, indexed: set[str]) -> list[dict[str, Any]]:
    """Consultations whose journal the index has no row for yet, as ``_list`` rows read from the journal: the index
    is first written once round 1's requests have left, so a run killed before that is only in its journal."""
    rows = []
    for cid in sorted(set(layout.journal_ids()) - indexed):
        path = layout.journal_path(cid)
        try:
            records = read_records(path)
        except (OSError, ValueError):
            continue
        started = next((r for r in records if r.get("type") == "consultation:started"), None)
        if started is None or not isinstance(started.get("ts"), (int, float)):  # an edited journal: verify says
            continue
        data = started.get("data") or {}
        paid = spent(records)
        rows.append({"id": cid, "started_at": iso(started["ts"]),
                     "status": live_status("running", path), "mode": data.get("mode"),
                     "total_cost": paid["cost"], "total_tokens": paid["input_tokens"] + paid["output_tokens"],
                     "confidence": None, "question": data.get("question")})
    return rows


def _list_line(cid: str, started: str, status: str, mode: str, cost: str, conf: str, question: str) -> str:
    return f"{cid}  {started:<19}  {status:<18} {mode:<9} {cost:>9} {conf:>5}  {question}"


def _show(layout: StoreLayout, cid: str, as_json: bool) -> int:
    journal = read_journal(layout.journal_path(cid))
    records = journal.records
    heads = HeadsLog(layout.heads_path).load(cid).get(cid, [])
    problem = check_journal(cid, journal, heads)
    if problem is None and layout.heads_path.exists():  # without a heads log verify reports that, once
        problem = check_headed(cid, layout.journal_path(cid), journal, heads)
    if problem is not None:
        print(f"conclave logs: {cid} fails verification: {problem}", file=sys.stderr)
        if problem.seq is not None:  # what follows the first bad record is not the consultation's
            records = [r for r in records if isinstance(r.get("seq"), int) and r["seq"] < problem.seq]
    if as_json:
        json.dump(records, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
        return 0
    start = records[0]["ts"] if records else 0.0
    for record in records:
        summary = describe(record["type"], record.get("data") or {})
        print(f"{record['seq']:>4}  +{record['ts'] - start:8.2f}s  {record['type']:<34} {summary}")
    if journal.torn_at is not None:
        print("      (the last write was cut short by a crash; `conclave resume` continues from here)")
    final = next((r for r in reversed(records) if r["type"] == "consultation:completed"), None)
    if final is not None:
        result = final["data"].get("result") or {}
        cost = (result.get("cost") or {}).get("actual")
        print(f"\n{final['data'].get('status')} · confidence {result.get('confidence')} · cost ${cost}")
        print(f"recommendation: {result.get('recommendation')}")
    elif records:
        print(f"\n{_unfinished(layout, cid, records)}")
    _print_thread(layout, cid)
    return 0


def _print_thread(layout: StoreLayout, cid: str) -> None:
    """The follow-up thread ``cid`` belongs to (what it follows up on, and its follow-ups), indented by depth."""
    rows = thread(layout, cid)
    if not rows:
        return
    print(f"\nthread ({len(rows)} consultations, follow-ups indented):")
    for row in rows:
        here = "  ← this one" if row["id"] == cid else ""
        question = (row["question"] or "").replace("\n", " ")
        question = question[:60] + ("…" if len(question) > 60 else "")
        print(f"  {'  ' * row['depth']}{row['id']}  {row['status'] or '-':<18} {question}{here}")


def _unfinished(layout: StoreLayout, cid: str, records: list[dict[str, Any]]) -> str:
    """The last line of ``logs show`` for a journal without an end record: running while a process writes it,
    interrupted otherwise (as ``logs list`` and the index's rounds table say), naming the round left open."""
    status = live_status("running", layout.journal_path(cid))
    ended = ("round:completed", "round:interrupted")
    open_round = None
    for record in records:
        if record["type"] == "round:started":
            open_round = record.get("data") or {}
        elif record["type"] in ended and (record.get("data") or {}).get("round_number") == (open_round or {}).get(
                "round_number"):
            open_round = None
    where = (f" in round {open_round.get('round_number')} ({open_round.get('round_type')})"
             if open_round is not None else "")
    if status == "running":
        return f"running{where}: a process is writing this journal"
    return (f"interrupted{where}: no process is writing this journal any more (killed); "
            f"`conclave resume {cid}` continues it")


def describe(type_: str, d: dict[str, Any]) -> str:
    """One line of the interesting payload of a record, for ``logs show``."""
    if type_ == "consultation:started":
        follow_up = f" · follow-up of {d['parent']}" if d.get("parent") else ""
        return f"{d.get('mode')} · {len(d.get('agents') or [])} agents · {d.get('question')!r}{follow_up}"
    if type_ == "state:transition":
        return f"{d.get('from')} → {d.get('to')} ({d.get('reason')})"
    if type_ in ("round:started", "round:completed"):
        extra = f" · {d.get('duration_s')} s · ${d.get('cost')}" if type_ == "round:completed" else ""
        return f"round {d.get('round_number')} {d.get('round_type')}{extra}"
    if type_ == "provider:attempt":
        hedge = " hedge" if d.get("hedge") else ""
        return (f"r{d.get('round_number')} {d.get('agent')} {d.get('provider')}/{d.get('model')} #{d.get('number')}"
                f"{hedge} {d.get('outcome')} {_seconds(d.get('latency_s'))} · {d.get('input_tokens')}→"
                f"{d.get('output_tokens')} tok · ${d.get('cost')}")
    if type_ == "consultation:round_artifact":
        return f"r{d.get('round_number')} {d.get('artifact_type')} ({d.get('agent') or 'judge'}) {d.get('status')}"
    if type_ == "agent:completed":
        return f"r{d.get('round_number')} {d.get('agent')} {'ok' if d.get('ok') else 'failed: ' + str(d.get('error'))}"
    if type_ == "consultation:completed":
        return f"status {d.get('status')}"
    keys = ("estimated_cost", "approved", "filter", "accepted", "phase", "reason", "from_round")
    return " · ".join(f"{k} {d[k]}" for k in keys if k in d)


def _seconds(value: Any) -> str:
    return f"{value:.2f} s" if isinstance(value, int | float) else "- s"


def _verify(layout: StoreLayout, ids: list[str] | None, against: str | None) -> int:
    key = key_from_env()
    try:
        report = verify_store(layout, ids, key=key, against=against, workers=None)
    except ValueError as exc:  # a malformed --against digest
        raise UsageError(str(exc)) from None
    for problem in report.problems:
        print(f"FAIL {problem}")
    for cid in report.torn:
        print(f"note {cid}: the last write was cut short by a crash (never durable); `conclave resume` repairs it",
              file=sys.stderr)
    if report.ok:
        modes = (["heads authenticated with CONCLAVE_JOURNAL_KEY"] if key else []) + (
            ["the heads log still starts as the digest says"] if against else [])
        print(f"OK: {report.journals} journal(s), {report.records} record(s) verified"
              + (f" ({'; '.join(modes)})" if modes else ""))
        return 0
    print(f"{len(report.problems)} of {report.journals + sum(p.kind == 'missing' for p in report.problems)} "
          "journal(s) failed verification", file=sys.stderr)
    return 1
