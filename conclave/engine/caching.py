"""The consultation's prompt-cache hint: which leading part of every call's prompt is the same, and its key.

Every system prompt of a consultation opens with the same context block (:func:`conclave.engine.strategy.
context_block`); that block is the prefix every call shares, agents' and judge's, round after round. The hint
names its length, a key derived from it (the same context gives the same key, so a resumed or repeated
consultation on the same files finds its cache warm) and every artifact schema the plan asks for, in plan order,
then those of rounds the engine may insert (the objection round).
Providers turn it into their API's caching hints (``providers.<name>.prompt_cache``).

Calls sent at the same time cannot read each other's cache writes, so the first round's agents would all write the
same prefix. Before the first round, one small request per (provider, model) that two or more of its agents share
— where the provider caches the prefix for every call to the model (``CacheRule.shared_by == "model"``) and does
not create it separately, and where it pays (:func:`warm_up_pays`) — writes the prefix once
(:func:`warm_prompt_caches`); the agents then read it. It costs one prefill of the context before round 1 and saves
a cache write per further agent. Those pairs are the hint's ``together``; a provider that creates its cache
separately (Gemini's cached contents) does so only for them.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from conclave.engine.extraction import request_schema
from conclave.engine.strategy import context_block
from conclave.providers.base import (
    WARMUP_AGENT,
    CacheRule,
    CompletionRequest,
    Message,
    PromptCache,
    ProviderError,
    Usage,
)
from conclave.providers.http import approx_tokens
from conclave.quality.objection import OBJECTION, QUICK_ROUNDS

if TYPE_CHECKING:
    from conclave.engine.session import Session
    from conclave.providers.pool import ProviderPool

log = logging.getLogger(__name__)

#: the ``agent`` of a cache warm-up request in the call log
WARMUP_PROMPT = "Reply with OK."


def prompt_cache_for(session: Session) -> PromptCache | None:
    """The hint for ``session``'s calls; None without a context (nothing long and shared to cache)."""
    block = context_block(session.context_text)
    if not block:
        return None
    key = "conclave-" + hashlib.sha256(block.encode("utf-8")).hexdigest()[:32]
    names = dict.fromkeys([*(t.schema for t in session.plan.types), *_insertable_schemas(session)])
    # every agent answers the first round, all at once
    agents = [(agent.provider, agent.model) for agent in session.settings.agents.values()]
    seats = Counter(agents)
    # which schemas each model is asked for: the agents' rounds' (the objection round is one) and the judge's
    asked: dict[tuple[str, str], set[str]] = {}
    agent_schemas = {t.schema for t in session.plan.types if t.seat == "agents"} | set(_insertable_schemas(session))
    for pair in agents:
        asked.setdefault(pair, set()).update(agent_schemas)
    judge = (session.settings.judge.provider, session.settings.judge.model)
    if judge[0] and judge[1]:
        asked.setdefault((str(judge[0]), str(judge[1])), set()).update(
            t.schema for t in session.plan.types if t.seat != "agents")
    return PromptCache(key=key, stable_chars=len(block), schemas=tuple((n, request_schema(n)) for n in names),
                       together=frozenset(pair for pair, count in seats.items() if count >= 2),
                       seat_schemas=tuple((pair, tuple(n for n in names if n in mine)) for pair, mine in asked.items()))


def _insertable_schemas(session: Session) -> list[str]:
    """Schemas of rounds the engine may insert while the consultation runs (the critical objection round, when
    groupthink detection can add one): they are in the hint from the start, so a call of such a round sends the same
    tool list as every other call and reads the cached prefix instead of writing a new one."""
    quality = session.settings.quality
    groupthink = quality.groupthink
    if (quality.stage == "on" and groupthink.enabled and groupthink.max_objection_rounds > 0
            and session.planned_rounds >= QUICK_ROUNDS):
        return [OBJECTION.schema]
    return []


def cache_rule(pool: ProviderPool, provider: str, model: str, stable_tokens: int,
               cache: PromptCache | None = None) -> CacheRule | None:
    """``provider``'s rule for a stable prefix of ``stable_tokens`` tokens (None: unknown provider, or no caching).
    With ``cache``, a prefix created once (Gemini's cached contents) applies only to the pairs it calls together."""
    try:
        rule = pool.provider(provider).cache_rule(model, stable_tokens)
    except ProviderError:
        return None
    if rule is not None and rule.created_once and cache is not None and (provider, model) not in cache.together:
        return None
    return rule


def warm_up_pays(pool: ProviderPool, provider: str, model: str, seats: int) -> bool:
    """Whether writing the prefix once before the first round costs less than letting its ``seats`` calls to
    ``provider``/``model`` (sent at once, so all of them miss) each write it: one write plus ``seats`` reads
    against ``seats`` writes. A write is billed at the sheet's cache-write price (the input price where there is
    none), a read at its cached price. gpt-4o (cached = half the input price) needs three seats; Claude (write
    1.25 ×, read 0.1 ×) or gpt-5 (read 0.1 ×) two. Unknown or zero prices: warm up (caching still saves time)."""
    size = 1_000_000
    write = pool.cost(provider, model, Usage(size, 0, 0, size))
    read = pool.cost(provider, model, Usage(size, 0, size, 0))
    if not write or read is None:
        return True
    return write + seats * read < seats * write - 1e-12


def cached_definitions(pool: ProviderPool, provider: str, model: str, cache: PromptCache, stable_tokens: int) -> str:
    """What ``provider`` sends before the shared prefix of calls carrying ``cache`` (its tool list), or ``""``."""
    try:
        return pool.provider(provider).cached_definitions(model, cache, stable_tokens)
    except ProviderError:
        return ""


def warmed_groups(pool: ProviderPool, seats: Iterable[tuple[str, str]], stable_tokens: int,
                  rule_for: Callable[[str, str, int], CacheRule | None] | None = None) -> list[tuple[str, str]]:
    """The (provider, model) pairs among the first round's ``seats`` that get a warm-up request."""
    rule_for = rule_for or (lambda provider, model, size: cache_rule(pool, provider, model, size))
    out = []
    for (provider, model), count in Counter(seats).items():
        rule = rule_for(provider, model, stable_tokens)
        if (count >= 2 and rule is not None and rule.shared_by == "model" and not rule.created_once
                and warm_up_pays(pool, provider, model, count)):
            out.append((provider, model))
    return out


async def warm_prompt_caches(session: Session, agents: Iterable[str]) -> None:
    """Write the consultation's shared prefix once per warmed (provider, model) before the first round's
    ``agents`` are asked. A warm-up that fails costs only the cache: the round goes ahead."""
    cache = session.prompt_cache
    if cache is None:
        return
    stable = context_block(session.context_text)
    seats = [(session.settings.agents[a].provider, session.settings.agents[a].model) for a in agents]
    requests = [
        session.pool.complete(
            agent=WARMUP_AGENT, provider=provider, round_number=1, allow_substitution=False,
            request=CompletionRequest(model=model, messages=(Message("user", WARMUP_PROMPT),), system=stable,
                                      max_tokens=1, cache=cache))
        for provider, model in warmed_groups(session.pool, seats, approx_tokens(stable))
    ]
    for outcome in await asyncio.gather(*requests, return_exceptions=True):
        if isinstance(outcome, ProviderError):
            log.info("prompt cache warm-up failed (%s); the first round writes the cache itself", outcome)
        elif isinstance(outcome, BaseException):
            raise outcome
