"""``conclave stats [--week | --month [YYYY-MM] | --all-time] [--json]``: consultations, cost, tokens, duration,
confidence, early termination, filtering savings and substitutions, per provider and per mode."""

from __future__ import annotations

import json
import sys

from conclave.cli.commands.arguments import CommandParser
from conclave.store.index_reader import open_current
from conclave.store.paths import StoreLayout, default_home
from conclave.store.period_stats import compute_stats, period_from_args, render_text


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave stats", description=__doc__)
    period = parser.add_mutually_exclusive_group()
    period.add_argument("--week", action="store_true", help="the last 7 days")
    period.add_argument("--month", nargs="?", const="", metavar="YYYY-MM",
                        help="the last 30 days, or a calendar month")
    period.add_argument("--all-time", action="store_true", help="everything (the default)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)


    chosen = period_from_args(week=args.week, month=args.month, all_time=args.all_time)
    path = StoreLayout(default_home()).index_path
    conn = open_current(path)
    if conn is None:  # a new index, or one to migrate: sqlite-utils does it
        # imported here, not at the top: sqlite_index imports sqlite-utils, which imports numpy (0.33 s measured,
        # up to 0.7 s on a loaded machine); a current index is read with sqlite3 alone (test_index_reader)
        from conclave.store.sqlite_index import connect

        conn = connect(path).conn
    try:
        stats = compute_stats(conn, chosen)
    finally:
        conn.close()
    if args.json:
        json.dump(stats, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(stats))
    return 0
