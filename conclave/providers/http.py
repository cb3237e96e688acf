"""Shared HTTP machinery of the built-in providers: endpoint and key resolution, one POST, SSE, error mapping.

Every failure leaves here as a typed :class:`~conclave.providers.base.ProviderError` whose message a user can act
on and which never contains an API key, whole or in part: provider text is redacted before it is shortened. A key
goes only to the vendor's own hosts unless ``providers.<name>.send_key`` says otherwise. Requests go out through the
pool's :class:`~conclave.providers.transport.HTTPClient`, so this module (and a provider plugin) does not import
aiohttp: loading plugins, which every ``conclave`` command does, stays cheap.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncGenerator, Iterable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, ClassVar
from urllib.parse import urlsplit

from conclave.providers.base import (
    AuthError,
    BadRequestError,
    CompletionRequest,
    ConnectionFailedError,
    FilePart,
    MalformedResponseError,
    MissingKeyError,
    ModelNotFoundError,
    OverloadedError,
    Provider,
    ProviderError,
    ProviderTimeoutError,
    QuotaExhaustedError,
    RateLimitedError,
    ServerError,
    TransportError,
)
from conclave.providers.pacing import RateLimits, pacer_for
from conclave.providers.sse import iter_sse
from conclave.providers.structured import is_local_url
from conclave.store.redact import MIN_SECRET_LENGTH, key_variables

REDACTED = "<redacted>"
#: a run of at least this many leading characters of a key is redacted as if it were the whole key
MIN_KEY_FRAGMENT = 8
#: how many characters of a provider's own error message an error passes on
MESSAGE_LIMIT = 300


class HTTPProvider(Provider):
    """A provider that speaks a JSON-over-HTTP API through the pool's shared HTTP client.

    Subclasses set the defaults below, build the wire body and parse the answer; this class owns headers, keys,
    transport errors and HTTP status mapping.
    """

    #: where calls go when ``providers.<name>.base_url`` is unset
    DEFAULT_BASE_URL: ClassVar[str] = ""
    #: key variables used when the endpoint is the default one and ``api_key_env`` is empty
    DEFAULT_KEY_ENV: ClassVar[tuple[str, ...]] = ()
    #: the vendor's own hosts (https only): they need a key, and with ``send_key: official`` only they receive it
    KEYED_HOSTS: ClassVar[frozenset[str]] = frozenset()

    # ------------------------------------------------------------------------------------- endpoint and key

    @property
    def base_url(self) -> str:
        return (self.settings.base_url or self.default_base_url()).rstrip("/")

    def default_base_url(self) -> str:
        return self.DEFAULT_BASE_URL

    def endpoint(self) -> str | None:
        return self.base_url

    def key_env(self) -> list[str]:
        if self.settings.api_key_env:
            return list(self.settings.api_key_env)
        # A configured endpoint without key variables is a local server: never hand it the vendor's key.
        return list(self.DEFAULT_KEY_ENV) if self.settings.base_url is None else []

    def is_official(self) -> bool:
        """Whether calls go to one of the vendor's own hosts, over https."""
        parts = urlsplit(self.base_url)
        return parts.scheme == "https" and (parts.hostname or "") in self.KEYED_HOSTS

    def costs_nothing(self) -> bool:
        """A server on this machine or the local network that is sent no key: nobody bills its calls. (A local
        proxy that is handed a vendor key may forward to a paid API, so it counts as paid.)"""
        return is_local_url(self.base_url) and self.api_key() is None

    def default_max_concurrency(self) -> int | None:
        """One call at a time for a server on this machine or the local network (llama.cpp, llama-cpp-python and
        Ollama serve one request per slot, one slot by default); no cap for a hosted API."""
        return 1 if is_local_url(self.base_url) else None

    def sends_cache_hints(self) -> bool:
        """Whether requests carry prompt-caching hints (``providers.<name>.prompt_cache``): ``auto`` on the
        vendor's own host, ``on`` anywhere, ``off`` never."""
        mode = self.settings.prompt_cache
        return mode == "on" or (mode == "auto" and self.is_official())

    def sends_key(self) -> bool:
        """Whether this endpoint may receive the key (``providers.<name>.send_key``; ``official`` by default)."""
        mode = self.settings.send_key
        if mode == "always":
            return True
        return mode == "official" and self.is_official()

    def api_key(self) -> str | None:
        """The key this endpoint is sent; None when none is set or ``send_key`` withholds it from this host."""
        return super().api_key() if self.sends_key() else None

    def key_source(self) -> str | None:
        return super().key_source() if self.sends_key() else None

    def requires_key(self) -> bool:
        """Calls fail without a key: the vendor's own host, or any host the user chose to send the key to."""
        return bool(self.key_env()) and self.sends_key()

    def secrets(self) -> list[str]:
        """Every key value to keep out of messages: this provider's (sent or not), and the other providers' keys
        that are set (long enough to be real keys)."""
        own = dict.fromkeys([*self.settings.api_key_env, *self.key_env(), *self.DEFAULT_KEY_ENV])
        values = [value for name in own if (value := self._environ.get(name))]
        others = (self._environ.get(name) or "" for name in key_variables() if name not in own)
        return values + [value for value in others if len(value) >= MIN_SECRET_LENGTH]

    def auth_headers(self, key: str) -> dict[str, str]:
        """The header(s) carrying ``key``; subclasses name their API's header."""
        return {"Authorization": f"Bearer {key}"}

    def headers(self, model: str) -> dict[str, str]:
        """Request headers; raises :class:`MissingKeyError` when an endpoint that needs a key has none."""
        headers = {"Content-Type": "application/json"}
        key = self.api_key()
        if key is not None:
            headers.update(self.auth_headers(key))
        elif self.requires_key():
            raise MissingKeyError(
                f"{self.name}: no API key; set {self.key_variables()} (the key is read from the environment)",
                provider=self.name,
                model=model,
            )
        return headers

    def withheld_key_hint(self) -> str:
        """What to do when an endpoint refuses a keyless request."""
        if self.sends_key() or super().api_key() is None:
            return f"set {self.key_variables()}"
        if self.settings.send_key == "never":
            return f"providers.{self.name}.send_key=never keeps the key in {self.key_variables()} from being sent"
        host = urlsplit(self.base_url).hostname or self.base_url
        return (f"the key in {self.key_variables()} is only sent to {self.name}'s own host, not {host}; "
                f"set providers.{self.name}.send_key=always if this endpoint needs it")

    def redact(self, text: str) -> str:
        """``text`` with this provider's keys (and any run of 8+ of their leading characters) replaced."""
        return redact_secrets(text, self.secrets())

    # ------------------------------------------------------------------------------------- transport

    def _session(self) -> Any:
        if self.session is None:
            raise RuntimeError(f"provider {self.name!r} has no HTTP session; use it inside a ProviderPool")
        return self.session

    def encode(self, body: Mapping[str, Any]) -> str | bytes:
        """``body`` as the request carries it (a provider may match its vendor SDK's serialization)."""
        return json.dumps(body)

    async def post_json(self, url: str, body: Mapping[str, Any], model: str) -> dict[str, Any]:
        """POST ``body``; return the decoded JSON object or raise the mapped :class:`ProviderError`."""
        headers = self.headers(model)
        try:
            async with self._session().request("POST", url, data=self.encode(body), headers=headers) as resp:
                self.heard(resp.headers)
                raw = await resp.read()
                if resp.status >= 400:
                    raise self.error_for(resp.status, raw, resp.headers, model)
        except TransportError as exc:
            raise self.transport_error(exc, model) from exc
        return self.decode(raw, model)

    async def send(self, method: str, url: str, *, form: Mapping[str, str | FilePart] | None = None,
                   json_body: Mapping[str, Any] | None = None, timeout_s: float | None = None) -> bytes:
        """One request of a batch API (a file upload as ``form``, a status, a results download): the raw answer
        body; errors mapped like :meth:`post_json`."""
        headers = self.headers("")
        if form is not None:
            headers.pop("Content-Type")  # the transport sets the multipart boundary
        body = self.encode(json_body) if json_body is not None else None
        timeout = timeout_s or self.settings.timeout_s
        try:
            async with self._session().request(method, url, data=body, form=form, headers=headers,
                                               timeout_s=timeout) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise self.error_for(resp.status, raw, resp.headers, "")
        except (TimeoutError, TransportError) as exc:
            if isinstance(exc, TransportError) and exc.kind != "timeout":
                raise self.transport_error(exc, "") from exc
            raise ProviderTimeoutError(f"{self.name} did not answer within {timeout:g}s ({self.base_url})",
                                       provider=self.name) from exc
        return bytes(raw)

    async def get_json(self, url: str, *, timeout_s: float, model: str = "") -> dict[str, Any]:
        """GET ``url`` (models lists) with its own timeout; errors mapped like :meth:`post_json`."""
        headers = self.headers(model)
        headers.pop("Content-Type")
        try:
            async with self._session().request("GET", url, headers=headers, timeout_s=timeout_s) as resp:
                raw = await resp.read()
                if resp.status >= 400:
                    raise self.error_for(resp.status, raw, resp.headers, model)
        except (TimeoutError, TransportError) as exc:
            if isinstance(exc, TransportError) and exc.kind != "timeout":
                raise self.transport_error(exc, model) from exc
            raise ProviderTimeoutError(
                f"{self.name} did not answer within {timeout_s:g}s ({self.base_url})", provider=self.name
            ) from exc
        return self.decode(raw, model)

    async def post_sse(self, url: str, body: Mapping[str, Any],
                       model: str) -> AsyncGenerator[tuple[str, str], None]:
        """POST ``body`` and yield the answer's server-sent events; close it with ``contextlib.aclosing``."""
        headers = self.headers(model)
        headers["Accept"] = "text/event-stream"
        try:
            async with self._session().request("POST", url, data=self.encode(body), headers=headers) as resp:
                self.heard(resp.headers)
                if resp.status >= 400:
                    raise self.error_for(resp.status, await resp.read(), resp.headers, model)
                async for event in iter_sse(resp.content):
                    yield event
        except TransportError as exc:
            raise self.transport_error(exc, model) from exc
        except ValueError as exc:  # undecodable bytes or an over-long line
            raise MalformedResponseError(
                f"{self.name} sent an unreadable event stream for {model}: {self.redact(str(exc))}",
                provider=self.name, model=model,
            ) from exc

    def rate_limits(self, headers: Mapping[str, str]) -> RateLimits | None:
        """The key's rate-limit state an answer's headers report (each API has its own), or None: not reported."""
        return None

    def heard(self, headers: Mapping[str, str]) -> None:
        """Pace this endpoint by the rate-limit state an answer (of any status) reports."""
        endpoint = self.endpoint()
        limits = self.rate_limits(headers)
        if endpoint and limits is not None:
            pacer_for(endpoint).heard(limits)

    def decode(self, raw: bytes, model: str) -> dict[str, Any]:
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            raise MalformedResponseError(
                f"{self.name} answered {model or 'the request'} with a body that is not a JSON object "
                f"({len(raw)} bytes)",
                provider=self.name,
                model=model,
            )
        return payload

    def decode_event(self, data: str, model: str) -> dict[str, Any]:
        return self.decode(data.encode(), model)

    # ------------------------------------------------------------------------------------- error mapping

    def is_auth_failure(self, status: int, message: str) -> bool:
        """Whether an HTTP error means the key was rejected (Gemini says so with a 400)."""
        return status in (401, 403)

    def error_for(self, status: int, raw: bytes, headers: Mapping[str, str], model: str) -> ProviderError:
        """The typed error for an HTTP error answer; only the provider's own words are passed on, redacted.

        An ``x-should-retry: true|false`` header (OpenAI and Anthropic send it) overrides whether it is retried,
        as the official SDKs do.
        """
        error = self._error_for(status, raw, headers, model)
        should_retry = (headers.get("x-should-retry") or "").strip().lower()
        if should_retry in ("true", "false"):
            error.retryable = should_retry == "true"
        return error

    def special_error(self, status: int, payload: Mapping[str, Any], message: str, headers: Mapping[str, str],
                      kw: dict[str, Any]) -> ProviderError | None:
        """An API-specific error for this answer (a quota, a refusal), or None for the generic mapping."""
        return None

    def _error_for(self, status: int, raw: bytes, headers: Mapping[str, str], model: str) -> ProviderError:
        message = provider_message(raw, secrets=self.secrets())
        kw: dict[str, Any] = {"provider": self.name, "model": model, "status": status}
        what = f"model {model!r}" if model else "the request"
        special = self.special_error(status, error_payload(raw), message, headers, kw)
        if special is not None:
            return special
        if self.is_auth_failure(status, message):
            var = self.key_source()
            if var is None:
                return AuthError(
                    f"{self.name} refused a request sent without a key (HTTP {status}); {self.withheld_key_hint()}",
                    **kw,
                )
            # The provider's message is dropped on purpose: some echo part of the key back.
            access = f" and its access to {what}" if model else ""
            return AuthError(f"{var} was rejected by {self.name} (HTTP {status}); check the key{access}", **kw)
        if status == 404:
            return ModelNotFoundError(
                f"{self.name} does not know {what} (HTTP 404 from {self.base_url}; check the model name and "
                f"providers.{self.name}.base_url): {message}",
                **kw,
            )
        if status == 402:  # Payment Required: the account is out of credit, waiting does not help
            return QuotaExhaustedError(
                f"{self.name} refused {what} for want of credit (HTTP 402) — check billing: {message}", **kw)
        if status == 408:
            return ProviderTimeoutError(f"{self.name} timed out serving {what} (HTTP 408)", **kw)
        if status == 409:  # a lock timeout on the provider's side; the official SDKs retry it
            return ServerError(f"{self.name} hit a conflict serving {what} (HTTP 409): {message}", **kw)
        if status == 429:
            retry_after = parse_retry_after(headers)
            hint = f"; retry after {retry_after:g}s" if retry_after is not None else ""
            return RateLimitedError(
                f"{self.name} rate-limited {what} (HTTP 429{hint}): {message}", retry_after_s=retry_after, **kw
            )
        if status in (503, 529):
            return OverloadedError(f"{self.name} is overloaded (HTTP {status}) serving {what}: {message}", **kw)
        if status >= 500:
            return ServerError(f"{self.name} failed serving {what} (HTTP {status}): {message}", **kw)
        return BadRequestError(f"{self.name} rejected the request for {what} (HTTP {status}): {message}", **kw)

    def transport_error(self, exc: TransportError, model: str) -> ProviderError:
        """A typed error for a failure below HTTP (refused, reset, dropped mid-body, read timeout)."""
        kw: dict[str, Any] = {"provider": self.name, "model": model}
        where = urlsplit(self.base_url).netloc or self.base_url
        if exc.kind == "timeout":
            return ProviderTimeoutError(f"{self.name} stopped sending data ({where}): {self.redact(exc.reason)}", **kw)
        if exc.kind == "connect":
            return ConnectionFailedError(f"cannot reach {self.name} at {where}: {self.redact(exc.reason)}", **kw)
        if exc.kind == "disconnected":
            return ConnectionFailedError(f"{self.name} closed the connection before answering ({where})", **kw)
        if exc.kind == "payload":
            return ConnectionFailedError(f"{self.name} dropped the connection mid-answer ({where})", **kw)
        return ConnectionFailedError(f"connection to {self.name} failed ({where}): {self.redact(exc.reason)}", **kw)

    def truncated(self, what: str, model: str) -> MalformedResponseError:
        """A cut-off or empty answer: handled like a malformed one (retried, then re-asked), and possibly billed."""
        error = self.malformed(f"{what} (truncated)", model)
        error.billed = True
        return error

    def malformed(self, what: str, model: str) -> MalformedResponseError:
        """A malformed-answer error; ``what`` may quote the provider (an in-band error event), so it is redacted."""
        return MalformedResponseError(f"{self.name} sent a malformed answer for {model}: {self.redact(what)}",
                                      provider=self.name, model=model)


