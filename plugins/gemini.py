"""Built-in ``gemini`` provider: ``POST {base_url}/models/{model}:generateContent`` (Gemini API, v1beta).

The system prompt goes in ``systemInstruction``; structured output asks for ``application/json`` with the artifact
schema as ``generationConfig.responseJsonSchema``, restricted to the keywords Gemini documents for it (the others
are stated in descriptions). Streaming uses ``:streamGenerateContent?alt=sse``. A 429 ``RESOURCE_EXHAUSTED`` carries
its wait in the body (``RetryInfo.retryDelay``); a per-day quota (a ``QuotaFailure`` whose ``quotaId`` says
``PerDay``) resets at midnight Pacific time and is not retried.

Prompt caching: the context block that opens every system prompt of a consultation is the same in every call. When
it is at least the model's minimum cacheable length, hints are on and the first round asks the model for two or
more answers at once (``PromptCache.together``), the first call to the model creates an explicit cached content
holding it (``POST cachedContents``, TTL 600 s, billed once at the input price plus its storage) and
every call then references it (``cachedContent``), so each reads the context at the cached rate whatever its
schema; the seat's own instructions, which a request naming a cached content may not send as
``systemInstruction``, open its user turn instead. The caches are deleted when the consultation ends. If creation
fails, or a cache has gone (expired), calls are sent whole, where Gemini's implicit caching (no guaranteed saving)
may still serve the shared prefix. A model with a single seat is always sent whole: its calls run one after
another, so the implicit cache serves the context to every call after the first at the cached rate, and an explicit
one would only add its storage.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from importlib import resources
from typing import Any, ClassVar
from urllib.parse import quote

from conclave.hookspecs import hookimpl
from conclave.providers.base import (
    BATCH_CLOCK_SKEW_S,
    BATCH_LIST_PAGES,
    BadRequestError,
    BatchClient,
    BatchStatus,
    CacheRule,
    Completion,
    CompletionRequest,
    ProviderError,
    QuotaExhaustedError,
    RateLimitedError,
    TransportError,
    Usage,
)
from conclave.providers.http import HTTPProvider, approx_tokens, parse_object, parse_retry_after
from conclave.providers.schema_hints import restrict_keywords

log = logging.getLogger(__name__)

_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
#: how long an explicit cached content lives (it is deleted at the end of the consultation anyway); the price
#: sheet's ``cache_write_input`` for Gemini includes this long a storage
CACHE_TTL_S = 600

#: the keywords Gemini documents for ``generationConfig.responseJsonSchema``
GEMINI_KEYWORDS = frozenset({
    "$id", "$defs", "$ref", "$anchor", "type", "format", "title", "description", "enum", "items", "prefixItems",
    "minItems", "maxItems", "minimum", "maximum", "anyOf", "oneOf", "properties", "additionalProperties", "required",
    "propertyOrdering",
})


def min_cache_tokens(model: str) -> int:
    """The smallest context Gemini caches for ``model`` (Flash models 1,024 tokens, the others 4,096)."""
    return 1024 if "flash" in model else 4096


class GeminiProvider(HTTPProvider):
    """Google Gemini API (AI Studio keys)."""

    DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
    DEFAULT_KEY_ENV = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
    KEY_VARIABLES = DEFAULT_KEY_ENV
    KEYED_HOSTS: ClassVar[frozenset[str]] = frozenset({"generativelanguage.googleapis.com"})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: (model, cache key) -> the cached content's name, or None when it could not be created (or expired)
        self._caches: dict[tuple[str, str], str | None] = {}
        self._creating: dict[tuple[str, str], asyncio.Lock] = {}
        #: cached content name -> tokens it holds, until a completed call carries its creation in its usage
        self._unbilled: dict[str, int] = {}
        self._created: list[str] = []

    def auth_headers(self, key: str) -> dict[str, str]:
        return {"x-goog-api-key": key}  # a header, never ?key=: URLs end up in logs

    def is_auth_failure(self, status: int, message: str) -> bool:
        # Gemini answers an invalid key with 400 INVALID_ARGUMENT "API key not valid".
        return status in (401, 403) or (status == 400 and "api key" in message.lower())

    def body(self, request: CompletionRequest, cached_content: str | None = None) -> dict[str, Any]:
        """The request body for ``request`` (what the API receives, key excluded); with ``cached_content`` the
        consultation's shared prefix is referenced instead of sent."""
        contents: list[dict[str, Any]] = [
            {"role": "model" if m.role == "assistant" else "user", "parts": [{"text": m.content}]}
            for m in request.messages
        ]
        body: dict[str, Any] = {"contents": contents}
        if cached_content is not None and request.cache is not None:
            body["cachedContent"] = cached_content
            _, own = request.cache.split(request.system)
            if own and contents:
                contents[0]["parts"].insert(0, {"text": own})
        elif request.system:
            body["systemInstruction"] = {"parts": [{"text": request.system}]}
        config: dict[str, Any] = {"maxOutputTokens": request.max_tokens}
        if request.temperature is not None:
            config["temperature"] = request.temperature
        if request.json_schema is not None:
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = restrict_keywords(request.json_schema, GEMINI_KEYWORDS)
        body["generationConfig"] = config
        if request.images and contents and self.accepts_images(request.model):
            # the attached images go with the first user turn, as inline data (base64)
            contents[0]["parts"] += [{"inline_data": {"mime_type": image.media_type, "data": image.base64()}}
                                     for image in request.images]
        return body

    # ------------------------------------------------------------------------------------- explicit caching

    def _explicit(self, request: CompletionRequest) -> bool:
        """A cached content is created for the models the first round calls two or more times at once: those
        calls all miss the implicit cache, and one creation (input price plus 10 minutes of storage: 1.6 × for
        2.5 Pro) costs less than two uncached prefixes. A model with one seat is left to implicit caching, which
        serves its later calls at the cached rate without the storage (no saving is promised)."""
        cache = request.cache
        if cache is None or cache.stable_chars <= 0 or not self.sends_cache_hints():
            return False
        if (self.name, request.model) not in cache.together:
            return False
        stable, _ = cache.split(request.system)
        return approx_tokens(stable) >= min_cache_tokens(request.model.removeprefix("models/"))

    def cache_rule(self, model: str, stable_tokens: int) -> CacheRule | None:
        # implicit caching promises no saving, so only the explicit cache counts in an estimate
        if not self.sends_cache_hints() or stable_tokens < min_cache_tokens(model.removeprefix("models/")):
            return None
        return CacheRule(shared_by="model", created_once=True)

    async def _cached_content(self, request: CompletionRequest) -> str | None:
        """The name of the consultation's cached content for ``request.model``, created by the first call that
        needs it (the others wait for it); None when explicit caching does not apply or creation failed."""
        if not self._explicit(request) or request.cache is None:
            return None
        model = request.model.removeprefix("models/")
        key = (model, request.cache.key)
        if key in self._caches:
            return self._caches[key]
        async with self._creating.setdefault(key, asyncio.Lock()):
            if key not in self._caches:
                self._caches[key] = await self._create_cache(request, model)
        return self._caches[key]

    async def _create_cache(self, request: CompletionRequest, model: str) -> str | None:
        assert request.cache is not None
        stable, _ = request.cache.split(request.system)
        body = {"model": f"models/{model}", "displayName": request.cache.key,
                "systemInstruction": {"parts": [{"text": stable}]}, "ttl": f"{CACHE_TTL_S}s"}
        try:
            payload = await self.post_json(f"{self.base_url}/cachedContents", body, request.model)
        except ProviderError as exc:
            log.info("%s: no cached content for %s (%s); calls carry the whole prompt", self.name, model, exc)
            return None
        name = payload.get("name")
        if not isinstance(name, str) or not name.startswith("cachedContents/"):
            log.info("%s: the cached content for %s came back without a name; calls carry the whole prompt",
                     self.name, model)
            return None
        self._created.append(name)
        self._unbilled[name] = int((payload.get("usageMetadata") or {}).get("totalTokenCount") or 0)
        return name

    def _forget(self, request: CompletionRequest, name: str, exc: ProviderError) -> None:
        log.info("%s: cached content %s is unusable (%s); calls carry the whole prompt", self.name, name, exc)
        if request.cache is not None:
            self._caches[(request.model.removeprefix("models/"), request.cache.key)] = None

    def _with_creation(self, usage: Usage, name: str | None) -> Usage:
        """The first completed call after a cached content was created carries its creation (a cache write),
        also when the content then proved unusable: the creation was billed all the same."""
        tokens = self._unbilled.pop(name, 0) if name is not None else 0
        return usage + Usage(input_tokens=tokens, cache_write_tokens=tokens) if tokens else usage

    async def close(self) -> None:
        """Delete the cached contents this consultation created (they would expire on their own after the TTL)."""
        created, self._created = self._created, []
        if self.session is None:
            return
        for name in created:
            with contextlib.suppress(TransportError, TimeoutError, OSError):
                async with self.session.request("DELETE", f"{self.base_url}/{name}", headers=self.headers(""),
                                                timeout_s=5) as resp:
                    await resp.read()

    def special_error(self, status: int, payload: Mapping[str, Any], message: str, headers: Mapping[str, str],
                      kw: dict[str, Any]) -> ProviderError | None:
        if status != 429:
            return None
        details = [d for d in payload.get("details") or [] if isinstance(d, Mapping)]
        quota_ids = [str(v.get("quotaId", "")) for d in details if d.get("@type") == _QUOTA_FAILURE
                     for v in d.get("violations") or [] if isinstance(v, Mapping)]
        daily = [q for q in quota_ids if "perday" in q.lower()]
        if daily:
            return QuotaExhaustedError(
                f"{self.name} per-day quota exhausted ({daily[0]}); it resets at midnight Pacific time: {message}",
                **kw)
        delays = [_seconds(d.get("retryDelay")) for d in details if d.get("@type") == _RETRY_INFO]
        known = [d for d in (*delays, parse_retry_after(headers)) if d is not None]
        wait = max(known) if known else None
        hint = f"; retry after {wait:g}s" if wait is not None else ""
        return RateLimitedError(f"{self.name} rate-limited model {kw['model']!r} (HTTP 429{hint}): {message}",
                                retry_after_s=wait, **kw)

    def _url(self, model: str, method: str) -> str:
        model_id = model.removeprefix("models/")
        return f"{self.base_url}/models/{quote(model_id, safe='.-_')}:{method}"

    async def attempt(self, request: CompletionRequest) -> Completion:
        started = time.perf_counter()
        name = await self._cached_content(request)
        try:
            payload = await self.post_json(self._url(request.model, "generateContent"), self.body(request, name),
                                           request.model)
        except ProviderError as exc:
            if name is None or not _cache_refused(exc):
                raise
            self._forget(request, name, exc)
            payload = await self.post_json(self._url(request.model, "generateContent"), self.body(request),
                                           request.model)
        text, finish = self._candidate(payload, request.model)
        if finish is None and not text:
            raise self.truncated("the answer has neither text nor a finish reason", request.model)
        completion = self._completion(request, text, finish, payload.get("usageMetadata"),
                                      payload.get("modelVersion"), started)
        return replace(completion, usage=self._with_creation(completion.usage, name))

    async def attempt_stream(self, request: CompletionRequest) -> AsyncIterator[str | Completion]:
        started = time.perf_counter()
        name = await self._cached_content(request)
        parts: list[str] = []
        finish: str | None = None
        usage: Any = None
        model: Any = None
        url = self._url(request.model, "streamGenerateContent") + "?alt=sse"
        for attempt_name in (name, None) if name is not None else (None,):
            events = self.post_sse(url, self.body(request, attempt_name), request.model)
            try:
                async with contextlib.aclosing(events):
                    async for _name, data in events:
                        chunk = self.decode_event(data, request.model)
                        text, chunk_finish = self._candidate(chunk, request.model)
                        if text:
                            parts.append(text)
                            yield text
                        finish = chunk_finish or finish
                        usage = chunk.get("usageMetadata") or usage
                        model = chunk.get("modelVersion") or model
            except ProviderError as exc:
                if attempt_name is None or parts or not _cache_refused(exc):
                    raise
                self._forget(request, attempt_name, exc)
                continue
            break
        # Gemini's stream has no terminator: the last chunk carries the finish reason, so its absence = truncated.
        if finish is None:
            raise self.truncated("the stream ended without a finish reason", request.model)
        completion = self._completion(request, "".join(parts), finish, usage, model, started)
        yield replace(completion, usage=self._with_creation(completion.usage, name))

    def _candidate(self, payload: dict[str, Any], model: str) -> tuple[str, str | None]:
        candidates = payload.get("candidates")
        if not candidates:
            feedback = payload.get("promptFeedback") or {}
            if feedback.get("blockReason"):
                raise BadRequestError(f"{self.name} blocked the prompt for {model}: {feedback['blockReason']}",
                                      provider=self.name, model=model)
            return "", None
        first = candidates[0] if isinstance(candidates, list) and isinstance(candidates[0], dict) else {}
        parts = (first.get("content") or {}).get("parts") or []
        # "thought" parts are the model's reasoning summary, not its answer
        text = "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict) and not p.get("thought"))
        return text, first.get("finishReason")

    def _completion(self, request: CompletionRequest, text: str, finish: str | None, usage: Any, model: Any,
                    started: float) -> Completion:
        return Completion(
            text=text,
            parsed=parse_object(text) if request.json_schema is not None else None,
            usage=_usage(usage),
            model=str(model or request.model.removeprefix("models/")),
            provider=self.name,
            finish_reason=finish,
            latency_s=time.perf_counter() - started,
        )

    def batch_client(self) -> BatchClient | None:
        # the Gemini API's batch mode on Google's host; a custom base_url only when it says so (batch_api: on)
        mode = self.settings.batch_api
        return GeminiBatch(self) if mode == "on" or (mode == "auto" and self.is_official()) else None

    def answer_of(self, payload: dict[str, Any], request: CompletionRequest) -> Completion:
        """The :class:`Completion` of a ``generateContent`` answer (a batch's inlined response)."""
        text, finish = self._candidate(payload, request.model)
        if finish is None and not text:
            raise self.truncated("the answer has neither text nor a finish reason", request.model)
        return self._completion(request, text, finish, payload.get("usageMetadata"), payload.get("modelVersion"),
                                time.perf_counter())

    async def list_models(self) -> list[str] | None:
        ids: list[str] = []
        url = f"{self.base_url}/models?pageSize=1000"
        for _page in range(20):  # bounded: a misbehaving proxy must not loop us forever
            payload = await self.get_json(url, timeout_s=10.0)
            models = payload.get("models")
            if not isinstance(models, list):
                raise self.malformed("the models list has no models array", "")
            ids += [str(m["name"]).removeprefix("models/") for m in models if isinstance(m, dict) and "name" in m]
            token = payload.get("nextPageToken")
            if not token:
                break
            url = f"{self.base_url}/models?pageSize=1000&pageToken={quote(str(token))}"
        return ids


