"""The MCP server: conclave's tools, resources and prompts on the official SDK (MCPServer, mcp 2.x), over stdio or
Streamable HTTP, for clients of the 2025 revisions (initialize handshake) and of 2026-07-28 (stateless).

Tools run the same composition, validation, scrubbing, cost gate and journal as the CLI; errors come back as tool
errors of one line per problem, naming the key and what is allowed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    BlobResourceContents,
    CallToolResult,
    ClientCapabilities,
    ElicitationCapability,
    ElicitRequest,
    ElicitRequestFormParams,
    ElicitResult,
    EmbeddedResource,
    InputRequiredResult,
    Resource,
    TextContent,
    ToolAnnotations,
)
from mcp.types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, ValidationError

from conclave.compose import hydra_quote
from conclave.config.guard import Door, Roots, approval_for, split_context
from conclave.config.settings import check_against_plugins
from conclave.doors.mcp import records
from conclave.doors.mcp.consult_tasks import CURRENT_JOB, ConsultationTasks, Status
from conclave.doors.mcp.evaluations import check_set, eval_overrides, run_eval
from conclave.doors.mcp.runs import DEFAULT_HEARTBEAT_S, OriginRecorder, ProgressBridge, run_with_progress
from conclave.doors.mcp.starters import register_prompts
from conclave.doors.mcp.tool_models import ConsultOutput, EvalOutput, ExportOutput, SessionsOutput, VerifyOutput
from conclave.engine.cost.consent import round_up_to_cent
from conclave.engine.interaction import Interaction
from conclave.engine.run import Consultation
from conclave.errors import ConclaveError, ConfigError
from conclave.plugin_manager import get_plugins
from conclave.render.markdown import render_markdown
from conclave.store.indexer import RESUMED
from conclave.store.paths import StoreLayout
from conclave.store.period_stats import compute_stats, period_from_args, render_text
from conclave.store.recorder import Recorder
from conclave.store.resume_points import latest_interrupted, load_resume_point
from conclave.store.sessions import sessions
from conclave.store.sqlite_index import connect
from conclave.store.verify import RESUMABLE_STATUSES, verify_store
from conclave.version import __version__

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "conclave puts a question to a panel of LLMs and runs a structured debate (independent answers, synthesis, "
    "cross-examination, verdict). Call conclave_consult with the question; it blocks until the verdict and sends "
    "progress notifications meanwhile (a client with the Tasks extension gets a task instead: poll tasks/get, "
    "fetch tasks/result). conclave_eval scores the debate on a question set. A cancelled or failed consultation "
    "keeps its completed rounds: "
    "conclave_resume continues it without paying for them again. conclave_sessions lists past consultations; "
    "conclave_show gives every artifact, call and cost of a round."
)


@dataclass
class ServerConfig:
    """What the operator fixed on ``conclave mcp``'s command line; tool calls cannot change it."""

    home: Path
    roots: Roots
    base_overrides: list[str] = field(default_factory=list)
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    #: consultations this process is running or still saving, by id (set when their journal is closed)
    active: dict[str, asyncio.Event] = field(default_factory=dict)
    #: the ids of those whose tool call was cancelled: the client already has its answer, the journal is being closed
    stopping: set[str] = field(default_factory=set)

    async def settled(self) -> None:
        """Wait until every cancelled consultation has saved its partial result (a few seconds at most)."""
        for cid in sorted(self.stopping):
            saving = self.active.get(cid)
            if saving is not None:
                with contextlib.suppress(TimeoutError):  # still saving after a minute: list it as it stands
                    await asyncio.wait_for(saving.wait(), 60)
            self.stopping.discard(cid)

    @property
    def layout(self) -> StoreLayout:
        return StoreLayout(self.home)

    @functools.cached_property
    def door(self) -> Door:
        return Door("an MCP client", self.roots, tuple(self.base_overrides))


AnyFunction = Callable[..., Any]
#: the text part of a consulting tool's answer
AnswerFormat = Annotated[Literal["markdown", "json", "both"], Field(description=(
    "The text part of the answer: the Markdown report, the full result JSON, or both."))]


