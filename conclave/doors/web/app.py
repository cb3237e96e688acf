"""The live web view: an aiohttp app on 127.0.0.1 that lists consultations, starts one from a form, and shows any
consultation live — rounds, agents thinking and done, artifacts as they land, answers streaming in — and, once it
ended, its formatted report.

Who may do what:
- Every route needs the session token (``?token=…`` once, then an HttpOnly cookie named after the serving port;
  or ``Authorization: Bearer``), compared in constant time; without it: 401.
- A browser's request from another origin is refused (403), whatever cookie it carries: a cookie is sent to every
  port of 127.0.0.1, so a page served by any other local server could otherwise drive this one. The checks are the
  Host header (it must name this machine: no DNS rebinding), Fetch Metadata (``Sec-Fetch-Site``), the ``Origin``
  of every POST, and a CSRF token (derived from the session token) in every form. Cross-site top-level navigation
  to a page stays allowed: it only shows the page to the person who followed the link.
- The form takes only what a person picks on the page — question, panel, mode, rounds and context files under
  the allowed directories — and passes it through :mod:`conclave.config.guard` like any outside value. Approval of a
  refused estimate is a one-time nonce shown on the refusal page, never a form field that skips the gate.

Each client address is rate-limited (a token bucket: 429 with ``Retry-After`` when it is empty) and may hold a
bounded number of event streams. Events go out over Server-Sent Events as the journal's own records (``id:`` is
the record's sequence number, so a dropped connection resumes after the last one it saw via ``Last-Event-ID``);
a viewer who joins late gets everything so far first. An idle stream gets a comment line every ``heartbeat_s``
and stays open until the consultation ends.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from conclave.compose import hydra_quote
from conclave.doors.web.feeds import Feeds
from conclave.doors.web.page import (
    FormChoices,
    consultation_page,
    eval_run_page,
    index_page,
    report_unavailable_page,
)
from conclave.errors import UsageError
from conclave.eval import run_store as store
from conclave.eval.batch_progress import read_progress
from conclave.render.html import render_html
from conclave.render.journal_view import result_from_records
from conclave.store.journal_file import read_records
from conclave.store.paths import StoreLayout
from conclave.store.sessions import sessions

COOKIE = "conclave_token"
#: the rate limit of one client address: a bucket of this many requests, refilled at RATE per second
BURST, RATE = 60, 20.0
#: event streams one client address may hold open at once
MAX_STREAMS = 16
#: a comment line on idle event streams, so proxies and browsers keep them open
HEARTBEAT_S = 15.0
#: consultations the list page shows
LIST_LIMIT = 100
#: evaluation runs the list page shows
EVAL_LIST_LIMIT = 20
#: how often an evaluation run's page stream looks for new batch progress
PROGRESS_POLL_S = 0.5
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def new_token() -> str:
    return secrets.token_urlsafe(24)


def csrf_token(token: str) -> str:
    """The form token of a session: readable only by a page of this origin, which is the point."""
    return hmac.new(token.encode(), b"conclave csrf", hashlib.sha256).hexdigest()


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


#: what a start or an approval came to: {"id"} | {"refused", "approval"} | {"error"}
Outcome = dict[str, Any]


@dataclass
class Starter:
    """Starts consultations in this process from the form: ``start(question, outside_overrides)`` and
    ``approve(nonce)``; ``choices`` fill the form's menus."""

    start: Callable[[str, list[str]], Awaitable[Outcome]]
    approve: Callable[[str], Awaitable[Outcome]]
    choices: FormChoices


@dataclass(frozen=True)
class ViewSettings:
    token: str
    host: str = "127.0.0.1"
    heartbeat_s: float = HEARTBEAT_S


SETTINGS_KEY = web.AppKey("settings", ViewSettings)
FEEDS_KEY = web.AppKey("feeds", Feeds)
STARTER_KEY = web.AppKey("starter", list)  # [Starter] or [] (no form)
LIMITS_KEY = web.AppKey("limits", RateLimits)


#: where ``conclave serve --openai`` mounts the OpenAI-compatible routes: their 401 is an OpenAI-style JSON error
OPENAI_PREFIX = "/v1/"


