"""Work a consultation must do but not before its next requests: run while those requests wait on the network.

Between a round's last answer and the next round's requests, the engine only does what building and sending
those requests needs (validating the answers, the journal made durable, the debate state, the prompts). Exact
token counts for the record — the savings of ``token_efficiency_stats``, the context summary's counts — are
queued here instead (:meth:`Background.defer`): from the consultation's second round on, they run on the event
loop :data:`DEFER_S` after they were queued, one job per loop iteration and only when nothing else is ready to
run (a request still being sent goes first; an answer that arrives meanwhile waits for one job at most), and
:meth:`Background.settle` runs whatever is still queued, at once, before anything reads their results.

Jobs only compute from values they were given (strings, counts): nothing they read changes after they were
queued, so running them later gives exactly what running them at once gave.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

#: how long after a job is queued it may run: the requests built just before it have left by then
DEFER_S = 0.05


class Background:
    """A queue of deferred jobs, run in order on the running event loop (or by :meth:`settle`).

    ``paused``: jobs only queue up until :meth:`start` (the engine starts it with the second round, leaving round
    1's wait to the imports and schema checks its answers need)."""

    def __init__(self, *, paused: bool = False) -> None:
        self._paused = paused
        self._jobs: deque[Callable[[], None]] = deque()
        self._handle: asyncio.Handle | None = None
        self._error: BaseException | None = None  # a job's failure, raised by the next settle()

    def __len__(self) -> int:
        return len(self._jobs)

    def defer(self, job: Callable[[], None]) -> None:
        """Run ``job`` later (see the module doc); outside an event loop it runs at :meth:`settle`."""
        self._jobs.append(job)
        self._arm()

    def start(self) -> None:
        """Let queued and later jobs run (see ``paused``)."""
        self._paused = False
        self._arm()

    def _arm(self) -> None:
        if self._handle is None and self._jobs and not self._paused:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            self._handle = loop.call_later(DEFER_S, self._run_one)

    def settle(self) -> None:
        """Run every queued job now, in order (before their results are read); a job that failed on the event
        loop raises here, as it would have where it was queued."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        while self._jobs:  # every job runs; the first failure is raised once all have
            try:
                self._jobs.popleft()()
            except Exception as exc:
                self._error = self._error or exc
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run_one(self) -> None:
        self._handle = None
        if not self._jobs:
            return
        loop = asyncio.get_running_loop()
        if busy(loop):  # a request still being built or sent goes first
            self._handle = loop.call_soon(self._run_one)
            return
        job = self._jobs.popleft()
        try:
            job()
        except Exception as exc:  # kept for settle(): the caller that reads the results sees it
            self._error = self._error or exc
        finally:
            if self._jobs and self._handle is None:
                self._handle = asyncio.get_running_loop().call_soon(self._run_one)


def busy(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` has other work ready to run (a task still building or sending a request) than the waiters
    for idleness themselves; False when it only waits on the network (or cannot tell: an event loop without
    asyncio's ready queue)."""
    return any(getattr(getattr(handle, "_callback", None), "__func__", getattr(handle, "_callback", None))
               not in _IDLE_WAITERS for handle in getattr(loop, "_ready", ()))


async def idle() -> None:
    """Return once the running loop has nothing but idle waiters ready to run (at most 1,000 loop iterations)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    loop.call_soon(_when_idle, done, 1000)
    await done


def _when_idle(done: asyncio.Future[None], tries: int) -> None:
    if done.done():
        return
    loop = done.get_loop()
    if tries > 0 and busy(loop):
        loop.call_soon(_when_idle, done, tries - 1)
    else:
        done.set_result(None)


#: the callbacks that wait for the loop to be idle: they do not count as work for each other
_IDLE_WAITERS = frozenset({Background._run_one, _when_idle})