class ConclaveMCP(MCPServer):
    """MCPServer whose resource list also names the most recent consultations, whose ``serverInfo`` carries conclave's
    version, and whose tools refuse unknown arguments and answer a bad one in one line."""

    def __init__(self, config: ServerConfig, **kwargs: Any) -> None:
        self.tasks = ConsultationTasks(config.layout, self.task_from_journal)
        super().__init__("conclave", instructions=INSTRUCTIONS, log_level="WARNING", version=__version__,
                         extensions=[self.tasks], **kwargs)
        self.config = config
        self.arguments: dict[str, list[str]] = {}

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        if not self.arguments:
            self.arguments = {t.name: list(t.input_schema.get("properties", {})) for t in await self.list_tools()}
        allowed = self.arguments.get(name)
        unknown = sorted(set(arguments) - set(allowed)) if allowed is not None else []
        if unknown:
            raise ToolError(f"{name}: unknown argument{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(map(repr, unknown))}; allowed: {', '.join(allowed or [])}")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            # MCPServer prefixes every failure with "Error executing tool NAME:"; ours already say what went wrong
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                raise ToolError(argument_errors(cause)) from None
            if isinstance(cause, ToolError | ConclaveError):
                raise tool_error(cause, self.config.home) from None
            raise

    async def task_from_journal(self, task_id: str) -> tuple[Status, str, CallToolResult | None] | None:
        """A task this process does not run (any more): its consultation as the journal has it."""
        layout = self.config.layout
        if not layout.journal_path(task_id).exists():
            return None
        data = records.consultation(layout, task_id)
        result, status = data.get("result"), data.get("status")
        if result is None:
            return ("working" if status == "running" else "failed"), f"consultation {status}", None
        state: Status = "completed" if status in ("complete", "completed_degraded") else "failed"
        return state, f"finished: {status}", result_content(result, "markdown")

    async def list_resources(self) -> list[Resource]:
        listed = await super().list_resources()
        try:
            rows = sessions(self.config.layout, limit=50)
        except Exception as exc:  # an unreadable index must not hide the tools
            log.warning("cannot list consultations: %s", exc)
            rows = []
        for row in rows:
            question = (row["question"] or "").replace("\n", " ")
            listed.append(Resource(
                uri=f"conclave://consultations/{row['id']}",
                name=row["id"],
                title=question[:80] or row["id"],
                description=f"{row['status']} · {row['mode']} · started {row['started_at']}",
                mime_type="application/json",
            ))
        return listed


# ----------------------------------------------------------------------------------------------- helpers


def text_result(text: str, data: dict[str, Any]) -> CallToolResult:
    """A read-only tool's answer: ``text`` for the model to read, ``data`` as its structured content."""
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


def argument_errors(exc: ValidationError) -> str:
    """A tool's argument errors in one line: each names the argument, what is allowed and what was given."""
    problems = []
    for error in exc.errors(include_url=False):
        name = ".".join(str(part) for part in error["loc"]) or "arguments"
        if error["type"] == "missing":
            problems.append(f"{name}: required")
            continue
        allowed = error["msg"].removeprefix("Input should be ").removeprefix("Value error, ")
        given = repr(error.get("input"))
        given = given if len(given) <= 40 else given[:39] + "…"
        problems.append(f"{name}: {given} is not allowed; it should be {allowed}")
    return "; ".join(problems)


def tool_error(exc: BaseException, home: Path | None = None) -> ToolError:
    """One line per problem, as the CLI prints them (without a traceback). A path under ``home`` reads relative to
    ``$CONCLAVE_HOME``: a client is not shown where the server keeps its data."""
    text = "; ".join(exc.problems) if isinstance(exc, ConfigError) else (str(exc).strip() or type(exc).__name__)
    if home is not None:
        text = text.replace(str(home), "$CONCLAVE_HOME")
    return ToolError(text)


def compose(door: Door, question: str, outside: list[str], trusted: list[str]) -> Any:
    """Compose and validate like the CLI, through the door's guard; errors become one-line tool errors."""
    if not question.strip():
        raise ToolError("question: the question is empty")
    try:
        return door.compose(question, outside, trusted)
    except ConclaveError as exc:
        raise tool_error(exc) from None


