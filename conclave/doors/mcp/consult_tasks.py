"""Long consultations as MCP Tasks (the ``io.modelcontextprotocol/tasks`` extension, 2026-07-28 clients).

A client that declares the extension gets a task from ``conclave_consult``, ``conclave_resume`` and
``conclave_eval`` as soon as the cost gate has let the run start (nothing is spent before that); a call that fails
before (bad arguments, an estimate that needs approval: an ``input_required`` result) answers at once as without
tasks. The task id is the consultation's id (for an evaluation, its run id), so ``tasks/get`` and ``tasks/result``
keep answering from the journal after this process is gone, and ``conclave_resume`` takes it as its id.

- ``tasks/get``: status (working, completed, failed, cancelled), the last progress message (updated at every round
  and agent event, as progress notifications are) and the progress value and total.
- ``tasks/result``: waits for the end and returns the tool's result.
- ``tasks/cancel``: stops the run as Ctrl-C does (completed rounds stay in the journal; it can be resumed).

Clients without the extension (every 2025-era client: the SDK delivers no task result on a handshake-era wire) get
the blocking call with progress notifications and heartbeats.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import datetime as dt
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mcp.server.extension import Extension, MethodBinding
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolRequestParams, CallToolResult, RequestParams, Result, TextContent
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from conclave import events as ev
from conclave.errors import ConclaveError
from conclave.store.paths import StoreLayout

IDENTIFIER = "io.modelcontextprotocol/tasks"
#: the tools that run as tasks for a client with the extension (conclave_continue: from the followup branch)
TASK_TOOLS = frozenset({"conclave_consult", "conclave_continue", "conclave_resume", "conclave_eval"})
POLL_INTERVAL_MS = 500

Status = Literal["working", "input_required", "completed", "failed", "cancelled"]


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class TaskState(Result):
    """A task as ``tasks/get`` (and the ``task`` of a tool call's answer) shows it."""

    task_id: str
    status: Status
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl: int | None = None
    poll_interval: int | None = POLL_INTERVAL_MS
    progress: float = 0.0
    total: float | None = None


class TaskCreated(Result):
    """A tool call's answer when it became a task (``resultType: "task"``)."""

    result_type: Literal["task"] = "task"
    task: TaskState


class TaskRequestParams(RequestParams):
    task_id: str = Field(min_length=1)


@dataclass
class Job:
    """One tool call running as a task: its status, progress and (once it ended) result."""

    kind: str
    id: str = ""
    status: Status = "working"
    message: str = "starting"
    progress: float = 0.0
    total: float | None = None
    created_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)
    result: Any = None
    #: set once the run may spend (the cost gate let it start): the call answers with the task then
    started: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[Any] | None = None

    async def report(self, value: float, total: float | None, message: str) -> None:
        """The progress bridge's sink: the task's status carries what a progress notification would."""
        self.progress, self.total, self.message, self.updated_at = value, total, message, now()

    def observe(self, event: ev.Event) -> None:
        """A subscriber of the consultation's events: its id names the task; approved consent starts it."""
        if not self.id and event.consultation_id:
            self.id = event.consultation_id
        if event.type == ev.USER_CONSENT and event.data.get("approved"):
            self.started.set()

    def begin(self, task_id: str) -> None:
        """A run that has no consultation events (an evaluation): it is named and may start at once."""
        self.id = task_id
        self.started.set()

    def state(self) -> TaskState:
        return TaskState(task_id=self.id, status=self.status, status_message=self.message, created_at=self.created_at,
                         last_updated_at=self.updated_at, progress=self.progress, total=self.total, ttl=None)


#: the job the current tool call runs as (set inside the task's own asyncio task only)
CURRENT_JOB: contextvars.ContextVar[Job | None] = contextvars.ContextVar("conclave_mcp_job", default=None)


