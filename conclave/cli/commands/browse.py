"""``conclave browse [--port N] [--no-open]``: explore the consultation index in Datasette on 127.0.0.1.

Runs ``datasette serve`` on the index; conclave's Datasette plugin (installed with conclave, so a plain
``datasette index.db`` gets the same) adds titles, facets, canned queries, charts and the consultation pages.
``--port 0`` picks a free port. The URLs go to stderr; Ctrl-C stops the server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from conclave.cli.commands import arguments
from conclave.errors import ConclaveError, UsageError
from conclave.store.paths import StoreLayout, default_home
from conclave.store.sqlite_index import connect, settle_killed_rounds

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 30.0


def run(argv: list[str]) -> int:
    parser = arguments.CommandParser(prog="conclave browse", description=__doc__)
    parser.add_argument("--port", type=arguments.port, default=8001,
                        help="port to listen on (default 8001; 0 = a free port)")
    parser.add_argument("--no-open", action="store_true", help="do not open a web browser")
    args = parser.parse_args(argv)


    layout = StoreLayout(default_home())
    db = connect(layout.index_path)  # create and migrate it, so a fresh home browses an empty index
    try:
        with contextlib.suppress(sqlite3.Error):  # a read-only index is browsed as it is
            settle_killed_rounds(db, layout)  # rounds a killed process left running read interrupted in Datasette
    finally:
        db.close()
    port = args.port or free_port()
    check_port(port)  # before Datasette, whose own complaint is four lines of its usage
    # Stopped with SIGTERM, still stop Datasette: exit through the ``finally`` below instead of dying at once.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = subprocess.Popen(serve_command(layout.index_path, port))
    try:
        url = f"http://{HOST}:{port}/{layout.index_path.stem}"
        wait_until_up(f"http://{HOST}:{port}/-/versions.json", server)
        print(f"conclave browse: Datasette is serving {layout.index_path} at {url} (Ctrl-C stops it)",
              file=sys.stderr)
        print(f"conclave browse: consultations and charts at http://{HOST}:{port}/-/conclave", file=sys.stderr)
        if not args.no_open:
            import webbrowser

            webbrowser.open(f"http://{HOST}:{port}/-/conclave")
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        _stop(server)


def serve_command(index_path: Path, port: int) -> list[str]:
    """``datasette serve`` on the index; in a directory this process may not write, the index is opened as an
    unchanging file (``-i``): SQLite cannot create there the files a write-ahead-log database is read through."""
    database = [str(index_path)] if os.access(index_path.parent, os.W_OK) else ["-i", str(index_path)]
    return [sys.executable, "-m", "datasette", "serve", *database, "--host", HOST, "--port", str(port)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        port: int = s.getsockname()[1]
        return port


def check_port(port: int) -> None:
    """:class:`UsageError` naming ``--port`` when ``port`` cannot be listened on here (in use, say). Bound as the
    server will bind it (``SO_REUSEADDR``), so a port a closed connection still lingers on is not refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as exc:
            raise UsageError(f"--port: cannot listen on {HOST}:{port}: {exc.strerror or exc}") from None


def wait_until_up(url: str, server: subprocess.Popen[bytes], timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    """Poll ``url`` until it answers; fail if the server exits or does not come up in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise ConclaveError(f"datasette exited with code {server.returncode} before serving")
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError), urllib.request.urlopen(
            url, timeout=1
        ):
            return
        time.sleep(0.1)
    raise ConclaveError(f"datasette did not answer on {url} within {timeout_s:.0f} s")


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
