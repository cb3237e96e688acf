"""``/v1/models`` and ``/v1/chat/completions``: the council as an OpenAI-compatible model, mounted on the live view's
server by ``conclave serve --openai``.

The live view's middlewares guard these routes too: the bearer token (the session token; 401 without it), the Host
check, cross-origin refusal and the rate limit. A chat request runs a consultation exactly as the live view's form
does — composed through the guard (:class:`conclave.config.guard.Door`), with this server's cost gate asked
non-interactively, journaled and indexed by the server's recorder, and shown live at ``/c/<id>`` — and answers:

- 200 with the verdict in prose (:mod:`.chat_answer`) and the ``conclave`` extra field (a block by the safety
  evaluator: 200 with ``finish_reason: content_filter`` and the reason), or, with ``stream: true``,
  Server-Sent Events in OpenAI's chunk format: the round progress as it happens (a ``>`` line each), then the
  verdict's text, a last chunk with ``finish_reason`` and the ``conclave`` field, and ``data: [DONE]``;
- 400 / 404 for a bad body or an unknown model, 402 ``cost_over_limit`` naming the estimate when it is over the
  server's ``cost.always_allow_under`` (nothing is spent), 502 when the consultation ended without a verdict (it is
  saved and ``conclave resume ID`` continues it), 500 when the data home fails: an OpenAI-style error body of one
  line each.

A consultation goes on when its client goes away (its record is complete); stopping the server saves it as
``partial``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from conclave import events as ev
from conclave.config.guard import Door
from conclave.doors.openai_api.chat_answer import answer_text, extra_field, usage
from conclave.doors.openai_api.chat_request import ApiError, ChatRequest, model_names, parse_chat, parse_model
from conclave.doors.web.feeds import Feeds
from conclave.doors.web.gated_start import start_gated
from conclave.engine.cost.consent import round_up_to_cent
from conclave.engine.run import Consultation
from conclave.errors import ConclaveError, ConfigError, PluginError, StorageError, UsageError
from conclave.render.nodes import one_line

#: how a caller at this door is named in the guard's refusals
DOOR_NAME = "an OpenAI client"
#: a comment line on a quiet stream, so clients and proxies keep it open through a long round
HEARTBEAT_S = 10.0
#: statuses answered with a chat message: those with a verdict, and a block by the safety evaluator (OpenAI's
#: ``content_filter`` finish)
ANSWERED = frozenset({"complete", "completed_degraded", "blocked"})


@dataclass
class ChatRun:
    """One consultation a chat request started: its engine task and its progress lines as they happen."""

    consultation: Consultation
    task: asyncio.Task[Any]
    request: ChatRequest
    created: int = field(default_factory=lambda: int(time.time()))
    progress: asyncio.Queue[str] = field(default_factory=asyncio.Queue)

    @property
    def id(self) -> str:
        return self.consultation.id


class ChatDoor:
    """Starts consultations for chat requests on the live view's feeds and recorder, through ``door``'s guard."""

    def __init__(self, feeds: Feeds, recorder: Any, door: Door) -> None:
        self.feeds = feeds
        self.recorder = recorder
        self.door = Door(DOOR_NAME, door.roots, door.operator)
        self.tasks: set[asyncio.Task[Any]] = set()

    def known(self, consultation_id: str) -> bool:
        return self.feeds.exists(consultation_id)

    async def start(self, chat: ChatRequest) -> ChatRun:
        """Compose and start the consultation; return once the cost gate has decided (402 when it refused)."""
        try:
            settings = self.door.compose(chat.question, chat.overrides())
        except ConclaveError as exc:
            raise api_error(exc) from None
        progress: asyncio.Queue[str] = asyncio.Queue()

        def show(event: ev.Event) -> None:
            line = progress_line(event)
            if line is not None:
                progress.put_nowait(line)

        started = await start_gated(settings, self.feeds, self.recorder, self.tasks, on_event=show,
                                    stdin_text=chat.context)
        if started.consultation.refusal is not None:
            raise ApiError(402, refusal_text(started.id, started.estimate, settings.cost.always_allow_under),
                           code="cost_over_limit", kind="insufficient_quota",
                           extra={"estimated_cost": started.estimate, "consultation_id": started.id})
        if (error := started.error()) is not None:
            raise api_error(error)
        return ChatRun(started.consultation, started.task, chat, progress=progress)

    async def outcome(self, run: ChatRun) -> dict[str, Any]:
        """The result dict once the consultation ended with a verdict; an :class:`ApiError` otherwise."""
        await asyncio.wait({run.task})  # not cancelled with the request: the consultation finishes its record
        if run.task.cancelled():
            raise ApiError(503, f"the server stopped during consultation {run.id}; it is saved: conclave resume "
                                f"{run.id}", kind="server_error", code="server_stopped")
        if run.task.exception() is not None:
            raise api_error(run.task.exception())
        result: dict[str, Any] = run.task.result().as_dict()
        if result["status"] not in ANSWERED:
            reason = one_line(result.get("abort_reason") or "no verdict")
            raise ApiError(502, f"consultation {run.id} {result['status']}: {reason}; it is saved: conclave resume "
                                f"{run.id}", kind="server_error", code="consultation_failed",
                           extra={"consultation_id": run.id})
        return result

    async def stop(self, _app: web.Application) -> None:
        """Cancel the consultations still running (each saves what it has as ``partial``)."""
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


DOOR_KEY = web.AppKey("chat_door", ChatDoor)


def openai_app(feeds: Feeds, recorder: Any, door: Door) -> web.Application:
    """The ``/v1`` sub-application (mounted under the live view, whose middlewares guard it)."""
    app = web.Application(middlewares=[_api_errors])
    chat_door = app[DOOR_KEY] = ChatDoor(feeds, recorder, door)
    app.router.add_get("/models", _models)
    app.router.add_get("/models/{model:.+}", _model)
    app.router.add_post("/chat/completions", _chat)
    app.on_shutdown.append(chat_door.stop)
    return app


def refusal_text(cid: str, estimate: float | None, limit: float) -> str:
    """Why the cost gate refused, and who can change that (the server's operator, not the caller)."""
    if estimate is None:
        return (f"consultation {cid} not started (nothing was spent): its cost cannot be estimated (a model of the "
                "panel has no known price); the server's operator can start the server with cost.auto_approve=true")
    return (f"consultation {cid} not started (nothing was spent): the estimated cost ${estimate:.4f} is over this "
            f"server's limit of ${limit:.2f} (cost.always_allow_under); the server's operator can raise it with "
            f"--max-cost {round_up_to_cent(estimate):.2f}")


def api_error(exc: BaseException | None) -> ApiError:
    """An engine or guard error as an OpenAI-style error: the caller's mistakes are 400s, the server's 500s."""
    if isinstance(exc, ConfigError):
        return ApiError(400, "; ".join(exc.problems))
    if isinstance(exc, UsageError | PluginError):
        return ApiError(400, one_line(exc))
    if isinstance(exc, StorageError):
        return ApiError(500, one_line(exc), kind="server_error", code="storage_error")
    if isinstance(exc, ConclaveError):
        return ApiError(500, one_line(exc), kind="server_error")
    return ApiError(500, f"internal error: {type(exc).__name__}", kind="server_error")


@web.middleware
async def _api_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status)
    return response