class GeminiBatch(BatchClient):
    """Gemini batch mode: one model's requests inlined in ``models/{model}:batchGenerateContent`` (each keyed by its
    custom id in ``metadata``), the batch polled at ``batches/{id}``, its inlined responses read once it succeeded.
    The shared prefix is sent in full in every request (no cached content is created for a batch)."""

    limit = 100_000  # inlined requests are bounded by the 20 MB request size as well
    _STATES: ClassVar[dict[str, str]] = {"BATCH_STATE_SUCCEEDED": "completed", "BATCH_STATE_EXPIRED": "expired",
                                         "BATCH_STATE_CANCELLED": "cancelled", "BATCH_STATE_FAILED": "failed"}

    def __init__(self, provider: GeminiProvider) -> None:
        self.provider = provider

    async def submit(self, requests: Sequence[tuple[str, CompletionRequest]], *, tag: str) -> str:
        p = self.provider
        model = requests[0][1].model
        body = {"batch": {"displayName": f"conclave-{tag}", "inputConfig": {"requests": {"requests": [
            {"request": p.body(request), "metadata": {"key": custom_id}} for custom_id, request in requests]}}}}
        job = p.decode(await p.send("POST", p._url(model, "batchGenerateContent"), json_body=body), model)
        name = job.get("name") or (job.get("metadata") or {}).get("name")
        if not isinstance(name, str):
            raise p.malformed("the batch was created without a name", model)
        return name.removeprefix("batches/")

    async def find(self, tag: str, count: int, since: float) -> str | None:
        """The batch whose ``displayName`` carries ``tag``, in ``GET batches`` (newest first, paged by
        ``pageToken``)."""
        p = self.provider
        token = ""
        for _ in range(BATCH_LIST_PAGES):
            page = p.decode(await p.send("GET", f"{p.base_url}/batches?pageSize=100{token}"), "")
            jobs = [j for j in page.get("operations") or [] if isinstance(j, dict)]
            for job in jobs:
                metadata = job.get("metadata") or {}
                if metadata.get("displayName") == f"conclave-{tag}":
                    return str(job.get("name") or metadata.get("name")).removeprefix("batches/")
            oldest = _epoch((jobs[-1].get("metadata") or {}).get("createTime")) if jobs else None
            if not page.get("nextPageToken") or (oldest is not None and oldest < since - BATCH_CLOCK_SKEW_S):
                return None
            token = f"&pageToken={quote(str(page['nextPageToken']))}"
        return None

    async def _job(self, batch_id: str) -> dict[str, Any]:
        p = self.provider
        return p.decode(await p.send("GET", f"{p.base_url}/batches/{batch_id}"), "")

    async def status(self, batch_id: str) -> BatchStatus:
        metadata = (await self._job(batch_id)).get("metadata") or {}
        stats = metadata.get("batchStats") or {}
        state = str(metadata.get("state"))
        total = int(stats.get("requestCount") or 0)
        failed = int(stats.get("failedRequestCount") or 0)
        done = total - int(stats.get("pendingRequestCount") or 0)
        return BatchStatus(self._STATES.get(state, "in_progress"), state, total, done, failed)  # type: ignore[arg-type]

    async def results(self, batch_id: str, requests: Mapping[str, CompletionRequest]
                      ) -> dict[str, Completion | ProviderError]:
        p = self.provider
        metadata = (await self._job(batch_id)).get("metadata") or {}
        responses = ((metadata.get("output") or {}).get("inlinedResponses") or {}).get("inlinedResponses") or []
        out: dict[str, Completion | ProviderError] = {}
        for entry in responses:
            key = str(((entry or {}).get("metadata") or {}).get("key"))
            request = requests.get(key)
            if request is None:
                continue
            try:
                if isinstance(entry.get("response"), dict):
                    out[key] = p.answer_of(entry["response"], request)
                elif isinstance(entry.get("error"), dict):
                    error = entry["error"]
                    out[key] = p.error_for(int(error.get("code") or 500), json.dumps({"error": error}).encode(), {},
                                           request.model)
                else:
                    out[key] = p.malformed("a batch response that is neither an answer nor an error", request.model)
            except ProviderError as exc:
                out[key] = exc
        return out

    async def cancel(self, batch_id: str) -> None:
        p = self.provider
        await p.send("POST", f"{p.base_url}/batches/{batch_id}:cancel")


