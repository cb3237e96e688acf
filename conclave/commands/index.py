"""``conclave index rebuild``: recreate the SQLite index from the journal (the source of truth)."""

from __future__ import annotations

import argparse
import sys

from conclave.store.paths import StoreLayout, default_home


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="conclave index", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("rebuild", help="empty the index and replay every journal into it")
    parser.parse_args(argv)

    from conclave.store.index import rebuild

    layout = StoreLayout(default_home())
    report = rebuild(layout)
    print(f"rebuilt {layout.index_path}: {report.consultations} consultation(s), {report.records} record(s) "
          f"in {report.seconds:.2f} s", file=sys.stderr)
    return 0
