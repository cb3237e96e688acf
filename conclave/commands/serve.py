"""``conclave serve [--port N] [--host ADDR]``: the live web view of this machine's consultations.

Lists consultations, starts one from a form (same configuration as the command line; the cost gate asks in the
page), and shows any of them live. Binds 127.0.0.1 unless ``--host`` says otherwise; every route needs the
session token printed with the URL (``CONCLAVE_WEB_TOKEN`` sets it)."""

from __future__ import annotations

import argparse
import asyncio


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="conclave serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine)")
    args = parser.parse_args(argv)
    from conclave.home import default_home
    from conclave.web.server import serve

    try:
        asyncio.run(serve(default_home(), args.host, args.port))
    except KeyboardInterrupt:
        return 130
    return 0
