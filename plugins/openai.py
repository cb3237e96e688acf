"""Built-in ``openai`` provider: Chat Completions against any OpenAI-compatible endpoint.

The same implementation serves OpenAI, xAI (grok), Mistral and local servers (Ollama, llama.cpp, vLLM): the
config picks the endpoint (``providers.<name>.base_url``) and the key variable. Structured output uses
``response_format: {type: json_schema, strict: true}`` with the schema's strict-mode variant (every property
required, optionals nullable, constraints strict mode rejects moved into descriptions); the answer's ``null``
optionals are dropped again, so ``parsed`` matches the original schema. Streaming uses SSE with ``include_usage``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import AsyncIterator
from typing import Any, ClassVar
from urllib.parse import urlsplit

from conclave.artifacts import drop_null_optionals, strict_variant
from conclave.hookspecs import hookimpl
from conclave.providers.base import BadRequestError, Completion, CompletionRequest, Usage
from conclave.providers.http import HTTPProvider, parse_object, schema_name
from conclave.providers.schema_hints import describe_constraints

OPENAI_HOST = "api.openai.com"


class OpenAIProvider(HTTPProvider):
    """OpenAI Chat Completions (``POST {base_url}/chat/completions``)."""

    DEFAULT_BASE_URL = f"https://{OPENAI_HOST}/v1"
    DEFAULT_KEY_ENV = ("OPENAI_API_KEY",)
    KEYED_HOSTS: ClassVar[frozenset[str]] = frozenset({OPENAI_HOST, "api.x.ai", "api.mistral.ai"})

    def default_base_url(self) -> str:
        return self._environ.get("OPENAI_BASE_URL") or self.DEFAULT_BASE_URL

    def body(self, request: CompletionRequest, *, stream: bool) -> dict[str, Any]:
        """The request body for ``request`` (what the API receives, key excluded)."""
        messages: list[dict[str, str]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        messages += [{"role": m.role, "content": m.content} for m in request.messages]
        body: dict[str, Any] = {"model": request.model, "messages": messages}
        # api.openai.com rejects max_tokens for its reasoning models; compatible servers only know max_tokens.
        limit_key = "max_completion_tokens" if urlsplit(self.base_url).hostname == OPENAI_HOST else "max_tokens"
        body[limit_key] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.json_schema is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": schema_name(request), "schema": _strict_schema(_canonical(request.json_schema)),
                                "strict": True},
            }
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def attempt(self, request: CompletionRequest) -> Completion:
        started = time.perf_counter()
        payload = await self.post_json(f"{self.base_url}/chat/completions", self.body(request, stream=False),
                                       request.model)
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self.malformed("no choices in the answer", request.model)
        message = choices[0].get("message") or {}
        text = message.get("content")
        if text is None and message.get("refusal"):
            raise BadRequestError(f"{self.name} refused to answer: {message['refusal']}",
                                  provider=self.name, model=request.model)
        if not isinstance(text, str):
            text = ""
        return Completion(
            text=text,
            parsed=_parsed(text, request),
            usage=_usage(payload.get("usage")),
            model=str(payload.get("model") or request.model),
            provider=self.name,
            finish_reason=choices[0].get("finish_reason"),
            latency_s=time.perf_counter() - started,
        )

    async def attempt_stream(self, request: CompletionRequest) -> AsyncIterator[str | Completion]:
        started = time.perf_counter()
        parts: list[str] = []
        usage = Usage()
        finish: str | None = None
        model = request.model
        done = False
        events = self.post_sse(f"{self.base_url}/chat/completions", self.body(request, stream=True), request.model)
        async with contextlib.aclosing(events):
            async for _event, data in events:
                if data.strip() == "[DONE]":
                    done = True
                    break
                chunk = self.decode_event(data, request.model)
                if isinstance(chunk.get("error"), dict):  # some servers report mid-stream failures in-band
                    raise self.malformed(str(chunk["error"].get("message", "error event")), request.model)
                model = str(chunk.get("model") or model)
                if chunk.get("usage"):
                    usage = _usage(chunk["usage"])
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    piece = delta.get("content")
                    if isinstance(piece, str) and piece:
                        parts.append(piece)
                        yield piece
                    finish = choice.get("finish_reason") or finish
        # Some compatible servers omit [DONE]; a stream that never reached a finish reason is cut off, though.
        if not done and finish is None:
            raise self.malformed("the stream ended before a finish reason or [DONE] (truncated)", request.model)
        text = "".join(parts)
        yield Completion(
            text=text,
            parsed=_parsed(text, request),
            usage=usage,
            model=model,
            provider=self.name,
            finish_reason=finish,
            latency_s=time.perf_counter() - started,
        )

    async def list_models(self) -> list[str] | None:
        payload = await self.get_json(f"{self.base_url}/models", timeout_s=10.0)
        data = payload.get("data")
        if not isinstance(data, list):
            raise self.malformed("the models list has no data array", "")
        return [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item]


def _canonical(schema: Any) -> str:
    # not sort_keys: property order is generation order, and models answer in it
    return json.dumps(schema)


@functools.lru_cache(maxsize=64)
def _strict_schema(canonical: str) -> dict[str, Any]:
    """The strict-mode variant of a schema, computed once per distinct schema (callers must not mutate it)."""
    return strict_variant(describe_constraints(json.loads(canonical)))


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


@hookimpl
def register_providers(register: Any) -> None:
    register("openai", OpenAIProvider)
