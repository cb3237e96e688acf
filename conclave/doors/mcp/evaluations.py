"""``conclave_eval``: ``conclave eval`` on a set, started from an MCP client.

The evaluation runs as its own ``conclave eval`` process (Hydra's global state and the run's worker pool stay out
of the server), in the server's data home, with the server's own overrides (provider endpoints) and only what the
named arguments stand for: the client passes no raw override. The set is a registered generator (``arithmetic``,
``gym:<task>``) or a file under the server's allowed roots. Each line the run prints on stderr becomes progress (or
the task's status) — a batched run's ``eval:batch_progress`` lines among them (provider, batch id, status, counts
done/failed/total, :mod:`conclave.eval.batch_progress`); cancelling sends it SIGINT, as Ctrl-C does, and
``run_id`` resumes it (``conclave eval resume``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from conclave.config.guard import Roots
from conclave.errors import ConfigError
from conclave.eval.evaluate import new_run_id

GENERATED = re.compile(r"arithmetic|gym:[A-Za-z0-9_]+")
RUN_ID = re.compile(r"ev-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")
NAME = re.compile(r"[A-Za-z0-9_]+")
#: how long a cancelled run gets to save what it has after SIGINT
STOP_GRACE_S = 60.0

Report = Callable[[float, float | None, str], Awaitable[None]]


@dataclass
class EvalOutcome:
    run_id: str
    exit_code: int
    report: str
    last_line: str


def check_set(spec: str, roots: Roots) -> str:
    """The set as ``conclave eval`` takes it: a registered generator, or the absolute path of a file (or saved
    dataset directory) under the allowed roots."""
    if GENERATED.fullmatch(spec):
        return spec
    if spec.startswith("gym:"):
        raise ConfigError([f"set: {spec!r} is not a reasoning-gym task name (letters, digits, _)"])
    path = roots.check("set", spec)
    if not path.exists():
        raise ConfigError([f"set: file not found: {spec}"])
    return str(path)


def eval_overrides(*, n: int, rounds: int | None, panel: str | None, max_cost: float | None,
                   batch: str | None = None, batch_poll_s: float | None = None) -> list[str]:
    out = [f"eval.n={n}"]
    if batch is not None:
        if batch not in ("true", "mixed"):
            raise ConfigError([f"batch: {batch!r} is not allowed; allowed: true, mixed"])
        out.append(f"eval.batch={batch}")
    if batch_poll_s is not None:
        out.append(f"eval.batch_poll_s={float(batch_poll_s)!r}")
    if rounds is not None:
        out.append(f"rounds={rounds}")
    if panel is not None:
        if not NAME.fullmatch(panel):
            raise ConfigError([f"panel: {panel!r} is not a panel name (letters, digits, _)"])
        out.append(f"agents={panel}")
    if max_cost is not None:
        out.append(f"cost.always_allow_under={max_cost}")
    return out


async def run_eval(home: Path, base_overrides: list[str], arguments: list[str], report: Report | None,
                   heartbeat_s: float, run_id: str | None = None,
                   on_start: Callable[[str], None] | None = None) -> EvalOutcome:
    """Run ``conclave eval`` (or ``conclave eval resume RUN`` when ``run_id`` is given) to its end."""
    if run_id is not None:
        if not RUN_ID.fullmatch(run_id):
            raise ConfigError([f"run_id: {run_id!r} is not an evaluation run id (ev-YYYYMMDD-HHMMSS-xxxxxx)"])
        argv = ["eval", "resume", run_id]
    else:
        run_id = new_run_id()
        argv = ["eval", *arguments, *base_overrides, f"eval.run_id={run_id}"]
    if on_start is not None:
        on_start(run_id)
    env = {**os.environ, "CONCLAVE_HOME": str(home), "CONCLAVE_PROGRESS": "0"}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", *argv, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=str(home))
    assert process.stdout is not None and process.stderr is not None
    reading = asyncio.create_task(process.stdout.read())
    last, value, started = "", 0.0, time.monotonic()
    try:
        while True:
            try:
                async with asyncio.timeout(heartbeat_s):
                    line = (await process.stderr.readline()).decode(errors="replace")
            except TimeoutError:
                line = None
            if line == "":
                break
            value += 1.0
            message = line.strip() if line else f"working: evaluation {run_id} ({time.monotonic() - started:.0f} s)"
            if line and line.strip():
                last = line.strip()
            if report is not None:
                with contextlib.suppress(Exception):  # a client that left must not stop the run
                    await report(value, None, message)
        out = await reading
        code = await process.wait()
    except asyncio.CancelledError:
        if process.returncode is None:
            process.send_signal(signal.SIGINT)  # as Ctrl-C: the run saves its finished items and is resumable
            try:
                await asyncio.shield(asyncio.wait_for(process.wait(), STOP_GRACE_S))
            except TimeoutError:
                process.kill()
        reading.cancel()
        raise
    return EvalOutcome(run_id, code, out.decode(errors="replace"), last)
