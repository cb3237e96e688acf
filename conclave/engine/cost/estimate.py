"""The pre-flight cost estimate (from the real prompts) and the in-flight meter (from the pool's call log).

Estimate, per planned call:
- input = tokens of the actual system + user message (a round without artifact inputs is built exactly as it will
  be sent; later rounds are the real templates rendered with the question and context, plus the artifacts they
  will carry, each counted at its producer's output cap — filtering only ever makes them smaller),
- output = the call's ``max_tokens`` cap (declared by its round type, :mod:`conclave.engine.rounds`),
- the cached share: the consultation's shared prefix (the context block) is expected from the provider's prompt
  cache as its :class:`~conclave.providers.base.CacheRule` says — read by a call when a call sharing it was answered
  in an earlier step (calls of one step run at once, so they all miss and the first step's calls write it), or,
  for a cache created once (Gemini), written once and read by every call —
priced with the pool's price table (cached reads and cache writes at their own rates). A model without a price
makes the whole estimate unknown. Re-asks, retries, hedges and a judge fallback are not planned calls and come on
top.

The meter (:func:`spent`) reads this process's call log; a resumed consultation adds what its earlier runs were
billed (:meth:`SpentSoFar.from_journal`, from ``resume_from["spent"]``), so the actual cost and the in-flight abort
cover every billed call of the consultation, whichever run made it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conclave.engine.caching import WARMUP_AGENT, cache_rule, cached_definitions, warmed_groups
from conclave.engine.calls import JUDGE, CallSpec
from conclave.engine.extraction import json_instruction
from conclave.engine.play import call_spec
from conclave.engine.rounds import Plan, RoundType, catalogue_of
from conclave.engine.session import Session
from conclave.providers.base import Usage
from conclave.tokens import count_tokens

if TYPE_CHECKING:
    from conclave.providers.pool import ProviderPool


@dataclass(frozen=True)
class PlannedCall:
    round_number: int
    agent: str
    provider: str
    model: str
    input_tokens: int
    output_tokens: int
    cost: float | None
    #: input tokens expected from the prompt cache, and written to it (both included in ``input_tokens``)
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0


@dataclass
class CostEstimate:
    calls: list[PlannedCall] = field(default_factory=list)

    @property
    def unknown_prices(self) -> list[str]:
        return sorted({f"{c.provider}/{c.model}" for c in self.calls if c.cost is None})

    @property
    def total(self) -> float | None:
        return self.for_rounds({c.round_number for c in self.calls})

    def for_rounds(self, rounds: Iterable[int]) -> float | None:
        """Cost of the planned calls of ``rounds``; None when any of them has no known price."""
        wanted = set(rounds)
        selected = [c for c in self.calls if c.round_number in wanted]
        if any(c.cost is None for c in selected):
            return None
        return round(sum(c.cost or 0.0 for c in selected), 6)

    def only(self, rounds: Iterable[int]) -> CostEstimate:
        """The planned calls of ``rounds`` alone."""
        wanted = set(rounds)
        return CostEstimate([c for c in self.calls if c.round_number in wanted])

    @property
    def input_tokens(self) -> int:
        return sum(c.input_tokens for c in self.calls)

    @property
    def output_tokens(self) -> int:
        return sum(c.output_tokens for c in self.calls)

    @property
    def cached_input_tokens(self) -> int:
        return sum(c.cached_input_tokens for c in self.calls)


#: tokens a chat API adds around the system and user messages of one call (role markers, separators)
MESSAGE_OVERHEAD_TOKENS = 16
#: input tokens counted for each attached image a call carries: an upper bound of what the APIs bill for one image
#: as they scale it (Anthropic: width × height / 750 after fitting 1568 px, at most about 1,600; OpenAI high detail: at
#: most 1,105; Gemini: 258 per 768-px tile)
IMAGE_TOKENS = 1600


@dataclass(frozen=True)
class PlannedText:
    """One planned call before it is counted: who, the prompt text, and the artifact tokens it will carry."""

    spec: CallSpec
    text: str
    carried: int
    step: int = 0  # the plan step it belongs to: calls of one step are sent at once


def empty_values(session: Session, round_type: RoundType) -> dict[str, str]:
    """A round's template values before the round's inputs exist: the question, the panel, who is absent, and
    every artifact input (and the debate state) left empty. Agents' calls add their ``label``."""
    text = session.strategy.template(round_type.template).text
    return {"question": session.question, "panel": session.labels.panel(), "absent": session.absent_notice(),
            **dict.fromkeys(round_type.inputs, ""), **session.quality.template_values(text, empty=True)}