def make_app(home: Path, token: str, feeds: Feeds | None = None, starter: Starter | None = None,
             limits: RateLimits | None = None, *, host: str = "127.0.0.1",
             heartbeat_s: float = HEARTBEAT_S) -> web.Application:
    """The app; without ``starter`` the page has no form (``conclave "Q" live=true`` watches one consultation)."""
    app = web.Application(middlewares=[_rate_limit, _same_origin, _auth])
    app[SETTINGS_KEY] = ViewSettings(token, host, heartbeat_s)
    app[FEEDS_KEY] = feeds or Feeds(StoreLayout(home))
    app[STARTER_KEY] = [starter] if starter is not None else []
    app[LIMITS_KEY] = limits or RateLimits()
    app.router.add_get("/", _index)
    app.router.add_post("/consult", _consult)
    app.router.add_post("/approve", _approve)
    app.router.add_get("/c/{id}", _consultation)
    app.router.add_post("/c/{id}/follow-up", _follow_up)
    app.router.add_get("/c/{id}/events", _events)
    app.router.add_get("/c/{id}/report", _report)
    app.router.add_get("/e/{run_id}", _eval_run)
    app.router.add_get("/e/{run_id}/events", _eval_events)
    return app


def _cookie_name(request: web.Request) -> str:
    """The token cookie of this port: browsers send a host's cookies to all of its ports, so two views on one
    machine must not read each other's cookie as their own."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    port = sockname[1] if isinstance(sockname, tuple) and len(sockname) > 1 else request.url.port
    return f"{COOKIE}_{port}"


@web.middleware
async def _auth(request: web.Request, handler: Any) -> web.StreamResponse:
    expected = request.app[SETTINGS_KEY].token
    header = request.headers.get("Authorization", "")
    cookie = _cookie_name(request)
    supplied = request.query.get("token") or request.cookies.get(cookie) or header.removeprefix("Bearer ").strip()
    if not supplied or not hmac.compare_digest(supplied.encode(), expected.encode()):
        if request.path.startswith(OPENAI_PREFIX):  # OpenAI clients read a JSON error (the SDK: AuthenticationError)
            return _openai_error(401, "a valid bearer token is required (Authorization: Bearer <the server's token>)",
                                 "invalid_api_key")
        return web.Response(status=401, text="401: this conclave view needs its session token (?token=…)\n")
    response: web.StreamResponse = await handler(request)
    if request.query.get("token") and not response.prepared:
        response.set_cookie(cookie, expected, httponly=True, samesite="Strict", path="/")
    return response


@web.middleware
async def _same_origin(request: web.Request, handler: Any) -> web.StreamResponse:
    """Refuse what a page of another origin makes a browser send (see the module's docstring)."""
    bound = request.app[SETTINGS_KEY].host
    hostname = (request.url.host or "").strip("[]")
    if bound not in WILDCARD_HOSTS and hostname not in LOOPBACK_NAMES | {bound.strip("[]")}:
        return _forbidden("the Host header does not name this machine")
    site = request.headers.get("Sec-Fetch-Site")
    if request.method in ("GET", "HEAD"):
        navigation = request.headers.get("Sec-Fetch-Mode") == "navigate"
        if site not in (None, "same-origin", "none") and not navigation:
            return _forbidden("cross-origin requests are refused", request)
    else:
        origin = request.headers.get("Origin")
        if site not in (None, "same-origin") or (origin is not None and origin != f"{request.scheme}://{request.host}"):
            return _forbidden("cross-origin requests are refused", request)
    response: web.StreamResponse = await handler(request)
    return response


def _forbidden(why: str, request: web.Request | None = None) -> web.Response:
    if request is not None and request.path.startswith(OPENAI_PREFIX):
        return _openai_error(403, why, "forbidden")
    return web.Response(status=403, text=f"403: {why}\n")


def _openai_error(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> web.Response:
    """An OpenAI-style error body, for the middlewares' refusals of the /v1 routes."""
    return web.json_response({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                        "code": code}}, status=status, headers=headers)


@web.middleware
async def _rate_limit(request: web.Request, handler: Any) -> web.StreamResponse:
    wait = request.app[LIMITS_KEY].take(request.remote or "?")
    if wait:
        retry = {"Retry-After": str(max(1, round(wait)))}
        if request.path.startswith(OPENAI_PREFIX):
            return _openai_error(429, "too many requests", "rate_limit_exceeded", retry)
        return web.Response(status=429, text="429: too many requests\n", headers=retry)
    response: web.StreamResponse = await handler(request)
    return response


async def _index(request: web.Request) -> web.Response:
    rows = await _list_rows(request.app)
    runs = await asyncio.to_thread(_eval_runs, request.app[FEEDS_KEY].layout.home)
    return _html(index_page(rows, **_form_args(request), runs=runs))


def _eval_runs(home: Path) -> list[dict[str, Any]]:
    """The newest evaluation runs of the home (by run id), each as its ``run.json`` has it."""
    runs = []
    for run_id in reversed(store.run_ids(home)[-EVAL_LIST_LIMIT:]):
        try:
            runs.append(store.read_run(home, run_id))
        except (UsageError, ValueError):  # removed or being rewritten meanwhile
            continue
    return runs


async def _list_rows(app: web.Application) -> list[dict[str, Any]]:
    """The newest consultations, from the index (read on a worker thread), with this process's running ones on top
    (the index learns of them only at their first round's end)."""
    feeds: Feeds = app[FEEDS_KEY]
    indexed = await asyncio.to_thread(sessions, feeds.layout, LIST_LIMIT)
    seen = {row["id"] for row in indexed}
    running = [feed.summary() for cid, feed in reversed(feeds.running.items()) if cid not in seen]
    return [*running, *indexed][:LIST_LIMIT]


def _form_args(request: web.Request) -> dict[str, Any]:
    starters: list[Starter] = request.app[STARTER_KEY]
    if not starters:
        return {"form": None}
    return {"form": starters[0].choices, "csrf": csrf_token(request.app[SETTINGS_KEY].token)}


async def _posted(request: web.Request) -> tuple[Starter, Any] | web.Response:
    """The starter and the posted form, once its CSRF token checks out."""
    starters: list[Starter] = request.app[STARTER_KEY]
    if not starters:
        raise web.HTTPNotFound(text="this view watches one consultation; start others with `conclave serve`")
    form = await request.post()
    expected = csrf_token(request.app[SETTINGS_KEY].token)
    if not hmac.compare_digest(str(form.get("csrf", "")).encode(), expected.encode()):
        return _forbidden("the form's CSRF token is missing or wrong; reload the page")
    return starters[0], form


async def _consult(request: web.Request) -> web.Response:
    posted = await _posted(request)
    if isinstance(posted, web.Response):
        return posted
    starter, form = posted
    question = str(form.get("question", "")).strip()
    picked = {key: str(form.get(key, "")).strip() for key in ("panel", "mode", "rounds", "context")}
    if not question:
        return _html(index_page([], **_form_args(request), error="Ask a question first.", picked=picked), 400)
    outcome = await starter.start(question, form_overrides(picked))
    return _outcome(request, outcome, question, picked)


async def _follow_up(request: web.Request) -> web.Response:
    """"Ask a follow-up" on a consultation's page: a new consultation with ``parent=ID``, started as ``/consult``
    starts one (CSRF, origin, the guard on values, the cost gate)."""
    cid = _known(request)
    posted = await _posted(request)
    if isinstance(posted, web.Response):
        return posted
    starter, form = posted
    question = str(form.get("question", "")).strip()
    if not question:
        return _html(index_page([], **_form_args(request), error="Ask a follow-up question first."), 400)
    outcome = await starter.start(question, [f"parent={cid}"])
    return _outcome(request, outcome, question, {})


async def _approve(request: web.Request) -> web.Response:
    posted = await _posted(request)
    if isinstance(posted, web.Response):
        return posted
    starter, form = posted
    outcome = await starter.approve(str(form.get("approval", "")))
    return _outcome(request, outcome, "", {})


def _outcome(request: web.Request, outcome: Outcome, question: str, picked: dict[str, str]) -> web.Response:
    if "id" in outcome:
        raise web.HTTPSeeOther(f"/c/{outcome['id']}")
    return _html(index_page([], **_form_args(request), error=outcome.get("error"), refused=outcome.get("refused"),
                            approval=outcome.get("approval"), question=question, picked=picked),
                 400 if "error" in outcome else 200)


def form_overrides(picked: dict[str, str]) -> list[str]:
    """The overrides the form's fields stand for; they pass :mod:`conclave.config.guard` as any outside value does."""
    out = []
    if picked.get("panel"):
        out.append(f"agents={picked['panel']}")
    if picked.get("mode"):
        out.append(f"mode={picked['mode']}")
    if picked.get("rounds"):
        out.append(f"rounds={picked['rounds']}")
    files = [line.strip() for line in picked.get("context", "").splitlines() if line.strip()]
    if files:
        out.append("context=[" + ",".join(hydra_quote(name) for name in files) + "]")
    return out


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html",
                        headers={"Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
                                 "style-src 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'",
                                 "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin"})


