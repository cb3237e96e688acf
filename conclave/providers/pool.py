"""The engine's only door to providers: one per consultation, with retries, hedging, failover, health and cost.

:meth:`ProviderPool.complete` runs the configured provider with retries; if it has not answered after the hedge
delay (and the hedge budget allows) a backup races it, and if it fails outright the backup takes over. Every
HTTP attempt is recorded and emitted as ``provider:attempt``; every answer from another model emits
``consultation:provider_substituted``. ``strict_models=true`` turns a would-be substitution into an error.

A model that fails for good (:data:`_UNAVAILABLE`: refused connections, server errors that outlast the retries, a
call that hangs to its deadline, a used-up quota) is not asked again for the rest of the consultation: its later
calls go straight to a substitute (reason ``unavailable``), or fail at once without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from jsonschema import Draft202012Validator

from conclave import events
from conclave.artifacts.schema_registry import ArtifactParseError, extract_json
from conclave.config.settings import Settings, resolve_provider
from conclave.providers.base import (
    WARMUP_AGENT,
    Attempt,
    Completion,
    CompletionRequest,
    MalformedResponseError,
    Outcome,
    Provider,
    ProviderError,
    ProviderTimeoutError,
    ProviderUnavailableError,
    RateLimitedError,
    SubstitutionRefusedError,
    Usage,
)
from conclave.providers.health import HealthStatus, HealthTracker
from conclave.providers.hedge_memory import HedgeMemory
from conclave.providers.hedging import HISTORY_QUANTILE, MIN_HISTORY, HedgeBudget, hedge_after, race
from conclave.providers.pacing import pacer_for
from conclave.providers.pricing import PriceTable
from conclave.providers.probe import TEST_PROMPT, TEST_SCHEMA, CallCheck, ProbeResult, probe, test_request
from conclave.providers.retry import RetryPolicy, call_with_retries
from conclave.providers.tiers import Tiers
from conclave.providers.transport import HTTPClient
from conclave.tokens import count_tokens, encoding_name_for, utf8_upper_bound

if TYPE_CHECKING:
    from conclave.events import EventBus
    from conclave.plugin_manager import Plugins

log = logging.getLogger(__name__)

#: outcomes that say something about the endpoint (a 400 or 404 says something about our request)
_HEALTH_OUTCOMES = frozenset({"ok", "auth", "rate_limited", "quota", "overloaded", "server_error", "timeout",
                              "connection", "malformed"})
#: failures that another model would not cure: the user must fix the key or the request
_NO_FAILOVER = frozenset({"auth", "bad_request", "cancelled"})
#: failures after which a model is not asked again in the same consultation: it is down (connection refused or
#: dropped, server errors or overload through every retry), it hangs (its deadline passed), or its quota is used
#: up. A rate limit is transient and a malformed answer says nothing about the next one: those are asked again.
_UNAVAILABLE = frozenset({"connection", "server_error", "overloaded", "timeout", "quota"})
#: the model part of an :attr:`ProviderPool.unavailable` key that stands for every model of the endpoint (a refused
#: connection is the endpoint's, whatever model is asked)
ANY_MODEL = "*"
_BACKUP_PREFERENCE = {HealthStatus.HEALTHY: 0, HealthStatus.UNKNOWN: 1, HealthStatus.DEGRADED: 2}


class _ChunkGate:
    """Forwards streamed text from one attempt at a time, so hedged or retried attempts never interleave."""

    def __init__(self, sink: Callable[[str], None]) -> None:
        self.sink = sink
        self.owner: object | None = None

    def emit(self, token: object, text: str) -> None:
        if self.owner is None:
            self.owner = token
        if self.owner is token:
            self.sink(text)

    def release(self, token: object) -> None:
        if self.owner is token:
            self.owner = None


@dataclass
class _Call:
    agent: str
    round_number: int
    gate: _ChunkGate | None
    attempts: list[Attempt] = field(default_factory=list)
    hedged: bool = False
    #: set when the primary attempt leaves the queue and is sent: the hedge delay counts from then
    sent: asyncio.Event = field(default_factory=asyncio.Event)


class BatchRoute(Protocol):
    """Where the calls of a batched evaluation go instead of an HTTP attempt: a provider's batch API."""

    def batches(self, provider: Provider) -> bool:
        """Whether calls to ``provider`` go through its batch API (and are billed at its batch price)."""

    async def complete(self, provider: Provider, request: CompletionRequest, round_number: int) -> Completion:
        """``request``'s answer from a batch of ``provider`` (raises a :class:`ProviderError` when it failed)."""


