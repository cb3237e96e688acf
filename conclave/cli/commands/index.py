"""``conclave index rebuild``: recreate the SQLite index from the journal (the source of truth).
``conclave index merge HOME…``: bring other homes' journals (e.g. distributed sweep workers') into this one."""

from __future__ import annotations

import sys
from pathlib import Path

from conclave.cli.commands.arguments import CommandParser
from conclave.eval.run_store import reindex
from conclave.store.merge import merge_homes
from conclave.store.paths import StoreLayout, default_home
from conclave.store.sqlite_index import rebuild


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave index", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("rebuild", help="empty the index and replay every journal into it")
    merge = sub.add_parser("merge", help="copy other homes' journals and eval runs here, rebuild, verify")
    merge.add_argument("homes", nargs="+", type=Path, help="data homes to merge into $CONCLAVE_HOME")
    args = parser.parse_args(argv)

    layout = StoreLayout(default_home())
    if args.command == "merge":
        return _merge(layout, args.homes)


    report = rebuild(layout)
    runs = reindex(layout.home)  # eval results live in their own files, not the journal
    print(f"rebuilt {layout.index_path}: {report.consultations} consultation(s), {report.records} record(s) "
          f"in {report.seconds:.2f} s" + (f"; {runs} eval run(s)" if runs else ""), file=sys.stderr)
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
