"""``conclave serve [--port N] [--host ADDR]``: the live web view of this machine's consultations.

Lists consultations, starts one from a form (same configuration as the command line; the cost gate asks in the
page), and shows any of them live. Binds 127.0.0.1 unless ``--host`` says otherwise; every route needs the
session token printed with the URL (``CONCLAVE_WEB_TOKEN`` sets it). Ctrl-C, SIGTERM and SIGHUP stop it; a
consultation it was running is saved as ``partial`` and continues with ``conclave resume``."""

from __future__ import annotations

import argparse
import asyncio
import sys

from conclave.commands.arguments import CommandParser, port
from conclave.signals import termination_as_interrupt


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave serve", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=port, default=8765, help="port (default 8765; 0 = any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine)")
    args = parser.parse_args(argv)
    from conclave.home import default_home
    from conclave.web.server import serve

    try:
        with termination_as_interrupt():
            asyncio.run(serve(default_home(), args.host, args.port))
    except KeyboardInterrupt:
        print("conclave serve: stopped", file=sys.stderr)
        return 130
    return 0