def wants_task(ctx: Any) -> bool:
    """Whether the caller is a 2026-07-28 client that declared the Tasks extension."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return bool(capabilities and capabilities.extensions and IDENTIFIER in capabilities.extensions)


def unknown_task(task_id: str) -> MCPError:
    return MCPError(code=INVALID_PARAMS, message=f"taskId: unknown task {task_id!r}")


class ConsultationTasks(Extension):
    """The Tasks extension: runs TASK_TOOLS calls in the background and serves ``tasks/*``.

    ``from_journal(id)`` answers for a task this process no longer (or never) ran: the ended consultation's result
    as the tool's answer, or None when there is no such consultation."""

    identifier = IDENTIFIER

    def __init__(self, layout: StoreLayout,
                 from_journal: Callable[[str], Awaitable[tuple[Status, str, CallToolResult | None] | None]]) -> None:
        self.layout = layout
        self.from_journal = from_journal
        self.jobs: dict[str, Job] = {}

    def methods(self) -> Sequence[MethodBinding]:
        return (MethodBinding("tasks/get", TaskRequestParams, self.get),
                MethodBinding("tasks/result", TaskRequestParams, self.result),
                MethodBinding("tasks/cancel", TaskRequestParams, self.cancel))

    async def intercept_tool_call(self, params: CallToolRequestParams, ctx: Any, call_next: Any) -> Any:
        if params.name not in TASK_TOOLS or not wants_task(ctx):
            return await call_next(ctx)
        job = Job(kind=params.name)
        job.runner = asyncio.create_task(self._run(job, call_next, ctx))
        started = asyncio.create_task(job.started.wait())
        try:
            await asyncio.wait({job.runner, started}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the client gave up before it had a task id: nobody could reach the task
            job.runner.cancel()
            raise
        finally:
            started.cancel()
        if not job.started.is_set() or not job.id:  # it ended before it could spend: answer as without tasks
            return await job.runner
        self.jobs[job.id] = job
        return TaskCreated(task=job.state())

    async def _run(self, job: Job, call_next: Any, ctx: Any) -> Any:
        CURRENT_JOB.set(job)
        try:
            result = await call_next(ctx)
        except asyncio.CancelledError:
            job.status, job.message, job.updated_at = "cancelled", "cancelled; resume it with conclave_resume", now()
            job.result = CallToolResult(content=[TextContent(type="text", text=(
                f"cancelled: resume it with conclave_resume (id {job.id}); completed rounds are not paid again"))],
                is_error=True)
            raise
        except BaseException as exc:
            job.status, job.message, job.updated_at = "failed", str(exc) or type(exc).__name__, now()
            job.result = CallToolResult(content=[TextContent(type="text", text=job.message)], is_error=True)
            raise
        else:
            failed = isinstance(result, CallToolResult) and result.is_error
            job.status = "failed" if failed else "completed"
            if failed:
                job.message = " ".join(b.text for b in result.content if isinstance(b, TextContent))
            job.updated_at = now()
            job.result = result
            return result
        finally:
            job.done.set()

    async def job_or_journal(self, task_id: str) -> tuple[Job | None, tuple[Status, str, CallToolResult | None]]:
        job = self.jobs.get(task_id)
        if job is not None:
            return job, (job.status, job.message, job.result)
        try:
            found = await self.from_journal(task_id)
        except ConclaveError:
            found = None
        if found is None:
            raise unknown_task(task_id)
        return None, found

    async def get(self, ctx: Any, params: TaskRequestParams) -> TaskState:
        job, (status, message, _) = await self.job_or_journal(params.task_id)
        if job is not None:
            return job.state()
        stamp = now()
        return TaskState(task_id=params.task_id, status=status, status_message=message, created_at=stamp,
                         last_updated_at=stamp)

    async def result(self, ctx: Any, params: TaskRequestParams) -> CallToolResult:
        job, (_, message, result) = await self.job_or_journal(params.task_id)
        if job is not None:
            await job.done.wait()
            result = job.result
        if result is None:
            raise MCPError(code=INVALID_PARAMS, message=f"taskId: task {params.task_id!r} has no result: {message}")
        return result

    async def cancel(self, ctx: Any, params: TaskRequestParams) -> TaskState:
        job = self.jobs.get(params.task_id)
        if job is None:
            await self.job_or_journal(params.task_id)  # unknown: a protocol error; known: already ended
            raise MCPError(code=INVALID_PARAMS, message=f"taskId: task {params.task_id!r} is not running")
        if job.runner is not None and not job.done.is_set():
            job.runner.cancel()
            with contextlib.suppress(BaseException):
                await job.runner
        return job.state()