def _known(request: web.Request) -> str:
    """The consultation id of the path, or 404 (an id that cannot name a journal included)."""
    cid = request.match_info["id"]
    try:
        known = request.app[FEEDS_KEY].exists(cid)
    except UsageError:
        known = False
    if not known:
        raise web.HTTPNotFound(text="no such consultation\n")
    return cid


async def _consultation(request: web.Request) -> web.Response:
    cid = _known(request)
    csrf = csrf_token(request.app[SETTINGS_KEY].token) if request.app[STARTER_KEY] else None
    return _html(consultation_page(cid, csrf))


async def _report(request: web.Request) -> web.Response:
    """The formatted report of a consultation, as ``conclave show ID --format html`` writes it."""
    cid = _known(request)
    layout: StoreLayout = request.app[FEEDS_KEY].layout
    try:
        records = await asyncio.to_thread(read_records, layout.journal_path(cid))
    except FileNotFoundError:  # started from the form a moment ago: nothing journaled yet
        records = []
    if not records:
        return _html(report_unavailable_page(cid), 404)
    text = await asyncio.to_thread(lambda: render_html(result_from_records(records), records))
    return _html(text)


async def _open_stream(request: web.Request) -> tuple[web.StreamResponse, _Bucket] | web.Response:
    """A Server-Sent Events response, counted against its client's open streams (the caller takes one off the
    bucket when it ends); a 429 when the client has too many open."""
    limits: RateLimits = request.app[LIMITS_KEY]
    bucket = limits.clients.setdefault(request.remote or "?", _Bucket())
    if bucket.streams >= limits.max_streams:
        return web.Response(status=429, text="429: too many open event streams\n", headers={"Retry-After": "5"})
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    bucket.streams += 1
    return response, bucket