def param_overrides(*, mode: str | None, rounds: int | None, quick: bool | None, panel: str | None,
                    judge: str | None, high_stakes: bool) -> list[str]:
    """The overrides the named tool arguments stand for (they win over ``overrides``); they pass the guard like
    ``overrides`` do."""
    out: list[str] = []
    if mode is not None:
        out.append(f"mode={mode}")
    if rounds is not None:
        out.append(f"rounds={rounds}")
    if quick is not None:
        out.append(f"quick={str(quick).lower()}")
    if panel is not None:
        out.append(f"agents={panel}")
    if judge is not None:
        provider, slash, model = judge.partition("/")
        if slash:
            out += [f"judge.provider={provider}", f"judge.model={hydra_quote(model)}"]
        else:
            out.append(f"judge.model={hydra_quote(judge)}")
    if high_stakes:
        # every round runs (no early termination) and no agent is silently replaced by another model
        out += ["early_termination.non_interactive=decline", "strict_models=true"]
    return out


def client_info(ctx: Context[Any, Any]) -> dict[str, Any] | None:
    try:
        params = ctx.session.client_params
    except Exception:
        return None
    if params is None:
        return None
    return {"name": params.client_info.name, "version": params.client_info.version}


def progress_reporter(ctx: Context[Any, Any]) -> Any:
    """``ctx.report_progress`` when the client asked for progress (gave a token), else None."""
    meta = ctx.request_context.meta
    if meta is None or meta.get("progress_token") is None:
        return None
    return ctx.report_progress


APPROVAL_KEY = "approve_cost"


def can_elicit(ctx: Context[Any, Any]) -> bool:
    return bool(ctx.session.check_client_capability(ClientCapabilities(elicitation=ElicitationCapability())))


def approval_request(message: str, estimate: float) -> InputRequiredResult:
    """The 2026-07-28 way to ask the user to approve the estimate: an ``input_required`` result carrying a form
    elicitation; the client retries the call with the answer, and the estimate rides the request state (which the
    SDK seals, so a client cannot raise the approved amount)."""
    form = ElicitRequestFormParams(message=message, requested_schema={
        "type": "object", "required": ["approve"],
        "properties": {"approve": {"type": "boolean", "description": "Spend the estimated cost and run it"}}})
    return InputRequiredResult(input_requests={APPROVAL_KEY: ElicitRequest(params=form)},
                               request_state=json.dumps({"estimate": estimate}))


def approval_answer(ctx: Context[Any, Any]) -> tuple[bool, float] | None:
    """On a retry after :func:`approval_request`: (whether the user approved, the estimate asked about)."""
    responses, state = ctx.input_responses, ctx.request_state
    if not responses or not state or APPROVAL_KEY not in responses:
        return None
    try:
        estimate = float(json.loads(state)["estimate"])
    except (ValueError, KeyError, TypeError):
        raise ToolError("request_state: not a state this server issued") from None
    answer = responses[APPROVAL_KEY]
    approved = (isinstance(answer, ElicitResult) and answer.action == "accept"
                and bool((answer.content or {}).get("approve")))
    return approved, estimate


def consult_output(result: dict[str, Any]) -> dict[str, Any]:
    return ConsultOutput(
        consultation_id=result["consultation_id"], status=result["status"], question=result["question"],
        mode=result["mode"], planned_rounds=result["planned_rounds"], completed_rounds=result["completed_rounds"],
        recommendation=result.get("recommendation"), confidence=result.get("confidence"),
        verdict=result.get("verdict"), dissent=result.get("dissent") or [], concerns=result.get("concerns") or [],
        cost=result.get("cost") or {}, tokens=result.get("tokens") or {}, duration_s=result.get("duration_s") or 0.0,
        abort_reason=result.get("abort_reason"), resumable=result["status"] in RESUMABLE_STATUSES,
    ).model_dump(mode="json")


