"""A fake LLM API server on 127.0.0.1 speaking the OpenAI, Anthropic and Gemini wire formats, scriptable per model.

``async with FakeProviderServer() as fake`` starts it on a free port; point ``providers.<name>.base_url`` at
``fake.base_url(api)``. Each model answers what :meth:`FakeProviderServer.script` says (replies, latencies,
faults); an unscripted model answers an instance generated from the request's schema, or a short text. A schema is
the ``response_format``'s, or a forced tool's (Anthropic's ``tool_choice: tool``, Chat Completions' ``tool_choice:
{type: function}``): the answer is then that tool's call, its arguments the reply's text, streamed as the APIs stream
calls (Chat Completions ends a call forced by name with ``finish_reason: stop``, as the real API does). Every
request is recorded with its auth header values replaced by ``"<redacted>"``; which key arrived is kept only as a
SHA-256 digest (``RecordedRequest.auth_sha256``, compare with :func:`key_digest` or ``RecordedRequest.carries``).
The fake stands in for the vendors' own hosts, so the config it hands out opts in to sending keys to it
(``send_key: always``).

Prompt caching is modelled per API (:mod:`conclave.testing.prompt_cache`): a request that repeats a long enough
prefix of an earlier one is reported with cached input tokens the way its API reports them, and Gemini's
``cachedContents`` endpoints create, serve and delete explicit caches. ``FakeProviderServer(prompt_cache=
PromptCacheModel(enabled=False))`` turns the implicit caches off.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import itertools
import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from conclave.config.settings import Settings
from conclave.testing.fake_batches import BatchDesk
from conclave.testing.prompt_cache import CacheUse, PromptCacheModel
from conclave.testing.schema_instances import instance_for

Latency = float | Callable[[random.Random], float]
API = Literal["openai", "anthropic", "gemini"]
REDACTED = "<redacted>"
_AUTH_HEADERS = frozenset({"authorization", "x-api-key", "x-goog-api-key", "api-key"})
_PREFIX = {"openai": "/openai/v1", "anthropic": "/anthropic", "gemini": "/gemini/v1beta"}

#: what the models-list endpoints answer, besides every scripted model
DEFAULT_MODELS: dict[str, list[str]] = {
    "openai": ["gpt-5.5", "gpt-5", "gpt-5-mini", "gpt-4.1", "gpt-4.1-mini", "gpt-4o", "gpt-4o-mini",
               "grok-4", "grok-3", "mistral-large-latest", "mistral-small-latest"],
    "anthropic": ["claude-opus-4-7", "claude-sonnet-4-6", "claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001"],
    "gemini": ["gemini-3-pro-preview", "gemini-2.5-pro", "gemini-2.5-flash", "gemini-2.5-flash-lite"],
}


@dataclass(frozen=True)
class Reply:
    """A successful answer: ``json`` (sent as structured output) or ``text``; ``latency`` in seconds or
    ``callable(rng) -> seconds``; ``usage`` as ``(input, output, cached_input)`` tokens."""

    text: str | None = None
    json: Any = None
    latency: Latency = 0.0
    usage: tuple[int, int, int] | None = None
    finish_reason: str | None = None
    model: str | None = None  # the model id the answer claims (e.g. a dated snapshot)
    #: the model declines: OpenAI sends it as ``message.refusal`` (``delta.refusal`` chunks when streamed) with no
    #: content; the other APIs, which have no refusal field, answer it as text
    refusal: str | None = None


FaultKind = Literal["http", "hang", "reset", "malformed", "truncated_stream", "empty_stream"]
#: Gemini's per-minute and per-day free-tier quota ids, as its 429 bodies name them
GEMINI_PER_MINUTE = "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"
GEMINI_PER_DAY = "GenerateRequestsPerDayPerProjectPerModel-FreeTier"


@dataclass(frozen=True)
class Fault:
    """A failure the fake produces instead of an answer. Build one with the class methods."""

    kind: FaultKind
    status: int = 0
    message: str = ""
    retry_after: float | None = None
    latency: Latency = 0.0
    #: the API's error code (OpenAI ``error.code``/``error.type``, e.g. ``insufficient_quota``)
    code: str | None = None
    #: Gemini ``error.details`` entries (``google.rpc.QuotaFailure``, ``google.rpc.RetryInfo``…)
    details: tuple[Mapping[str, Any], ...] = ()
    #: the ``x-should-retry`` header the answer carries (None: none)
    should_retry: bool | None = None

    @classmethod
    def rate_limited(cls, retry_after: float | None = 1, *, latency: Latency = 0.0,
                     should_retry: bool | None = None) -> Fault:
        return cls("http", 429, "Rate limit reached for requests", retry_after, latency, should_retry=should_retry)

    @classmethod
    def insufficient_quota(cls) -> Fault:
        """OpenAI's billing state: 429 with ``error.code``/``type`` ``insufficient_quota`` (waiting does not help)."""
        return cls("http", 429, "You exceeded your current quota, please check your plan and billing details. For "
                   "more information on this error, read the docs: "
                   "https://platform.openai.com/docs/guides/error-codes/api-errors.", code="insufficient_quota")

    @classmethod
    def resource_exhausted(cls, retry_delay: str | None = "33s", *, per_day: bool = False) -> Fault:
        """Gemini's 429 ``RESOURCE_EXHAUSTED``: a ``QuotaFailure`` naming the quota (per minute, or per day) and a
        ``RetryInfo`` with the delay in the body, not in a header."""
        quota_id = GEMINI_PER_DAY if per_day else GEMINI_PER_MINUTE
        details: list[Mapping[str, Any]] = [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
             "violations": [{"quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                             "quotaId": quota_id, "quotaDimensions": {"location": "global", "model": "gemini"},
                             "quotaValue": "250" if per_day else "10"}]},
            {"@type": "type.googleapis.com/google.rpc.Help",
             "links": [{"description": "Learn more about Gemini API quotas",
                        "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]},
        ]
        if retry_delay is not None:
            details.append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay})
        return cls("http", 429, "You exceeded your current quota, please check your plan and billing details.",
                   details=tuple(details))

    @classmethod
    def conflict(cls) -> Fault:
        """409: a lock timeout on the provider's side; the official SDKs retry it."""
        return cls("http", 409, "The request could not be completed due to a conflict; please retry.")

    @classmethod
    def request_timeout(cls) -> Fault:
        return cls("http", 408, "Request timed out.")

    @classmethod
    def empty_stream(cls, *, latency: Latency = 0.0) -> Fault:
        """An answer with no content and no finish reason: a stream that ends at once (OpenAI still sends
        ``[DONE]``, Anthropic ``message_stop``), or a body whose message is empty."""
        return cls("empty_stream", latency=latency)

    @classmethod
    def server_error(cls, status: int = 500, *, latency: Latency = 0.0, should_retry: bool | None = None) -> Fault:
        return cls("http", status, "The server had an error while processing your request", None, latency,
                   should_retry=should_retry)

    @classmethod
    def overloaded(cls, *, latency: Latency = 0.0) -> Fault:
        """503 (OpenAI, Gemini) or 529 ``overloaded_error`` (Anthropic)."""
        return cls("http", 0, "Overloaded", None, latency)

    @classmethod
    def http(cls, status: int, message: str, *, latency: Latency = 0.0) -> Fault:
        """Any HTTP error in the API's own error format (400, 401, 403, 404, …)."""
        return cls("http", status, message, None, latency)

    @classmethod
    def auth_rejected(cls, status: int = 401) -> Fault:
        return cls.http(status, "Incorrect API key provided")

    @classmethod
    def unknown_model(cls) -> Fault:
        return cls.http(404, "The model does not exist or you do not have access to it")

    @classmethod
    def bad_request(cls, message: str = "Invalid schema for response_format") -> Fault:
        return cls.http(400, message)

    @classmethod
    def hang(cls) -> Fault:
        """Never answer (until the client gives up or the server closes)."""
        return cls("hang")

    @classmethod
    def reset(cls, *, latency: Latency = 0.0) -> Fault:
        """Abort the TCP connection without an answer."""
        return cls("reset", latency=latency)

    @classmethod
    def malformed(cls, *, latency: Latency = 0.0) -> Fault:
        """HTTP 200 with a body (or stream event) that is not valid JSON."""
        return cls("malformed", latency=latency)

    @classmethod
    def truncated_stream(cls, *, latency: Latency = 0.0) -> Fault:
        """Start answering, then stop early: a stream without its final events, or half a JSON body."""
        return cls("truncated_stream", latency=latency)