def planned_texts(session: Session, rounds: Iterable[int], plan: Plan | None = None) -> list[PlannedText]:
    """The prompt of every call the plan's rounds ``rounds`` will make (no tokenizer needed); ``plan``: another
    plan than the session's (the longest one the exit controller could play).

    Every agent is counted on the agents' seat (who will be present is not known before round 1); the
    artifacts a call will carry are empty here and counted at their producers' output caps."""
    agents = list(session.settings.agents)
    wanted = set(rounds)
    plan = plan or session.plan
    catalogue = catalogue_of(plan)
    specs: list[tuple[CallSpec, int, int]] = []
    steps = plan.steps()
    for index, step in enumerate(steps):
        if step.number not in wanted:
            continue
        round_type = step.type
        text = session.strategy.template(round_type.template).text
        empty = empty_values(session, round_type)
        carried = round_type.carried_tokens(catalogue, len(agents)) + session.quality.carried_tokens(text) \
            + session.context.carried_tokens(steps, index, len(agents))
        if round_type.seat == "judge":
            specs.append((call_spec(session, round_type, step.number, empty), carried, index))
        else:
            specs += [
                (call_spec(session, round_type, step.number, {**empty, "label": session.labels.label(name)}, name),
                 carried, index)
                for name in agents
            ]
    texts = []
    for spec, carried, index in specs:
        instruction = json_instruction(spec.schema_name, session.native(spec.provider))
        texts.append(PlannedText(spec, f"{spec.system}\n{spec.user}\n{instruction}", carried, index))
    return texts


def price_calls(
    pool: ProviderPool, planned: Iterable[PlannedText], count: Callable[[str, str | None], int] | None = None
) -> CostEstimate:
    """Size and price ``planned``: input = ``count`` (the real tokenizer by default) of the prompt + the carried
    artifacts + message overhead; output = the call's ``max_tokens`` cap. Touches nothing but the price table,
    so it may run in a worker thread."""
    counter = count or count_tokens
    estimate = CostEstimate()
    planned = list(planned)
    stable_sizes: dict[tuple[str, str], int] = {}
    definition_sizes: dict[tuple[str, str], int] = {}

    def context_size(spec: CallSpec) -> int:
        stable = spec.cache.split(spec.system)[0] if spec.cache is not None else ""
        key = (stable[:64] + str(len(stable)), spec.model)
        if key not in stable_sizes:
            stable_sizes[key] = counter(stable, spec.model) if stable else 0
        return stable_sizes[key]

    def definitions_size(spec: CallSpec) -> int:
        """Tokens of the definitions (tool lists) the endpoint sends before the context: in the input, and cached."""
        key = (spec.provider, spec.model)
        if key not in definition_sizes:
            text = cached_definitions(pool, spec.provider, spec.model, spec.cache, context_size(spec)) \
                if spec.cache is not None and context_size(spec) else ""
            definition_sizes[key] = counter(text, spec.model) if text else 0
        return definition_sizes[key]

    def stable_size(spec: CallSpec) -> int:
        """The shared prefix: the definitions sent before the context block, and the context block."""
        return definitions_size(spec) + context_size(spec)

    # the warm-ups sent before the first round (see conclave.engine.caching), each a write of the shared prefix
    first = min((c.step for c in planned), default=0)
    opening = [c.spec for c in planned if c.step == first and c.spec.agent != JUDGE and c.spec.cache is not None]
    sizes = {(s.provider, s.model): stable_size(s) for s in opening}
    warmed = {pair for pair in warmed_groups(
        pool, [(s.provider, s.model) for s in opening], 0,
        lambda provider, model, _: cache_rule(pool, provider, model, sizes[(provider, model)]))}
    first_step: dict[tuple[str, ...], int] = {(p, m): first - 1 for p, m in warmed}
    for provider, model in sorted(warmed):
        size = sizes[(provider, model)]
        usage = Usage(size + MESSAGE_OVERHEAD_TOKENS, 1, 0, size)
        estimate.calls.append(PlannedCall(planned[0].spec.round_number, WARMUP_AGENT, provider, model,
                                          usage.input_tokens, 1, pool.cost(provider, model, usage), 0, size))
    created: set[tuple[str, ...]] = set()  # caches created once, whose creation is already counted
    for call in planned:
        spec = call.spec
        input_tokens = (counter(call.text, spec.model) + call.carried + MESSAGE_OVERHEAD_TOKENS
                        + IMAGE_TOKENS * len(spec.images))
        cached = written = 0
        if spec.cache is not None:
            input_tokens += definitions_size(spec)
            size = min(stable_size(spec), input_tokens)
            rule = cache_rule(pool, spec.provider, spec.model, size, spec.cache)
            if rule is not None:
                key = (spec.provider, spec.model, *((spec.schema_name,) if rule.shared_by == "model+schema" else ()))
                seen = first_step.setdefault(key, call.step)
                if rule.created_once:  # one creation (a write of its own), then every call reads it
                    cached = size
                    if key not in created:
                        created.add(key)
                        written, input_tokens = size, input_tokens + size
                elif seen < call.step:
                    cached = size
                else:
                    written = size
        usage = Usage(input_tokens, spec.max_tokens, cached, written)
        price = pool.cost(spec.provider, spec.model, usage)
        estimate.calls.append(PlannedCall(spec.round_number, spec.agent, spec.provider, spec.model, input_tokens,
                                          spec.max_tokens, price, cached, written))
    return estimate


