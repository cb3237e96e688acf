"""Server-sent events: turn a byte stream of ``event:``/``data:`` lines into ``(event, data)`` pairs."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator


async def iter_sse(lines: AsyncIterable[bytes]) -> AsyncIterator[tuple[str, str]]:
    """Yield ``(event, data)`` per dispatched event; ``event`` is ``"message"`` when the server names none.

    ``lines`` is any async iterable of raw lines (aiohttp's ``response.content`` yields them). Multi-line data
    is joined with ``\\n``; comments (``:``) and ``id``/``retry`` fields are ignored, as no API here uses them.
    """
    event = ""
    data: list[str] = []
    async for raw in lines:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield event or "message", "\n".join(data)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
    if data:  # a server that closes without the final blank line still delivered this event
        yield event or "message", "\n".join(data)
