"""``conclave mcp [--http [--port N] [--host H]] [--allow-dir DIR ...] [OVERRIDE ...]``: serve conclave's tools
over the Model Context Protocol (stdio by default; Streamable HTTP with a bearer token).

Overrides given here (e.g. ``providers.openai.base_url=…``, ``agents=openai_only``) apply to every consultation
the server runs; clients cannot change provider endpoints, the data home or scrubbing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import TYPE_CHECKING

from conclave.cli.commands.arguments import CommandParser, port
from conclave.cli.main import _is_override
from conclave.config.guard import Roots
from conclave.config.home import default_home
from conclave.errors import UsageError
from conclave.signals import termination_as_interrupt

if TYPE_CHECKING:
    from conclave.doors.mcp.tools import ServerConfig

LOOPBACK = "127.0.0.1"


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave mcp", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--http", action="store_true", help="serve Streamable HTTP instead of stdio")
    parser.add_argument("--port", type=port, default=8765, help="HTTP port (default 8765; 0 picks a free one)")
    parser.add_argument("--host", default=LOOPBACK,
                        help="HTTP interface (default 127.0.0.1; anything else is exposed beyond this machine)")
    parser.add_argument("--allow-dir", action="append", default=[], metavar="DIR",
                        help="another directory file context may come from (besides the working directory)")
    parser.add_argument("--heartbeat", type=float, default=None, metavar="SECONDS",
                        help="longest silence between progress notifications (default 10, at most 15)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to every consultation")
    args = parser.parse_args(argv)

    try:
        import mcp  # noqa: F401
    except ImportError:
        from conclave.extras import install_hint

        raise UsageError(f"the MCP server needs the mcp extra: {install_hint('mcp')}") from None
    from conclave.doors.mcp.runs import DEFAULT_HEARTBEAT_S
    from conclave.doors.mcp.tools import ServerConfig, build_server, print_to_stderr

    for override in args.overrides:
        if not _is_override(override):
            raise UsageError(f"not an override: {override!r} (expected key=value)")
    heartbeat = DEFAULT_HEARTBEAT_S if args.heartbeat is None else args.heartbeat
    if not 0 < heartbeat <= 15:
        raise UsageError(f"--heartbeat: {heartbeat:g} is not in (0, 15] seconds")
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="conclave mcp: %(message)s")
    config = ServerConfig(home=default_home(), roots=Roots.of(args.allow_dir), base_overrides=list(args.overrides),
                          heartbeat_s=heartbeat)
    _check_base_overrides(config)
    if args.http:
        from conclave.doors.mcp.transports import serve_http

        server = build_server(config)
        try:
            with termination_as_interrupt():  # SIGTERM and SIGHUP stop it as Ctrl-C does, saying so
                asyncio.run(serve_http(server, args.host, args.port, print_to_stderr))
        except KeyboardInterrupt:
            print_to_stderr("stopped")
            return 130
        return 0
    from conclave.doors.mcp.transports import serve_stdio

    asyncio.run(serve_stdio(build_server(config)))
    return 0


def _check_base_overrides(config: ServerConfig) -> None:
    """Fail at start (exit 2, one line) when the server's own overrides do not compose. Composing once at start
    also warms Hydra up, so that the first tool call answers (or returns its task id) as fast as the next ones."""
    from mcp.server.mcpserver.exceptions import ToolError

    from conclave.doors.mcp.tools import compose

    try:
        compose(config.door, "check", [], [])
    except ToolError as exc:
        raise UsageError(str(exc)) from None
