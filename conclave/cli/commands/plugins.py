"""``conclave plugins [--json]``: every loaded plugin, its version, the hooks it implements and what it registered."""

from __future__ import annotations

import json
import sys

from conclave.cli.commands.arguments import CommandParser
from conclave.plugin_manager import get_plugins


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave plugins", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    infos = [info.as_dict() for info in get_plugins().info()]
    if args.json:
        json.dump(infos, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if not infos:
        print("no plugins loaded (is CONCLAVE_PLUGINS set?)")
        return 0
    for info in infos:
        version = info["version"] or "-"
        dist = f" ({info['distribution']})" if info["distribution"] else ""
        print(f"{info['name']} {version}{dist}")
        print(f"  hooks: {', '.join(info['hooks']) or '-'}")
        for kind, names in info["registered"].items():
            print(f"  {kind}: {', '.join(names)}")
    return 0
