"""Running the live view: ``conclave serve`` (list, start and watch consultations) and ``live=true`` (watch the
consultation this command runs). Both bind 127.0.0.1 unless told otherwise and print the URL with its token."""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from conclave.compose import config_groups
from conclave.config.guard import Door, approval_for
from conclave.doors.web.app import Starter, make_app, new_token
from conclave.doors.web.feeds import KEEP_FINISHED, KEEP_S, Feeds
from conclave.doors.web.gated_start import start_gated
from conclave.doors.web.page import FormChoices
from conclave.errors import ConclaveError, UsageError
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder

#: how long a refused estimate may be approved from its page
APPROVAL_TTL_S = 600.0


class LocalStarter:
    """Starts consultations in this process from the form. The form's choices pass the door's guard
    (:class:`conclave.config.guard.Door`) and are composed and validated exactly as on the command line; the cost gate
    runs non-interactively, and a refusal is shown in the page with the figure and a one-time approval, which
    starts the same request with ``cost.auto_approve=true``."""

    def __init__(self, feeds: Feeds, recorder: Any, door: Door) -> None:
        self.feeds = feeds
        self.recorder = recorder
        self.door = door
        self.tasks: set[asyncio.Task[Any]] = set()
        #: refused requests that may be approved: nonce -> (expiry, question, overrides, the estimate shown)
        self.pending: dict[str, tuple[float, str, list[str], float | None]] = {}

    def starter(self) -> Starter:
        groups = config_groups()
        choices = FormChoices(tuple(groups.get("agents", ())), tuple(groups.get("mode", ())),
                              tuple(str(d) for d in self.door.roots.dirs))
        return Starter(start=self.start, approve=self.approve, choices=choices)

    async def start(self, question: str, outside: list[str]) -> dict[str, Any]:
        return await self._run(question, outside)

    def _prune(self) -> None:
        now = time.monotonic()
        self.pending = {k: v for k, v in self.pending.items() if v[0] > now}

    async def approve(self, nonce: str) -> dict[str, Any]:
        self._prune()
        request = self.pending.pop(nonce, None)
        if request is None:
            return {"error": "this approval has expired or was used; start the consultation again"}
        _, question, outside, estimate = request
        return await self._run(question, outside, approval_for(estimate))

    async def _run(self, question: str, outside: list[str], approval: list[str] | None = None) -> dict[str, Any]:
        try:
            settings = self.door.compose(question, outside, approval or [])
        except ConclaveError as exc:
            return {"error": str(exc)}
        started = await start_gated(settings, self.feeds, self.recorder, self.tasks)
        if started.consultation.refusal is not None:
            self._prune()  # refusals nobody approves do not pile up
            nonce = secrets.token_urlsafe(18)
            self.pending[nonce] = (time.monotonic() + APPROVAL_TTL_S, question, outside, started.estimate)
            return {"refused": started.consultation.refusal, "approval": nonce}
        if (error := started.error()) is not None:
            return {"error": f"{type(error).__name__}: {error}"}
        return {"id": started.id}


async def start_site(app: web.Application, host: str, port: int, option: str = "--port"
                     ) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host:port``; an address that cannot be listened on is a :class:`UsageError` naming
    ``option``, the setting that chose the port (``--host`` when the host is unknown or not this machine's)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
            option = "--host"  # the address is at fault, not the port
        raise UsageError(f"{option}: cannot listen on {host}:{port}: {_os_reason(exc)}") from None
    addresses = runner.addresses
    return runner, int(addresses[0][1]) if addresses else port


def _os_reason(exc: OSError) -> str:
    """The system's short reason ("Address already in use"), not asyncio's sentence around it."""
    if isinstance(exc, socket.gaierror) or not exc.errno or exc.errno < 0:
        return exc.strerror or str(exc)
    return os.strerror(exc.errno)


def token_from_env() -> str:
    return os.environ.get("CONCLAVE_WEB_TOKEN") or new_token()


@dataclass(frozen=True)
class Mount:
    """Another door served on the live view's port, under ``prefix``, behind the same token and origin checks:
    ``build(feeds, recorder, door)`` makes its sub-application."""

    prefix: str
    title: str
    build: Callable[[Feeds, Any, Door], web.Application]


async def serve(home: Path, host: str, port: int, door: Door, mounts: Sequence[Mount] = (),
                keep: tuple[int, float] = (KEEP_FINISHED, KEEP_S)) -> None:
    """Serve until cancelled (Ctrl-C); the form's requests pass ``door``, and so do those of ``mounts``; ``keep``
    is how many finished consultations' events stay in memory once nobody watches them, and for how long at most
    (:class:`Feeds`)."""
    recorder = Recorder(home)
    feeds = Feeds(StoreLayout(home), *keep)
    token = token_from_env()
    starter = LocalStarter(feeds, recorder, door)
    app = make_app(home, token, feeds, starter.starter(), host=host)
    for mount in mounts:
        app.add_subapp(mount.prefix, mount.build(feeds, recorder, door))
    runner, bound = await start_site(app, host, port)
    print(f"conclave: live view at http://{host}:{bound}/?token={token}  (Ctrl-C stops it)", file=sys.stderr,
          flush=True)
    for mount in mounts:
        print(f"conclave: {mount.title} at http://{host}:{bound}{mount.prefix}  (API key: the token above)",
              file=sys.stderr, flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for task in list(starter.tasks):
            task.cancel()
        await asyncio.gather(*starter.tasks, return_exceptions=True)
        await runner.cleanup()
        recorder.close()


async def run_watched(consultation: Any, home: Path, port: int) -> Any:
    """Run ``consultation`` (which streams) while serving its live view; the URL goes to stderr."""
    feeds = Feeds(StoreLayout(home))
    consultation.bus.subscribe(feeds.feed_for(consultation.id))
    token = token_from_env()
    runner, bound = await start_site(make_app(home, token, feeds), "127.0.0.1", port, option="live_port")
    print(f"conclave: watch it live at http://127.0.0.1:{bound}/c/{consultation.id}?token={token}",
          file=sys.stderr, flush=True)
    try:
        return await consultation.run()
    finally:
        await asyncio.sleep(0.2)  # let open streams deliver the end
        await runner.cleanup()
