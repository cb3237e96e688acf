"""Built-in ``openai`` provider: Chat Completions against any OpenAI-compatible endpoint.

The same implementation serves OpenAI, xAI (grok), Mistral and local servers (Ollama, llama.cpp, vLLM): the
config picks the endpoint (``providers.<name>.base_url``) and the key variable. Structured output is negotiated per
(base URL, model) (:mod:`conclave.providers.structured`): api.openai.com gets ``response_format: {type: json_schema,
strict: true}`` with the schema's strict-mode variant (every property required, optionals nullable, constraints
strict mode rejects moved into descriptions; the answer's ``null`` optionals are dropped again, so ``parsed`` matches
the original schema); every other server gets the full schema, as ``json_schema``, else ``json_object`` with a
``schema``, else written into the prompt. Streaming uses SSE with ``include_usage``.

Prompt caching is automatic on OpenAI for prompts of 1,024 tokens or more: the longest previously seen prefix
(in 128-token steps) is billed at the cached rate. The cached prefix is the tools, then the ``response_format``
schema ("a prefix to the system message"), then the messages. The system message opens with the consultation's
context, the same bytes in every call, and the call's ``prompt_cache_key`` (the consultation's key; sent to
api.openai.com, or anywhere with ``prompt_cache: on``) routes its calls to the same cache.

A schema per round in ``response_format`` would split that cache by round, so where the tools layout applies
(:meth:`OpenAIProvider.uses_tools`: api.openai.com with ``prompt_cache`` auto or on, or a custom ``base_url`` —
a proxy or stand-in for it — with ``prompt_cache: on``, and a context long enough to cache) every artifact schema the
model is asked for in the consultation (all of them for a model that is agent and judge; the agents' rounds' for a
model that only answers as an agent) is sent as a strict function tool, always the same list in the same order, and
the round's own is forced with ``tool_choice`` (which is not part of the cached prefix); the call's ``arguments``
are the artifact.
Every call of the model then shares tools + context. xAI's and Mistral's hosts keep ``response_format``: their
caches and strict function calling are not documented to behave the same way, so nothing there is changed.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from importlib import resources
from typing import Any, ClassVar
from urllib.parse import quote, urlsplit

from conclave.artifacts.schema_refs import deref, drop_null_optionals, resolver_for
from conclave.hookspecs import hookimpl
from conclave.providers.base import (
    BATCH_CLOCK_SKEW_S,
    BATCH_LIST_PAGES,
    BatchClient,
    BatchStatus,
    CacheRule,
    Completion,
    CompletionRequest,
    FilePart,
    ImagePart,
    PromptCache,
    ProviderError,
    QuotaExhaustedError,
    RefusalError,
    ServerError,
    StructuredOutputRejectedError,
    Usage,
)
from conclave.providers.http import HTTPProvider, api_name, approx_tokens, parse_object, schema_name
from conclave.providers.pacing import Allowance, RateLimits
from conclave.providers.schema_hints import (
    CAPPED_MAX_ITEMS,
    anchored_patterns_only,
    bounded_lengths,
    bounded_numbers_as_choices,
    capped_items,
    describe_constraints,
)
from conclave.providers.structured import is_rejection, memory_for, next_forms, prompt_instruction

log = logging.getLogger(__name__)

OPENAI_HOST = "api.openai.com"
#: the shortest prompt OpenAI's automatic prompt cache serves
OPENAI_MIN_CACHED = 1024
_TOOL_DESCRIPTION = "Record your answer. Call this function exactly once with the complete answer."


class OpenAIProvider(HTTPProvider):
    """OpenAI Chat Completions (``POST {base_url}/chat/completions``)."""

    DEFAULT_BASE_URL = f"https://{OPENAI_HOST}/v1"
    DEFAULT_KEY_ENV = ("OPENAI_API_KEY",)
    KEY_VARIABLES = ("OPENAI_API_KEY", "XAI_API_KEY", "MISTRAL_API_KEY")  # the hosts it speaks to: OpenAI, xAI, Mistral
    KEYED_HOSTS: ClassVar[frozenset[str]] = frozenset({OPENAI_HOST, "api.x.ai", "api.mistral.ai"})

    def default_base_url(self) -> str:
        return self._environ.get("OPENAI_BASE_URL") or self.DEFAULT_BASE_URL

    def is_openai(self) -> bool:
        """api.openai.com itself: the only endpoint whose ``json_schema`` is strict mode."""
        return self.is_official() and urlsplit(self.base_url).hostname == OPENAI_HOST

    def rate_limits(self, headers: Mapping[str, str]) -> RateLimits | None:
        """``x-ratelimit-remaining-requests`` and ``x-ratelimit-reset-requests`` (a duration such as ``6m0s`` or
        ``20ms``: the time until the limit is whole again), the same for ``-tokens``; sent with every answer."""
        requests, tokens = (_allowance(headers, what) for what in ("requests", "tokens"))
        return None if requests is None and tokens is None else RateLimits(requests, tokens)

    # ------------------------------------------------------------------------------------- structured output

    def forms(self, request: CompletionRequest) -> list[str]:
        """The structured-output forms to try for ``request``, in order (a single one when it has no schema)."""
        if request.json_schema is None:
            return ["off"]
        remembered = memory_for(self._environ).get(self.base_url, request.model)
        return next_forms(self.settings.structured_output, remembered)

    def _fallback(self, exc: ProviderError, form: str, remaining: list[str], request: CompletionRequest) -> bool:
        """Whether ``exc`` is the server rejecting ``form`` and another form is left to try (then say so)."""
        if not remaining or not is_rejection(exc.status, str(exc)):
            return False
        log.info("%s (%s, %s) rejected structured output as %s (HTTP %s); asking with %s from now on",
                 self.name, self.base_url, request.model, form, exc.status, remaining[0])
        memory_for(self._environ).remember(self.base_url, request.model, remaining[0])
        return True

    def _rejected_form(self, exc: ProviderError, form: str) -> ProviderError:
        """A forced form the server rejects: a configuration problem, said as one."""
        if self.settings.structured_output == "auto" or not is_rejection(exc.status, str(exc)):
            return exc
        return StructuredOutputRejectedError(
            f"{exc} — providers.{self.name}.structured_output={form} is not accepted by {self.base_url}; "
            "set it to auto to negotiate a form", provider=self.name, model=exc.model, status=exc.status)

    def tool_layout(self) -> bool:
        """Whether this endpoint gets the consultation's schemas as function tools when a call carries the cache
        hint: api.openai.com unless ``prompt_cache: off``; a custom ``base_url`` (a proxy or stand-in for OpenAI)
        only with ``prompt_cache: on``; never xAI's or Mistral's hosts, nor llama.cpp/vLLM/Ollama by default."""
        mode = self.settings.prompt_cache
        return (mode != "off" and self.is_openai()) or (mode == "on" and not self.is_official())

    def uses_tools(self, request: CompletionRequest, form: str) -> bool:
        """Whether ``request`` asked in ``form`` is sent in the tools layout: the endpoint takes it, the request
        carries the consultation's schemas and a shared prefix long enough to be cached, and the structured-output
        form is ``json_schema`` (for a call without a schema, such as a cache warm-up: the form a schema would get
        here, so a warm-up writes the prefix the rounds read)."""
        cache = request.cache
        if cache is None or not cache.schemas or not self.tool_layout():
            return False
        if approx_tokens(cache.split(request.system)[0]) < OPENAI_MIN_CACHED:
            return False
        if request.json_schema is None:
            return self._schema_form(request.model) == "json_schema"
        return form == "json_schema"

    def body(self, request: CompletionRequest, *, stream: bool, form: str | None = None) -> dict[str, Any]:
        """The request body for ``request`` asked in structured-output ``form`` (what the API receives, key
        excluded); ``form`` defaults to the first one :meth:`forms` would try."""
        form = form or self.forms(request)[0]
        tools = self.uses_tools(request, form)
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages += [{"role": m.role, "content": m.content} for m in request.messages]
        body: dict[str, Any] = {"model": request.model, "messages": messages}
        # api.openai.com rejects max_tokens for its reasoning models; compatible servers only know max_tokens.
        limit_key = "max_completion_tokens" if urlsplit(self.base_url).hostname == OPENAI_HOST else "max_tokens"
        body[limit_key] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        schema = request.json_schema
        if tools and request.cache is not None:
            # every schema of the consultation, always in the same order: the tools open the cached prefix
            body["tools"] = _tools(request.cache.schemas_for(self.name, request.model),
                                   request if schema is not None else None)
            body["tool_choice"] = ({"type": "function", "function": {"name": schema_name(request)}}
                                   if schema is not None else "none")
        elif schema is not None and form == "json_schema":
            if self.is_openai():
                body["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": schema_name(request), "schema": _strict_schema(_canonical(schema)), "strict": True}}
            else:  # servers that enforce a raw schema get all of it, constraints included
                body["response_format"] = {"type": "json_schema", "json_schema": {
                    "name": schema_name(request), "schema": self._enforced_schema(request, schema)}}
        elif schema is not None and form == "json_object":
            if self.is_official():  # the vendors' json_object takes no schema: the model reads it in the prompt
                body["response_format"] = {"type": "json_object"}
                _append_to_last_user(messages, prompt_instruction(schema))
            else:  # llama.cpp and llama-cpp-python turn this schema into a grammar
                body["response_format"] = {"type": "json_object", "schema": self._enforced_schema(request, schema)}
        elif schema is not None and form == "prompt":
            _append_to_last_user(messages, prompt_instruction(schema))
        if request.images and self.accepts_images(request.model):
            _attach_images(messages, request.images)
        if request.cache is not None and self.sends_cache_hints_to_openai():
            body["prompt_cache_key"] = request.cache.key
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return _sdk_order(body)

    def encode(self, body: Mapping[str, Any]) -> bytes:
        # as the official SDK serializes it (compact, UTF-8, no NaN): with _sdk_order, the SDK's own bytes
        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def _enforced_schema(self, request: CompletionRequest, schema: Any) -> dict[str, Any]:
        """The schema a server that enforces it receives. A vendor's own host gets every constraint as written;
        any other server (llama.cpp, llama-cpp-python, vLLM, Ollama: they compile it into a grammar) also gets
        lengths by ``grammar_lengths``: ``cap`` (default) bounds arrays so no list runs away, ``fit`` also fits
        array and string lengths to the call's ``max_tokens`` so a small model cannot loop until the budget cuts its
        answer (strings get short: meant for tiny models), ``off`` adds none."""
        lengths = "off" if self.is_official() else self.settings.grammar_lengths
        return _grammar_schema(_canonical(schema), lengths, request.max_tokens if lengths == "fit" else None)

    def prepare_schemas(self, model: str, schemas: Sequence[Mapping[str, Any]]) -> None:
        # the strict variant (api.openai.com and every tool list) and the grammar form (other servers), both
        # computed once per distinct schema; a length fit to each call's max_tokens is left to the call
        lengths = "off" if self.is_official() else self.settings.grammar_lengths
        for schema in schemas:
            canonical = _canonical(schema)
            _strict_schema(canonical)
            if lengths != "fit":
                _grammar_schema(canonical, lengths, None)

    def sends_cache_hints_to_openai(self) -> bool:
        """``prompt_cache_key`` is OpenAI's own parameter: with ``prompt_cache: auto`` only api.openai.com gets it
        (xAI and Mistral, on the same implementation, document no such field); ``on`` sends it anywhere."""
        mode = self.settings.prompt_cache
        return mode == "on" or (mode == "auto" and self.is_openai())

    def cache_rule(self, model: str, stable_tokens: int) -> CacheRule | None:
        # automatic on the vendor's side, whatever the hints: a 1,024-token prefix, shared by every call to the model
        # in the tools layout, else only by calls with one schema (the schema precedes the prompt)
        if stable_tokens < OPENAI_MIN_CACHED or self.costs_nothing():
            return None
        if self.tool_layout() and self._schema_form(model) == "json_schema":
            return CacheRule(shared_by="model")
        return CacheRule(shared_by="model+schema")

    def cached_definitions(self, model: str, cache: PromptCache, stable_tokens: int) -> str:
        if not cache.schemas or not self.tool_layout() or stable_tokens < OPENAI_MIN_CACHED:
            return ""
        if self._schema_form(model) != "json_schema":
            return ""
        return json.dumps(_tools(cache.schemas_for(self.name, model), None))

    def _schema_form(self, model: str) -> str:
        """The first structured-output form a call to ``model`` with a schema is asked in."""
        return next_forms(self.settings.structured_output, memory_for(self._environ).get(self.base_url, model))[0]

    def special_error(self, status: int, payload: Mapping[str, Any], message: str, headers: Mapping[str, str],
                      kw: dict[str, Any]) -> ProviderError | None:
        if status == 429 and "insufficient_quota" in (payload.get("code"), payload.get("type")):
            return QuotaExhaustedError(
                f"{self.name} quota exhausted for this key — check billing (HTTP 429 insufficient_quota): {message}",
                **kw)
        return None

    # ------------------------------------------------------------------------------------- calls

    async def attempt(self, request: CompletionRequest) -> Completion:
        forms = self.forms(request)
        while True:
            form = forms.pop(0)
            try:
                return await self._attempt_form(request, form)
            except ProviderError as exc:
                if not self._fallback(exc, form, forms, request):
                    raise self._rejected_form(exc, form) from None

    async def _attempt_form(self, request: CompletionRequest, form: str) -> Completion:
        started = time.perf_counter()
        payload = await self.post_json(f"{self.base_url}/chat/completions",
                                       self.body(request, stream=False, form=form), request.model)
        return self.completion_from(payload, request, form, time.perf_counter() - started)

    def completion_from(self, payload: Mapping[str, Any], request: CompletionRequest, form: str,
                        latency_s: float) -> Completion:
        """The :class:`Completion` of a Chat Completions answer to ``request`` asked in ``form`` (an interactive
        call's body, or one line of a batch's output)."""
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self.malformed("no choices in the answer", request.model)
        message = choices[0].get("message") or {}
        text = message.get("content")
        arguments = _call_arguments(message.get("tool_calls"), request)
        if arguments is not None:  # the tools layout: the forced call's arguments are the answer
            text = arguments
        if not text and message.get("refusal"):
            raise self.refusal(str(message["refusal"]), request.model)
        if not isinstance(text, str):
            text = ""
        finish = choices[0].get("finish_reason")
        if not text and not finish:
            raise self.truncated("the answer has neither content nor a finish reason", request.model)
        return Completion(
            text=text,
            parsed=_parsed(text, request),
            usage=_usage(payload.get("usage")),
            model=str(payload.get("model") or request.model),
            provider=self.name,
            finish_reason=finish,
            latency_s=latency_s,
            structured_output=form if request.json_schema is not None else None,
        )

    def batch_client(self) -> BatchClient | None:
        # api.openai.com has the Batch API; a custom base_url only when it says so (batch_api: on)
        mode = self.settings.batch_api
        return OpenAIBatch(self) if mode == "on" or (mode == "auto" and self.is_openai()) else None

    async def attempt_stream(self, request: CompletionRequest) -> AsyncIterator[str | Completion]:
        forms = self.forms(request)
        while True:
            form = forms.pop(0)
            sent_any = False
            try:
                async for item in self._stream_form(request, form):
                    sent_any = sent_any or isinstance(item, str)
                    yield item
                return
            except ProviderError as exc:
                if sent_any or not self._fallback(exc, form, forms, request):
                    raise self._rejected_form(exc, form) from None

    async def _stream_form(self, request: CompletionRequest, form: str) -> AsyncIterator[str | Completion]:
        started = time.perf_counter()
        parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}  # streamed tool calls by index: name and argument pieces
        refusal: list[str] = []
        usage = Usage()
        finish: str | None = None
        model = request.model
        done = False
        events = self.post_sse(f"{self.base_url}/chat/completions", self.body(request, stream=True, form=form),
                               request.model)
        async with contextlib.aclosing(events):
            async for _event, data in events:
                if data.strip() == "[DONE]":
                    done = True
                    break
                chunk = self.decode_event(data, request.model)
                if isinstance(chunk.get("error"), dict):  # some servers report mid-stream failures in-band
                    error = self.malformed(str(chunk["error"].get("message", "error event")), request.model)
                    error.billed = True
                    raise error
                model = str(chunk.get("model") or model)
                if chunk.get("usage"):
                    usage = _usage(chunk["usage"])
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    piece = delta.get("content")
                    if isinstance(piece, str) and piece:
                        parts.append(piece)
                        yield piece
                    for call in delta.get("tool_calls") or []:  # a call streams its name, then argument pieces
                        if not isinstance(call, dict):
                            continue
                        index = call["index"] if isinstance(call.get("index"), int) else 0
                        entry = calls.setdefault(index, {"name": None, "arguments": []})
                        function = call.get("function") or {}
                        entry["name"] = function.get("name") or entry["name"]
                        if isinstance(function.get("arguments"), str) and function["arguments"]:
                            entry["arguments"].append(function["arguments"])
                            yield function["arguments"]
                    if isinstance(delta.get("refusal"), str):  # a refusal streams apart from the content
                        refusal.append(delta["refusal"])
                    finish = choice.get("finish_reason") or finish
        text = "".join(parts)
        arguments = _call_arguments([{"function": {"name": c["name"], "arguments": "".join(c["arguments"])}}
                                     for _, c in sorted(calls.items())], request)
        if arguments is not None:
            text = arguments
        if not text and refusal:
            raise self.refusal("".join(refusal), request.model)
        # Some compatible servers omit [DONE]; a stream that never reached a finish reason is cut off, though, and
        # one that ends with no content and no finish reason ([DONE] or not) is no answer at all.
        if finish is None and (not done or not text):
            raise self.truncated("the stream ended before a finish reason" + ("" if done else " or [DONE]"),
                                 request.model)
        yield Completion(
            text=text,
            parsed=_parsed(text, request),
            usage=usage,
            model=model,
            provider=self.name,
            finish_reason=finish,
            latency_s=time.perf_counter() - started,
            structured_output=form if request.json_schema is not None else None,
        )

    def refusal(self, text: str, model: str) -> RefusalError:
        return RefusalError(f"{self.name} refused to answer: {self.redact(text)}", provider=self.name, model=model)

    async def list_models(self) -> list[str] | None:
        payload = await self.get_json(f"{self.base_url}/models", timeout_s=10.0)
        data = payload.get("data")
        if not isinstance(data, list):
            raise self.malformed("the models list has no data array", "")
        return [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item]


class OpenAIBatch(BatchClient):
    """OpenAI's Batch API: the requests as a JSONL file (``purpose: batch``), one batch on ``/v1/chat/completions``
    with a 24 h window, its output and error files read back line by line."""

    limit = 50_000
    _STATES: ClassVar[dict[str, str]] = {"completed": "completed", "expired": "expired", "cancelled": "cancelled",
                                         "failed": "failed"}

    def __init__(self, provider: OpenAIProvider) -> None:
        self.provider = provider

    async def submit(self, requests: Sequence[tuple[str, CompletionRequest]], *, tag: str) -> str:
        p = self.provider
        lines = [json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                             "body": p.body(request, stream=False, form=p.forms(request)[0])}, ensure_ascii=False)
                 for custom_id, request in requests]
        upload = FilePart(("\n".join(lines) + "\n").encode(), "conclave-batch.jsonl", "application/jsonl")
        uploaded = p.decode(await p.send("POST", f"{p.base_url}/files", form={"purpose": "batch", "file": upload}),
                            "")
        batch = p.decode(await p.send("POST", f"{p.base_url}/batches", json_body={
            "input_file_id": uploaded.get("id"), "endpoint": "/v1/chat/completions", "completion_window": "24h",
            "metadata": {TAG_KEY: tag}}), "")
        if not isinstance(batch.get("id"), str):
            raise p.malformed("the batch was created without an id", "")
        return str(batch["id"])

    async def find(self, tag: str, count: int, since: float) -> str | None:
        """The batch whose ``metadata`` carries ``tag``, in ``GET /batches`` (newest first, paged by ``after``)."""
        p = self.provider
        after = ""
        for _ in range(BATCH_LIST_PAGES):
            page = p.decode(await p.send("GET", f"{p.base_url}/batches?limit=100{after}"), "")
            data = [b for b in page.get("data") or [] if isinstance(b, dict)]
            for batch in data:
                if (batch.get("metadata") or {}).get(TAG_KEY) == tag:
                    return str(batch["id"])
            if not data or not page.get("has_more") or float(data[-1].get("created_at") or 0) < since - \
                    BATCH_CLOCK_SKEW_S:
                return None
            after = f"&after={quote(str(data[-1]['id']))}"
        return None

    async def _batch(self, batch_id: str) -> dict[str, Any]:
        p = self.provider
        return p.decode(await p.send("GET", f"{p.base_url}/batches/{batch_id}"), "")

    async def status(self, batch_id: str) -> BatchStatus:
        batch = await self._batch(batch_id)
        counts = batch.get("request_counts") or {}
        status = str(batch.get("status"))
        return BatchStatus(self._STATES.get(status, "in_progress"), status,  # type: ignore[arg-type]
                           int(counts.get("total") or 0), int(counts.get("completed") or 0),
                           int(counts.get("failed") or 0))

    async def results(self, batch_id: str, requests: Mapping[str, CompletionRequest]
                      ) -> dict[str, Completion | ProviderError]:
        p = self.provider
        batch = await self._batch(batch_id)
        out: dict[str, Completion | ProviderError] = {}
        for key in ("output_file_id", "error_file_id"):
            if not batch.get(key):
                continue
            content = await p.send("GET", f"{p.base_url}/files/{batch[key]}/content")
            for line in content.decode("utf-8", "replace").splitlines():
                if line.strip():
                    custom_id, answer = self._line(line, requests)
                    if custom_id is not None:
                        out[custom_id] = answer
        return out

    async def cancel(self, batch_id: str) -> None:
        p = self.provider
        await p.send("POST", f"{p.base_url}/batches/{batch_id}/cancel")

    def _line(self, line: str, requests: Mapping[str, CompletionRequest]
              ) -> tuple[str | None, Completion | ProviderError]:
        """One output or error line as (custom id, its completion or failure)."""
        p = self.provider
        try:
            row = json.loads(line)
        except ValueError:
            found = _CUSTOM_ID.search(line)
            return (found.group(1) if found else None), p.malformed("a batch result line is not JSON", "")
        custom_id = str(row.get("custom_id"))
        request = requests.get(custom_id)
        if request is None:
            return None, p.malformed("a batch result names no request of the batch", "")
        response = row.get("response") or {}
        status = int(response.get("status_code") or 0)
        if row.get("error") or not response:
            error = row.get("error") or {}
            failure = ServerError(f"{p.name} batch request {error.get('code')}: {p.redact(str(error.get('message')))}",
                                  provider=p.name, model=request.model)
            return custom_id, failure
        if status >= 400:
            return custom_id, p.error_for(status, json.dumps(response.get("body") or {}).encode(), {}, request.model)
        try:
            return custom_id, p.completion_from(response.get("body") or {}, request, p.forms(request)[0], 0.0)
        except ProviderError as exc:
            return custom_id, exc


_CUSTOM_ID = re.compile(r'"custom_id"\s*:\s*"([^"]+)"')
#: the batch ``metadata`` key holding the tag a batch was submitted with
TAG_KEY = "conclave_batch"

#: the keys the official SDK puts first in a Chat Completions body; it sorts the others by name
_SDK_FIRST = ("model", "stream", "service_tier", "messages")


def _sdk_order(body: dict[str, Any]) -> dict[str, Any]:
    """``body``'s keys in the order the official ``openai`` SDK sends them (nested objects keep theirs)."""
    first = [k for k in _SDK_FIRST if k in body]
    return {k: body[k] for k in [*first, *sorted(k for k in body if k not in _SDK_FIRST)]}


