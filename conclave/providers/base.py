"""The provider contract every provider plugin implements, and the typed errors they raise.

A provider turns a :class:`CompletionRequest` into a :class:`Completion` over real HTTP (through the pool's
:class:`~conclave.providers.transport.HTTPClient`). Retries,
hedging and substitution live above it (``conclave.providers.retry`` / ``hedging``); a provider makes exactly
one HTTP attempt per :meth:`Provider.attempt` call and raises a :class:`ProviderError` subclass on failure.
"""

from __future__ import annotations

import abc
import base64
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from conclave.errors import ConclaveError
from conclave.providers.pricing import ContextLimits, PriceTable

if TYPE_CHECKING:
    from conclave.config.settings import ProviderSettings
    from conclave.providers.transport import HTTPClient


@dataclass(frozen=True)
class Message:
    role: Literal["user", "assistant"]
    content: str


@dataclass(frozen=True)
class ImagePart:
    """An image the user attached (``context=[diagram.png]``): sent, with the first user message, to models whose
    price sheet says they accept images (``vision: true``)."""

    path: str
    media_type: str  # image/png, image/jpeg, image/webp or image/gif
    data: bytes

    def base64(self) -> str:
        return base64.b64encode(self.data).decode("ascii")

    def data_url(self) -> str:
        return f"data:{self.media_type};base64,{self.base64()}"


@dataclass(frozen=True)
class PromptCache:
    """How a call may reuse the prefix it shares with the other calls of its consultation.

    The first ``stable_chars`` characters of the request's ``system`` (the context block) are byte-identical in
    every call of the consultation, agents' and judge's; the rest of ``system`` (persona, role, anchors) is stable
    across one seat's calls; the user message varies. ``key`` is the same for every call of a consultation with
    this context (OpenAI's ``prompt_cache_key``, the name of a Gemini cached content). ``schemas`` are all the
    artifact schemas the consultation asks for, in a fixed order, for APIs whose cached prefix includes the tool
    definitions (Anthropic): sending them all keeps that prefix identical from round to round.
    """

    key: str
    stable_chars: int
    schemas: tuple[tuple[str, Mapping[str, Any]], ...] = ()
    #: the (provider, model) pairs the first round calls two or more times at once: those calls cannot read each
    #: other's writes, so only for these does caching the prefix before the round pay (a warm-up request, or
    #: Gemini's explicit cached content)
    together: frozenset[tuple[str, str]] = frozenset()
    #: (provider, model) -> the names of the schemas its seats are asked for: an API that sends the schemas in front
    #: of the prefix (as tools) sends a model only its own, so a model that only answers as an agent does not carry
    #: the judge's schemas in every call; a pair not listed (a substitute) gets them all
    seat_schemas: tuple[tuple[tuple[str, str], tuple[str, ...]], ...] = ()

    def schemas_for(self, provider: str, model: str) -> tuple[tuple[str, Mapping[str, Any]], ...]:
        """The schemas, in the hint's order, that calls to ``provider``/``model`` send."""
        for pair, names in self.seat_schemas:
            if pair == (provider, model):
                return tuple((n, s) for n, s in self.schemas if n in names)
        return self.schemas

    def split(self, system: str | None) -> tuple[str, str]:
        """``system`` as (the consultation-wide stable part, the seat's part)."""
        text = system or ""
        return text[: self.stable_chars], text[self.stable_chars :]


@dataclass(frozen=True)
class CompletionRequest:
    """What to ask: ``json_schema`` (an artifact schema from ``schemas/``) requests native structured output;
    ``cache`` (None: no caching hints) says which leading part of the prompt every call of the consultation
    shares."""

    model: str
    messages: tuple[Message, ...]
    system: str | None = None
    json_schema: Mapping[str, Any] | None = None
    schema_name: str | None = None
    max_tokens: int = 2048
    temperature: float | None = None
    timeout_s: float | None = None  # whole-call deadline, retries included; None = the provider's timeout_s
    cache: PromptCache | None = None
    #: images that go with the first user message (only to a model that accepts images)
    images: tuple[ImagePart, ...] = ()