# ------------------------------------------------------------------------------------- helpers


def error_payload(raw: bytes) -> dict[str, Any]:
    """The ``error`` object of an API error body (all three APIs nest it so), or an empty dict."""
    try:
        payload = json.loads(raw)
    except ValueError:
        return {}
    error = payload.get("error") if isinstance(payload, dict) else None
    return error if isinstance(error, dict) else {}


def provider_message(raw: bytes, limit: int = MESSAGE_LIMIT, *, secrets: Iterable[str] = ()) -> str:
    """The human message inside an API error body (``error.message`` in all three APIs), else the raw text.

    ``secrets`` are redacted before the text is cut to ``limit`` characters, so a key straddling the cut cannot
    leave its first characters behind.
    """
    text = raw.decode("utf-8", "replace").strip()
    try:
        payload = json.loads(text)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text = error["message"]
        elif isinstance(error, str):
            text = error
        elif isinstance(payload.get("message"), str):  # vLLM / llama.cpp style
            text = payload["message"]
    text = redact_secrets(" ".join(text.split()), secrets)
    return (text[:limit] + "…") if len(text) > limit else (text or "(empty body)")


def redact_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each secret replaced by ``<redacted>``, and any run of its first 8+ characters as well (a key
    an API echoed in part, or cut short by someone else)."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
        if len(secret) > MIN_KEY_FRAGMENT:
            text = _redact_key_prefixes(text, secret)
    return text