def _tools(schemas: Iterable[tuple[str, Mapping[str, Any]]],
           request: CompletionRequest | None) -> list[dict[str, Any]]:
    """Every schema the model is asked for in the consultation (the hint's ``schemas_for``) as a strict function
    tool, in the hint's order (``request``'s own schema added last if the hint lacks it)."""
    functions = {api_name(n): s for n, s in schemas}
    if request is not None and request.json_schema is not None:
        functions.setdefault(schema_name(request), request.json_schema)
    return [{"type": "function", "function": {
        "name": n, "description": _TOOL_DESCRIPTION, "parameters": _strict_schema(_canonical(s)), "strict": True}}
        for n, s in functions.items()]


def _call_arguments(calls: Any, request: CompletionRequest) -> str | None:
    """The arguments (JSON text) of the call of the request's own function among ``calls`` (a message's
    ``tool_calls``), or of the first call when none names it; None when there is no call."""
    if not isinstance(calls, list) or request.json_schema is None:
        return None
    found: list[dict[str, Any]] = [c["function"] for c in calls
                                   if isinstance(c, dict) and isinstance(c.get("function"), dict)]
    if not found:
        return None
    wanted = schema_name(request)
    function = next((f for f in found if f.get("name") == wanted), found[0])
    arguments = function.get("arguments")
    return arguments if isinstance(arguments, str) else json.dumps(arguments) if arguments is not None else ""


