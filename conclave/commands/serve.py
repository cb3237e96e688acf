"""``conclave serve [--port N] [--no-open]``: watch consultations in a browser, live, on 127.0.0.1.

Every route needs the random session token printed with the URL (``?token=…`` once; a cookie after that); no or a
wrong token is a 401. ``/`` lists consultations; ``/c/ID`` shows one with the same report as ``conclave show`` and
follows it while it runs: ``/c/ID/events`` is a Server-Sent Events stream of the journal's own records (a viewer
who joins late gets every record so far, then the new ones; a reconnect resumes after ``Last-Event-ID``, the
record's ``seq``). The journal is followed as it is flushed, which happens at least once per round. Each client
address is rate-limited. Starting a consultation from the page, and per-agent and per-token streaming, are not
part of this view yet.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import html
import json
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from conclave.store.paths import StoreLayout, default_home

HOST = "127.0.0.1"
POLL_S = 0.02  # how often a stream looks for appended journal lines (one read of the new bytes)
RATE_PER_S, RATE_BURST = 20.0, 60.0
COOKIE = "conclave_session"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="conclave serve", description=__doc__)
    parser.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = a free port)")
    parser.add_argument("--no-open", action="store_true", help="do not open a web browser")
    args = parser.parse_args(argv)
    from aiohttp import web

    layout = StoreLayout(default_home())
    token = secrets.token_urlsafe(24)
    app = make_app(layout, token)

    async def serve() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, HOST, args.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        url = f"http://{HOST}:{port}/?token={token}"
        print(f"conclave serve: watching {layout.journal_dir} at {url} (Ctrl-C stops it)", file=sys.stderr,
              flush=True)
        if not args.no_open:
            import webbrowser

            webbrowser.open(url)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        return 0
    return 0


Handler = Callable[[Any], Awaitable[Any]]


def make_app(layout: StoreLayout, token: str) -> Any:
    """The aiohttp application; every route is behind ``token`` and a per-address rate limit."""
    from aiohttp import web

    buckets: dict[str, tuple[float, float]] = {}

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> Any:
        given = request.query.get("token") or request.cookies.get(COOKIE) or ""
        if not hmac.compare_digest(given.encode(), token.encode()):
            return web.Response(status=401, text="401: this page needs the session token from `conclave serve`\n")
        address = request.remote or "?"
        now = time.monotonic()
        level, last = buckets.get(address, (RATE_BURST, now))
        level = min(RATE_BURST, level + (now - last) * RATE_PER_S)
        if level < 1:
            return web.Response(status=429, text="429: too many requests\n", headers={"Retry-After": "1"})
        buckets[address] = (level - 1, now)
        response = await handler(request)
        if request.query.get("token"):
            response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
        return response

    app = web.Application(middlewares=[guard])
    app["layout"] = layout
    app.router.add_get("/", _index)
    app.router.add_get("/conclave.css", _css)
    app.router.add_get(r"/c/{cid:[A-Za-z0-9_.-]+}", _page)
    app.router.add_get(r"/c/{cid:[A-Za-z0-9_.-]+}/report", _report)
    app.router.add_get(r"/c/{cid:[A-Za-z0-9_.-]+}/events", _events)
    return app


class JournalTail:
    """Reads a journal's complete lines as they are appended, from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits for its newline
        self.offset += end
        records = []
        for line in data[:end].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                records.append(record)
        return records

    def at_end(self) -> bool:
        return self.path.stat().st_size <= self.offset


def _journal(request: Any) -> Path:
    from aiohttp import web

    from conclave.errors import ConclaveError

    layout: StoreLayout = request.app["layout"]
    try:
        path = layout.journal_path(request.match_info["cid"])
    except ConclaveError:
        raise web.HTTPNotFound(text="no such consultation\n") from None
    if not path.is_file():
        raise web.HTTPNotFound(text="no such consultation\n")
    return path


def _shell(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            '<link rel="stylesheet" href="/conclave.css"><style>body { margin: 1.5em auto; padding: 0 1.5em; '
            "max-width: 1100px; } .cv-live { font-size: 0.9em; color: #59636e; } .cv-events { font: 12px/1.4 "
            "monospace; max-height: 14em; overflow: auto; background: #f6f8fa; padding: 0.5em; }</style></head>"
            f"<body>{body}</body></html>")


async def _css(request: Any) -> Any:
    from aiohttp import web

    from conclave.render.html import stylesheet

    return web.Response(text=stylesheet(), content_type="text/css")


