"""Garbage collection in a ``conclave`` CLI process: paused while the process starts, then frozen and resumed.

Starting a consultation imports ~500 modules and builds the configuration: hundreds of thousands of objects that
live until the process ends, and almost no garbage. Python's cyclic collector still runs every 700 allocations and
rescans that growing heap (~140 young and a dozen older collections, one full one of ~12 ms, ~30 ms in all before
round 1's requests leave). So the ``conclave`` command pauses the collector (:func:`pause`) and, when its start is
over, moves everything alive to the permanent generation (``gc.freeze``: never scanned again) and resumes it
(:func:`resume`): a consultation's own garbage is collected as before, at the cost of collecting only what it
allocated. Every other command resumes it without freezing once it knows which command runs, and code that is not
the ``conclave`` command (tests, the MCP server, a library user) never pauses it.
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Stop automatic collection until :func:`resume` (the ``conclave`` command's entry calls this first)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume(*, freeze: bool) -> None:
    """Collect automatically again if :func:`pause` stopped it; ``freeze``: what is alive now (the start-up's
    modules and configuration) is never scanned again. Does nothing when the collector was not paused here."""
    global _paused
    if not _paused:
        return
    _paused = False
    if freeze:
        gc.freeze()
    gc.enable()