ScriptItem = Reply | Fault


@dataclass
class RecordedRequest:
    """One request as the fake received it; auth header values (and a ``key`` query) are ``"<redacted>"``, and only
    their digests are kept (``auth_sha256``)."""

    api: str
    model: str | None
    path: str
    method: str
    headers: dict[str, str]
    query: dict[str, str]
    json: Any
    ts: float
    stream: bool = False
    schema: Any = None  # the structured-output schema the request carried, in its API's place
    disconnected: bool = False  # the client closed the connection before the answer was complete
    #: header (lower case) or ``?key`` -> SHA-256 hex of the credential it carried ("Bearer " stripped)
    auth_sha256: dict[str, str] = field(default_factory=dict)
    #: input tokens the fake's prompt cache served to this request, and wrote for it
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    #: headers the answer to this request carries besides the usual ones (a rate limit's state: set by a gate)
    response_headers: dict[str, str] = field(default_factory=dict)

    def carries(self, key: str) -> bool:
        """Whether this request carried ``key`` in any auth header (or a ``key`` query parameter)."""
        return key_digest(key) in self.auth_sha256.values()


@dataclass
class _Script:
    items: list[ScriptItem] = field(default_factory=list)
    function: Callable[[RecordedRequest], ScriptItem] | None = None
    calls: int = 0

    def next(self, request: RecordedRequest) -> ScriptItem:
        if self.function is not None:
            return self.function(request)
        item = self.items[min(self.calls, len(self.items) - 1)]
        self.calls += 1
        return item