def output_floor(pool: ProviderPool, planned: Iterable[PlannedText]) -> float | None:
    """A lower bound of :func:`price_calls`'s total for ``planned`` that needs no tokenizer: every call's output
    cap priced alone (input, cached or not, only ever adds); None when a model has no price."""
    total = 0.0
    for call in planned:
        price = pool.cost(call.spec.provider, call.spec.model, Usage(0, call.spec.max_tokens))
        if price is None:
            return None
        total += price
    return total


def estimate_cost(
    session: Session, rounds: Iterable[int], count: Callable[[str, str | None], int] | None = None,
    plan: Plan | None = None,
) -> CostEstimate:
    """Every call the plan's rounds ``rounds`` will make, sized from the prompts that will be sent; ``count``
    as in :func:`price_calls` (:func:`conclave.tokens.utf8_upper_bound` gives a bound that loads nothing);
    ``plan`` as in :func:`planned_texts`."""
    return price_calls(session.pool, planned_texts(session, rounds, plan), count)


@dataclass(frozen=True)
class SpentSoFar:
    """What the pool's attempts so far cost: known total, per provider, models without a price, tokens."""

    total: float
    by_provider: dict[str, float]
    unknown_prices: list[str]
    usage: Usage

    @classmethod
    def nothing(cls) -> SpentSoFar:
        return cls(total=0.0, by_provider={}, unknown_prices=[], usage=Usage())

    @classmethod
    def from_journal(cls, data: Mapping[str, Any] | None) -> SpentSoFar:
        """What earlier runs of a resumed consultation were billed: ``resume_from["spent"]``, as summed from the
        journal by :func:`conclave.store.resume_points.spent` (``cost``, ``input_tokens``, ``output_tokens`` and, when
        present, ``cached_input_tokens``, ``by_provider``, ``unknown_prices``). Missing or empty: nothing.

        Without ``by_provider`` the cost still counts in ``total``; it just cannot be attributed to a provider.
        """
        if not data:
            return cls.nothing()
        by_provider = {str(k): float(v) for k, v in (data.get("by_provider") or {}).items() if v is not None}
        return cls(
            total=round(float(data.get("cost") or 0.0), 6),
            by_provider={k: round(v, 6) for k, v in sorted(by_provider.items())},
            unknown_prices=sorted({str(m) for m in data.get("unknown_prices") or []}),
            usage=Usage(
                int(data.get("input_tokens") or 0),
                int(data.get("output_tokens") or 0),
                int(data.get("cached_input_tokens") or 0),
            ),
        )

    def __add__(self, other: SpentSoFar) -> SpentSoFar:
        by_provider: dict[str, float] = defaultdict(float)
        for part in (self.by_provider, other.by_provider):
            for provider, cost in part.items():
                by_provider[provider] += cost
        return SpentSoFar(
            total=round(self.total + other.total, 6),
            by_provider={k: round(v, 6) for k, v in sorted(by_provider.items())},
            unknown_prices=sorted(set(self.unknown_prices) | set(other.unknown_prices)),
            usage=self.usage + other.usage,
        )


def spent(pool: ProviderPool, since: int = 0) -> SpentSoFar:
    """Cost and tokens of ``pool.attempts[since:]`` (every HTTP attempt: retries and hedges are billed too)."""
    by_provider: dict[str, float] = defaultdict(float)
    unknown: set[str] = set()
    usage = Usage()
    for attempt in pool.attempts[since:]:
        usage = usage + attempt.usage
        if not attempt.usage.total_tokens:
            continue
        cost = pool.cost(attempt.provider, attempt.model, attempt.usage)
        if cost is None:
            unknown.add(f"{attempt.provider}/{attempt.model}")
        else:
            by_provider[attempt.provider] += cost
    return SpentSoFar(
        total=round(sum(by_provider.values()), 6),
        by_provider={k: round(v, 6) for k, v in sorted(by_provider.items())},
        unknown_prices=sorted(unknown),
        usage=usage,
    )
