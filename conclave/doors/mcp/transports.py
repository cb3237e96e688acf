"""Serving the MCP server: stdio (stdout carries protocol messages only) or Streamable HTTP behind a bearer token."""

from __future__ import annotations

import errno
import hmac
import ipaddress
import logging
import os
import secrets
import socket
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from conclave.errors import UsageError

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Awaitable[None]]

TOKEN_ENV = "CONCLAVE_MCP_TOKEN"
#: the logger of the SDK's Streamable HTTP transport
SDK_HTTP_LOGGER = "mcp.server.streamable_http"


async def serve_stdio(server: Any) -> None:
    """Speak MCP on stdin/stdout. While it serves, the SDK points file descriptor 1 at stderr (and 0 at the null
    device), so nothing else that writes to stdout (a print, a C library, a plugin) can corrupt the protocol
    stream."""
    if sys.stdin is None or sys.stdout is None:  # started with fd 0 or 1 closed: no client can reach us
        raise UsageError("the stdio transport needs stdin and stdout open (a client starts `conclave mcp` with "
                         "pipes); use --http to serve over the network")
    await server.run_stdio_async()


class BearerAuth:
    """ASGI middleware: every HTTP request needs ``Authorization: Bearer <token>`` (compared in constant time)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not self._authorized(scope):
            await send({"type": "http.response.start", "status": 401, "headers": [
                (b"content-type", b"application/json"), (b"www-authenticate", b'Bearer realm="conclave"')]})
            await send({"type": "http.response.body",
                        "body": b'{"error": "unauthorized", "error_description": "a valid bearer token is required"}'})
            return
        await self.app(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, credential = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    given = credential.strip()
                break
        return hmac.compare_digest(given, self._token)


def http_token() -> tuple[str, bool]:
    """The bearer token: ``$CONCLAVE_MCP_TOKEN``, or a new random one (second value True: print it once)."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token, False
    return secrets.token_urlsafe(32), True


class ClientLeftFilter(logging.Filter):
    """Drops the SDK's error records whose exception is a stream closed because the client left: the SDK's
    Streamable HTTP transport logs one, with a traceback, each time a client ends its session
    (``anyio.ClosedResourceError`` in the SSE writer). Every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, anyio.ClosedResourceError | anyio.BrokenResourceError)


async def serve_http(server: Any, host: str, port: int, announce: Callable[[str], None]) -> None:
    """Serve Streamable HTTP at ``http://host:port/mcp``; ``port`` 0 picks a free one (announced on stderr)."""
    import uvicorn

    logging.getLogger(SDK_HTTP_LOGGER).addFilter(ClientLeftFilter())
    token, generated = http_token()
    app = BearerAuth(server.streamable_http_app(host=host), token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        option = "--host" if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL else "--port"
        raise UsageError(f"{option}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    if not is_loopback(host):
        announce(f"warning: serving on {host}, reachable beyond this machine")
    if generated:
        announce(f"bearer token (set {TOKEN_ENV} to choose one): {token}")
    announce(f"listening on http://{shown}:{bound}/mcp")
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    await uvicorn.Server(config).serve(sockets=[sock])


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