@dataclass(frozen=True)
class Usage:
    """Tokens of one call. ``input_tokens`` counts every input token, including ``cached_input_tokens`` (read from
    a prompt cache, billed at the cached rate) and ``cache_write_tokens`` (written to a cache: Anthropic's cache
    creation, a Gemini cached content's creation; billed at the write rate)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cached_input_tokens + other.cached_input_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
        )


@dataclass(frozen=True)
class CacheRule:
    """How an endpoint reuses a consultation's stable prefix, for the pre-flight estimate.

    ``shared_by``: which calls can read what another call wrote — every call to the model (``model``), or only
    calls that also ask for the same schema (``model+schema``: the API puts the schema before the prompt). A call
    reads the prefix only when a call sharing it finished in an earlier round (calls of one round run at once and
    all miss). ``created_once``: the prefix is cached by a separate request before the first call (Gemini's
    cached contents), so every call reads it and the creation is billed once as a write. The provider creates it
    only for the pairs in :attr:`PromptCache.together` (elsewhere its implicit cache serves the later calls, with
    no saving promised, so the estimate counts none there).
    """

    shared_by: Literal["model", "model+schema"] = "model"
    created_once: bool = False


Outcome = Literal[
    "ok", "auth", "not_found", "bad_request", "rate_limited", "quota", "overloaded", "server_error", "timeout",
    "connection", "malformed", "cancelled",
]

#: the structured-output forms an endpoint may take, best first (``providers.<name>.structured_output``)
StructuredForm = Literal["json_schema", "json_object", "prompt", "off"]


@dataclass(frozen=True)
class Attempt:
    """One HTTP attempt, as the call log records it (hedges and retries included)."""

    provider: str
    model: str
    number: int
    started_at: float  # time.time()
    latency_s: float
    outcome: Outcome
    status: int | None = None
    error: str | None = None
    hedge: bool = False
    usage: Usage = field(default_factory=Usage)
    #: ``usage`` is conclave's own count, not the provider's: the attempt was abandoned (a hedge's loser, a timeout,
    #: a stream cut off) after the provider had started working on it, so it is billed without a usage report
    estimated: bool = False


@dataclass(frozen=True)
class Completion:
    text: str
    parsed: dict[str, Any] | None  # the object when native structured output was used and parsed
    usage: Usage
    model: str  # the model the provider says answered
    provider: str  # the configured provider name that answered (differs from the request's on substitution)
    finish_reason: str | None
    latency_s: float
    attempts: tuple[Attempt, ...] = ()
    #: how the schema was asked for (``json_schema``, ``json_object``, ``prompt``, ``off``); None without a schema
    structured_output: str | None = None


# ---------------------------------------------------------------------------------------------- errors


class ProviderError(ConclaveError):
    """A provider call failed. Messages are safe to show: they never contain an API key."""

    outcome: ClassVar[Outcome] = "server_error"
    #: a class default; an answer's ``x-should-retry`` header overrides it per error
    retryable: bool = False
    #: seconds the provider asked us to wait before another attempt (Retry-After, Gemini's RetryInfo)
    retry_after_s: float | None = None
    #: the provider may have started generating (a cut-off stream, a timeout): the attempt may be billed
    billed: bool = False

    def __init__(self, message: str, *, provider: str = "", model: str = "", status: int | None = None) -> None:
        super().__init__(message)
        self.provider = provider
        self.model = model
        self.status = status


class AuthError(ProviderError):
    outcome = "auth"


class ModelNotFoundError(ProviderError):
    outcome = "not_found"


class BadRequestError(ProviderError):
    outcome = "bad_request"


class RefusalError(BadRequestError):
    """The model declined to answer (OpenAI ``refusal``, streamed or not). Asking another model is the user's
    call, not ours: no retry, no substitution."""


class StructuredOutputRejectedError(BadRequestError):
    """The endpoint rejected the configured structured-output form (``providers.<name>.structured_output``)."""


class RateLimitedError(ProviderError):
    outcome = "rate_limited"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class QuotaExhaustedError(ProviderError):
    """A billing or per-day quota is used up (OpenAI ``insufficient_quota``, a Gemini ``PerDay`` quota): waiting a
    few seconds does not clear it, so it is never retried. Another provider may still answer."""

    outcome = "quota"


class OverloadedError(ProviderError):
    outcome = "overloaded"
    retryable = True


class ServerError(ProviderError):
    outcome = "server_error"
    retryable = True


class ProviderTimeoutError(ProviderError):
    outcome = "timeout"
    retryable = True


@dataclass(frozen=True)
class FilePart:
    """A file in a multipart upload (a batch API's input file), sent by the transport."""

    content: bytes
    filename: str
    content_type: str


class TransportError(Exception):
    """A request failed below HTTP; ``kind`` is timeout (no data for too long), connect (refused, unreachable;
    ``reason`` is the OS's), disconnected (closed before answering), payload (dropped mid-body) or other."""

    def __init__(self, kind: Literal["timeout", "connect", "disconnected", "payload", "other"], reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class ConnectionFailedError(ProviderError):
    outcome = "connection"
    retryable = True


class MalformedResponseError(ProviderError):
    outcome = "malformed"
    retryable = True


class MissingKeyError(ProviderError):
    """No API key in any of the provider's ``api_key_env`` variables."""

    outcome = "auth"


class SubstitutionRefusedError(ProviderError):
    """``strict_models=true`` and a call would have been answered by another model."""

    outcome = "cancelled"


class ProviderUnavailableError(ProviderError):
    """The model (or its whole endpoint) failed for good earlier in this consultation — dead, hung to its deadline
    or out of quota — and is not asked again; no substitute was allowed or found. No request was sent."""

    outcome = "cancelled"


# ---------------------------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class BatchStatus:
    """Where a provider's batch stands: ``state`` ``in_progress`` or ended as ``completed``, ``expired``,
    ``cancelled`` or ``failed``; ``status`` the provider's own word for it."""

    state: Literal["in_progress", "completed", "expired", "cancelled", "failed"]
    status: str
    total: int
    done: int
    failed: int

    @property
    def ended(self) -> bool:
        return self.state != "in_progress"


#: how far a provider's clock may be from ours when a batch is looked up by when it was created
BATCH_CLOCK_SKEW_S = 600.0
#: the most pages of a provider's batch list :meth:`BatchClient.find` reads
BATCH_LIST_PAGES = 50


class BatchClient(abc.ABC):
    """A provider's asynchronous batch API: requests submitted together, answered later at the batch price. The
    requests are built, and the answers read, exactly as the provider's interactive calls are."""

    #: the most requests one batch may hold (a larger set is split)
    limit: ClassVar[int] = 50_000
    #: whether one batch holds requests to one model only (OpenAI, Gemini): then a round is a batch per model
    per_model: ClassVar[bool] = True

    @abc.abstractmethod
    async def submit(self, requests: Sequence[tuple[str, CompletionRequest]], *, tag: str) -> str:
        """Submit ``(custom_id, request)`` pairs as one batch carrying ``tag`` (a client-chosen key, journaled
        before this call: what :meth:`find` looks for); its id once the provider accepted it."""

    async def find(self, tag: str, count: int, since: float) -> str | None:
        """The id of the batch :meth:`submit` created with ``tag`` (``count`` requests, created after ``since``,
        epoch seconds), from the provider's list of batches; None when the provider holds none (it never accepted
        it). A client that cannot list answers None, and the requests are submitted again."""
        return None

    @abc.abstractmethod
    async def status(self, batch_id: str) -> BatchStatus:
        """The batch's state and counts."""

    @abc.abstractmethod
    async def results(self, batch_id: str, requests: Mapping[str, CompletionRequest]
                      ) -> dict[str, Completion | ProviderError]:
        """Each answered request's completion, or its failure, by custom id (an unreadable result line is a
        :class:`MalformedResponseError` of its request; a request missing from the results is left out)."""

    @abc.abstractmethod
    async def cancel(self, batch_id: str) -> None:
        """Ask the provider to stop the batch."""


# ---------------------------------------------------------------------------------------------- provider


class Provider(abc.ABC):
    """Base class of provider implementations registered through ``register_providers``.

    ``name`` is the configured provider name (``grok``), ``settings`` its endpoint settings; the session is shared
    by every call of one consultation.
    """

    #: pydantic model of extra options this implementation accepts (None = none)
    Options: ClassVar[Any] = None
    #: whether :meth:`attempt` honours ``json_schema`` natively
    supports_structured_output: ClassVar[bool] = True
    #: every environment variable this implementation's keys are conventionally read from: their values are kept
    #: out of everything conclave writes and sends (:func:`conclave.store.redact.key_variables`)
    KEY_VARIABLES: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        name: str,
        settings: ProviderSettings,
        session: HTTPClient | None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.settings = settings
        self.session = session
        self._environ = os.environ if environ is None else environ

    def key_env(self) -> list[str]:
        """The variables a key is read from, in order (``api_key_env``; subclasses may supply defaults)."""
        return list(self.settings.api_key_env)

    def api_key(self) -> str | None:
        """The first non-empty key among ``api_key_env``; None when unset (local endpoints may need none)."""
        for var in self.key_env():
            value = self._environ.get(var)
            if value:
                return value
        return None

    def key_variables(self) -> str:
        return " or ".join(self.key_env()) or "(no key variable)"

    def key_source(self) -> str | None:
        """The name of the variable that supplies the key (never its value); None when no key is set."""
        for var in self.key_env():
            if self._environ.get(var):
                return var
        return None

    def requires_key(self) -> bool:
        """Whether calls fail without a key. Endpoints configured without key variables (local models) need none."""
        return bool(self.key_env())

    def has_key(self) -> bool:
        """A key is available, or this endpoint needs none."""
        return self.api_key() is not None or not self.requires_key()

    def endpoint(self) -> str | None:
        """Where calls go, for messages and ``conclave doctor`` (a URL, or None for in-process providers)."""
        return self.settings.base_url

    def costs_nothing(self) -> bool:
        """Whether calls are free (an in-process model, a server on this machine): ``conclave doctor`` then makes
        a real test call without being asked."""
        endpoint = self.endpoint()
        return endpoint is None or endpoint.startswith(("local:", "file:"))

    def default_max_concurrency(self) -> int | None:
        """Calls in flight when ``max_concurrency`` is unset; None = no cap."""
        return None

    def max_concurrency(self) -> int | None:
        """The cap on calls in flight to this endpoint (``providers.<name>.max_concurrency``); None = no cap."""
        configured = self.settings.max_concurrency
        if configured is None:
            return self.default_max_concurrency()
        return configured or None  # 0 = unlimited

    async def list_models(self) -> list[str] | None:
        """The model ids the endpoint serves, or None when its API has no models list."""
        return None

    def batch_client(self) -> BatchClient | None:
        """This endpoint's batch API (``providers.<name>.batch_api``); None when it has none."""
        return None

    def cache_rule(self, model: str, stable_tokens: int) -> CacheRule | None:
        """How calls to ``model`` reuse a stable prefix of ``stable_tokens`` tokens; None when they do not (no
        prompt cache, caching off, or a prefix too short to be cached)."""
        return None

    def prepare_schemas(self, model: str, schemas: Sequence[Mapping[str, Any]]) -> None:
        """Compute, and keep, whatever a request to ``model`` carrying one of ``schemas`` derives from it (the form
        the API takes): called from a worker thread while round 1 waits, so a later round's first request does not
        pay for it. Must be safe to call from another thread; by default nothing is prepared."""
        return None

    def cached_definitions(self, model: str, cache: PromptCache, stable_tokens: int) -> str:
        """The definitions (tool lists) calls to ``model`` carrying ``cache`` send in front of the shared prefix, as
        the API receives them, for the estimate to count in every call's input and in its cached prefix; ``""``
        when the endpoint sends none there."""
        return ""

    def context_limits(self, model: str) -> ContextLimits | None:
        """What one call to ``model`` can hold: a hosted model's figures from its price sheet
        (the registered price sheets, by this provider's name, then its ``api``). None — no check, the provider
        rejects what does not fit — when the sheet gives no figure, and for a free endpoint (a server on this
        machine answering under a hosted model's name has a window of its own). A prompt that cannot fit is
        refused before the consultation starts (:mod:`conclave.engine.cost.limits`), and a backup whose limits are too
        small is not asked (:meth:`ProviderPool.backup_for`)."""
        if self.costs_nothing():
            return None
        return PriceTable.load().context_limits((self.name, self.settings.api), model)

    def accepts_images(self, model: str) -> bool:
        """Whether ``model`` takes image input: its price sheet entry says ``vision: true`` (by this provider's name,
        then its ``api``). A model the sheets do not mark is treated as text-only, and so is an in-process model
        (whatever hosted name it answers under)."""
        endpoint = self.endpoint()
        if endpoint is None or endpoint.startswith(("local:", "file:")):  # in-process: a local model file
            return False
        return PriceTable.load().accepts_images((self.name, self.settings.api), model)

    def context_window(self, model: str) -> int | None:
        """Tokens one call to ``model`` can hold (prompt and answer; a model with only an input limit: that
        limit), or None when unknown."""
        limits = self.context_limits(model)
        if limits is None:
            return None
        return limits.window if limits.window is not None else limits.max_input

    @abc.abstractmethod
    async def attempt(self, request: CompletionRequest) -> Completion:
        """Exactly one HTTP attempt; raise a :class:`ProviderError` subclass on failure."""

    async def attempt_stream(self, request: CompletionRequest) -> AsyncIterator[str | Completion]:
        """One streaming attempt: yields text chunks, then the final :class:`Completion` (usage included).

        The default falls back to :meth:`attempt` and yields its whole text as one chunk.
        """
        completion = await self.attempt(request)
        if completion.text:
            yield completion.text
        yield completion

    async def close(self) -> None:  # noqa: B027 - optional hook; most providers own nothing to release
        """Release resources the provider owns (the shared session is not its to close)."""


#: the agent name of a prompt-cache warm-up call (one output token, sent before round 1): its latency is a prefill,
#: not an answer, so it sets no hedge delay (neither as a peer nor in the latency history)
WARMUP_AGENT = "prompt_cache"
