"""Pre-flight limits: refuse, before anything is journaled, loaded or billed, a prompt its model cannot take.

A question (with its context) goes into every round's prompt. For each seat (every agent, the judge) and each
round type of the plan, the fixed part of the call — system prompt with the context, the round's template with
the question, the answer instruction, and the round's schema (or the tool list the endpoint sends with a cached
context) — plus the round's answer cap must fit the seat's model (:meth:`Provider.context_limits`: a hosted
model's figures from its price sheet, the local model's runtime size). The artifacts a later round will carry are
not known yet and are not counted: what is refused here could only fail later, after consent, after loading a
model or paying for other calls. The CLI prints one line and exits 2 (the MCP tool returns the same line as its
error). A model without a known limit is not checked.

The check stays cheap: the UTF-8 size of each part bounds its tokens from above (every BPE token covers at least one
byte), so a prompt whose bound fits is never counted; the round's schema or tool list (the same few texts in every
consultation) is counted exactly; only a prompt that might still not fit is counted exactly, each part once per
encoding (the context is the same in every seat's prompt).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass

from conclave.engine.caching import cached_definitions
from conclave.engine.calls import CallSpec
from conclave.engine.cost.estimate import MESSAGE_OVERHEAD_TOKENS, empty_values
from conclave.engine.extraction import json_instruction, request_schema
from conclave.engine.play import call_spec
from conclave.engine.session import Session
from conclave.errors import ConfigError
from conclave.providers.base import ProviderError
from conclave.providers.pricing import ContextLimits
from conclave.tokens import count_tokens, encoding_name_for, utf8_upper_bound

#: bytes that bound the round's schema or an endpoint's whole tool list (OpenAI's, every schema strict, is ~25 KB:
#: a test keeps it under this): a prompt that fits with them is not asked for its schema, so none is loaded
DEFINITIONS_ALLOWANCE = 64 * 1024
#: how a prompt that is too long is made shorter
SMALLER_CONTEXT = "shorten the question or send less context (the files of context=[...], project=, stdin)"


@dataclass(frozen=True)
class _TooLong:
    seat: str
    title: str
    spec: CallSpec
    needed: int
    room: int
    limits: ContextLimits


def check_context_windows(session: Session) -> None:
    """Raise :class:`ConfigError` (one line) naming the seat, its provider/model, its largest prompt's tokens and
    the model's limit, and what to do, when a seat's fixed prompt cannot fit its model."""
    counted: dict[tuple[str, str], int] = {}
    schemas: dict[str, str] = {}

    def exact(part: str, model: str) -> int:
        """``part``'s tokens, counted once per encoding."""
        key = (encoding_name_for(model), part)
        if key not in counted:
            counted[key] = count_tokens(part, model)
        return counted[key]

    failures: list[_TooLong] = []
    for seat, title, spec in _largest_calls(session):
        limits = _limits_of(session, spec.provider, spec.model)
        room = None if limits is None else limits.prompt_room(spec.max_tokens)
        if limits is None or room is None:
            continue
        parts = _parts(spec, json_instruction(spec.schema_name, session.native(spec.provider)))
        bound = sum(utf8_upper_bound(part) for part in parts) + MESSAGE_OVERHEAD_TOKENS
        if bound + DEFINITIONS_ALLOWANCE <= room:
            continue  # fits whatever the tokenizer and the schema say: nothing loaded, nothing counted
        if spec.schema_name not in schemas:
            schemas[spec.schema_name] = json.dumps(request_schema(spec.schema_name))
        parts.append(_definitions(session, spec) or schemas[spec.schema_name])
        if bound + utf8_upper_bound(parts[-1]) <= room:
            continue
        if bound + exact(parts[-1], spec.model) <= room:  # the schema or tool list counted exactly
            continue
        needed = sum(exact(part, spec.model) for part in parts if part) + MESSAGE_OVERHEAD_TOKENS
        if needed > room:
            failures.append(_TooLong(seat, title, spec, needed, room, limits))
    if failures:
        first = failures[0].seat  # the seat named first; its largest prompt over the limit
        worst = max((f for f in failures if f.seat == first), key=lambda f: f.needed - f.room)
        raise ConfigError([_message(session, worst)])