def _attach_images(messages: list[dict[str, Any]], images: Sequence[ImagePart]) -> None:
    """The attached images as ``image_url`` parts (base64 data URLs) after the first user message's text."""
    for message in messages:
        if message["role"] == "user":
            message["content"] = [{"type": "text", "text": message["content"]},
                                  *({"type": "image_url", "image_url": {"url": image.data_url()}} for image in images)]
            return


def _append_to_last_user(messages: list[dict[str, Any]], text: str) -> None:
    for message in reversed(messages):
        if message["role"] == "user":
            message["content"] = f"{message['content'].rstrip()}\n\n{text}"
            return
    messages.append({"role": "user", "content": text})


def _canonical(schema: Any) -> str:
    # not sort_keys: property order is generation order, and models answer in it
    return json.dumps(schema)


@functools.lru_cache(maxsize=64)
def _strict_schema(canonical: str) -> dict[str, Any]:
    """The strict-mode variant of a schema, computed once per distinct schema (callers must not mutate it)."""
    return strict_variant(describe_constraints(json.loads(canonical)))


@functools.lru_cache(maxsize=64)
def _grammar_schema(canonical: str, lengths: str = "off", fitted_to: int | None = None) -> dict[str, Any]:
    """The full schema for servers that compile it into a grammar: every constraint, unanchored patterns stated in
    descriptions, bounded numbers also listed as the values the grammar may write and, by ``lengths``, arrays
    capped (``cap``) or array and string lengths fitted to ``fitted_to``, a ``max_tokens`` (``fit``) (callers must
    not mutate it)."""
    # with capped lists, no reference number beyond the cap is needed: those are listed too
    schema = bounded_numbers_as_choices(anchored_patterns_only(json.loads(canonical)),
                                        open_above=None if lengths == "off" else CAPPED_MAX_ITEMS)
    if lengths == "fit" and fitted_to is not None:
        return dict(bounded_lengths(schema, max_tokens=fitted_to))
    return dict(capped_items(schema) if lengths == "cap" else schema)


