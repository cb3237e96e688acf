"""The live web view: an aiohttp app on 127.0.0.1 that lists consultations, starts one from a form, and shows any
consultation live — rounds, agents thinking and done, artifacts as they land, answers streaming in.

Every route needs the session token (``?token=…`` once, then an HttpOnly cookie; or ``Authorization: Bearer``),
compared in constant time; without it: 401. Each client address is rate-limited (a token bucket: 429 with
``Retry-After`` when it is empty) and may hold a bounded number of event streams. Events go out over
Server-Sent Events as the journal's own records (``id:`` is the record's sequence number, so a dropped
connection resumes after the last one it saw via ``Last-Event-ID``); a viewer who joins late gets everything
so far first.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from conclave.store.paths import StoreLayout
from conclave.web.feeds import Feeds, summary
from conclave.web.page import consultation_page, index_page

COOKIE = "conclave_token"
#: the rate limit of one client address: a bucket of this many requests, refilled at RATE per second
BURST, RATE = 60, 20.0
#: event streams one client address may hold open at once
MAX_STREAMS = 16
#: a comment line on idle event streams, so proxies and browsers keep them open
HEARTBEAT_S = 15.0

def new_token() -> str:
    return secrets.token_urlsafe(24)


@dataclass
class _Bucket:
    tokens: float = BURST
    at: float = field(default_factory=time.monotonic)
    streams: int = 0


class RateLimits:
    def __init__(self, burst: int = BURST, rate: float = RATE, max_streams: int = MAX_STREAMS) -> None:
        self.burst, self.rate, self.max_streams = burst, rate, max_streams
        self.clients: dict[str, _Bucket] = {}

    def take(self, client: str) -> float:
        """0 when ``client`` may make a request now, else the seconds until it may."""
        bucket = self.clients.setdefault(client, _Bucket(tokens=self.burst))
        now = time.monotonic()
        bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate)
        bucket.at = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return 0.0
        return (1 - bucket.tokens) / self.rate


#: starts a consultation in this process: (question, overrides, approved) -> {"id"} | {"refused"} | {"error"}
Starter = Callable[[str, list[str], bool], Awaitable[dict[str, Any]]]

TOKEN_KEY = web.AppKey("token", str)
FEEDS_KEY = web.AppKey("feeds", Feeds)
STARTER_KEY = web.AppKey("starter", list)  # [Starter] or [] (no form)
LIMITS_KEY = web.AppKey("limits", RateLimits)


def make_app(home: Path, token: str, feeds: Feeds | None = None, starter: Starter | None = None,
             limits: RateLimits | None = None) -> web.Application:
    """The app. ``starter(question, overrides, approved)`` starts a consultation in this process and returns
    ``{"id": …}`` once its cost gate decided, or ``{"refused": reason}`` / ``{"error": message}``; None: the
    page has no form (``conclave "Q" live=true`` watches one consultation)."""
    app = web.Application(middlewares=[_rate_limit, _auth])
    app[TOKEN_KEY] = token
    app[FEEDS_KEY] = feeds or Feeds(StoreLayout(home))
    app[STARTER_KEY] = [starter] if starter is not None else []
    app[LIMITS_KEY] = limits or RateLimits()
    app.router.add_get("/", _index)
    app.router.add_post("/consult", _consult)
    app.router.add_get("/c/{id}", _consultation)
    app.router.add_get("/c/{id}/events", _events)
    return app


@web.middleware
async def _auth(request: web.Request, handler: Any) -> web.StreamResponse:
    expected: str = request.app[TOKEN_KEY]
    header = request.headers.get("Authorization", "")
    supplied = request.query.get("token") or request.cookies.get(COOKIE) or header.removeprefix("Bearer ").strip()
    if not supplied or not hmac.compare_digest(supplied.encode(), expected.encode()):
        return web.Response(status=401, text="401: this conclave view needs its session token (?token=…)\n")
    response: web.StreamResponse = await handler(request)
    if request.query.get("token") and not response.prepared:
        response.set_cookie(COOKIE, expected, httponly=True, samesite="Strict", path="/")
    return response


@web.middleware
async def _rate_limit(request: web.Request, handler: Any) -> web.StreamResponse:
    wait = request.app[LIMITS_KEY].take(request.remote or "?")
    if wait:
        return web.Response(status=429, text="429: too many requests\n",
                            headers={"Retry-After": str(max(1, round(wait)))})
    response: web.StreamResponse = await handler(request)
    return response


async def _index(request: web.Request) -> web.Response:
    feeds: Feeds = request.app[FEEDS_KEY]
    layout = feeds.layout
    paths = sorted(layout.journal_dir.glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns, reverse=True) \
        if layout.journal_dir.is_dir() else []
    rows = [summary(p) for p in paths[:100]]
    return web.Response(text=index_page(rows, can_start=bool(request.app[STARTER_KEY])),
                        content_type="text/html")


async def _consult(request: web.Request) -> web.Response:
    starters: list[Starter] = request.app[STARTER_KEY]
    if not starters:
        raise web.HTTPNotFound(text="this view watches one consultation; start others with `conclave serve`")
    form = await request.post()
    question = str(form.get("question", "")).strip()
    overrides = [line.strip() for line in str(form.get("overrides", "")).splitlines() if line.strip()]
    if not question:
        return web.Response(status=400, text=index_page([], can_start=True, error="Ask a question first."),
                            content_type="text/html")
    outcome = await starters[0](question, overrides, form.get("approve") == "yes")
    if "id" in outcome:
        raise web.HTTPSeeOther(f"/c/{outcome['id']}")
    return web.Response(
        status=400 if "error" in outcome else 200, content_type="text/html",
        text=index_page([], can_start=True, error=outcome.get("error"), refused=outcome.get("refused"),
                        question=question, overrides=overrides),
    )


async def _consultation(request: web.Request) -> web.Response:
    cid = request.match_info["id"]
    if not request.app[FEEDS_KEY].exists(cid):
        raise web.HTTPNotFound(text=f"no consultation {cid}")
    return web.Response(text=consultation_page(cid), content_type="text/html")


async def _events(request: web.Request) -> web.StreamResponse:
    cid = request.match_info["id"]
    feeds: Feeds = request.app[FEEDS_KEY]
    if not feeds.exists(cid):
        raise web.HTTPNotFound(text=f"no consultation {cid}")
    limits: RateLimits = request.app[LIMITS_KEY]
    bucket = limits.clients.setdefault(request.remote or "?", _Bucket())
    if bucket.streams >= limits.max_streams:
        return web.Response(status=429, text="429: too many open event streams\n", headers={"Retry-After": "5"})
    after = _last_event_id(request)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    bucket.streams += 1
    try:
        stream = feeds.follow(cid, after).__aiter__()
        while True:
            try:
                record = await asyncio.wait_for(stream.__anext__(), HEARTBEAT_S)
            except TimeoutError:
                await response.write(b": ping\n\n")
                continue
            except StopAsyncIteration:
                break
            await response.write(_sse(record))
        await response.write(b"event: end\ndata: {}\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        bucket.streams -= 1
    return response


def _last_event_id(request: web.Request) -> int:
    raw = request.headers.get("Last-Event-ID") or request.query.get("after") or "-1"
    try:
        return int(raw)
    except ValueError:
        return -1


def _sse(record: dict[str, Any]) -> bytes:
    data = json.dumps({k: record.get(k) for k in ("type", "seq", "ts", "data")}, ensure_ascii=False)
    head = "" if record.get("type") == "agent:chunk" else f"id: {record['seq']}\n"
    return f"{head}data: {data}\n\n".encode()