def _largest_calls(session: Session) -> Iterator[tuple[str, str, CallSpec]]:
    """(seat, round title, call) for every seat of each round type of the plan, its artifact inputs empty: a
    repeated round type has the same fixed prompt."""
    seen: set[str] = set()
    for step in session.plan.steps():
        round_type = step.type
        if round_type.name in seen:
            continue
        seen.add(round_type.name)
        values = empty_values(session, round_type)
        title = f"round {step.number}, {round_type.title.lower()}"
        if round_type.seat == "judge":
            yield "judge", title, call_spec(session, round_type, step.number, values)
            continue
        for name in session.settings.agents:
            spec = call_spec(session, round_type, step.number, {**values, "label": session.labels.label(name)}, name)
            yield f"agents.{name}", title, spec


def _parts(spec: CallSpec, instruction: str) -> list[str]:
    """The texts one call sends but its schema: the context (the shared stable prefix, the same string for every
    seat), the rest of the system prompt, the user message and its answer instruction."""
    stable, own = spec.cache.split(spec.system) if spec.cache is not None else ("", spec.system)
    return [stable, own, spec.user, instruction]


def _definitions(session: Session, spec: CallSpec) -> str:
    """The tool list the endpoint sends before a cached context (it holds the round's schema), or ``""`` when it
    sends the round's schema alone. The stable prefix is sized by its UTF-8 bound: a larger prefix is cached, and
    carries the list, sooner."""
    if spec.cache is None:
        return ""
    stable = spec.cache.split(spec.system)[0]
    return cached_definitions(session.pool, spec.provider, spec.model, spec.cache, utf8_upper_bound(stable)) \
        if stable else ""


def _limits_of(session: Session, provider: str, model: str) -> ContextLimits | None:
    try:
        return session.pool.provider(provider).context_limits(model)
    except ProviderError:
        return None  # an unknown provider is reported by the key check, not here


def _message(session: Session, failure: _TooLong) -> str:
    spec, limits = failure.spec, failure.limits
    answer = "" if limits.answer_shrinks or limits.window is None else \
        f" plus up to {spec.max_tokens:,} for its answer"
    return (f"prompt too long for {failure.seat} ({spec.provider}/{spec.model}): its largest prompt "
            f"({failure.title}) is about {failure.needed:,} tokens{answer}, and the model has {limits.describe()}; "
            f"{SMALLER_CONTEXT}, or {_larger_model(session, spec, failure.needed)}")


def _larger_model(session: Session, spec: CallSpec, needed: int) -> str:
    """Advice naming a model of the same provider's sheet (the closest in price, then the smallest room) whose
    limits take ``needed`` tokens with the call's answer cap; any provider's when none of its own does."""
    prices = session.pool.prices
    own = prices.price(spec.provider, spec.model)

    def distance(price: float) -> float:
        if own is None or own.input <= 0 or price <= 0:
            return 0.0
        return abs(math.log(price / own.input))

    endpoint = session.settings.providers.get(spec.provider)
    own_sheets = [spec.provider, endpoint.api if endpoint is not None else spec.provider]
    for sheets in (own_sheets, sorted(prices.sheets)):
        fitting = [
            (distance(price.input), limits.prompt_room(spec.max_tokens) or 0, name, model, limits)
            for name in dict.fromkeys(sheets)
            for model, limits, price in prices.models_with_limits(name)
            if model != spec.model and (limits.prompt_room(spec.max_tokens) or 0) >= needed
        ]
        if fitting:
            *_, name, model, limits = min(fitting)
            return f"choose a model with a larger window ({name}/{model}: {limits.describe()})"
    return "no model in the price sheets has a window that large: split the context"
