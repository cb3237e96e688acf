"""Import what a consultation needs only after its first request while round 1 waits for its answers.

A CLI process imports nothing it does not need before round 1's requests leave; what the later steps need —
schema validation (jsonschema with its format checkers), the result models, the exit controller's averages and
word diffs (statistics, difflib), the report renderers — is imported by a worker thread :data:`WARMUP_AFTER_S`
after round 1 starts, while the event loop waits on the network, instead of on the path between a round's last
answer and the next round's requests.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

from conclave import startup_trace
from conclave.events import ROUND_STARTED

#: how long after round 1 starts the warm-up begins (its requests leave first)
WARMUP_AFTER_S = 0.05

#: imported by the warm-up, in this order
LATER_MODULES = ("jsonschema", "conclave.engine.result", "statistics", "difflib", "conclave.render.markdown",
                 "conclave.render.jsonld")


_THREAD_NAME = "conclave-import-warmup"
#: module -> set once the warm-up has imported it (or failed to); empty until a warm-up starts
_imported: dict[str, threading.Event] = {}


def settled(name: str = LATER_MODULES[-1]) -> None:
    """Wait until a running warm-up is past ``name`` (by default: done). Two threads importing one package at the
    same time can deadlock (Python raises ``_DeadlockError`` in one of them: a package half initialized by one
    thread lets the other in to its submodules), so code outside the warm-up calls this before it imports a module
    the warm-up imports. Returns at once when no warm-up was started."""
    event = _imported.get(name)
    if event is not None and threading.current_thread().name != _THREAD_NAME:
        event.wait()


def _import_later_modules() -> None:
    time.sleep(WARMUP_AFTER_S)
    startup_trace.mark(startup_trace.WARM_UP, once=True)
    for name in LATER_MODULES:
        # on failure the step that needs the module imports it again and says what is wrong
        try:
            with contextlib.suppress(Exception):
                importlib.import_module(name)
        finally:
            _imported[name].set()


_early_http: threading.Thread | None = None


def import_http_client_early() -> None:
    """Import the HTTP client on a worker thread while the main thread reads the configuration (a plain
    consultation's start).

    Importing aiohttp builds its two default TLS contexts, each loading the system's CA bundle (~25 ms apiece) in
    OpenSSL, which runs without holding the interpreter lock: on a thread of its own that work overlaps the
    configuration's validation instead of following it. Both threads may import the same standard modules (the
    import system makes one wait for the other); what must not happen is the main thread importing a *submodule*
    of a package the worker has half initialized (aiohttp's, asyncio's): conclave's own code imports only the
    packages themselves, and a third-party plugin is loaded only after :func:`settle_early_imports`. A failure is
    left for the real import to meet."""
    global _early_http

    def load() -> None:
        with contextlib.suppress(Exception):
            import aiohttp  # noqa: F401

    _early_http = threading.Thread(target=load, name="conclave-http-import", daemon=True)
    _early_http.start()


def settle_early_imports() -> None:
    """Wait until the early HTTP-client import is done (at once when none runs): before code whose imports are not
    conclave's own (a third-party plugin) runs on the main thread."""
    if _early_http is not None and _early_http is not threading.current_thread():
        _early_http.join()


def warm_up_subscriber() -> Callable[[Any], None]:
    """An event subscriber that starts the warm-up thread when the first round starts (once)."""
    started = False

    def on_event(event: Any) -> None:
        nonlocal started
        if started or event.type != ROUND_STARTED:
            return
        started = True
        for name in LATER_MODULES:
            _imported.setdefault(name, threading.Event())
        threading.Thread(target=_import_later_modules, daemon=True, name=_THREAD_NAME).start()

    return on_event