class FakeProviderServer:
    """The fake API server. ``keys={"openai": "sk-…"}`` makes that API reject any other key, as the real one
    would; without it every key (and no key) is accepted."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, seed: int = 0,
                 keys: Mapping[str, str] | None = None, prompt_cache: PromptCacheModel | None = None) -> None:
        self.host = host
        self.port = port
        self.rng = random.Random(seed)
        self.keys = dict(keys or {})
        self.models: dict[str, list[str]] = {api: list(ids) for api, ids in DEFAULT_MODELS.items()}
        self.requests: list[RecordedRequest] = []
        self.cache = prompt_cache or PromptCacheModel()
        self._scripts: dict[str, _Script] = {}
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()
        #: the batch APIs (OpenAI Batch, Anthropic Message Batches): scripted latency, outcomes, counters
        self.batches = BatchDesk(self.answer)

    # ------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> FakeProviderServer:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/openai/v1/chat/completions", self._openai)
        app.router.add_get("/openai/v1/models", self._models_openai)
        app.router.add_post("/anthropic/v1/messages", self._anthropic)
        app.router.add_get("/anthropic/v1/models", self._models_anthropic)
        app.router.add_post("/gemini/v1beta/models/{target}", self._gemini)
        app.router.add_get("/gemini/v1beta/models", self._models_gemini)
        app.router.add_post("/gemini/v1beta/cachedContents", self._gemini_cache_create)
        app.router.add_get("/gemini/v1beta/cachedContents/{id}", self._gemini_cache_get)
        app.router.add_delete("/gemini/v1beta/cachedContents/{id}", self._gemini_cache_delete)
        self.batches.add_routes(app.router, _PREFIX)
        # handler_cancellation: a client that hangs up cancels its handler, which is how we see a hedge's loser go
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeProviderServer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # ------------------------------------------------------------------------------------- public API

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def base_url(self, api: str) -> str:
        """The ``providers.<name>.base_url`` for ``api`` (grok and mistral speak the openai format)."""
        api = "openai" if api in ("grok", "mistral") else api
        return self.url + _PREFIX[api]

    def script(self, model: str, *items: Any) -> None:
        """What ``model`` answers: one Reply/Fault (always), a list or several (one per call, the last repeats),
        or ``callable(RecordedRequest) -> Reply | Fault``."""
        if len(items) == 1 and callable(items[0]) and not isinstance(items[0], Reply | Fault):
            self._scripts[model] = _Script(function=items[0])
        else:
            flat = list(items[0]) if len(items) == 1 and isinstance(items[0], Sequence) else list(items)
            if not flat or not all(isinstance(item, Reply | Fault) for item in flat):
                raise TypeError("script() takes Reply/Fault objects, a list of them, or a function")
            self._scripts[model] = _Script(items=flat)
        for ids in self.models.values():
            if model not in ids:
                ids.append(model)

    def providers_config(self, *, send_key: str = "always") -> dict[str, dict[str, Any]]:
        """``providers`` entries for the five built-in endpoints, all pointing at this fake. The fake plays the
        vendors' hosts, so by default it is sent their keys; ``send_key="official"`` is what a real custom
        ``base_url`` gets (no key at all)."""
        keys = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY",
                "grok": "XAI_API_KEY", "mistral": "MISTRAL_API_KEY"}
        # It plays hosted APIs, so like them it takes any number of calls at once (a 127.0.0.1 server would
        # otherwise get one slot by default).
        # It plays the vendors' hosts, so it is sent their caching hints too (prompt_cache: on).
        return {
            name: {"api": "openai" if name in ("grok", "mistral") else name, "base_url": self.base_url(name),
                   "api_key_env": [var], "send_key": send_key, "max_concurrency": 0, "prompt_cache": "on",
                   # it speaks the OpenAI, Anthropic and Gemini batch APIs (fake.batches)
                   "batch_api": "on" if name in ("openai", "anthropic", "gemini") else "auto"}
            for name, var in keys.items()
        }

    def overrides(self, *, send_key: str = "always") -> list[str]:
        """Hydra overrides pointing every built-in provider at this fake (for ``conclave`` subprocesses)."""
        return [override for name, entry in self.providers_config(send_key=send_key).items()
                for override in (f"providers.{name}.base_url={entry['base_url']}",
                                 f"providers.{name}.send_key={entry['send_key']}",
                                 f"providers.{name}.max_concurrency={entry['max_concurrency']}",
                                 f"providers.{name}.prompt_cache={entry['prompt_cache']}",
                                 f"providers.{name}.batch_api={entry['batch_api']}")]

    def settings(self, **overrides: Any) -> Any:
        """A minimal valid :class:`~conclave.config.settings.Settings` on this fake: agents on openai, anthropic and
        gemini, judge on openai. ``overrides`` replace top-level keys."""
        data: dict[str, Any] = {
            "question": "What should we do?",
            "agents": {
                "architect": {"persona": "p", "provider": "openai", "model": "gpt-4o"},
                "security": {"persona": "p", "provider": "anthropic", "model": "claude-sonnet-4-5"},
                "pragmatist": {"persona": "p", "provider": "gemini", "model": "gemini-2.5-pro"},
            },
            "judge": {"provider": "openai", "model": "gpt-4o"},
            "personas": {"p": {"name": "Panelist", "focus": "the question"}},
            "providers": self.providers_config(),
            "mode": {"strategy": "converge"},
        }
        data.update(overrides)
        return Settings.model_validate(data)

    def answer(self, api: str, body: Mapping[str, Any]) -> tuple[int, dict[str, Any] | None]:
        """``body`` answered as a batch answers one of its requests (no HTTP, no latency, not recorded): (HTTP
        status, the API's response or error body); ``None`` as the body for a scripted malformed answer."""
        schema, fmt = None, _format_of(api, body)
        if api == "openai":
            tool = _forced_function(body)
            response_format = body.get("response_format") or {}
            if tool is not None:
                schema = (tool.get("function") or {}).get("parameters")
            elif response_format.get("type") == "json_schema":
                schema = (response_format.get("json_schema") or {}).get("schema")
        elif api == "anthropic":
            schema = (_forced_tool(body) or {}).get("input_schema")
        else:
            config = body.get("generationConfig") or {}
            schema = config.get("responseJsonSchema") or config.get("responseSchema")
        record = RecordedRequest(api, str(body.get("model") or ""), "", "POST", {}, {}, dict(body), time.time(),
                                 False, schema)
        item = self._choose(record)
        if isinstance(item, Fault):
            if item.kind in ("malformed", "truncated_stream"):
                return 200, None
            status = item.status or fmt.overloaded_status
            return status, fmt.error_body(status, item.message or "the request failed")
        return 200, fmt.body(_Answer.of(item, record, next(self._ids)))

    def requests_for(self, model: str) -> list[RecordedRequest]:
        return [r for r in self.requests if r.model == model]

    def reset(self) -> None:
        """Forget scripts, recorded requests and everything cached."""
        self._scripts.clear()
        self.requests.clear()
        self.cache.forget()

    # ------------------------------------------------------------------------------------- handlers

    async def _openai(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        schema = None
        fmt = body.get("response_format") or {}
        tool = _forced_function(body)
        if tool is not None:  # a forced function call: its parameters are the answer's schema
            schema = (tool.get("function") or {}).get("parameters")
        elif fmt.get("type") == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema")
        elif fmt.get("type") == "json_object":  # llama.cpp's form: a schema beside the type
            schema = fmt.get("schema")
        record = self._record(request, "openai", body.get("model"), body, bool(body.get("stream")), schema)
        return await self._serve(request, record, _OpenAI(body, tool))

    async def _anthropic(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        tool = _forced_tool(body)
        schema = tool.get("input_schema") if tool else None
        record = self._record(request, "anthropic", body.get("model"), body, bool(body.get("stream")), schema)
        return await self._serve(request, record, _Anthropic(body, tool))

    async def _gemini(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        model, _, method = request.match_info["target"].rpartition(":")
        if method == "batchGenerateContent":
            return await self.batches.gemini_create(request, model)
        if method not in ("generateContent", "streamGenerateContent"):
            raise web.HTTPNotFound(text=json.dumps(_Gemini.error_body(404, f"unknown method {method}")),
                                   content_type="application/json")
        config = body.get("generationConfig") or {}
        schema = config.get("responseJsonSchema") or config.get("responseSchema")
        record = self._record(request, "gemini", model, body, method == "streamGenerateContent", schema)
        return await self._serve(request, record, _Gemini(body))

    async def _gemini_cache_create(self, request: web.Request) -> web.StreamResponse:
        body = await _body(request)
        self._record(request, "gemini", body.get("model"), body, False, None)
        if (denied := self._denied(request, "gemini")) is not None:
            return denied
        status, payload = self.cache.create(body, next(self._ids))
        if status != 200:
            return web.json_response(_Gemini.error_body(status, payload["message"]), status=status)
        return web.json_response(payload)

    async def _gemini_cache_get(self, request: web.Request) -> web.StreamResponse:
        self._record(request, "gemini", None, None, False, None)
        if (denied := self._denied(request, "gemini")) is not None:
            return denied
        content = self.cache.contents.get(f"cachedContents/{request.match_info['id']}")
        if content is None or content.expires <= time.time():
            return web.json_response(_Gemini.error_body(404, "CachedContent not found (or permission denied)"),
                                     status=404)
        return web.json_response(content.resource())

    async def _gemini_cache_delete(self, request: web.Request) -> web.StreamResponse:
        self._record(request, "gemini", None, None, False, None)
        if (denied := self._denied(request, "gemini")) is not None:
            return denied
        if not self.cache.delete(f"cachedContents/{request.match_info['id']}"):
            return web.json_response(_Gemini.error_body(404, "CachedContent not found (or permission denied)"),
                                     status=404)
        return web.json_response({})

    async def _models_openai(self, request: web.Request) -> web.StreamResponse:
        self._record(request, "openai", None, None, False, None)
        if (denied := self._denied(request, "openai")) is not None:
            return denied
        data = [{"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "fake"}
                for m in self.models["openai"]]
        return web.json_response({"object": "list", "data": data})

    async def _models_anthropic(self, request: web.Request) -> web.StreamResponse:
        self._record(request, "anthropic", None, None, False, None)
        if (denied := self._denied(request, "anthropic")) is not None:
            return denied
        ids = self.models["anthropic"]
        data = [{"type": "model", "id": m, "display_name": m, "created_at": "2025-01-01T00:00:00Z"} for m in ids]
        return web.json_response({"data": data, "has_more": False, "first_id": ids[0] if ids else None,
                                  "last_id": ids[-1] if ids else None})

    async def _models_gemini(self, request: web.Request) -> web.StreamResponse:
        self._record(request, "gemini", None, None, False, None)
        if (denied := self._denied(request, "gemini")) is not None:
            return denied
        models = [{"name": f"models/{m}", "displayName": m, "supportedGenerationMethods": ["generateContent"]}
                  for m in self.models["gemini"]]
        return web.json_response({"models": models})

    # ------------------------------------------------------------------------------------- serving

    def _record(self, request: web.Request, api: str, model: Any, body: Any, stream: bool,
                schema: Any) -> RecordedRequest:
        headers = {k: (REDACTED if k.lower() in _AUTH_HEADERS else v) for k, v in request.headers.items()}
        query = {k: (REDACTED if k == "key" else v) for k, v in request.query.items()}
        digests = {k.lower(): key_digest(_credential(k, v)) for k, v in request.headers.items()
                   if k.lower() in _AUTH_HEADERS}
        if "key" in request.query:
            digests["?key"] = key_digest(request.query["key"])
        record = RecordedRequest(api, str(model) if model is not None else None, request.path, request.method,
                                 headers, query, body, time.time(), stream, schema, auth_sha256=digests)
        self.requests.append(record)
        return record

    def _denied(self, request: web.Request, api: str) -> web.Response | None:
        expected = self.keys.get(api)
        if expected is None:
            return None
        given = {
            "openai": request.headers.get("Authorization", "").removeprefix("Bearer "),
            # the real API takes the key as x-api-key or as Authorization: Bearer
            "anthropic": request.headers.get("x-api-key")
            or request.headers.get("Authorization", "").removeprefix("Bearer "),
            "gemini": request.headers.get("x-goog-api-key") or request.query.get("key", ""),
        }[api]
        if given == expected:
            return None
        if api == "gemini":  # Gemini says "invalid key" with a 400
            return web.json_response(_Gemini.error_body(400, "API key not valid. Please pass a valid API key."),
                                     status=400)
        return web.json_response(_ERRORS[api](401, "Invalid API key"), status=401)

    def _choose(self, record: RecordedRequest) -> ScriptItem:
        script = self._scripts.get(record.model or "")
        if script is not None:
            return script.next(record)
        if isinstance(record.schema, Mapping):
            return Reply(json=instance_for(record.schema))
        return Reply(text=f"This is {record.model} answering from the fake provider server.")

    def _latency(self, spec: Latency) -> float:
        return float(spec(self.rng)) if callable(spec) else float(spec)

    async def _serve(self, request: web.Request, record: RecordedRequest, api: _Format) -> web.StreamResponse:
        try:
            if (denied := self._denied(request, record.api)) is not None:
                return denied
            if (problem := image_problem(record.api, record.json)) is not None:
                return web.json_response(api.error_body(400, problem), status=400)
            use = self.cache.use(record.api, record.model or "", record.json or {})
            if use.error is not None:
                return web.json_response(api.error_body(*use.error), status=use.error[0])
            item = self._choose(record)
            await asyncio.sleep(self._latency(item.latency))
            if isinstance(item, Fault):
                return await self._fault(request, record, item, api)
            answer = _Answer.of(item, record, next(self._ids), use)
            record.cached_tokens, record.cache_write_tokens = answer.usage[2], answer.cache_write
            self.cache.apply(use)  # answered: what it wrote is readable from now on
            if record.stream:
                return await self._stream(request, record, api.frames(answer))
            return web.json_response(api.body(answer), headers=record.response_headers)
        except asyncio.CancelledError:
            record.disconnected = True
            raise

    async def _fault(self, request: web.Request, record: RecordedRequest, fault: Fault,
                     api: _Format) -> web.StreamResponse:
        if fault.kind == "hang":
            await self._closing.wait()
            return web.Response(status=503)
        if fault.kind == "reset":
            if request.transport is not None:
                request.transport.abort()
            record.disconnected = True
            raise asyncio.CancelledError  # nothing can be sent on an aborted connection
        if fault.kind == "malformed":
            if record.stream:
                return await self._stream(request, record, [api.malformed_frame])
            return web.Response(body=b'{"id": "fake", "choices": [', content_type="application/json")
        if fault.kind == "empty_stream":
            if record.stream:
                return await self._stream(request, record, api.empty_frames(record))
            return web.json_response(api.empty_body(record))
        if fault.kind == "truncated_stream":
            answer = _Answer.of(self._fallback_reply(record), record, next(self._ids))
            if record.stream:
                frames = api.frames(answer)
                return await self._stream(request, record, frames[: max(1, len(frames) // 2)])
            raw = json.dumps(api.body(answer)).encode()
            return web.Response(body=raw[: len(raw) // 2], content_type="application/json")
        status = fault.status or api.overloaded_status
        headers = dict(record.response_headers)
        if fault.retry_after is not None:
            headers["Retry-After"] = f"{fault.retry_after:g}"
        if fault.should_retry is not None:
            headers["x-should-retry"] = "true" if fault.should_retry else "false"
        body = api.error_body(status, fault.message)
        if fault.code and record.api == "openai":
            body["error"].update(code=fault.code, type=fault.code)
        if fault.details and record.api == "gemini":
            body["error"]["details"] = [dict(d) for d in fault.details]
        return web.json_response(body, status=status, headers=headers)

    def _fallback_reply(self, record: RecordedRequest) -> Reply:
        if isinstance(record.schema, Mapping):
            return Reply(json=instance_for(record.schema))
        return Reply(text="A partial answer that will be cut off before it is complete.")

    async def _stream(self, request: web.Request, record: RecordedRequest, frames: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               **record.response_headers})
        try:
            await response.prepare(request)
            for frame in frames:
                await response.write(frame)
            await response.write_eof()
        except ConnectionResetError:
            record.disconnected = True
        return response


# ------------------------------------------------------------------------------------- wire formats


@dataclass(frozen=True)
class _Answer:
    """A reply made concrete for one request: text, the object (if any), usage, ids."""

    id: int
    model: str
    text: str
    obj: Any
    usage: tuple[int, int, int]
    finish_reason: str | None
    refusal: str | None = None
    cache_write: int = 0  # input tokens written to a prompt cache (Anthropic's cache_creation_input_tokens)

    @classmethod
    def of(cls, reply: Reply, record: RecordedRequest, number: int, use: CacheUse | None = None) -> _Answer:
        """``reply`` for ``record``; unscripted usage counts the request (and the cache ``use``)."""
        text = reply.text if reply.json is None else json.dumps(reply.json)
        text = text or ""
        if reply.refusal is not None and record.api != "openai":
            text = reply.refusal  # no refusal field outside OpenAI: the model says it in words
        write = 0
        if reply.usage is not None:
            usage = reply.usage
        else:
            use = use or CacheUse()
            total = _count_tokens(record.json) + 7 + use.extra
            cached = min(use.read, total)
            write = min(use.write, total - cached)
            usage = (total, max(1, len(text or reply.refusal or "") // 4), cached)
        refusal = reply.refusal if record.api == "openai" else None
        return cls(number, reply.model or record.model or "fake-model", "" if refusal else text, reply.json,
                   usage, reply.finish_reason, refusal, write)

    def pieces(self, n: int = 4) -> list[str]:
        size = max(1, -(-len(self.text) // n))
        return [self.text[i:i + size] for i in range(0, len(self.text), size)] or [""]


class _Format:
    overloaded_status = 503
    #: a stream event whose JSON is cut off, in the API's own framing
    malformed_frame = b""

    def body(self, answer: _Answer) -> dict[str, Any]:
        raise NotImplementedError

    def frames(self, answer: _Answer) -> list[bytes]:
        raise NotImplementedError

    def empty_body(self, record: RecordedRequest) -> dict[str, Any]:
        raise NotImplementedError

    def empty_frames(self, record: RecordedRequest) -> list[bytes]:
        raise NotImplementedError

    @staticmethod
    def error_body(status: int, message: str) -> dict[str, Any]:
        raise NotImplementedError


class _OpenAI(_Format):
    malformed_frame = b'data: {"choices": [{"delta": \n\n'

    def __init__(self, request: Mapping[str, Any], tool: Mapping[str, Any] | None = None) -> None:
        self.request = request
        self.tool = tool

    def _calls(self, answer: _Answer) -> bool:
        """Whether the answer is a call of the forced function (its text the call's arguments)."""
        return self.tool is not None and not answer.refusal

    def _finish(self, answer: _Answer) -> str:
        if answer.finish_reason:
            return answer.finish_reason
        # the real API ends a call forced by name with "stop", one the model chose ("required") with "tool_calls"
        named = isinstance(self.request.get("tool_choice"), Mapping)
        return "tool_calls" if self._calls(answer) and not named else "stop"

    def _call_head(self, answer: _Answer) -> dict[str, Any]:
        assert self.tool is not None
        return {"id": f"call_fake{answer.id}", "type": "function",
                "function": {"name": (self.tool.get("function") or {}).get("name"), "arguments": ""}}

    def body(self, answer: _Answer) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": None if answer.refusal else answer.text,
                                   "refusal": answer.refusal}
        if self._calls(answer):
            head = self._call_head(answer)
            message.update(content=None, tool_calls=[{**head, "function": {**head["function"],
                                                                           "arguments": answer.text}}])
        return {
            "id": f"chatcmpl-fake{answer.id}", "object": "chat.completion", "created": int(time.time()),
            "model": answer.model,
            "choices": [{"index": 0, "message": message,
                         "logprobs": None, "finish_reason": self._finish(answer)}],
            "usage": _openai_usage(answer.usage),
        }

    def empty_body(self, record: RecordedRequest) -> dict[str, Any]:
        return {"id": "chatcmpl-fake-empty", "object": "chat.completion", "created": int(time.time()),
                "model": record.model, "choices": [{"index": 0, "message": {"role": "assistant", "content": ""},
                                                    "logprobs": None, "finish_reason": None}]}

    def empty_frames(self, record: RecordedRequest) -> list[bytes]:
        return [b"data: [DONE]\n\n"]

    def frames(self, answer: _Answer) -> list[bytes]:
        head = {"id": f"chatcmpl-fake{answer.id}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": answer.model}

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        if self._calls(answer):  # the call's name first, then its arguments in pieces, as the real API streams it
            frames = [chunk({"role": "assistant", "content": None,
                             "tool_calls": [{"index": 0, **self._call_head(answer)}]})]
            frames += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
                       for piece in answer.pieces()]
        else:
            frames = [chunk({"role": "assistant", "content": ""})]
        if answer.refusal:
            size = max(1, len(answer.refusal) // 3)
            frames += [chunk({"refusal": answer.refusal[i:i + size]}) for i in range(0, len(answer.refusal), size)]
        elif not self._calls(answer):
            frames += [chunk({"content": piece}) for piece in answer.pieces()]
        frames.append(chunk({}, self._finish(answer)))
        if (self.request.get("stream_options") or {}).get("include_usage"):
            frames.append(_sse({**head, "choices": [], "usage": _openai_usage(answer.usage)}))
        frames.append(b"data: [DONE]\n\n")
        return frames

    @staticmethod
    def error_body(status: int, message: str) -> dict[str, Any]:
        kinds = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
                 429: "requests"}
        return {"error": {"message": message, "type": kinds.get(status, "server_error"), "param": None,
                          "code": {404: "model_not_found", 401: "invalid_api_key"}.get(status)}}


class _Anthropic(_Format):
    overloaded_status = 529
    malformed_frame = b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, "delta": \n\n'

    def empty_body(self, record: RecordedRequest) -> dict[str, Any]:
        return {"id": "msg_fake_empty", "type": "message", "role": "assistant", "model": record.model,
                "content": [], "stop_reason": None, "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0}}

    def empty_frames(self, record: RecordedRequest) -> list[bytes]:
        message = {**self.empty_body(record), "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [_sse({"type": "message_start", "message": message}, "message_start"),
                _sse({"type": "message_stop"}, "message_stop")]

    def __init__(self, request: Mapping[str, Any], tool: Mapping[str, Any] | None) -> None:
        self.request = request
        self.tool = tool

    def _use_tool(self, answer: _Answer) -> bool:
        return self.tool is not None and answer.obj is not None

    def body(self, answer: _Answer) -> dict[str, Any]:
        if self._use_tool(answer):
            assert self.tool is not None
            block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_fake{answer.id}", "name": self.tool["name"],
                                     "input": answer.obj}
            stop = "tool_use"
        else:
            block, stop = {"type": "text", "text": answer.text}, "end_turn"
        return {"id": f"msg_fake{answer.id}", "type": "message", "role": "assistant", "model": answer.model,
                "content": [block], "stop_reason": answer.finish_reason or stop, "stop_sequence": None,
                "usage": _anthropic_usage(answer.usage, answer.cache_write)}

    def frames(self, answer: _Answer) -> list[bytes]:
        message: dict[str, Any] = {
            "id": f"msg_fake{answer.id}", "type": "message", "role": "assistant", "model": answer.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {**_anthropic_usage(answer.usage, answer.cache_write), "output_tokens": 1},
        }
        frames = [_sse({"type": "message_start", "message": message}, "message_start")]
        if self._use_tool(answer):
            assert self.tool is not None
            start = {"type": "tool_use", "id": f"toolu_fake{answer.id}", "name": self.tool["name"], "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in answer.pieces()]
            stop = "tool_use"
        else:
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in answer.pieces()]
            stop = "end_turn"
        frames.append(_sse({"type": "content_block_start", "index": 0, "content_block": start},
                           "content_block_start"))
        frames.append(_sse({"type": "ping"}, "ping"))
        frames += [_sse({"type": "content_block_delta", "index": 0, "delta": d}, "content_block_delta")
                   for d in deltas]
        frames.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        frames.append(_sse({"type": "message_delta",
                            "delta": {"stop_reason": answer.finish_reason or stop, "stop_sequence": None},
                            "usage": {"output_tokens": answer.usage[1]}}, "message_delta"))
        frames.append(_sse({"type": "message_stop"}, "message_stop"))
        return frames

    @staticmethod
    def error_body(status: int, message: str) -> dict[str, Any]:
        kinds = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                 404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 529: "overloaded_error"}
        return {"type": "error", "error": {"type": kinds.get(status, "api_error"), "message": message}}


class _Gemini(_Format):
    malformed_frame = b'data: {"candidates": [{"content": {"parts": \r\n\r\n'

    def __init__(self, request: Mapping[str, Any]) -> None:
        self.request = request

    def empty_body(self, record: RecordedRequest) -> dict[str, Any]:
        return {"candidates": [{"content": {"role": "model", "parts": []}, "index": 0}],
                "modelVersion": record.model}

    def empty_frames(self, record: RecordedRequest) -> list[bytes]:
        return [_sse(self.empty_body(record), crlf=True)]

    def _response(self, answer: _Answer, text: str, *, final: bool) -> dict[str, Any]:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
        out: dict[str, Any] = {"candidates": [candidate], "modelVersion": answer.model,
                               "responseId": f"fake{answer.id}"}
        if final:
            candidate["finishReason"] = answer.finish_reason or "STOP"
            usage = {"promptTokenCount": answer.usage[0], "candidatesTokenCount": answer.usage[1],
                     "totalTokenCount": answer.usage[0] + answer.usage[1]}
            if answer.usage[2]:
                usage["cachedContentTokenCount"] = answer.usage[2]
            out["usageMetadata"] = usage
        return out

    def body(self, answer: _Answer) -> dict[str, Any]:
        return self._response(answer, answer.text, final=True)

    def frames(self, answer: _Answer) -> list[bytes]:
        pieces = answer.pieces()
        return [_sse(self._response(answer, piece, final=i == len(pieces) - 1), crlf=True)
                for i, piece in enumerate(pieces)]

    @staticmethod
    def error_body(status: int, message: str) -> dict[str, Any]:
        kinds = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
                 429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE"}
        return {"error": {"code": status, "message": message, "status": kinds.get(status, "INTERNAL")}}


_ERRORS: dict[str, Callable[[int, str], dict[str, Any]]] = {
    "openai": _OpenAI.error_body, "anthropic": _Anthropic.error_body, "gemini": _Gemini.error_body,
}


# ------------------------------------------------------------------------------------- helpers


def _format_of(api: str, body: Mapping[str, Any]) -> _Format:
    if api == "openai":
        return _OpenAI(body, _forced_function(body))
    if api == "anthropic":
        return _Anthropic(body, _forced_tool(body))
    return _Gemini(body)


def key_digest(key: str) -> str:
    """The SHA-256 hex digest the fake records for a credential (tests compare, the key itself is never kept)."""
    return hashlib.sha256(key.encode()).hexdigest()


def _credential(header: str, value: str) -> str:
    return value.removeprefix("Bearer ") if header.lower() == "authorization" else value


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text='{"error": {"message": "request body is not JSON"}}',
                                 content_type="application/json") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text='{"error": {"message": "request body is not an object"}}',
                                 content_type="application/json")
    return body


def _forced_tool(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    tools = [t for t in body.get("tools") or [] if isinstance(t, Mapping)]
    choice = body.get("tool_choice") or {}
    if choice.get("type") == "tool":
        return next((t for t in tools if t.get("name") == choice.get("name")), None)
    if choice.get("type") == "any" and tools:
        return tools[0]
    return None


def _forced_function(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The Chat Completions function tool the request forces (by name, or ``required`` with one tool offered)."""
    tools = [t for t in body.get("tools") or [] if isinstance(t, Mapping) and t.get("type") == "function"]
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        return next((t for t in tools if (t.get("function") or {}).get("name") == name), None)
    if choice == "required" and len(tools) == 1:
        return tools[0]
    return None


def _sse(payload: Any, event: str | None = None, *, crlf: bool = False) -> bytes:
    end = "\r\n" if crlf else "\n"
    head = f"event: {event}{end}" if event else ""
    return f"{head}data: {json.dumps(payload)}{end}{end}".encode()


def _openai_usage(usage: tuple[int, int, int]) -> dict[str, Any]:
    return {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": usage[0] + usage[1],
            "prompt_tokens_details": {"cached_tokens": usage[2]}}


def _anthropic_usage(usage: tuple[int, int, int], written: int = 0) -> dict[str, Any]:
    # Anthropic's input_tokens excludes cache reads and writes, which it reports apart.
    return {"input_tokens": usage[0] - usage[2] - written, "output_tokens": usage[1],
            "cache_creation_input_tokens": written, "cache_read_input_tokens": usage[2]}


IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})
_DATA_URL = re.compile(r"^data:(image/[a-z]+);base64,(.*)$", re.DOTALL)


def _base64_problem(data: Any, *, urlsafe: bool = False) -> str | None:
    """Why ``data`` is not base64 (Google's JSON mapping of bytes also takes the URL-safe alphabet)."""
    if not isinstance(data, str):
        return "image data must be a base64 string"
    if urlsafe:
        data = data.replace("-", "+").replace("_", "/")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "image data is not valid base64"
    return None


def image_problem(api: str, body: Any) -> str | None:
    """Why the images in a request body would be rejected by the real API (None when there are none or they are
    well-formed): OpenAI chat ``image_url`` parts (a URL or a base64 data URL), Anthropic ``image`` blocks with a
    base64 source, Gemini ``inline_data`` parts."""
    if not isinstance(body, Mapping):
        return None
    if api in ("openai", "anthropic"):
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, Mapping) else None
            for part in content if isinstance(content, list) else []:
                kind = part.get("type") if isinstance(part, Mapping) else None
                if api == "openai" and kind == "image_url":
                    url = (part.get("image_url") or {}).get("url") if isinstance(part.get("image_url"), Mapping) \
                        else None
                    if not isinstance(url, str):
                        return "Invalid content part: image_url.url is required"
                    if url.startswith("data:"):
                        match = _DATA_URL.match(url)
                        if match is None or match.group(1) not in IMAGE_TYPES:
                            return "Invalid image URL: a data URL must be data:image/{png,jpeg,webp,gif};base64,..."
                        if (problem := _base64_problem(match.group(2))) is not None:
                            return problem
                    elif not url.startswith(("https://", "http://")):
                        return "Invalid image URL"
                elif api == "anthropic" and kind == "image":
                    source = part.get("source")
                    if not isinstance(source, Mapping) or source.get("type") not in ("base64", "url"):
                        return "messages: image.source.type must be base64 or url"
                    if source.get("type") == "base64":
                        if source.get("media_type") not in IMAGE_TYPES:
                            return "messages: image.source.media_type must be one of " + ", ".join(sorted(IMAGE_TYPES))
                        if (problem := _base64_problem(source.get("data"))) is not None:
                            return problem
    if api == "gemini":
        for content in body.get("contents") or []:
            for part in (content.get("parts") or []) if isinstance(content, Mapping) else []:
                blob = (part.get("inline_data") or part.get("inlineData")) if isinstance(part, Mapping) else None
                if blob is None:
                    continue
                mime = blob.get("mime_type") or blob.get("mimeType") if isinstance(blob, Mapping) else None
                if not isinstance(mime, str) or not mime:
                    return "Invalid value at 'contents.parts.inline_data.mime_type'"
                if (problem := _base64_problem(blob.get("data"), urlsafe=True)) is not None:
                    return problem
    return None


def _count_tokens(body: Any) -> int:
    """A rough input token count (4 characters a token) for answers whose usage is not scripted."""
    with contextlib.suppress(TypeError, ValueError):
        return len(json.dumps(body)) // 4
    return 0


@contextlib.contextmanager
def serving_in_a_thread(**options: Any) -> Iterator[FakeProviderServer]:
    """A :class:`FakeProviderServer` (made with ``options``) on an event loop of its own thread: it answers while the
    caller's loop is blocked, and keeps requests open while the caller waits on other processes."""
    ready = threading.Event()
    held: dict[str, Any] = {}

    async def serve() -> None:
        async with FakeProviderServer(**options) as server:
            held.update(fake=server, loop=asyncio.get_running_loop(), stop=asyncio.Event())
            ready.set()
            await held["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    if not ready.wait(30):
        raise RuntimeError("the fake provider server did not start within 30 s")
    try:
        yield held["fake"]
    finally:
        held["loop"].call_soon_threadsafe(held["stop"].set)
        thread.join(30)