async def _index(request: Any) -> Any:
    from aiohttp import web

    rows = await asyncio.to_thread(_list_rows, request.app["layout"])
    body = ('<div class="cv-report"><h1>Consultations</h1><div class="cv-table-wrap"><table class="cv-table">'
            "<thead><tr><th>Id</th><th>Status</th><th>Mode</th><th>Question</th></tr></thead>"
            f"<tbody>{''.join(rows[:200])}</tbody></table></div></div>")
    return web.Response(text=_shell("conclave · consultations", body), content_type="text/html")


def _list_rows(layout: StoreLayout) -> list[str]:
    """One table row per journal, newest id first: its state (running until it completes), mode and question."""
    from conclave.store.journal import last_record

    rows = []
    for cid in reversed(layout.journal_ids()):
        path = layout.journal_path(cid)
        with open(path, "rb") as f:
            first = f.readline()
        try:
            started = json.loads(first).get("data") or {}
        except ValueError:
            started = {}
        last = last_record(path) or {}
        state = (last.get("data") or {}).get("status") if last.get("type") == "consultation:completed" else "running"
        rows.append(f'<tr><td><a href="/c/{html.escape(cid)}">{html.escape(cid)}</a></td>'
                    f"<td>{html.escape(str(state))}</td><td>{html.escape(str(started.get('mode') or ''))}</td>"
                    f"<td>{html.escape(str(started.get('question') or ''))}</td></tr>")
    return rows


def _fragment(path: Path) -> str:
    from conclave.render.html import report_fragment
    from conclave.render.journal_view import result_from_records
    from conclave.store.journal import read_records

    records = read_records(path)
    if not records:
        return '<div class="cv-report"><p class="cv-muted">Nothing recorded yet.</p></div>'
    return report_fragment(result_from_records(records), records)


async def _report(request: Any) -> Any:
    from aiohttp import web

    return web.Response(text=await asyncio.to_thread(_fragment, _journal(request)), content_type="text/html")


_LIVE_JS = """
<script>
(function () {
  var cid = document.body.dataset.cid;
  var report = document.getElementById('report');
  var status = document.getElementById('live-status');
  var log = document.getElementById('events');
  var pending = null;
  function refresh() {
    pending = null;
    fetch('/c/' + cid + '/report').then(function (r) { return r.text(); })
      .then(function (text) { report.innerHTML = text; });
  }
  var source = new EventSource('/c/' + cid + '/events');
  source.onmessage = function () {};
  source.addEventListener('record', function (e) {
    var record = JSON.parse(e.data);
    var line = document.createElement('div');
    line.textContent = '#' + record.seq + ' ' + record.type + ' ' + (record.summary || '');
    log.appendChild(line);
    log.scrollTop = log.scrollHeight;
    if (!pending) { pending = setTimeout(refresh, 150); }
    status.textContent = record.type === 'consultation:completed' ? 'finished' : 'live';
  });
  source.addEventListener('end', function () { status.textContent = 'finished'; source.close(); });
  source.onerror = function () { status.textContent = 'reconnecting…'; };
})();
</script>
"""


async def _page(request: Any) -> Any:
    from aiohttp import web

    path = _journal(request)
    cid = html.escape(request.match_info["cid"])
    body = '<p class="cv-live"><a href="/">All consultations</a> · <span id="live-status">connecting…</span></p>'
    report = await asyncio.to_thread(_fragment, path)
    body += (f'<div id="report">{report}</div><h3>Journal records</h3><div class="cv-events" id="events">'
            f"</div>{_LIVE_JS}")
    page = _shell(f"conclave · {cid}", body).replace("<body>", f'<body data-cid="{cid}">', 1)
    return web.Response(text=page, content_type="text/html")


async def _events(request: Any) -> Any:
    """Every journal record after ``Last-Event-ID`` as SSE (``event: record``), then new ones as the journal grows,
    until the consultation completes (``event: end``)."""
    from aiohttp import web

    from conclave.commands.logs import describe

    path = _journal(request)
    after = request.headers.get("Last-Event-ID") or request.query.get("last_event_id") or "-1"
    try:
        last_seq = int(after)
    except ValueError:
        last_seq = -1
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"})
    await response.prepare(request)
    tail = JournalTail(path)
    last_type = ""
    while True:
        records = await asyncio.to_thread(tail.read_new)
        for record in records:
            last_type = str(record.get("type"))
            seq = int(record.get("seq", -1))
            if seq <= last_seq:
                continue
            summary = describe(last_type, record.get("data") or {})
            payload = json.dumps({**record, "summary": summary}, ensure_ascii=False)
            await response.write(f"id: {seq}\nevent: record\ndata: {payload}\n\n".encode())
            last_seq = seq
        # finished when the journal ends on a completion (a resumed run writes more after its first one)
        if last_type == "consultation:completed" and await asyncio.to_thread(tail.at_end):
            break
        await asyncio.sleep(POLL_S)
    await response.write(b"event: end\ndata: {}\n\n")
    return response