async def _models(request: web.Request) -> web.Response:
    names = model_names(request.app[DOOR_KEY].door.groups)
    return web.json_response({"object": "list", "data": [_model_entry(name) for name in names]})


async def _model(request: web.Request) -> web.Response:
    name = request.match_info["model"]
    parse_model(name, request.app[DOOR_KEY].door.groups)
    return web.json_response(_model_entry(name))


def _model_entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "conclave"}


async def _chat(request: web.Request) -> web.StreamResponse:
    chat_door: ChatDoor = request.app[DOOR_KEY]
    try:
        body = await request.json()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"the request body is over {request.client_max_size:,} bytes") from None
    except (ValueError, RecursionError):  # json's parser recurses: a deeply nested body is no request either
        raise ApiError(400, "the request body is not JSON (or is nested too deeply)") from None
    chat = parse_chat(body, chat_door.door.groups, chat_door.known)
    run = await chat_door.start(chat)
    if chat.stream:
        return await _stream(request, chat_door, run)
    result = await chat_door.outcome(run)
    return web.json_response({
        "id": f"chatcmpl-{run.id}", "object": "chat.completion", "created": run.created, "model": chat.model,
        "choices": [{"index": 0, "finish_reason": finish_reason(result), "logprobs": None,
                     "message": {"role": "assistant", "content": answer_text(result), "conclave": {"id": run.id}}}],
        "usage": usage(result),
        "conclave": extra_field(result, chat_door.feeds.layout, chat.parent),
    })


async def _stream(request: web.Request, chat_door: ChatDoor, run: ChatRun) -> web.StreamResponse:
    """Progress lines as they happen, then the verdict, in OpenAI's chunk format; a client that goes away stops
    only the stream."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    head = {"id": f"chatcmpl-{run.id}", "object": "chat.completion.chunk", "created": run.created,
            "model": run.request.model}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        body = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    try:
        await response.write(chunk({"role": "assistant", "content": ""}))
        while not run.task.done():
            line = asyncio.ensure_future(run.progress.get())
            done, _ = await asyncio.wait({line, run.task}, timeout=HEARTBEAT_S, return_when=asyncio.FIRST_COMPLETED)
            if line in done:
                await response.write(chunk({"content": f"> {line.result()}\n"}))
            else:
                line.cancel()
                if not done:
                    await response.write(b": working\n\n")
        while not run.progress.empty():
            await response.write(chunk({"content": f"> {run.progress.get_nowait()}\n"}))
        try:
            result = await chat_door.outcome(run)
        except ApiError as exc:
            await response.write(f"data: {json.dumps(exc.body(), ensure_ascii=False)}\n\n".encode())
        else:
            await response.write(chunk({"content": "\n" + answer_text(result)}))
            await response.write(chunk({}, finish_reason(result), usage=usage(result),
                                       conclave=extra_field(result, chat_door.feeds.layout, run.request.parent)))
        await response.write(b"data: [DONE]\n\n")
    except ConnectionResetError:
        pass  # the client went away: the consultation goes on and is recorded
    return response


def finish_reason(result: dict[str, Any]) -> str:
    return "content_filter" if result["status"] == "blocked" else "stop"


def progress_line(event: ev.Event) -> str | None:
    """One line of progress for a stream, or None for events a chat reader does not need."""
    d = event.data
    if event.type == ev.CONSULTATION_STARTED:
        return (f"conclave {event.consultation_id}: {len(d.get('agents') or [])} agents, "
                f"{d.get('planned_rounds')} rounds planned (live at /c/{event.consultation_id})")
    if event.type == ev.ROUND_STARTED:
        return f"round {d.get('round_number')} · {d.get('round_type')} started"
    if event.type == ev.AGENT_COMPLETED:
        state = "✓" if d.get("ok") else "✗"
        return f"round {d.get('round_number')}: {d.get('agent')} {state} {d.get('duration_s')} s"
    if event.type == ev.ROUND_COMPLETED:
        return f"round {d.get('round_number')} · {d.get('round_type')} done in {d.get('duration_s')} s"
    return None
