"""``conclave serve [--port N] [--host ADDR] [--allow-dir DIR …] [--openai] [--max-cost DOLLARS] [OVERRIDES …]``:
the live web view of this machine's consultations.

Lists consultations, starts one from a form, and shows any of them live, with each one's formatted report. The
form offers what a person picks on a page: the question, a registered panel and mode, the rounds, and context
files from the working directory or an ``--allow-dir``. Everything else — provider endpoints and keys, the data
home, approval — is this command line's (OVERRIDES apply to every consultation the form starts); the cost gate asks
in the page. Binds 127.0.0.1 unless ``--host`` says otherwise; every route needs the session token printed with
the URL (``CONCLAVE_WEB_TOKEN`` sets it), and requests from other origins are refused. Ctrl-C, SIGTERM and
SIGHUP stop it; a consultation it was running is saved as ``partial`` and continues with ``conclave resume``.

``--openai`` also serves the council as an OpenAI-compatible model on the same port: ``/v1/models`` lists
``conclave/<panel>`` and ``conclave/<panel>/<mode>``, ``/v1/chat/completions`` runs a consultation (the API key is
the session token). Over ``--max-cost`` dollars (default: ``cost.always_allow_under``) a request is refused with
the estimate, before anything is spent. See docs/openai-door.md.

Memory stays flat however long it runs: a finished consultation's events stay in memory while someone watches it,
then only for the ``--keep-finished`` most recent ones and at most ``--keep-seconds``; after that its page reads
them from the journal."""

from __future__ import annotations

import argparse
import asyncio
import sys

from conclave.cli.commands.arguments import CommandParser, count, dollars, port, positive_seconds
from conclave.cli.main import _is_override
from conclave.config.guard import Door, Roots
from conclave.config.home import default_home
from conclave.doors.openai_api.chat_door import openai_app
from conclave.doors.web.feeds import KEEP_FINISHED, KEEP_S
from conclave.doors.web.serving import Mount, serve
from conclave.errors import UsageError
from conclave.signals import termination_as_interrupt


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave serve", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=port, default=8765, help="port (default 8765; 0 = any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, this machine)")
    parser.add_argument("--allow-dir", action="append", default=[], metavar="DIR",
                        help="another directory context files may come from (besides the working directory)")
    parser.add_argument("--openai", action="store_true",
                        help="also serve the council as an OpenAI-compatible model under /v1 (docs/openai-door.md)")
    parser.add_argument("--max-cost", type=dollars, default=None, metavar="DOLLARS",
                        help="the largest estimate a consultation may start with unasked "
                             "(sets cost.always_allow_under; the form and /v1 callers cannot raise it)")
    parser.add_argument("--keep-finished", type=count, default=KEEP_FINISHED, metavar="N",
                        help=f"finished consultations whose events stay in memory once nobody watches them "
                             f"(default {KEEP_FINISHED}; 0 = none)")
    parser.add_argument("--keep-seconds", type=positive_seconds, default=KEEP_S, metavar="S",
                        help=f"and for at most this long after they finished (default {KEEP_S:g})")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides applied to every consultation")
    args = parser.parse_args(argv)
    for override in args.overrides:
        if not _is_override(override):
            raise UsageError(f"not an override: {override!r} (expected key=value)")
    operator = [*args.overrides]
    if args.max_cost is not None:
        operator.append(f"cost.always_allow_under={args.max_cost}")

    door = Door("the web form", Roots.of(args.allow_dir), tuple(operator))
    door.compose("check", [])  # the server's own overrides must compose: fail at start, not on the first form
    mounts = [Mount("/v1", "OpenAI-compatible API", openai_app)] if args.openai else []
    try:
        with termination_as_interrupt():
            asyncio.run(serve(default_home(), args.host, args.port, door, mounts,
                              keep=(args.keep_finished, args.keep_seconds)))
    except KeyboardInterrupt:
        print("conclave serve: stopped", file=sys.stderr)
        return 130
    return 0
