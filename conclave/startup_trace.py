"""``CONCLAVE_TRACE_STARTUP=1``: a ``conclave`` process says on stderr when it reaches each step of its start and
exit — the budget of issue 11 is process start → first provider request.

Each line reads ``conclave-trace: +0.412 s STEP (cpu 0.380 s, 493 modules)``: seconds since the process started
(the kernel's start time of the process, 10 ms resolution), the process's CPU time so far and how many modules
are imported. The steps: ``entry`` (conclave's code starts), ``settings validated``, ``journal started`` (durable),
``first request sent``, ``warm-up imports`` (a thread imports what later steps need while round 1 waits),
``result printed``, ``exit`` (the exit handlers run; the process ends right after).
``CONCLAVE_TRACE_STARTUP=modules`` also lists every imported module at the first request or the first warm-up
import, whichever comes first (the test that keeps heavy modules off the path to the first request reads it).
Off by default; then :func:`mark` costs one comparison.
"""

from __future__ import annotations

import os
import sys
import time

_MODE = os.environ.get("CONCLAVE_TRACE_STARTUP", "")
ENABLED = _MODE in ("1", "modules")
FIRST_REQUEST = "first request sent"
#: a warm-up thread starts importing what later steps need (after round 1 has started; see conclave.engine.warmup)
WARM_UP = "warm-up imports"
_seen: set[str] = set()


def _process_start() -> float:
    """When this process started, on the ``time.time()`` clock (``/proc/self/stat`` field 22, clock ticks since
    boot); now, where there is no ``/proc``."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


def mark(step: str, once: bool = False) -> None:
    """Say that the process reached ``step`` (only with ``CONCLAVE_TRACE_STARTUP`` set); ``once``: the first time
    only."""
    if not ENABLED or (once and step in _seen):
        return
    _seen.add(step)
    print(f"conclave-trace: +{time.time() - _STARTED:.3f} s {step} (cpu {time.process_time():.3f} s, "
          f"{len(sys.modules)} modules)", file=sys.stderr, flush=True)
    if _MODE == "modules" and step in (FIRST_REQUEST, WARM_UP) and "modules" not in _seen:
        _seen.add("modules")  # what the main thread imported before either: no warm-up import is counted
        print(f"conclave-trace: modules: {' '.join(sorted(sys.modules))}", file=sys.stderr, flush=True)


if ENABLED:
    import atexit

    _STARTED = _process_start()
    atexit.register(mark, "exit")  # registered first, so it runs last