def _cache_refused(exc: ProviderError) -> bool:
    """Whether Gemini refused a request because of its ``cachedContent`` (expired, deleted, another model's)."""
    return exc.status in (400, 403, 404) and "cachedcontent" in str(exc).lower().replace(" ", "").replace("_", "")


def _epoch(value: Any) -> float | None:
    """An RFC 3339 timestamp as epoch seconds; None when absent or unreadable."""
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


def _seconds(value: Any) -> float | None:
    """A protobuf Duration in JSON (``"33s"``, ``"1.5s"``) as seconds; None when absent or unreadable."""
    if not isinstance(value, str) or not value.endswith("s"):
        return None
    try:
        return max(0.0, float(value[:-1]))
    except ValueError:
        return None


def _usage(raw: Any) -> Usage:
    """Thinking tokens are billed as output, so they count as output here."""
    if not isinstance(raw, dict):
        return Usage()
    return Usage(
        input_tokens=int(raw.get("promptTokenCount") or 0),
        output_tokens=int(raw.get("candidatesTokenCount") or 0) + int(raw.get("thoughtsTokenCount") or 0),
        cached_input_tokens=int(raw.get("cachedContentTokenCount") or 0),
    )


@hookimpl
def register_providers(register: Any) -> None:
    register("gemini", GeminiProvider)


@hookimpl
def register_price_sheets(register: Any) -> None:
    register("gemini", resources.files("conclave_plugins").joinpath("pricing", "gemini.yaml"))
