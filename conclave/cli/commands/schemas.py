"""``conclave schemas list | show NAME [--strict] | validate NAME FILE``: inspect schemas, check files.

Exit codes: 0 ok, 1 the file is not a valid artifact (every error printed to stdout), 2 unknown schema name,
unreadable or non-JSON file, or bad usage.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from conclave.artifacts import schema_registry as artifacts
from conclave.cli.commands.arguments import CommandParser
from conclave.plugin_manager import get_plugins

EXIT_OK, EXIT_INVALID, EXIT_USAGE = 0, 1, 2


def run(argv: list[str]) -> int:
    """Parse ``argv`` (the words after ``conclave schemas``), run the action, return the exit code."""
    args = _parser().parse_args(argv)
    if args.action == "list":
        return _list()
    schema = _schema_or_none(args.name)
    if schema is None:
        return EXIT_USAGE
    if args.action == "show":
        dialect = "openai-strict" if args.strict else args.dialect
        dialects = get_plugins().schema_dialects
        if dialect is not None and dialect not in dialects:
            print(f"conclave schemas: unknown --dialect {dialect!r}; allowed: {', '.join(dialects.names()) or 'none'}"
                  " (provider plugins register them)", file=sys.stderr)
            return EXIT_USAGE
        shown = dialects.get(dialect)(schema) if dialect is not None else schema
        print(json.dumps(shown, indent=2, ensure_ascii=False))
        return EXIT_OK
    return _validate(args.name, args.file)


def _parser() -> CommandParser:
    parser = CommandParser(prog="conclave schemas", description="The artifact JSON Schemas.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="{list,show,validate}")
    actions.add_parser("list", help="one schema per line: name and title")
    show = actions.add_parser("show", help="print a schema as JSON")
    show.add_argument("name")
    show.add_argument("--dialect", metavar="D", help="the variant a provider's structured output accepts, as its "
                      "plugin registers it (openai-strict)")
    show.add_argument("--strict", action="store_true", help="--dialect openai-strict")
    check = actions.add_parser("validate", help="validate a JSON file against a schema")
    check.add_argument("name")
    check.add_argument("file", help="path to a JSON file, or - for stdin")
    return parser


def _list() -> int:
    names = artifacts.schema_names()
    width = max(map(len, names), default=0)
    for name in names:
        print(f"{name:<{width}}  {artifacts.get_schema(name).get('title', '')}")
    return EXIT_OK


def _schema_or_none(name: str) -> dict[str, Any] | None:
    try:
        return artifacts.get_schema(name)
    except KeyError:
        allowed = ", ".join(artifacts.schema_names())
        print(f"conclave schemas: unknown schema {name!r}; allowed: {allowed}", file=sys.stderr)
        return None


def _validate(name: str, path: str) -> int:
    try:
        text = sys.stdin.read() if path == "-" else _read(path)
        instance = json.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        print(f"conclave schemas: cannot read {path}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except json.JSONDecodeError as exc:
        print(f"conclave schemas: {path} is not JSON: {exc}", file=sys.stderr)
        return EXIT_USAGE
    errors = artifacts.validate(name, instance)
    for error in errors:
        print(error)
    if errors:
        return EXIT_INVALID
    print("OK")
    return EXIT_OK


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as handle:
        return handle.read()
