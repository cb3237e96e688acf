"""``conclave show ID [--round N] [--format markdown|json|html] [-o FILE]``: re-print a past consultation from its
journal (the source of truth): the full report, or one round's artifacts. A run that never finished shows what it
got to, with how to resume it. ``--format html`` writes one self-contained HTML document."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from conclave.cli.commands.arguments import CommandParser
from conclave.errors import UsageError
from conclave.render.console import _print_markdown
from conclave.render.html import render_html
from conclave.render.journal_view import artifact_entries, result_from_records
from conclave.render.jsonld import to_jsonld
from conclave.render.markdown import render_markdown
from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout, default_home

FORMATS = ("markdown", "json", "html")


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave show", description=__doc__)
    parser.add_argument("id", help="consultation id (a unique prefix is enough)")
    parser.add_argument("--round", type=int, metavar="N", help="only round N's artifacts")
    parser.add_argument("--format", default="markdown", help="markdown (default), json or html")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    args = parser.parse_args(argv)
    if args.format not in FORMATS:
        raise UsageError(f"--format: {args.format!r} is not one of {', '.join(FORMATS)}")


    layout = StoreLayout(default_home())
    cid = layout.resolve_id(args.id)  # not logs' resolve_id: that module imports sqlite-utils (and numpy)
    records = read_records(layout.journal_path(cid))
    if not records:
        raise UsageError(f"consultation {cid} has no complete journal records")
    result = result_from_records(records)
    entries = artifact_entries(records)
    if args.round is not None:
        known = sorted({e.round_number for e in entries})
        if args.round not in known:
            allowed = ", ".join(map(str, known)) or "none (no round finished)"
            raise UsageError(f"--round: {args.round} is not a round of {cid}; rounds with artifacts: {allowed}")

    text = _render(args.format, result, records, args.round, entries)
    if args.output is not None:
        try:
            args.output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--output: cannot write {args.output}: {exc.strerror or exc}") from None
        print(f"conclave show: wrote {args.output}", file=sys.stderr)
        return 0
    if args.format == "markdown":
        _print_markdown(text, sys.stdout)
    else:
        sys.stdout.write(text)
    return 0


def _render(fmt: str, result: dict[str, Any], records: list[dict[str, Any]], only_round: int | None,
            entries: list[Any]) -> str:
    if fmt == "html":
        return render_html(result, records, only_round=only_round)
    if fmt == "json":
        if only_round is None:
            document: Any = to_jsonld(result)
        else:
            document = {
                "consultation_id": result.get("consultation_id"), "round_number": only_round,
                "artifacts": [{"agent": e.agent, "schema": e.kind, "status": e.status, "artifact": e.artifact}
                              for e in entries if e.round_number == only_round],
            }
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"

    return render_markdown(result, records, only_round=only_round)