def result_content(result: dict[str, Any], fmt: str) -> CallToolResult:
    blocks = []
    if fmt in ("markdown", "both"):
        text = render_markdown(result)
        if result["status"] in RESUMABLE_STATUSES:
            text += (f"\nThis consultation can be continued: conclave_resume with id "
                     f"{result['consultation_id']} (completed rounds are not paid for again).\n")
        blocks.append(TextContent(type="text", text=text))
    if fmt in ("json", "both"):
        blocks.append(TextContent(type="text", text=json.dumps(result, indent=2, ensure_ascii=False)))
    return CallToolResult(content=list(blocks), structured_content=consult_output(result))


def refusal_reason(consultation: Any) -> str:
    """Why the cost gate stopped ``consultation`` before it spent anything."""
    return f"consultation {consultation.id} not started (nothing was spent): {consultation.refusal}"


def refusal_error(consultation: Any, bridge: ProgressBridge) -> ToolError:
    """The refusal as a tool error that says how an MCP client approves the estimate."""
    estimate = bridge.estimated_cost
    budget = "the dollars you approve" if estimate is None else f"{round_up_to_cent(estimate):.2f}"
    return ToolError(f"{refusal_reason(consultation)} Over MCP, call again with max_cost: {budget}.")


# ----------------------------------------------------------------------------------------------- the server


