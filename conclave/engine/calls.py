"""One artifact-producing model call: ask with the schema, extract, and re-ask once quoting the errors.

Provider failures (after the pool's retries, hedging and substitution) and answers that stay invalid after the
re-ask both come back as a failed :class:`CallOutcome` that keeps every raw text; nothing here raises for them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from conclave.engine.extraction import (
    Extraction,
    Status,
    answer_errors,
    constrained,
    extract,
    header_for,
    json_instruction,
    reask_message,
    request_schema,
)
from conclave.events import AGENT_CHUNK, AGENT_COMPLETED, EventBus
from conclave.providers.base import (
    Completion,
    CompletionRequest,
    ImagePart,
    Message,
    PromptCache,
    ProviderError,
    Usage,
)
from conclave.providers.pricing import same_model

if TYPE_CHECKING:
    from conclave.providers.pool import ProviderPool

#: the ``agent`` value of judge calls in events and the pool's call log
JUDGE = "judge"


@dataclass(frozen=True)
class CallSpec:
    """Who is asked what: ``agent`` is an agent name or :data:`JUDGE`."""

    agent: str
    provider: str
    model: str
    system: str
    user: str
    schema_name: str
    round_number: int
    max_tokens: int
    agent_id: str | None = None  # set on the artifact header when its schema has ``agent_id``
    allow_substitution: bool = True  # whether the pool may answer with a backup model
    cache: PromptCache | None = None  # the consultation's shared prefix (None: no caching hints)
    #: the only ``final_answer`` values allowed (a multiple-choice item's letters): an enum in the schema sent
    answers: tuple[str, ...] = ()
    #: attached images sent with the user message (only to a model that accepts images)
    images: tuple[ImagePart, ...] = ()


@dataclass
class CallOutcome:
    spec: CallSpec
    artifact: dict[str, Any] | None = None
    status: Status | None = None
    raw_texts: list[str] = field(default_factory=list)
    errors: tuple[str, ...] = ()
    error: str | None = None
    provider: str = ""  # who actually answered (the last answer)
    model: str = ""
    usage: Usage = field(default_factory=Usage)
    cost: float | None = 0.0
    duration_s: float = 0.0
    reasked: bool = False
    #: the provider failed (after the pool's retries, hedging and substitution): no model answered, as opposed to
    #: an answer that stayed invalid after the re-ask
    provider_failed: bool = False

    @property
    def ok(self) -> bool:
        return self.artifact is not None

    @property
    def raw_text(self) -> str:
        return self.raw_texts[-1] if self.raw_texts else ""

    @property
    def substituted(self) -> bool:
        return bool(self.provider) and (self.provider, self.model) != (self.spec.provider, self.spec.model)


async def ask_for_artifact(
    pool: ProviderPool, spec: CallSpec, *, native: bool, bus: EventBus | None = None, stream: bool = False
) -> CallOutcome:
    """Ask ``spec``; on an invalid answer re-ask once with the validator's errors. Emits ``agent:completed``;
    with ``stream``, publishes the answer's text as it arrives (``agent:chunk``, live only)."""
    started = time.monotonic()
    outcome = CallOutcome(spec=spec)
    request = CompletionRequest(
        model=spec.model,
        system=spec.system,
        messages=(Message("user", f"{spec.user.rstrip()}\n\n{json_instruction(spec.schema_name, native)}"),),
        json_schema=constrained(request_schema(spec.schema_name), spec.answers),
        schema_name=spec.schema_name,
        max_tokens=spec.max_tokens,
        cache=spec.cache,
        images=spec.images,
    )
    header = header_for(spec.schema_name, spec.round_number, spec.agent_id)
    try:
        on_chunk = _chunk_publisher(bus, spec) if stream and bus is not None else None
        completion = await _complete(pool, spec, request, outcome, on_chunk)
        result = _checked(extract(completion.text, completion.parsed, spec.schema_name, header), spec)
        if not result.ok:
            outcome.errors = result.errors
            answer = completion.text or json.dumps(completion.parsed or {}, ensure_ascii=False)
            # The re-ask goes to whoever gave the invalid answer: after a substitution, the backup, not the
            # provider that had already failed.
            reask_spec = replace(spec, provider=outcome.provider, model=outcome.model) if outcome.substituted else spec
            retry = CompletionRequest(
                model=reask_spec.model,
                system=request.system,
                messages=(
                    *request.messages,
                    Message("assistant", answer),
                    Message("user", reask_message(result.errors)),
                ),
                json_schema=request.json_schema,
                schema_name=request.schema_name,
                max_tokens=request.max_tokens,
                cache=request.cache,
                images=request.images,
            )
            outcome.reasked = True
            completion = await _complete(pool, reask_spec, retry, outcome, on_chunk)
            result = _checked(extract(completion.text, completion.parsed, spec.schema_name, header), spec)
            if result.ok:
                result = Extraction(result.artifact, "reasked")
        if result.ok:
            outcome.artifact, outcome.status, outcome.errors = result.artifact, result.status, ()
        else:
            outcome.errors = result.errors
            outcome.error = "invalid answer after one re-ask: " + "; ".join(result.errors[:5])
    except ProviderError as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
        outcome.provider_failed = True
    outcome.duration_s = round(time.monotonic() - started, 3)
    if bus is not None:
        bus.emit(
            AGENT_COMPLETED,
            round_number=spec.round_number,
            agent=spec.agent,
            ok=outcome.ok,
            duration_s=outcome.duration_s,
            input_tokens=outcome.usage.input_tokens,
            output_tokens=outcome.usage.output_tokens,
            cost=outcome.cost,
            error=outcome.error,
            provider=outcome.provider or spec.provider,
            model=outcome.model or spec.model,
            reasked=outcome.reasked,
            raw_text=None if outcome.ok else outcome.raw_text,
        )
    return outcome


def _checked(result: Extraction, spec: CallSpec) -> Extraction:
    """``result``, failed when its ``final_answer`` is not one of ``spec.answers`` (so the re-ask quotes why)."""
    errors = answer_errors(result.artifact, spec.answers) if result.artifact is not None else ()
    return Extraction(None, None, errors) if errors else result


def _chunk_publisher(bus: EventBus, spec: CallSpec) -> Callable[[str], None]:
    def publish(text: str) -> None:
        bus.publish(AGENT_CHUNK, round_number=spec.round_number, agent=spec.agent, text=text)

    return publish


async def _complete(pool: ProviderPool, spec: CallSpec, request: CompletionRequest, outcome: CallOutcome,
                    on_chunk: Callable[[str], None] | None = None) -> Completion:
    completion = await pool.complete(
        agent=spec.agent,
        provider=spec.provider,
        request=request,
        round_number=spec.round_number,
        on_chunk=on_chunk,
        allow_substitution=spec.allow_substitution,
    )
    outcome.raw_texts.append(completion.text)
    outcome.provider, outcome.model = completion.provider, _requested_model(spec, completion)
    outcome.usage = outcome.usage + completion.usage
    cost = pool.cost(outcome.provider, outcome.model, completion.usage)
    outcome.cost = None if cost is None or outcome.cost is None else outcome.cost + cost
    return completion


def _requested_model(spec: CallSpec, completion: Completion) -> str:
    # Providers report dated or prefixed ids ("gpt-4o-2024-08-06", "models/gemini-2.5-pro"); when that is the
    # model we asked for, the configured id is what the record (and pricing) should name.
    if completion.provider == spec.provider and (not completion.model or same_model(spec.model, completion.model)):
        return spec.model
    return completion.model
