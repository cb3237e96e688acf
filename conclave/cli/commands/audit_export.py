"""``conclave export [ID] [--format md|html|json|pdf] [-o FILE]``: the audit record of a consultation (default: the
latest one), the same record the MCP tool ``conclave_export_record`` gives: question, panel, rounds, verdict,
dissent, costs, prompt versions, configuration hash and the verified journal head. ``--format pdf`` needs the
``pdf`` extra (WeasyPrint) and writes to FILE (or to stdout when it is not a terminal)."""

from __future__ import annotations

import sys
from pathlib import Path

from conclave.cli.commands.arguments import CommandParser
from conclave.errors import UsageError
from conclave.render.audit_record import FORMATS, audit_html, audit_json, audit_markdown, audit_pdf, audit_record
from conclave.store.paths import StoreLayout, default_home


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave export", description=__doc__)
    parser.add_argument("id", nargs="?", help="consultation id or unique prefix (default: the latest)")
    parser.add_argument("--format", default="md", help="md (default), html, json or pdf")
    parser.add_argument("-o", "--output", type=Path, metavar="FILE", help="write to FILE instead of stdout")
    args = parser.parse_args(argv)
    if args.format not in FORMATS:
        raise UsageError(f"--format: {args.format!r} is not one of {', '.join(FORMATS)}")
    if args.format == "pdf" and args.output is None and sys.stdout.isatty():
        raise UsageError("--format pdf: name a file with -o FILE (or redirect stdout to one)")

    layout = StoreLayout(default_home())
    if args.id:
        cid = layout.resolve_id(args.id)  # not logs' resolve_id: importing that command costs a second
    else:
        ids = layout.journal_ids()  # ids sort by the time they started
        if not ids:
            raise UsageError(f"no consultation to export in {layout.journal_dir}")
        cid = ids[-1]
    record = audit_record(layout, cid)
    if args.format == "pdf":
        data = audit_pdf(record)
    else:
        render = {"md": audit_markdown, "html": audit_html, "json": audit_json}[args.format]
        data = render(record).encode("utf-8")

    if args.output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        args.output.write_bytes(data)
    except OSError as exc:
        raise UsageError(f"--output: cannot write {args.output}: {exc.strerror or exc}") from None
    print(f"conclave export: wrote {cid} to {args.output}", file=sys.stderr)
    return 0