class ProviderPool:
    """Per-consultation: one HTTP client, provider instances, retries, hedging, substitution, health, pricing.
    Use as ``async with ProviderPool(settings, plugins, bus) as pool``."""

    def __init__(
        self,
        settings: Settings,
        plugins: Plugins,
        bus: EventBus | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        retry_policy: RetryPolicy | None = None,
        health: HealthTracker | None = None,
        prices: PriceTable | None = None,
        tiers: Tiers | None = None,
        rng: random.Random | None = None,
        hedge_memory: HedgeMemory | None = None,
        batch: BatchRoute | None = None,
    ) -> None:
        """``hedge_memory``: the home's hedging file; the pool seeds its latency history from it, shares its hedge
        budget and adds its latencies on close. Without it, history and budget last as long as the pool."""
        self.settings = settings
        self.plugins = plugins
        self.bus = bus
        #: calls to a provider this route batches go through its batch API, at its batch price (``eval.batch``)
        self.batch = batch
        self.retry_policy = retry_policy or RetryPolicy()
        self.health = health or HealthTracker()
        self.prices = prices or PriceTable.load()
        self.tiers = tiers or Tiers.load()
        self.hedge_memory = hedge_memory if settings.hedging.enabled else None
        #: awaited before every request is sent (the runner sets it to the recorder's ``until_durable``)
        self.before_spending: Callable[[], Awaitable[None]] | None = None
        self.budget = HedgeBudget(settings.hedging.budget, settings.hedging.burst, self.hedge_memory)
        if self.hedge_memory is not None and settings.hedging.hedge_after_s is None:
            for (provider, model), latencies in self.hedge_memory.load().items():
                self.health.seed(provider, model, latencies)
        self._environ: Mapping[str, str] = os.environ if environ is None else environ
        self._rng = rng or random.Random()
        self._session: HTTPClient | None = None
        self._providers: dict[str, Provider] = {}
        self._attempts: list[Attempt] = []
        self._substitutions: list[dict[str, Any]] = []
        self._slots: dict[str, asyncio.Semaphore] = {}
        #: (agent, round, provider, model) -> the (provider, model) that stood in for it: a follow-up call of the
        #: same agent in the same round (the re-ask quoting the substitute's answer) goes to the substitute
        self._stand_ins: dict[tuple[str, int, str, str], tuple[str, str]] = {}
        #: (provider, model or :data:`ANY_MODEL`) -> why it is not asked again in this consultation
        self._unavailable: dict[tuple[str, str], str] = {}
        #: latencies of the successful attempts of this consultation, by round: the peers a model without latency
        #: history is compared with; ``_answered`` is set (and replaced) each time one is added
        self._peer_latencies: dict[int, list[float]] = {}
        self._answered = asyncio.Event()

    # ------------------------------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> ProviderPool:
        self._session = HTTPClient()
        for instance in self._providers.values():
            instance.session = self._session
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # Every provider is closed and the session always is, whatever one provider's close() raises; the first
        # such error is raised afterwards (unless the block is already leaving with an exception of its own).
        failures: list[BaseException] = []
        for instance in self._providers.values():
            try:
                await instance.close()
            except Exception as exc:
                log.warning("closing provider %s failed: %s", instance.name, exc)
                failures.append(exc)
            finally:
                instance.session = None
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
        if self.hedge_memory is not None:
            self.hedge_memory.flush(self.settings.hedging.burst)
        if failures and exc_info[0] is None:
            raise failures[0]

    # ------------------------------------------------------------------------------------- providers

    def provider(self, name: str) -> Provider:
        """The provider instance for a configured (or bare registered) provider name."""
        instance = self._providers.get(name)
        if instance is not None:
            return instance
        try:
            api, endpoint = resolve_provider(self.settings, name, self.plugins)
        except KeyError:
            known = ", ".join(sorted(self.settings.providers)) or "(none)"
            raise ProviderError(f"unknown provider {name!r}; configured: {known}", provider=name) from None
        if api not in self.plugins.providers:
            raise ProviderError(f"providers.{name}.api: {api!r} is not a registered provider", provider=name)
        cls = self.plugins.providers.get(api)
        instance = cls(name, endpoint, self._session, environ=self._environ)
        self._providers[name] = instance
        return instance

    def _api(self, name: str) -> str:
        endpoint = self.settings.providers.get(name)
        return endpoint.api if endpoint is not None else name

    def has_key(self, provider: str) -> bool:
        """A key is available for ``provider`` (or its endpoint needs none)."""
        try:
            return self.provider(provider).has_key()
        except ProviderError:
            return False

    def backup_for(self, provider: str, model: str, request: CompletionRequest | None = None
                   ) -> tuple[str, str] | None:
        """The next usable (provider, model) from the tiers, on a different provider.

        Searches ``model``'s tier, then lower tiers; within a tier HEALTHY, then UNKNOWN, then DEGRADED providers;
        UNHEALTHY providers and providers without a key are skipped, and so is, with ``request``, a model whose
        context limits cannot hold its prompt and answer cap (:func:`_fits`).
        """
        best: tuple[tuple[int, int, int], tuple[str, str]] | None = None
        sizes = _PromptSize(request) if request is not None else None
        for position, (tier, (name, candidate)) in enumerate(self.tiers.candidates(model)):
            if name == provider or (best is not None and tier > best[0][0]):
                continue
            if self.unavailable_reason(name, candidate) is not None:
                continue
            if name not in self.settings.providers and name not in self.plugins.providers:
                continue
            rank = _BACKUP_PREFERENCE.get(self.health.status(name))
            if rank is None or not self.has_key(name):
                continue
            key = (tier, rank, position)
            if (best is None or key < best[0]) and (sizes is None or sizes.fits(self.provider(name), candidate)):
                best = (key, (name, candidate))
        return None if best is None else best[1]

    def fits(self, provider: str, model: str, request: CompletionRequest) -> bool:
        """Whether ``model`` on ``provider`` can hold ``request``'s prompt and answer cap (True when its limits
        are unknown)."""
        return _PromptSize(request).fits(self.provider(provider), model)

    # ------------------------------------------------------------------------------------- cost

    def cost(self, provider: str, model: str, usage: Usage) -> float | None:
        """USD for ``usage`` of ``model`` on ``provider``; None when the price is unknown. A free endpoint (a keyless
        server on this machine or the local network, the local model) costs $0 whatever its model is called: a
        llama.cpp server answering as ``gpt-4o`` is not billed like OpenAI."""
        batched = False
        try:
            instance = self.provider(provider)
            if instance.costs_nothing():
                return 0.0
            batched = self.batch is not None and self.batch.batches(instance)
        except ProviderError:
            pass
        return self.prices.cost((provider, self._api(provider)), model, usage, batch=batched)

    def interactive_cost(self, provider: str, model: str, usage: Usage) -> float | None:
        """What ``usage`` would cost through ``provider``'s interactive API (a batched call's equivalent)."""
        try:
            if self.provider(provider).costs_nothing():
                return 0.0
        except ProviderError:
            pass
        return self.prices.cost((provider, self._api(provider)), model, usage)

    def estimate_cost(self, provider: str, model: str, input_tokens: int, output_tokens: int) -> float | None:
        return self.cost(provider, model, Usage(input_tokens, output_tokens))

    # ------------------------------------------------------------------------------------- records

    @property
    def attempts(self) -> list[Attempt]:
        """Every attempt of this consultation, in the order they finished."""
        return list(self._attempts)

    @property
    def substitutions(self) -> list[dict[str, Any]]:
        return [dict(s) for s in self._substitutions]

    @property
    def unavailable(self) -> dict[tuple[str, str], str]:
        """(provider, model) pairs not asked again in this consultation, and why; a model of :data:`ANY_MODEL`
        stands for the whole endpoint."""
        return dict(self._unavailable)

    def unavailable_reason(self, provider: str, model: str) -> str | None:
        """Why ``model`` on ``provider`` is not asked again in this consultation; None when it may be asked."""
        return self._unavailable.get((provider, model)) or self._unavailable.get((provider, ANY_MODEL))

    def _note_failure(self, call: _Call, provider: str, model: str, error: ProviderError) -> None:
        """Remember a model whose call failed for good (:data:`_UNAVAILABLE`, after its retries), so later calls of
        the consultation skip it."""
        self._note_unavailable(call, provider, model, error.outcome, str(error))

    def _note_beaten(self, call: _Call, provider: str, model: str) -> None:
        """A primary whose hedge's backup answered first while it was failing: remembered like a failed call when
        it had failed, been retried and failed again (or once, when it may not be retried), with nothing but
        :data:`_UNAVAILABLE` failures. A primary that was only slow, or failed once, is asked again later."""
        made = [a for a in call.attempts
                if not a.hedge and (a.provider, a.model) == (provider, model) and a.outcome != "cancelled"]
        if not made or any(a.outcome not in _UNAVAILABLE for a in made):
            return
        if len(made) >= min(2, self.provider(provider).settings.max_attempts) or made[-1].outcome == "quota":
            self._note_unavailable(call, provider, model, made[-1].outcome, made[-1].error or "")

    def _note_unavailable(self, call: _Call, provider: str, model: str, outcome: str, error: str) -> None:
        # a warm-up or a pre-flight check says nothing final about a model
        if outcome not in _UNAVAILABLE or call.agent == WARMUP_AGENT or call.round_number < 1:
            return
        key = (provider, ANY_MODEL if outcome == "connection" else model)
        if key not in self._unavailable:
            self._unavailable[key] = (f"{provider}/{model if key[1] != ANY_MODEL else '*'} failed in round "
                                      f"{call.round_number} ({outcome}: {_first_line(error)})")

    # ------------------------------------------------------------------------------------- calls

    async def complete(
        self,
        *,
        agent: str,
        provider: str,
        request: CompletionRequest,
        round_number: int,
        on_chunk: Callable[[str], None] | None = None,
        allow_substitution: bool = True,
    ) -> Completion:
        """Answer ``request`` for ``agent`` with ``provider``, hedging and failing over as configured.

        ``on_chunk`` receives streamed text for live progress (after a failed attempt the next one's text
        follows); the returned completion is authoritative. Raises a :class:`ProviderError` when all failed.
        """
        if self._session is None:
            raise RuntimeError("ProviderPool.complete() needs `async with ProviderPool(...)`")
        call = _Call(agent, round_number, _ChunkGate(on_chunk) if on_chunk is not None else None)
        started = time.perf_counter()
        self.budget.note_call()
        stand_in = self._stand_ins.get((agent, round_number, provider, request.model))
        if stand_in is not None:
            # The provider failed this agent earlier in the round and another model answered; a follow-up (a re-ask
            # quoting that answer) goes to the model that wrote it, not back to the one that failed.
            provider, request = stand_in[0], replace(request, model=stand_in[1])
        if self.batch is not None and agent != WARMUP_AGENT and round_number >= 1:
            instance = self.provider(provider)
            if self.batch.batches(instance):
                completion = await self._batched(call, instance, request)
                return replace(completion, latency_s=time.perf_counter() - started, attempts=tuple(call.attempts))
        substitute = allow_substitution and not self.settings.strict_models
        down = self.unavailable_reason(provider, request.model)
        if down is not None:
            completion = await self._instead(call, provider, request, down, substitute)
        else:
            try:
                completion = await self._hedged(call, provider, request, substitute)
            except ProviderError as exc:
                self._note_failure(call, provider, request.model, exc)
                if call.hedged or exc.outcome in _NO_FAILOVER:
                    raise
                completion = await self._failover(call, provider, request, exc, allow_substitution)
        return replace(completion, latency_s=time.perf_counter() - started, attempts=tuple(call.attempts))

    async def _batched(self, call: _Call, instance: Provider, request: CompletionRequest) -> Completion:
        """``request`` answered through the batch route, recorded as one attempt (billed at the batch price)."""
        if self.before_spending is not None:
            await self.before_spending()
        started_at, t0 = time.time(), time.perf_counter()
        try:
            completion = await self.batch.complete(instance, request, call.round_number)  # type: ignore[union-attr]
        except ProviderError as exc:
            self._record(call, instance.name, request.model, 1, started_at, t0, False, error=exc)
            raise
        self._record(call, instance.name, request.model, 1, started_at, t0, False, usage=completion.usage,
                     estimated=False)
        return completion

    async def _instead(self, call: _Call, provider: str, request: CompletionRequest, down: str,
                       substitute: bool) -> Completion:
        """Answer a call whose model failed for good earlier in this consultation without asking it again: its
        substitute answers (reason ``unavailable``, the journal saying why), or, with none allowed or found, a
        :class:`ProviderUnavailableError` at once."""
        target = self.backup_for(provider, request.model, request) if substitute else None
        if target is None:
            why = ("strict_models=true: no other model may answer" if self.settings.strict_models
                   else "no substitute allowed" if not substitute else "no substitute available")
            raise ProviderUnavailableError(f"{down}; not asked again in this consultation ({why})",
                                           provider=provider, model=request.model)
        try:
            completion = await self._hedged(call, target[0], replace(request, model=target[1]), False)
        except ProviderError as exc:
            self._note_failure(call, target[0], target[1], exc)
            exc.add_note(f"it stood in for {provider}/{request.model}: {down}")
            raise
        self._substituted(call, provider, request.model, target, "unavailable", detail=down)
        return completion

    def _hedge_delay(self, call: _Call, provider: str, model: str) -> tuple[float | None, bool]:
        """The hedge delay for ``model`` now, and whether it can still change (no history: it follows the peers
        that answer while the call waits)."""
        samples = self.health.latency_count(provider, model)
        if samples >= MIN_HISTORY or self.settings.hedging.hedge_after_s is not None:
            history = self.health.latency_quantile(provider, model, HISTORY_QUANTILE)
            return hedge_after(self.settings.hedging, history), False
        if samples:  # thin: its median, like a peer (one slow call in it must not stop every later hedge)
            median = self.health.latency_quantile(provider, model, 0.5)
            return hedge_after(self.settings.hedging, None, [median] if median is not None else []), False
        peers = self._peer_latencies.get(call.round_number) or [
            latency for latencies in self._peer_latencies.values() for latency in latencies]
        return hedge_after(self.settings.hedging, None, peers), True

    async def _wait_for_hedge(self, call: _Call, primary: asyncio.Task[Completion], provider: str,
                              model: str) -> float | None:
        """Wait until the primary is done (None) or its hedge delay has passed since it was sent (the delay)."""
        # the hedge delay counts from when the primary is sent, not from when it joined an endpoint's queue
        sent = asyncio.create_task(call.sent.wait())
        try:
            await asyncio.wait({primary, sent}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sent.cancel()
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        while True:
            delay, provisional = self._hedge_delay(call, provider, model)
            assert delay is not None  # hedging is on
            remaining = delay - (loop.time() - sent_at)
            if primary.done():
                return None
            if remaining <= 0:
                return delay
            waiting: set[asyncio.Future[Any]] = {primary}
            answered = asyncio.create_task(self._answered.wait()) if provisional else None
            if answered is not None:
                waiting.add(answered)
            due = loop.time() + remaining
            try:
                done, _ = await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if answered is not None:
                    answered.cancel()
            if primary in done:
                return None
            if not done:
                # Woken late, this process was stalled (a busy machine, a blocking write): an answer that arrived
                # meanwhile is not read yet, and a hedge now pays for it twice. The primary gets back the time
                # the stall took (at most the delay) before it counts as silent.
                late = loop.time() - due
                if late > STALL_S and await _finishes(primary, min(late, delay)):
                    return None
                return delay

    def _peer_answered(self, round_number: int, latency: float) -> None:
        self._peer_latencies.setdefault(round_number, []).append(latency)
        answered, self._answered = self._answered, asyncio.Event()
        answered.set()

    async def _hedged(self, call: _Call, provider: str, request: CompletionRequest, substitute: bool) -> Completion:
        if not self.settings.hedging.enabled:
            return await self._run(call, provider, request, hedge=False)
        primary = asyncio.create_task(self._run(call, provider, request, hedge=False))
        try:
            delay = await self._wait_for_hedge(call, primary, provider, request.model)
            if delay is None:
                return primary.result()
            target = (self.backup_for(provider, request.model, request) if substitute else None) \
                or (provider, request.model)
            # a primary waiting out its key's limit: a backup on the same endpoint waits for it too (paid twice if
            # both are then sent)
            same_limit = target == (provider, request.model) and _hedge_reason(call, False) == "rate_limited"
            if self._one_slot_for_both(provider, target[0]) or same_limit or not self.budget.try_acquire():
                return await primary
            call.hedged = True
            log.debug("%s: %s/%s silent after %.2fs, hedging with %s/%s", call.agent, provider, request.model, delay,
                      *target)
            backup = asyncio.create_task(self._run(call, target[0], replace(request, model=target[1]), hedge=True))
            try:
                completion, backup_won = await race(primary, backup, fatal=lambda e: _outcome(e) in _NO_FAILOVER)
            except ProviderError:
                self._hedged_event(call, provider, request.model, target, delay, "none", _hedge_reason(call, True))
                raise
            failed = primary.done() and not primary.cancelled() and primary.exception() is not None
            reason = _hedge_reason(call, failed)
            self._hedged_event(call, provider, request.model, target, delay, "backup" if backup_won else "primary",
                               reason)
            if backup_won and target != (provider, request.model):  # (the same model answering is alive)
                self._note_beaten(call, provider, request.model)
                self._substituted(call, provider, request.model, target, reason)
            return completion
        finally:
            if not primary.done():  # our caller was cancelled: take the primary down with us
                primary.cancel()
                await asyncio.gather(primary, return_exceptions=True)

    async def _failover(self, call: _Call, provider: str, request: CompletionRequest, error: ProviderError,
                        allow_substitution: bool) -> Completion:
        target = self.backup_for(provider, request.model, request) if allow_substitution else None
        if target is None:
            raise error
        if self.settings.strict_models:
            raise SubstitutionRefusedError(
                f"strict_models=true: agent {call.agent!r} would have been answered by {target[0]}/{target[1]} "
                f"instead of {provider}/{request.model}, which failed: {error}",
                provider=provider,
                model=request.model,
            ) from error
        try:
            completion = await self._run(call, target[0], replace(request, model=target[1]), hedge=False)
        except ProviderError as backup_error:
            self._note_failure(call, target[0], target[1], backup_error)
            error.add_note(f"the backup {target[0]}/{target[1]} failed too: {backup_error}")
            raise error from backup_error
        self._substituted(call, provider, request.model, target,
                          "rate_limited" if error.outcome == "rate_limited" else "failure")
        return completion

    def _one_slot_for_both(self, primary: str, backup: str) -> bool:
        """Whether ``primary`` and ``backup`` are one endpoint serving one call at a time. A backup there waits for
        the primary's slot, so it could only be sent once the primary has answered, and the server would then
        generate a whole answer nobody reads (llama-cpp-python's server does not stop when the caller goes away)."""
        slot = self._slot(self.provider(primary))
        return (slot is not None and self.provider(primary).max_concurrency() == 1
                and slot is self._slot(self.provider(backup)))

    def _slot(self, instance: Provider) -> asyncio.Semaphore | None:
        """The queue of calls to ``instance``'s endpoint (shared by provider names that point at the same URL);
        None when the endpoint takes any number of calls at once."""
        limit = instance.max_concurrency()
        if limit is None:
            return None
        key = instance.endpoint() or instance.name
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = asyncio.Semaphore(limit)
        return slot

    async def _run(self, call: _Call, name: str, request: CompletionRequest, *, hedge: bool) -> Completion:
        """One provider's answer, with retries inside the call's deadline.

        With ``max_concurrency`` the call first waits for a free slot of its endpoint (emitting
        ``provider:queued``); its deadline starts when it is sent, so time spent queued never times it out.
        """
        if self.before_spending is not None:
            # e.g. the journal's writes so far are durable (conclave.store.recorder): before the call counts as
            # sent (its hedge timer) and before its deadline starts
            await self.before_spending()
        instance = self.provider(name)
        budget_s = request.timeout_s or instance.settings.timeout_s
        slot = self._slot(instance)
        async with contextlib.AsyncExitStack() as stack:
            if slot is not None:
                if slot.locked():
                    self._queued(call, instance, request.model, hedge)
                await stack.enter_async_context(slot)

            async def attempt(number: int, remaining: float) -> Completion:
                if number > 1 and self.before_spending is not None:
                    await self.before_spending()  # a retry spends again: the journal must still hold
                return await self._attempt(call, instance, request, number, remaining, hedge)

            return await call_with_retries(
                attempt,
                max_attempts=instance.settings.max_attempts,
                deadline=time.monotonic() + budget_s,
                policy=self.retry_policy,
                rng=self._rng,
            )
        raise AssertionError("unreachable")  # pragma: no cover - the stack never swallows exceptions

    def _queued(self, call: _Call, instance: Provider, model: str, hedge: bool) -> None:
        log.debug("%s: %s/%s waits for a free slot (max_concurrency=%s)", call.agent, instance.name, model,
                  instance.max_concurrency())
        if self.bus is not None:
            self.bus.emit(events.PROVIDER_QUEUED, round_number=call.round_number, agent=call.agent,
                          provider=instance.name, model=model, max_concurrency=instance.max_concurrency(),
                          hedge=hedge)

    async def _attempt(self, call: _Call, instance: Provider, request: CompletionRequest, number: int,
                       remaining: float, hedge: bool) -> Completion:
        endpoint = instance.endpoint()
        pacer = pacer_for(endpoint) if endpoint else None
        if pacer is not None:  # under a rate limit, requests to the endpoint are spaced (never past the deadline)
            while (wait_s := pacer.take()) > 0:
                if wait_s >= remaining:  # a refusal of our own, as the endpoint would answer: transient, not a hang
                    raise RateLimitedError(f"{instance.name}: paced under its rate limit past the call's deadline",
                                           retry_after_s=wait_s, provider=instance.name, model=request.model)
                await asyncio.sleep(wait_s)
                remaining -= wait_s
            pace = pacer.cuts
        if not hedge:  # the hedge delay counts from here: a wait for the endpoint's slot or pace is not slowness
            call.sent.set()
        started_at, t0 = time.time(), time.perf_counter()
        token = object()
        streamed: list[str] = []
        try:
            async with asyncio.timeout(remaining):
                if call.gate is None:
                    completion = await instance.attempt(request)
                else:
                    completion = await self._stream(instance, request, call.gate, token, streamed)
        except TimeoutError:
            error = ProviderTimeoutError(
                f"{instance.name} did not answer {request.model} within the call's deadline "
                f"({remaining:.1f}s left of {request.timeout_s or instance.settings.timeout_s:g}s)",
                provider=instance.name,
                model=request.model,
            )
            self._record(call, instance.name, request.model, number, started_at, t0, hedge, error=error,
                         usage=_abandoned_usage(instance, request, streamed))
            raise error from None
        except ProviderError as exc:
            if pacer is not None and exc.outcome == "rate_limited":
                pacer.refused(pace, exc.retry_after_s)
            usage = _abandoned_usage(instance, request, streamed) if exc.billed else None
            self._record(call, instance.name, request.model, number, started_at, t0, hedge, error=exc, usage=usage)
            raise
        except asyncio.CancelledError:
            self._record(call, instance.name, request.model, number, started_at, t0, hedge, cancelled=True,
                         usage=_abandoned_usage(instance, request, streamed))
            raise
        finally:
            if call.gate is not None:
                call.gate.release(token)
        if pacer is not None:
            pacer.answered(completion.usage.total_tokens)
        self._record(call, instance.name, request.model, number, started_at, t0, hedge, usage=completion.usage,
                     estimated=False)
        return replace(completion, provider=instance.name)

    async def _stream(self, instance: Provider, request: CompletionRequest, gate: _ChunkGate,
                      token: object, streamed: list[str]) -> Completion:
        completion: Completion | None = None
        stream = cast(AsyncGenerator[str | Completion, None], instance.attempt_stream(request))
        async with contextlib.aclosing(stream):
            async for item in stream:
                if isinstance(item, Completion):
                    completion = item
                else:
                    streamed.append(item)
                    gate.emit(token, item)
        if completion is None:
            error = MalformedResponseError(f"{instance.name} ended its stream without a completion",
                                           provider=instance.name, model=request.model)
            error.billed = True
            raise error
        return completion

    def _record(self, call: _Call, provider: str, model: str, number: int, started_at: float, t0: float,
                hedge: bool, *, usage: Usage | None = None, error: ProviderError | None = None,
                cancelled: bool = False, estimated: bool = True) -> None:
        latency = time.perf_counter() - t0
        outcome: Outcome = "cancelled" if cancelled else ("ok" if error is None else error.outcome)
        attempt = Attempt(
            provider=provider,
            model=model,
            number=number,
            started_at=started_at,
            latency_s=latency,
            outcome=outcome,
            status=error.status if error is not None else (None if cancelled else 200),
            error=str(error) if error is not None else None,
            hedge=hedge,
            usage=usage or Usage(),
            estimated=usage is not None and estimated,
        )
        self._attempts.append(attempt)
        call.attempts.append(attempt)
        if outcome in _HEALTH_OUTCOMES:
            # a warm-up's latency is a prefill and a pre-flight check's (round 0) is not a round's answer: neither
            # sets a hedge delay
            answer = call.agent != WARMUP_AGENT and call.round_number >= 1
            self.health.record(provider, model, ok=outcome == "ok", latency_s=latency, latency_history=answer)
            if outcome == "ok" and answer:
                self._peer_answered(call.round_number, latency)
                if self.hedge_memory is not None:
                    self.hedge_memory.note(provider, model, latency)
        if self.bus is not None:
            self.bus.emit(
                events.PROVIDER_ATTEMPT,
                round_number=call.round_number,
                agent=call.agent,
                provider=provider,
                model=model,
                number=number,
                started_at=started_at,
                latency_s=latency,
                outcome=outcome,
                status=attempt.status,
                error=attempt.error,
                hedge=hedge,
                input_tokens=attempt.usage.input_tokens,
                output_tokens=attempt.usage.output_tokens,
                cached_input_tokens=attempt.usage.cached_input_tokens,
                cache_write_tokens=attempt.usage.cache_write_tokens,
                cost=self.cost(provider, model, attempt.usage),
                estimated=attempt.estimated,
            )

    def _hedged_event(self, call: _Call, provider: str, model: str, target: tuple[str, str], after_s: float,
                      winner: str, reason: str) -> None:
        if self.bus is not None:
            self.bus.emit(events.PROVIDER_HEDGED, round_number=call.round_number, agent=call.agent,
                          provider=provider, model=model, backup_provider=target[0], backup_model=target[1],
                          after_s=round(after_s, 3), winner=winner, same_model=target == (provider, model),
                          reason=reason)

    def _substituted(self, call: _Call, provider: str, model: str, target: tuple[str, str], reason: str,
                     detail: str | None = None) -> None:
        payload: dict[str, Any] = {
            "round_number": call.round_number,
            "agent": call.agent,
            "original_provider": provider,
            "original_model": model,
            "substitute_provider": target[0],
            "substitute_model": target[1],
            "reason": reason,
        }
        if detail is not None:
            payload["detail"] = detail
        self._substitutions.append(payload)
        self._stand_ins[(call.agent, call.round_number, provider, model)] = target
        # with a bus, the event is what the user sees (the progress line "↻ agent: original → substitute"): the log
        # line would print it a second time on stderr
        log.log(logging.DEBUG if self.bus is not None else logging.INFO, "%s: %s/%s answered for %s/%s (%s)",
                call.agent, *target, provider, model, reason)
        if self.bus is not None:
            self.bus.emit(events.PROVIDER_SUBSTITUTED, **payload)

    # ------------------------------------------------------------------------------------- active checks

    def test_call_estimate(self, provider: str, model: str) -> float | None:
        """What :meth:`test_call` would cost at most (its prompt and its whole output budget), USD."""
        request = test_request(model, 10.0)
        prompt = TEST_PROMPT + json.dumps(TEST_SCHEMA)
        return self.estimate_cost(provider, model, count_tokens(prompt, model) + 20, request.max_tokens)

    async def test_call(self, provider: str, model: str, *, timeout_s: float) -> CallCheck:
        """One tiny structured-output call, asked the way a consultation asks for an artifact (with the endpoint's
        negotiated form, which is remembered). Retries and the endpoint's queue apply; no hedge, no substitute."""
        if self._session is None:
            raise RuntimeError("ProviderPool.test_call() needs `async with ProviderPool(...)`")
        call = _Call("doctor", 0, None)
        started = time.perf_counter()
        try:
            completion = await self._run(call, provider, test_request(model, timeout_s), hedge=False)
        except ProviderError as exc:
            cost = sum(self.cost(provider, model, a.usage) or 0.0 for a in call.attempts)
            return CallCheck(tested=True, ok=False, latency_s=time.perf_counter() - started, cost=cost,
                             error=str(exc))
        problem = _valid_test_answer(completion)
        return CallCheck(tested=True, ok=problem is None, form=completion.structured_output,
                         latency_s=time.perf_counter() - started,
                         cost=self.cost(provider, model, completion.usage), error=problem)

    async def probe(self, provider: str, models: list[str] | None = None, *, timeout_s: float = 10.0) -> ProbeResult:
        """Actively check ``provider`` (key, reachability, ``models`` listed); feeds health like a real call."""
        if self._session is None:
            raise RuntimeError("ProviderPool.probe() needs `async with ProviderPool(...)`")
        result = await probe(self.provider(provider), self._api(provider), models or [], timeout_s=timeout_s)
        result.free = self.provider(provider).costs_nothing()
        if result.reachable is not None and result.latency_s is not None:
            # an unlisted model says nothing about the endpoint's health; unreachable or a rejected key does
            self.health.record(provider, "", ok=result.reachable and not result.key_rejected,
                               latency_s=result.latency_s)
        return result


def _valid_test_answer(completion: Completion) -> str | None:
    """None when the test call's answer is a valid :data:`TEST_SCHEMA` object; otherwise what is wrong with it."""
    obj: Any = completion.parsed
    if obj is None:
        try:
            obj = extract_json(completion.text)
        except ArtifactParseError:
            return f"the answer holds no JSON object: {completion.text[:80]!r}"
    errors = sorted(Draft202012Validator(TEST_SCHEMA).iter_errors(obj), key=lambda e: list(e.path))
    if errors:
        where = "/".join(str(p) for p in errors[0].path) or "(root)"
        return f"the answer does not match the schema ({where}: {errors[0].message})"
    return None


def _outcome(exc: BaseException) -> str:
    return exc.outcome if isinstance(exc, ProviderError) else "bug"


#: a hedge timer firing this much later than due means the event loop was stalled, not the provider silent
STALL_S = 0.05


async def _finishes(task: asyncio.Task[Any], within_s: float) -> bool:
    """Whether ``task`` is done within ``within_s`` seconds (it is not cancelled meanwhile)."""
    done, _ = await asyncio.wait({task}, timeout=within_s)
    return task in done


def _hedge_reason(call: _Call, primary_failed: bool) -> str:
    """Why a hedge's backup was needed: the primary was rate limited (a 429 it was waiting out), it failed (outright,
    or was between retries of failed attempts), or it was only slow."""
    failed = [a.outcome for a in call.attempts if not a.hedge and a.outcome not in ("ok", "cancelled")]
    if "rate_limited" in failed:
        return "rate_limited"
    return "failure" if primary_failed or failed else "timeout"


def _first_line(error: str) -> str:
    text = error.strip()
    line = text.splitlines()[0] if text else "no message"
    return line if len(line) <= 160 else line[:157] + "…"


def _abandoned_usage(instance: Provider, request: CompletionRequest, streamed: list[str]) -> Usage | None:
    """What an attempt abandoned after it was sent (a hedge's loser, a timeout, a cut-off stream) is billed at
    least: the whole prompt, and the answer text that arrived. Providers report no usage for such attempts, so
    conclave counts it (``Attempt.estimated``); the price table then prices it like any attempt (a local model at
    $0)."""
    prompt = "\n".join([request.system or "", *(m.content for m in request.messages)])
    if request.json_schema is not None:
        prompt += json.dumps(request.json_schema)
    return Usage(input_tokens=count_tokens(prompt, request.model),
                 output_tokens=count_tokens("".join(streamed), request.model) if streamed else 0)


class _PromptSize:
    """A request's prompt size against a backup's context limits: its UTF-8 bound first (no tokenizer), counted
    exactly (once per encoding) only when the bound is over a candidate's room."""

    def __init__(self, request: CompletionRequest) -> None:
        self.request = request
        self._texts: list[str] | None = None
        self._counted: dict[str, int] = {}

    def texts(self) -> list[str]:
        if self._texts is None:
            request = self.request
            self._texts = [request.system or "", *(m.content for m in request.messages),
                           json.dumps(request.json_schema) if request.json_schema is not None else ""]
        return self._texts

    def fits(self, instance: Provider, model: str) -> bool:
        limits = instance.context_limits(model)
        room = None if limits is None else limits.prompt_room(self.request.max_tokens)
        if room is None:
            return True  # no known limit: the provider decides
        overhead = 16  # role markers around the messages, as the pre-flight estimate counts them
        if sum(utf8_upper_bound(text) for text in self.texts()) + overhead <= room:
            return True
        encoding = encoding_name_for(model)
        if encoding not in self._counted:
            self._counted[encoding] = sum(count_tokens(text, model) for text in self.texts() if text)
        return self._counted[encoding] + overhead <= room