def _parsed(text: str, request: CompletionRequest) -> dict[str, Any] | None:
    """The answer's object with strict mode's ``null`` stand-ins for absent optionals removed."""
    if request.json_schema is None:
        return None
    obj = parse_object(text)
    if obj is None:
        return None
    cleaned = drop_null_optionals(dict(request.json_schema), obj)
    return cleaned if isinstance(cleaned, dict) else obj


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, dict):
        return Usage()
    details = raw.get("prompt_tokens_details") or {}
    return Usage(
        input_tokens=int(raw.get("prompt_tokens") or 0),
        output_tokens=int(raw.get("completion_tokens") or 0),
        cached_input_tokens=int(details.get("cached_tokens") or 0) if isinstance(details, dict) else 0,
    )


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?)(h|ms|m|s|us|µs|ns)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def duration_s(text: str) -> float | None:
    """Seconds in a duration as OpenAI writes its rate-limit resets (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``)."""
    text = text.strip()
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def _allowance(headers: Mapping[str, str], what: str) -> Allowance | None:
    remaining, reset = headers.get(f"x-ratelimit-remaining-{what}"), headers.get(f"x-ratelimit-reset-{what}")
    reset_s = duration_s(reset) if reset else None
    try:
        left = float(remaining) if remaining else None
    except ValueError:
        left = None
    # Azure sends -1 for a limit it does not report
    return None if left is None or left < 0 or reset_s is None else Allowance(left, reset_s)


