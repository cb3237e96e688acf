"""Built-in ``gemini`` provider: ``POST {base_url}/models/{model}:generateContent`` (Gemini API, v1beta).

The system prompt goes in ``systemInstruction``; structured output asks for ``application/json`` with the artifact
schema as ``generationConfig.responseJsonSchema``, restricted to the keywords Gemini documents for it (the others
are stated in descriptions). Streaming uses ``:streamGenerateContent?alt=sse``. A 429 ``RESOURCE_EXHAUSTED`` carries
its wait in the body (``RetryInfo.retryDelay``); a per-day quota (a ``QuotaFailure`` whose ``quotaId`` says
``PerDay``) resets at midnight Pacific time and is not retried.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar
from urllib.parse import quote

from conclave.hookspecs import hookimpl
from conclave.providers.base import (
    BadRequestError,
    Completion,
    CompletionRequest,
    ProviderError,
    QuotaExhaustedError,
    RateLimitedError,
    Usage,
)
from conclave.providers.http import HTTPProvider, parse_object, parse_retry_after
from conclave.providers.schema_hints import restrict_keywords

_RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
_QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"


class GeminiProvider(HTTPProvider):
    """Google Gemini API (AI Studio keys)."""

    DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com/v1beta"
    DEFAULT_KEY_ENV = ("GEMINI_API_KEY", "GOOGLE_API_KEY")
    KEYED_HOSTS: ClassVar[frozenset[str]] = frozenset({"generativelanguage.googleapis.com"})

    def auth_headers(self, key: str) -> dict[str, str]:
        return {"x-goog-api-key": key}  # a header, never ?key=: URLs end up in logs

    def is_auth_failure(self, status: int, message: str) -> bool:
        # Gemini answers an invalid key with 400 INVALID_ARGUMENT "API key not valid".
        return status in (401, 403) or (status == 400 and "api key" in message.lower())

    def body(self, request: CompletionRequest) -> dict[str, Any]:
        """The request body for ``request`` (what the API receives, key excluded)."""
        body: dict[str, Any] = {
            "contents": [
                {"role": "model" if m.role == "assistant" else "user", "parts": [{"text": m.content}]}
                for m in request.messages
            ],
        }
        if request.system:
            body["systemInstruction"] = {"parts": [{"text": request.system}]}
        config: dict[str, Any] = {"maxOutputTokens": request.max_tokens}
        if request.temperature is not None:
            config["temperature"] = request.temperature
        if request.json_schema is not None:
            config["responseMimeType"] = "application/json"
            config["responseJsonSchema"] = restrict_keywords(request.json_schema)
        body["generationConfig"] = config
        return body

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
        payload = await self.post_json(self._url(request.model, "generateContent"), self.body(request),
                                       request.model)
        text, finish = self._candidate(payload, request.model)
        if finish is None and not text:
            raise self.truncated("the answer has neither text nor a finish reason", request.model)
        return self._completion(request, text, finish, payload.get("usageMetadata"), payload.get("modelVersion"),
                                started)

    async def attempt_stream(self, request: CompletionRequest) -> AsyncIterator[str | Completion]:
        started = time.perf_counter()
        parts: list[str] = []
        finish: str | None = None
        usage: Any = None
        model: Any = None
        url = self._url(request.model, "streamGenerateContent") + "?alt=sse"
        events = self.post_sse(url, self.body(request), request.model)
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
        # Gemini's stream has no terminator: the last chunk carries the finish reason, so its absence = truncated.
        if finish is None:
            raise self.truncated("the stream ended without a finish reason", request.model)
        yield self._completion(request, "".join(parts), finish, usage, model, started)

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