def _redact_key_prefixes(text: str, secret: str) -> str:
    head = secret[:MIN_KEY_FRAGMENT]
    found = text.find(head)
    if found < 0:
        return text
    parts: list[str] = []
    start = 0
    while found >= 0:
        end, matched = found + len(head), len(head)
        while end < len(text) and matched < len(secret) and text[end] == secret[matched]:
            end, matched = end + 1, matched + 1
        parts += [text[start:found], REDACTED]
        start = end
        found = text.find(head, end)
    parts.append(text[start:])
    return "".join(parts)


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date); None when absent."""
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")


def schema_name(request: CompletionRequest, default: str = "response") -> str:
    """A name for the schema the APIs accept (``^[A-Za-z0-9_-]{1,64}$``): ``schema_name``, the title, or default."""
    raw = request.schema_name or str((request.json_schema or {}).get("title") or "") or default
    return api_name(raw, default)


def api_name(raw: str, default: str = "response") -> str:
    """``raw`` as a tool or schema name the APIs accept (``^[A-Za-z0-9_-]{1,64}$``)."""
    return (_NAME_CHARS.sub("_", raw).strip("_") or default)[:64]


def approx_tokens(text: str) -> int:
    """A cheap token estimate (4 UTF-8 bytes a token) for deciding whether a prefix is long enough to cache."""
    return len(text.encode("utf-8")) // 4


def parse_object(text: str) -> dict[str, Any] | None:
    """The JSON object in ``text`` when the whole text is one; None otherwise (extraction and repair come later)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
