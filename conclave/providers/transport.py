"""The one module that speaks HTTP: a consultation's aiohttp session, and aiohttp's failures as :class:`TransportError`.

Provider plugins build request bodies and read answers; they send through an :class:`HTTPClient` handed to them by
the pool, so loading a plugin (which every ``conclave`` command does, ``--help`` included) does not import aiohttp.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from conclave.providers.base import FilePart, TransportError


def as_transport_error(exc: aiohttp.ClientError) -> TransportError:
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return TransportError("timeout", str(exc))
    if isinstance(exc, aiohttp.ClientConnectorError):
        return TransportError("connect", exc.os_error.strerror or str(exc.os_error) or type(exc.os_error).__name__)
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return TransportError("disconnected", str(exc))
    if isinstance(exc, aiohttp.ClientPayloadError):
        return TransportError("payload", str(exc))
    return TransportError("other", f"{type(exc).__name__}: {exc}")


class HTTPClient:
    """One aiohttp session shared by every provider of a consultation; no total timeout (the pool enforces each
    call's deadline). A response is aiohttp's (``status``, ``headers``, ``read()``, ``content``)."""

    def __init__(self, session: aiohttp.ClientSession | None = None) -> None:
        self.session = session or aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    @asynccontextmanager
    async def request(self, method: str, url: str, *, headers: Mapping[str, str], data: str | bytes | None = None,
                      timeout_s: float | None = None, form: Mapping[str, str | FilePart] | None = None
                      ) -> AsyncIterator[Any]:
        """The response to one request; a failure below HTTP, also while the body is read, is a TransportError.
        ``form`` sends a multipart form instead of ``data`` (a batch API's file upload)."""
        options: dict[str, Any] = {} if timeout_s is None else {"timeout": aiohttp.ClientTimeout(total=timeout_s)}
        body: str | bytes | aiohttp.FormData | None = data
        if form is not None:
            body = aiohttp.FormData()
            for name, value in form.items():
                if isinstance(value, FilePart):
                    body.add_field(name, value.content, filename=value.filename, content_type=value.content_type)
                else:
                    body.add_field(name, value)
        try:
            async with self.session.request(method, url, data=body, headers=headers, **options) as resp:
                yield resp
        except aiohttp.ClientError as exc:
            raise as_transport_error(exc) from exc

    @property
    def closed(self) -> bool:
        return self.session.closed

    async def close(self) -> None:
        await self.session.close()
