"""``conclave index rebuild``: recreate the SQLite index from the journal (the source of truth).
``conclave index vacuum``: give the disk back the index's free pages (an upgrade that rewrites tables leaves some).
``conclave index merge HOME…``: bring other homes' journals (e.g. distributed sweep workers') into this one."""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

from conclave.cli.commands.arguments import CommandParser
from conclave.errors import StorageError
from conclave.eval.run_store import reindex
from conclave.store.merge import merge_homes
from conclave.store.migrations import page_bytes
from conclave.store.paths import StoreLayout, default_home
from conclave.store.sqlite_index import connect, rebuild


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave index", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("rebuild", help="empty the index and replay every journal into it")
    sub.add_parser("vacuum", help="give the disk back the index's free pages (left by an upgrade)")
    merge = sub.add_parser("merge", help="copy other homes' journals and eval runs here, rebuild, verify")
    merge.add_argument("homes", nargs="+", type=Path, help="data homes to merge into $CONCLAVE_HOME")
    args = parser.parse_args(argv)

    layout = StoreLayout(default_home())
    if args.command == "merge":
        return _merge(layout, args.homes)
    if args.command == "vacuum":
        return _vacuum(layout.index_path)

    report = rebuild(layout)
    runs = reindex(layout.home)  # eval results live in their own files, not the journal
    print(f"rebuilt {layout.index_path}: {report.consultations} consultation(s), {report.records} record(s) "
          f"in {report.seconds:.2f} s" + (f"; {runs} eval run(s)" if runs else ""), file=sys.stderr)
    return 0


def _vacuum(path: Path) -> int:
    """VACUUM the index in place: readers keep reading meanwhile; writers wait (up to the busy timeout)."""
    db = connect(path)
    try:
        started = time.perf_counter()
        before = sum(page_bytes(db))
        print(f"conclave index: vacuuming {path} ({before / 1e6:,.1f} MB, {page_bytes(db)[1] / 1e6:,.1f} MB of it "
              "free) …", file=sys.stderr, flush=True)
        db.conn.execute("VACUUM")
        db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the file shrinks now, not when the last reader leaves
        after = sum(page_bytes(db))
    except sqlite3.Error as exc:
        raise StorageError(f"cannot vacuum the index {path}: {exc}") from exc
    finally:
        db.close()
    print(f"vacuumed {path}: {before / 1e6:,.1f} MB -> {after / 1e6:,.1f} MB in {time.perf_counter() - started:.1f} s",
          file=sys.stderr)
    return 0


def _merge(layout: StoreLayout, homes: list[Path]) -> int:
    report = merge_homes(layout.home, homes)
    for conflict in report.conflicts:
        print(f"conclave index merge: {conflict}", file=sys.stderr)
    for problem in report.problems:
        print(f"conclave index merge: verify: {problem}", file=sys.stderr)
    print(f"merged {len(homes)} home(s) into {layout.home}: {report.copied} journal(s) copied, {report.skipped} "
          f"already present, {report.eval_runs} eval run(s); index rebuilt ({report.consultations} consultation(s)); "
          f"verify {'ok' if report.verified else 'FAILED'}", file=sys.stderr)
    return 0 if report.verified and not report.conflicts else 1
