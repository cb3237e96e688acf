"""Built-in ``anthropic`` provider: the Messages API (``POST {base_url}/v1/messages``).

The system prompt is the top-level ``system`` field. Structured output is one forced tool whose ``input_schema``
is the artifact schema (``tool_choice: {type: tool, name}``); the tool call's ``input`` is the parsed object.

Prompt caching: Anthropic caches the prefix tools → system → messages up to each ``cache_control`` breakpoint
(reads billed at ~10% of input, writes at 125%). When a call carries the consultation's cache hint and the shared
prefix is at least the model's minimum cacheable length, the system prompt is sent as two text blocks — the
context block every call shares, then the seat's own instructions — each ending in an ``ephemeral`` breakpoint
(2 of the 4 allowed), and ``tools`` lists every schema the model is asked for in the consultation
(``PromptCache.schemas_for``: a model that only answers as an agent does not carry the judge's) in a fixed order,
the wanted one forced by ``tool_choice``: a different tool list would change the prefix before the system prompt
from round to round, while ``tool_choice`` only affects the cached messages, which are never cached here.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from importlib import resources
from typing import Any, ClassVar

from conclave.hookspecs import hookimpl
from conclave.providers.base import (
    BATCH_CLOCK_SKEW_S,
    BATCH_LIST_PAGES,
    BatchClient,
    BatchStatus,
    CacheRule,
    Completion,
    CompletionRequest,
    ImagePart,
    OverloadedError,
    PromptCache,
    ProviderError,
    QuotaExhaustedError,
    RateLimitedError,
    ServerError,
    Usage,
)
from conclave.providers.http import HTTPProvider, api_name, approx_tokens, parse_object, schema_name
from conclave.providers.pacing import Allowance, RateLimits

API_VERSION = "2023-06-01"
#: the first API version that rejects ``temperature``/``top_p``/``top_k`` with a 400 (ISO dates compare as strings)
NO_SAMPLING_SINCE = "2026-10-21"


#: the API's limit on ``cache_control`` breakpoints in one request
MAX_BREAKPOINTS = 4
EPHEMERAL = {"type": "ephemeral"}
_TOOL_DESCRIPTION = "Record your answer. Call this tool exactly once with the complete answer."


def min_cacheable_tokens(model: str) -> int:
    """The shortest prefix the model caches (shorter ones are processed without caching, no error)."""
    if model.startswith(("claude-opus-4-5", "claude-opus-4-6", "claude-opus-4-7", "claude-haiku-4-5")):
        return 4096
    if model.startswith(("claude-3-5-haiku", "claude-3-haiku")):
        return 2048
    return 1024


def accepts_temperature(version: str = API_VERSION) -> bool:
    """Whether requests under ``anthropic-version: version`` may carry ``temperature``."""
    return version < NO_SAMPLING_SINCE


class AnthropicProvider(HTTPProvider):
    """Anthropic Messages API."""

    DEFAULT_BASE_URL = "https://api.anthropic.com"
    DEFAULT_KEY_ENV = ("ANTHROPIC_API_KEY",)
    KEY_VARIABLES = DEFAULT_KEY_ENV
    KEYED_HOSTS: ClassVar[frozenset[str]] = frozenset({"api.anthropic.com"})

    def auth_headers(self, key: str) -> dict[str, str]:
        return {"x-api-key": key, "anthropic-version": API_VERSION}

    def headers(self, model: str) -> dict[str, str]:
        headers = super().headers(model)
        headers.setdefault("anthropic-version", API_VERSION)  # also when a keyless proxy is configured
        return headers

    def special_error(self, status: int, payload: Mapping[str, Any], message: str, headers: Mapping[str, str],
                      kw: dict[str, Any]) -> ProviderError | None:
        # An account out of credit is answered with a 400 ("Your credit balance is too low to access the Anthropic
        # API"): a quota, not a bad request, so another provider may still answer and the model is not asked again.
        if status == 400 and "credit balance" in message.lower():
            return QuotaExhaustedError(f"{self.name} credit exhausted for this key — check billing (HTTP 400): "
                                       f"{message}", **kw)
        return None

    def rate_limits(self, headers: Mapping[str, str]) -> RateLimits | None:
        """``anthropic-ratelimit-requests-remaining`` and ``-reset`` (an RFC 3339 time: when the limit is whole
        again), the same for ``-tokens`` (the most restrictive token limit in effect); sent with every answer."""
        requests, tokens = (_allowance(headers, what) for what in ("requests", "tokens"))
        return None if requests is None and tokens is None else RateLimits(requests, tokens)

    def body(self, request: CompletionRequest, *, stream: bool) -> dict[str, Any]:
        """The request body for ``request`` (what the API receives, key excluded)."""
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        }
        cached = self._cached_prefix(request)
        if cached:
            stable, own = request.cache.split(request.system) if request.cache is not None else ("", "")
            blocks = [{"type": "text", "text": stable, "cache_control": dict(EPHEMERAL)}]
            if own:
                blocks.append({"type": "text", "text": own, "cache_control": dict(EPHEMERAL)})
            assert len(blocks) <= MAX_BREAKPOINTS
            body["system"] = blocks
        elif request.system:
            body["system"] = request.system
        if request.temperature is not None and accepts_temperature(API_VERSION):
            body["temperature"] = request.temperature
        tools: dict[str, Any] = {}
        if cached and request.cache is not None:
            # every schema the model is asked for, always in the same order: the tools open the cached prefix (a
            # request without a schema, such as a cache warm-up, sends them too and uses none)
            tools = {api_name(n): dict(s) for n, s in request.cache.schemas_for(self.name, request.model)}
        if request.json_schema is not None:
            name = schema_name(request)
            tools.setdefault(name, dict(request.json_schema))
            body["tool_choice"] = {"type": "tool", "name": name}
        elif tools:
            body["tool_choice"] = {"type": "none"}
        if tools:
            body["tools"] = [{"name": n, "description": _TOOL_DESCRIPTION, "input_schema": s}
                             for n, s in tools.items()]
        if stream:
            body["stream"] = True
        if request.images and self.accepts_images(request.model):
            _attach_images(body["messages"], request.images)
        return body

    def _cached_prefix(self, request: CompletionRequest) -> bool:
        """Whether ``request`` gets cache breakpoints: hints are on, it carries the consultation's hint, and the
        shared prefix is long enough for the model to cache."""
        cache = request.cache
        if cache is None or cache.stable_chars <= 0 or not self.sends_cache_hints():
            return False
        stable, _ = cache.split(request.system)
        return approx_tokens(stable) >= min_cacheable_tokens(request.model)

    def cached_definitions(self, model: str, cache: PromptCache, stable_tokens: int) -> str:
        if not cache.schemas or not self.sends_cache_hints() or stable_tokens < min_cacheable_tokens(model):
            return ""
        return json.dumps([{"name": api_name(n), "description": _TOOL_DESCRIPTION, "input_schema": dict(s)}
                           for n, s in cache.schemas_for(self.name, model)])

    def cache_rule(self, model: str, stable_tokens: int) -> CacheRule | None:
        if not self.sends_cache_hints() or stable_tokens < min_cacheable_tokens(model):
            return None
        return CacheRule(shared_by="model")

    async def attempt(self, request: CompletionRequest) -> Completion:
        started = time.perf_counter()
        payload = await self.post_json(f"{self.base_url}/v1/messages", self.body(request, stream=False),
                                       request.model)
        return self.message_completion(payload, request, started)

    def message_completion(self, payload: Mapping[str, Any], request: CompletionRequest,
                           started: float) -> Completion:
        """The :class:`Completion` of a Messages answer to ``request`` (an interactive call's body, or a batch
        result's ``message``)."""
        content = payload.get("content")
        if not isinstance(content, list):
            raise self.malformed("no content blocks in the answer", request.model)
        texts: list[str] = []
        tool_input: dict[str, Any] | None = None
        for block in content:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text":
                texts.append(str(block.get("text", "")))
            elif block.get("type") == "tool_use" and isinstance(block.get("input"), dict):
                tool_input = block["input"]
        if tool_input is None and not "".join(texts) and not payload.get("stop_reason"):
            raise self.truncated("the answer has neither content nor a stop reason", request.model)
        return self._completion(request, texts, tool_input, payload.get("usage"), payload.get("model"),
                                payload.get("stop_reason"), started)

    async def attempt_stream(self, request: CompletionRequest) -> AsyncIterator[str | Completion]:
        started = time.perf_counter()
        texts: list[str] = []
        tool_json: list[str] = []
        usage: dict[str, Any] = {}
        model: Any = request.model
        stop: Any = None
        done = False
        events = self.post_sse(f"{self.base_url}/v1/messages", self.body(request, stream=True), request.model)
        async with contextlib.aclosing(events):
            async for _name, data in events:
                event = self.decode_event(data, request.model)
                kind = event.get("type")
                if kind == "message_start":
                    message = event.get("message") or {}
                    model = message.get("model") or model
                    usage.update(message.get("usage") or {})
                elif kind == "content_block_delta":
                    delta = event.get("delta") or {}
                    if delta.get("type") == "text_delta" and delta.get("text"):
                        texts.append(delta["text"])
                        yield delta["text"]
                    elif delta.get("type") == "input_json_delta" and delta.get("partial_json"):
                        tool_json.append(delta["partial_json"])
                        yield delta["partial_json"]
                elif kind == "message_delta":
                    stop = (event.get("delta") or {}).get("stop_reason") or stop
                    usage.update(event.get("usage") or {})
                elif kind == "message_stop":
                    done = True
                    break
                elif kind == "error":
                    error = self._stream_error(event.get("error") or {}, request.model)
                    error.billed = True
                    raise error
        if not done:
            raise self.truncated("the stream ended before message_stop", request.model)
        if not texts and not tool_json and stop is None:
            raise self.truncated("the stream ended with no content and no stop reason", request.model)
        tool_input = None
        if tool_json:
            tool_input = parse_object("".join(tool_json))
            if tool_input is None:
                raise self.malformed("the tool input in the stream is not a JSON object", request.model)
        yield self._completion(request, texts, tool_input, usage, model, stop, started)

    def _completion(self, request: CompletionRequest, texts: list[str], tool_input: dict[str, Any] | None,
                    usage: Any, model: Any, stop: Any, started: float) -> Completion:
        parsed: dict[str, Any] | None = tool_input
        if tool_input is not None:
            text = json.dumps(tool_input, ensure_ascii=False)
        else:
            text = "".join(texts)
            parsed = parse_object(text) if request.json_schema is not None else None
        return Completion(
            text=text,
            parsed=parsed,
            usage=_usage(usage),
            model=str(model or request.model),
            provider=self.name,
            finish_reason=str(stop) if stop else None,
            latency_s=time.perf_counter() - started,
        )

    def _stream_error(self, error: dict[str, Any], model: str) -> ProviderError:
        kind, message = error.get("type"), self.redact(str(error.get("message", "")))
        kw: dict[str, Any] = {"provider": self.name, "model": model}
        if kind == "overloaded_error":
            return OverloadedError(f"{self.name} is overloaded (mid-stream) serving {model}: {message}", **kw)
        if kind == "rate_limit_error":
            return RateLimitedError(f"{self.name} rate-limited {model} mid-stream: {message}", **kw)
        return ServerError(f"{self.name} failed mid-stream serving {model} ({kind}): {message}", **kw)

    def batch_client(self) -> BatchClient | None:
        # api.anthropic.com has Message Batches; a custom base_url only when it says so (batch_api: on)
        mode = self.settings.batch_api
        return AnthropicBatch(self) if mode == "on" or (mode == "auto" and self.is_official()) else None

    async def list_models(self) -> list[str] | None:
        ids: list[str] = []
        url = f"{self.base_url}/v1/models?limit=1000"
        for _page in range(20):  # bounded: a misbehaving proxy must not loop us forever
            payload = await self.get_json(url, timeout_s=10.0)
            data = payload.get("data")
            if not isinstance(data, list):
                raise self.malformed("the models list has no data array", "")
            ids += [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item]
            if not payload.get("has_more") or not payload.get("last_id"):
                break
            url = f"{self.base_url}/v1/models?limit=1000&after_id={payload['last_id']}"
        return ids


class AnthropicBatch(BatchClient):
    """Anthropic's Message Batches: every request's Messages body as ``params`` beside its ``custom_id``, the
    results read line by line once the batch has ended."""

    limit = 100_000
    per_model = False  # one batch may ask several models

    def __init__(self, provider: AnthropicProvider) -> None:
        self.provider = provider

    async def submit(self, requests: Sequence[tuple[str, CompletionRequest]], *, tag: str) -> str:
        """Message Batches carry no metadata: ``tag`` prefixes every request's custom id (``tag_key``)."""
        p = self.provider
        body = {"requests": [{"custom_id": f"{tag}_{custom_id}", "params": p.body(request, stream=False)}
                             for custom_id, request in requests]}
        batch = p.decode(await p.send("POST", f"{p.base_url}/v1/messages/batches", json_body=body), "")
        if not isinstance(batch.get("id"), str):
            raise p.malformed("the batch was created without an id", "")
        return str(batch["id"])

    async def find(self, tag: str, count: int, since: float) -> str | None:
        """The batch of ``count`` requests created since ``since`` whose custom ids start with ``tag``, in
        ``GET /v1/messages/batches`` (newest first, paged by ``after_id``). Custom ids are readable only in the
        results of an ended batch: one still in progress is taken when it is the only such candidate (its results
        are read by custom id, so a stranger's batch would answer none of ours)."""
        p = self.provider
        candidates: list[dict[str, Any]] = []
        after = ""
        for _ in range(BATCH_LIST_PAGES):
            page = p.decode(await p.send("GET", f"{p.base_url}/v1/messages/batches?limit=100{after}"), "")
            data = [b for b in page.get("data") or [] if isinstance(b, dict)]
            recent = [b for b in data if (_epoch(b.get("created_at")) or 0.0) >= since - BATCH_CLOCK_SKEW_S]
            candidates += [b for b in recent if sum(int(v or 0) for v in (b.get("request_counts") or {}).values())
                           == count]
            if len(recent) < len(data) or not page.get("has_more") or not page.get("last_id"):
                break
            after = f"&after_id={page['last_id']}"
        running = []
        for batch in candidates:
            if batch.get("processing_status") != "ended":
                running.append(str(batch["id"]))
                continue
            raw = await p.send("GET", f"{p.base_url}/v1/messages/batches/{batch['id']}/results")
            found = _CUSTOM_ID.search(raw.decode("utf-8", "replace"))
            if found and found.group(1).startswith(f"{tag}_"):
                return str(batch["id"])
        return running[0] if len(running) == 1 else None

    async def status(self, batch_id: str) -> BatchStatus:
        p = self.provider
        batch = p.decode(await p.send("GET", f"{p.base_url}/v1/messages/batches/{batch_id}"), "")
        counts = {k: int(v or 0) for k, v in (batch.get("request_counts") or {}).items()}
        status = str(batch.get("processing_status"))
        total = sum(counts.values())
        failed = counts.get("errored", 0) + counts.get("canceled", 0) + counts.get("expired", 0)
        state = "in_progress"
        if status == "ended":
            state = ("expired" if counts.get("expired") and not counts.get("succeeded")
                     else "cancelled" if batch.get("cancel_initiated_at") else "completed")
        return BatchStatus(state, status, total, counts.get("succeeded", 0) + failed, failed)  # type: ignore[arg-type]

    async def results(self, batch_id: str, requests: Mapping[str, CompletionRequest]
                      ) -> dict[str, Completion | ProviderError]:
        p = self.provider
        raw = await p.send("GET", f"{p.base_url}/v1/messages/batches/{batch_id}/results")
        out: dict[str, Completion | ProviderError] = {}
        for line in raw.decode("utf-8", "replace").splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                found = _CUSTOM_ID.search(line)
                key = found.group(1).partition("_")[2] if found else ""
                if key in requests:
                    out[key] = p.malformed("a batch result line is not JSON", "")
                continue
            custom_id = str(row.get("custom_id")).partition("_")[2]  # the batch's tag, then the request's key
            request = requests.get(custom_id)
            result = row.get("result") or {}
            if request is None:
                continue
            kind = result.get("type")
            try:
                if kind == "succeeded":
                    out[custom_id] = p.message_completion(result.get("message") or {}, request, time.perf_counter())
                elif kind == "errored":
                    error = (result.get("error") or {}).get("error") or {}
                    status = {"overloaded_error": 529, "api_error": 500, "rate_limit_error": 429}.get(
                        str(error.get("type")), 400)
                    out[custom_id] = p.error_for(status, json.dumps(result.get("error") or {}).encode(), {},
                                                 request.model)
                else:  # expired or canceled: never answered
                    out[custom_id] = ServerError(f"{p.name} batch request {kind}", provider=p.name,
                                                 model=request.model)
            except ProviderError as exc:
                out[custom_id] = exc
        return out

    async def cancel(self, batch_id: str) -> None:
        p = self.provider
        await p.send("POST", f"{p.base_url}/v1/messages/batches/{batch_id}/cancel")


_CUSTOM_ID = re.compile(r'"custom_id"\s*:\s*"([^"]+)"')


def _epoch(value: Any) -> float | None:
    """An RFC 3339 timestamp as epoch seconds; None when absent or unreadable."""
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


def _usage(raw: Any) -> Usage:
    """Anthropic counts cache reads and writes apart from ``input_tokens``; ours includes them."""
    if not isinstance(raw, dict):
        return Usage()
    cached = int(raw.get("cache_read_input_tokens") or 0)
    written = int(raw.get("cache_creation_input_tokens") or 0)
    return Usage(
        input_tokens=int(raw.get("input_tokens") or 0) + cached + written,
        output_tokens=int(raw.get("output_tokens") or 0),
        cached_input_tokens=cached,
        cache_write_tokens=written,
    )


def _allowance(headers: Mapping[str, str], what: str) -> Allowance | None:
    remaining, reset = (headers.get(f"anthropic-ratelimit-{what}-{part}") for part in ("remaining", "reset"))
    if not remaining or not reset:
        return None
    try:
        left, reset_at = float(remaining), datetime.fromisoformat(reset)
    except ValueError:
        return None
    if reset_at.tzinfo is None:
        return None
    return Allowance(left, max(0.0, reset_at.timestamp() - time.time()))


@hookimpl
def register_providers(register: Any) -> None:
    register("anthropic", AnthropicProvider)


@hookimpl
def register_price_sheets(register: Any) -> None:
    register("anthropic", resources.files("conclave_plugins").joinpath("pricing", "anthropic.yaml"))


def _attach_images(messages: list[dict[str, Any]], images: Sequence[ImagePart]) -> None:
    """The attached images, as base64 image blocks ahead of the first user message's text (where Anthropic advises
    images to go)."""
    for message in messages:
        if message["role"] == "user":
            blocks = [{"type": "image", "source": {"type": "base64", "media_type": image.media_type,
                                                   "data": image.base64()}} for image in images]
            message["content"] = [*blocks, {"type": "text", "text": message["content"]}]
            return