@hookimpl
def register_providers(register: Any) -> None:
    register("openai", OpenAIProvider)


@hookimpl
def register_schema_dialects(register: Any) -> None:
    register("openai-strict", strict_variant)


# ------------------------------------------------------------------------------------- strict mode

# Keywords outside the subset every strict-capable OpenAI model accepts. The answer is still validated against
# the full schema afterwards, so dropping them loosens decoding, never acceptance.
_STRICT_DROPPED = frozenset({
    "$schema", "$id", "$defs", "$comment", "format", "pattern", "minLength", "maxLength", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minItems", "maxItems", "uniqueItems",
})


def strict_variant(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` for OpenAI ``response_format`` strict mode; the input is not modified.

    Strict mode needs every property listed in ``required``, ``additionalProperties: false`` and no external
    ``$ref``. So every ``$ref`` is inlined (the schema must not be recursive), every object requires all its
    properties, optional properties become nullable (``null`` stands for "absent": pass the answer through
    ``drop_null_optionals`` before ``validate``), ``const`` becomes a one-value ``enum`` and the keywords in
    ``_STRICT_DROPPED`` are removed.
    """
    return _strictify(schema, resolver_for(schema))


def _strictify(node: dict[str, Any], resolver: Any) -> dict[str, Any]:
    node, resolver = deref(node, resolver)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _STRICT_DROPPED:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {prop: _strictify(sub, resolver) for prop, sub in value.items()}
        elif key == "items" and isinstance(value, dict):
            out[key] = _strictify(value, resolver)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [_strictify(sub, resolver) for sub in value]
        else:
            out[key] = copy.deepcopy(value)
    if "properties" in out:
        required = set(node.get("required", ()))
        out["properties"] = {
            prop: sub if prop in required else _nullable(sub) for prop, sub in out["properties"].items()
        }
        out["required"] = list(out["properties"])
        out["additionalProperties"] = False
    return out


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    kind = node.get("type")
    if kind is None:
        return {"anyOf": [node, {"type": "null"}]}
    node = dict(node)
    if isinstance(kind, str):
        node["type"] = [kind, "null"]
    elif "null" not in kind:
        node["type"] = [*kind, "null"]
    if "enum" in node and None not in node["enum"]:
        node["enum"] = [*node["enum"], None]
    return node


@hookimpl
def register_price_sheets(register: Any) -> None:
    # its own sheet and those of the OpenAI-compatible endpoints it speaks to (xAI, Mistral)
    for provider in ("openai", "grok", "mistral"):
        register(provider, resources.files("conclave_plugins").joinpath("pricing", f"{provider}.yaml"))