def build_server(config: ServerConfig, **kwargs: Any) -> ConclaveMCP:
    """The MCP server with every conclave tool and resource registered."""
    mcp = ConclaveMCP(config, **kwargs)
    layout = config.layout
    register_prompts(mcp)

    def read_only_tool(name: str, title: str, description: str) -> Callable[[AnyFunction], AnyFunction]:
        """A tool that only reads this home's records: it changes nothing and asks no model."""
        return mcp.tool(name=name, title=title, description=description,
                        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False), structured_output=True)

    def spending_tool(name: str, title: str, description: str) -> Callable[[AnyFunction], AnyFunction]:
        """A tool that asks the panel's models (and may spend): it adds records, never changes one."""
        return mcp.tool(name=name, title=title, description=description,
                        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                                    idempotent_hint=False, open_world_hint=True),
                        structured_output=True)

    async def run_consultation(ctx: Context[Any, Any], settings: Any, *, stdin_text: str | None = None,
                               **resume: Any) -> tuple[Any, ProgressBridge]:
        plugins = get_plugins()
        recorder = Recorder(settings.home)
        origin = {"origin": "mcp", "client": client_info(ctx)}
        job = CURRENT_JOB.get()  # a task: its status carries the progress (the tool call has been answered)
        bridge = ProgressBridge(report=progress_reporter(ctx) if job is None else job.report,
                                heartbeat_s=config.heartbeat_s)
        subscribers: list[Any] = [bridge] if job is None else [bridge, job.observe]
        done = asyncio.Event()
        started: list[str] = []
        try:
            consultation = Consultation(
                settings, plugins=plugins, interaction=Interaction.non_interactive(), subscribers=subscribers,
                recorder=OriginRecorder(recorder, origin), stdin_text=stdin_text, **resume,
            )
            started.append(consultation.id)
            config.active[consultation.id] = done
            try:
                await run_with_progress(consultation, bridge,
                                        on_cancel=lambda: config.stopping.add(consultation.id))
            except ConclaveError as exc:
                raise tool_error(exc) from None
        finally:
            recorder.close()
            done.set()
            for cid in started:  # saved (or failed): nothing to wait for any more, and nothing kept
                config.active.pop(cid, None)
        return consultation, bridge

    async def approved_by_elicitation(ctx: Context[Any, Any], message: str) -> bool:
        """Ask the user through the client to approve the estimate (only when the client supports elicitation)."""
        class Approval(BaseModel):
            approve: bool = Field(description="Spend the estimated cost and run the consultation")

        if not can_elicit(ctx):
            return False
        try:
            answer = await ctx.elicit(message, Approval)
        except Exception as exc:
            log.warning("elicitation failed: %s", exc)
            return False
        return answer.action == "accept" and bool(getattr(answer.data, "approve", False))

    @spending_tool(
        name="conclave_consult",
        title="Consult a panel of LLMs",
        description=(
            "Put a question to a panel of LLMs and run a structured debate to a verdict (round 1 independent "
            "answers, 2 judge synthesis, 3 cross-examination, 4 verdict). Blocks until done; sends progress "
            "notifications at every round and agent event and a heartbeat while waiting. Returns the verdict as "
            "structured content and the Markdown report as text. Over the cost threshold it returns an error with "
            "the estimate and how to approve it."
        ),
    )
    async def conclave_consult(
        ctx: Context[Any, Any],
        question: Annotated[str, Field(description="The question, sent verbatim (after secret scrubbing).")],
        context: Annotated[list[str] | None, Field(description=(
            "Context for the panel: file paths (absolute, or relative to the server's working directory; they "
            "must lie under the server's allowed roots) or inline text (an item with a line break, or one that "
            "names no file). Everything is scrubbed of secrets before it is sent."))] = None,
        overrides: Annotated[list[str] | None, Field(description=(
            "Hydra overrides exactly as on the command line, e.g. [\"filtering.round3.tensions=1\", "
            "\"cost.auto_approve=true\"]. Provider endpoints, home, hydra.* and scrub are fixed by the server."
        ))] = None,
        mode: Annotated[str | None, Field(description="Debate strategy: converge (one verdict) or explore "
                                                      "(a menu of options).")] = None,
        rounds: Annotated[int | None, Field(ge=1, le=4, description=(
            "Exactly this many rounds (1-4); default: the full debate, whose cross-examination may repeat up to "
            "exit.round_cap."))] = None,
        quick: Annotated[bool | None, Field(description="Two rounds only (independent answers + synthesis).")]
        = None,
        panel: Annotated[str | None, Field(description=(
            "A panel from conf/agents (e.g. default, openai_only, anthropic_only, local) or from "
            "$CONCLAVE_HOME/conf/agents."))] = None,
        judge: Annotated[str | None, Field(description="The judge's model, as model or provider/model "
                                                       "(e.g. openai/gpt-4o).")] = None,
        high_stakes: Annotated[bool, Field(description=(
            "Run every round (no early termination) and refuse provider substitution (strict_models)."))] = False,
        format: AnswerFormat = "markdown",
        max_cost: Annotated[float | None, Field(ge=0, description=(
            "Approve spending up to this many dollars (estimate) without asking; sets "
            "cost.always_allow_under."))] = None,
    ) -> Annotated[CallToolResult, ConsultOutput]:
        try:
            files, inline = split_context(context or [], config.roots)
            outside = [*(overrides or []), *param_overrides(mode=mode, rounds=rounds, quick=quick, panel=panel,
                                                            judge=judge, high_stakes=high_stakes)]
            if files:
                outside.append("context=[" + ",".join(hydra_quote(f) for f in files) + "]")
            # max_cost is the client's explicit approval of a budget; the guard refuses approval as an override
            trusted = [] if max_cost is None else [f"cost.always_allow_under={max_cost}"]
        except ConclaveError as exc:
            raise tool_error(exc) from None
        settings = compose(config.door, question, outside, trusted)
        answer = approval_answer(ctx)
        if answer is not None:  # a 2026-07-28 client retried with its answer to the approval we asked for
            approved, estimate = answer
            if not approved:
                raise ToolError(f"not started (nothing was spent): the estimated cost ${estimate:.4f} was declined")
            settings = compose(config.door, question, outside, approval_for(estimate))
        consultation, bridge = await run_consultation(ctx, settings, stdin_text=inline)
        if consultation.refusal is not None:
            if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
                if not can_elicit(ctx) or bridge.estimated_cost is None:
                    raise refusal_error(consultation, bridge)
                return approval_request(refusal_reason(consultation), bridge.estimated_cost)  # type: ignore[return-value]
            if not await approved_by_elicitation(ctx, refusal_reason(consultation)):
                raise refusal_error(consultation, bridge)
            settings = compose(config.door, question, outside, approval_for(bridge.estimated_cost))
            consultation, bridge = await run_consultation(ctx, settings, stdin_text=inline)
        assert consultation.result is not None
        return result_content(consultation.result.as_dict(), format)

    @spending_tool(
        name="conclave_continue",
        title="Ask a follow-up question",
        description=(
            "Ask a follow-up of a finished consultation: a new consultation linked to it (parent), run by the same "
            "panel and mode unless overrides change them, whose panel sees the earlier verdict, dissent and claims. "
            "Same answer, progress and cost gate as conclave_consult."
        ),
    )
    async def conclave_continue(
        ctx: Context[Any, Any],
        question: Annotated[str, Field(description="The follow-up question, sent verbatim (after scrubbing).")],
        id: Annotated[str | None, Field(description=(
            "The consultation to follow up: id or unique prefix; default: the most recent one."))] = None,
        overrides: Annotated[list[str] | None, Field(description=(
            "Hydra overrides as for conclave_consult, e.g. [\"mode=explore\"]."))] = None,
        format: AnswerFormat = "markdown",
        max_cost: Annotated[float | None, Field(ge=0, description=(
            "Approve spending up to this many dollars (estimate) without asking."))] = None,
    ) -> Annotated[CallToolResult, ConsultOutput]:
        ids = layout.journal_ids()
        if not id and not ids:
            raise ToolError(f"no consultation to follow up in {layout.journal_dir}")
        parent = id or ids[-1]
        return await conclave_consult(ctx, question, overrides=[*(overrides or []), f"parent={hydra_quote(parent)}"],
                                      format=format, max_cost=max_cost)

    @spending_tool(
        name="conclave_resume",
        title="Resume an interrupted consultation",
        description=(
            "Continue a consultation that was cancelled, failed or killed. Completed rounds are restored from the "
            "journal, neither re-run nor paid for again; the recorded configuration is reused. Same answer and "
            "progress as conclave_consult."
        ),
    )
    async def conclave_resume(
        ctx: Context[Any, Any],
        id: Annotated[str | None, Field(description=(
            "Consultation id or unique prefix; default: the most recent interrupted one."))] = None,
        format: AnswerFormat = "markdown",
    ) -> Annotated[CallToolResult, ConsultOutput]:
        try:
            if not id:  # a consultation cancelled a moment ago is the one to continue: wait until it is saved
                await config.settled()
            cid = records.resolve_id(layout, id) if id else latest_interrupted(layout)
            if cid is None:
                raise ToolError(f"no interrupted consultation to resume in {layout.journal_dir}")
            saving = config.active.get(cid)
            if saving is not None:  # cancelled a moment ago: its partial result is still being saved
                await asyncio.wait_for(saving.wait(), 60)
            point = load_resume_point(layout, cid)
            check_against_plugins(point.settings, get_plugins())
            config.door.check_recorded(point.settings)
        except ConclaveError as exc:
            raise tool_error(exc) from None
        marker = Recorder(layout.home)
        try:
            marker.record(point.consultation_id, RESUMED, {
                "restored_rounds": point.restored_rounds, "spent": point.resume_from["spent"],
                "from_seq": point.next_seq,
            })
        finally:
            marker.close()
        consultation, bridge = await run_consultation(
            ctx, point.settings, resume_from=point.resume_from, consultation_id=point.consultation_id,
            first_seq=point.next_seq + 1,
        )
        if consultation.refusal is not None:
            raise refusal_error(consultation, bridge)
        assert consultation.result is not None
        return result_content(consultation.result.as_dict(), format)

    @spending_tool(
        name="conclave_eval",
        title="Evaluate the debate on a question set",
        description=(
            "Run `conclave eval` on a set: the debate against a single agent and a round-1 vote, scored item by "
            "item, with the report as text. The set is a generator (arithmetic, gym:<task>) or a file under the "
            "server's allowed roots. Long: a client with the Tasks extension gets a task; otherwise it blocks with "
            "progress notifications. Over the cost threshold it fails with the estimate; pass max_cost to approve. "
            "run_id resumes an interrupted evaluation (finished items are not paid again)."
        ),
    )
    async def conclave_eval(
        ctx: Context[Any, Any],
        set: Annotated[str, Field(description=(
            "arithmetic, gym:<task> (reasoning-gym), or a .jsonl/.csv/.parquet file under the allowed roots."))]
        = "arithmetic",
        n: Annotated[int, Field(ge=1, le=1000, description="How many items (default 5).")] = 5,
        rounds: Annotated[int | None, Field(ge=1, le=4, description="Rounds per debate (1-4).")] = None,
        panel: Annotated[str | None, Field(description="A panel from conf/agents (e.g. default).")] = None,
        max_cost: Annotated[float | None, Field(ge=0, description=(
            "Approve spending up to this many dollars (estimate) without asking."))] = None,
        run_id: Annotated[str | None, Field(description=(
            "Resume this interrupted run instead of starting one (the other arguments are the run's own)."))]
        = None,
        batch: Annotated[Literal["true", "mixed"] | None, Field(description=(
            "Through the providers' batch APIs at batch prices, one batch per round barrier (mixed: a provider "
            "without one, and a request a batch failed, is asked interactively); progress names each batch's "
            "provider, id, status and counts done/failed/total."))] = None,
        batch_poll_s: Annotated[float | None, Field(ge=1, le=3600, description=(
            "Seconds between two status requests of an open batch (default 30)."))] = None,
    ) -> Annotated[CallToolResult, EvalOutput]:
        try:
            arguments = [] if run_id else [check_set(set, config.roots), *eval_overrides(
                n=n, rounds=rounds, panel=panel, max_cost=max_cost, batch=batch, batch_poll_s=batch_poll_s)]
            job = CURRENT_JOB.get()
            outcome = await run_eval(
                config.home, config.base_overrides, arguments,
                report=progress_reporter(ctx) if job is None else job.report, heartbeat_s=config.heartbeat_s,
                run_id=run_id, on_start=None if job is None else job.begin)
        except ConclaveError as exc:
            raise tool_error(exc) from None
        data = {"run_id": outcome.run_id, "exit_code": outcome.exit_code, "ok": outcome.exit_code == 0}
        if outcome.exit_code != 0:
            raise ToolError(f"evaluation {outcome.run_id} stopped (exit {outcome.exit_code}): {outcome.last_line}")
        return text_result(outcome.report, data)

    @read_only_tool(
        name="conclave_sessions",
        title="List consultations",
        description="Recent consultations, newest first: id, status, mode, rounds, cost, confidence, question.",
    )
    async def conclave_sessions(
        limit: Annotated[int, Field(ge=1, le=500, description="How many (default 10).")] = 10,
        status: Annotated[Literal["running", "interrupted", "complete", "completed_degraded", "partial", "aborted",
                                  "blocked"] | None,
                          Field(description="Only consultations with this status (interrupted: every one "
                                            "conclave_resume can continue: killed, cancelled or failed).")] = None,
        mode: Annotated[str | None, Field(description="Only this mode (converge, explore, …).")] = None,
    ) -> Annotated[CallToolResult, SessionsOutput]:
        try:
            await config.settled()  # a consultation cancelled a moment ago is listed as it ended, not as running
            rows = sessions(layout, limit, status, mode)
        except ConclaveError as exc:
            raise tool_error(exc) from None
        return text_result(records.sessions_text(rows), {"sessions": rows})

    @read_only_tool(
        name="conclave_show",
        title="Show a consultation or one of its rounds",
        description=(
            "Without round: the consultation's panel, rounds and result. With round: every artifact (with the raw "
            "answer), every provider call and its cost, for each run of that round."
        ),
    )
    async def conclave_show(
        id: Annotated[str, Field(description="Consultation id or unique prefix.")],
        round: Annotated[int | None, Field(ge=1, le=4, description="A round number (1-4).")] = None,
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        try:
            cid = records.resolve_id(layout, id)
            if round is None:
                data = records.consultation(layout, cid)
                text = json.dumps(data, indent=2, ensure_ascii=False)
            else:
                data = records.round_details(layout, cid, round)
                text = records.round_text(data)
        except ConclaveError as exc:
            raise tool_error(exc) from None
        return text_result(text, data)

    @read_only_tool(
        name="conclave_stats",
        title="Usage statistics",
        description="Consultations, cost, tokens, duration, confidence, early termination and filtering savings, "
                    "per provider and per mode, for a period.",
    )
    async def conclave_stats(
        period: Annotated[str, Field(description="all (default), week (last 7 days), month (last 30 days) or "
                                                 "a calendar month YYYY-MM.")] = "all",
    ) -> Annotated[CallToolResult, dict[str, Any]]:
        try:
            if period not in ("all", "week", "month") and not period[:4].isdigit():
                raise ConfigError([f"period: {period!r} is not one of: all, week, month, YYYY-MM"])
            chosen = period_from_args(week=period == "week", month="" if period == "month" else (
                period if period not in ("all", "week") else None))
            db = connect(layout.index_path)
            try:
                stats = compute_stats(db, chosen)
            finally:
                db.close()
        except ConclaveError as exc:
            raise tool_error(exc) from None
        return text_result(render_text(stats), stats)

    @read_only_tool(
        name="conclave_verify",
        title="Verify the journal",
        description="Check the hash chain of one consultation's journal (or all) against the recorded heads: an "
                    "edited, inserted, dropped or truncated record is named.",
    )
    async def conclave_verify(
        id: Annotated[str | None, Field(description="Consultation id or unique prefix; default: all.")] = None,
    ) -> Annotated[CallToolResult, VerifyOutput]:
        try:
            report = verify_store(layout, [records.resolve_id(layout, id)] if id else None)
        except ConclaveError as exc:
            raise tool_error(exc) from None
        problems = [str(p) for p in report.problems]
        data = {"ok": report.ok, "journals": report.journals, "records": report.records, "problems": problems,
                "torn": list(report.torn)}
        text = (f"OK: {report.journals} journal(s), {report.records} record(s) verified" if report.ok
                else "\n".join(f"FAIL {p}" for p in problems))
        return text_result(text, data)

    @read_only_tool(
        name="conclave_export_record",
        title="Export an audit record",
        description=(
            "An audit record of one consultation: question, panel, rounds, verdict, dissent, costs, prompt versions, "
            "config hash and the journal's head hash (with its verification). Read-only; nothing is sent to a model."
        ),
    )
    async def conclave_export_record(
        id: Annotated[str, Field(description="Consultation id or unique prefix.")],
        format: Annotated[Literal["markdown", "html", "json", "pdf"], Field(description=(
            "markdown, html, json, or pdf (an embedded application/pdf resource; needs the server's pdf extra)."))]
        = "markdown",
    ) -> Annotated[CallToolResult, ExportOutput]:
        try:
            cid = records.resolve_id(layout, id)
            record = records.audit_record(layout, cid)
            if format == "pdf":
                document = base64.b64encode(records.audit_pdf(record)).decode("ascii")
                pdf = EmbeddedResource(type="resource", resource=BlobResourceContents(
                    uri=f"conclave://consultations/{cid}/record.pdf", mime_type="application/pdf", blob=document))
                return CallToolResult(content=[TextContent(type="text", text=f"Audit record of {cid} as PDF."), pdf],
                                      structured_content={"format": format, "record": record})
        except ConclaveError as exc:
            raise tool_error(exc) from None
        if format == "markdown":
            text = records.audit_markdown(record)
        elif format == "html":
            text = records.audit_html(record)
        else:
            text = json.dumps(record, indent=2, ensure_ascii=False)
        return text_result(text, {"format": format, "record": record})

    @mcp.resource("conclave://consultations/{id}", name="consultation", mime_type="application/json",
                  description="One consultation: panel, rounds and (once it ended) its result JSON.")
    def consultation_resource(id: str) -> str:
        return json.dumps(records.consultation(layout, records.resolve_id(layout, id)), ensure_ascii=False)

    @mcp.resource("conclave://consultations/{id}/rounds/{n}", name="consultation-round",
                  mime_type="application/json",
                  description="One round of a consultation: every artifact, provider call and cost of each run.")
    def round_resource(id: str, n: str) -> str:
        if not n.isdigit() or not 1 <= int(n) <= 4:
            raise ValueError(f"round: {n!r} is not one of: 1, 2, 3, 4")
        return json.dumps(records.round_details(layout, records.resolve_id(layout, id), int(n)), ensure_ascii=False)

    return mcp


def print_to_stderr(message: str) -> None:
    print(f"conclave mcp: {message}", file=sys.stderr, flush=True)