async def _events(request: web.Request) -> web.StreamResponse:
    cid = _known(request)
    feeds: Feeds = request.app[FEEDS_KEY]
    opened = await _open_stream(request)
    if isinstance(opened, web.Response):
        return opened
    response, bucket = opened
    heartbeat_s = request.app[SETTINGS_KEY].heartbeat_s
    stream = feeds.follow(cid, _last_event_id(request)).__aiter__()
    # The next record is awaited across heartbeats: cancelling a pending __anext__ (as wait_for does on its
    # timeout) would close the generator, and an idle stream would end while the consultation goes on.
    pending: asyncio.Future[list[bytes]] = asyncio.ensure_future(stream.__anext__())
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=heartbeat_s)
            if not done:
                await response.write(b": ping\n\n")
                continue
            try:
                batch = pending.result()
            except StopAsyncIteration:
                break
            # frames encoded once when their event was published (the same bytes for every viewer); a batch (the
            # replay, or what queued up meanwhile) is one write
            await response.write(batch[0] if len(batch) == 1 else b"".join(batch))
            pending = asyncio.ensure_future(stream.__anext__())
        await response.write(b"event: end\ndata: {}\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    finally:
        pending.cancel()
        bucket.streams -= 1
    return response


def _known_run(request: web.Request) -> tuple[str, dict[str, Any]]:
    """The evaluation run of the path and its ``run.json``, or 404 (an id that cannot name a run included)."""
    run_id = request.match_info["run_id"]
    try:
        return run_id, store.read_run(request.app[FEEDS_KEY].layout.home, run_id)
    except (UsageError, ValueError):
        raise web.HTTPNotFound(text="no such evaluation run\n") from None


async def _eval_run(request: web.Request) -> web.Response:
    run_id, run = await asyncio.to_thread(_known_run, request)
    return _html(eval_run_page(run_id, run))


async def _eval_events(request: web.Request) -> web.StreamResponse:
    """The run's ``eval:batch_progress`` records over Server-Sent Events (``id:`` is the byte offset in
    ``progress.jsonl`` after the record, so a dropped connection resumes after the last one it saw), new ones as
    the run appends them, until the run is no longer running."""
    run_id, _ = await asyncio.to_thread(_known_run, request)
    home = request.app[FEEDS_KEY].layout.home
    opened = await _open_stream(request)
    if isinstance(opened, web.Response):
        return opened
    response, bucket = opened
    heartbeat_s = request.app[SETTINGS_KEY].heartbeat_s
    offset, quiet, status = max(0, _last_event_id(request)), 0.0, ""
    try:
        while True:
            records, offset = await asyncio.to_thread(read_progress, home, run_id, offset)
            if records:
                await response.write(b"".join(
                    f"id: {offset}\ndata: {json.dumps(r.as_dict(), ensure_ascii=False)}\n\n".encode()
                    for r in records))
                quiet = 0.0
                continue
            status = str((await asyncio.to_thread(store.read_run, home, run_id)).get("status") or "")
            if status not in ("starting", "running"):
                break
            await asyncio.sleep(PROGRESS_POLL_S)
            quiet += PROGRESS_POLL_S
            if quiet >= heartbeat_s:
                await response.write(b": ping\n\n")
                quiet = 0.0
        await response.write(f"event: end\ndata: {json.dumps({'status': status})}\n\n".encode())
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

