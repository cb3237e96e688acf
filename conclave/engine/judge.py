"""The judge seat: the configured judge, and the one replacement from another provider when it fails.

A judge "fails" when its provider fails after the pool's retries or its answer stays invalid after the re-ask.
The replacement (``pool.backup_for``, else the first panel model on another provider with a key) then judges
this round and every later one; if it fails too, the caller ends the consultation as ``partial``. With
``strict_models=true`` no replacement is asked: the consultation ends ``partial`` saying so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from conclave.config.settings import Settings
from conclave.engine.calls import JUDGE, CallOutcome, CallSpec, ask_for_artifact
from conclave.engine.extraction import request_schema
from conclave.events import PROVIDER_SUBSTITUTED, EventBus
from conclave.providers.base import CompletionRequest, Message

if TYPE_CHECKING:
    from conclave.providers.pool import ProviderPool


class JudgeSeat:
    def __init__(self, settings: Settings, native: Callable[[str], bool]) -> None:
        self.configured = (settings.judge.provider, settings.judge.model)
        self.provider, self.model = self.configured
        self.fallback_used = False
        self.actual: tuple[str, str] | None = None  # who produced the latest judge artifact
        self.substitution: dict[str, Any] | None = None  # the fallback, as recorded in ``substitutions``
        self._settings = settings
        self._native = native
        self.stream = False  # publish the judge's answers as they stream in (set by the session)

    def restore(self, substitution: dict[str, Any] | None) -> None:
        """Continue with the replacement an earlier run of this consultation switched to (``conclave resume``)."""
        if not substitution or self._settings.strict_models:
            return
        self.substitution, self.fallback_used = dict(substitution), True
        self.provider, self.model = substitution["substitute_provider"], substitution["substitute_model"]

    async def ask(self, pool: ProviderPool, spec: CallSpec, bus: EventBus) -> CallOutcome:
        """Ask the current judge; on failure switch once to a replacement and ask it the same thing."""
        # The seat, not the pool, replaces a failing judge: the replacement then judges every later round, and
        # the record says so (``judge.fallback_used``).
        spec = replace(spec, agent=JUDGE, provider=self.provider, model=self.model, allow_substitution=False)
        outcome = await ask_for_artifact(pool, spec, native=self._native(self.provider), bus=bus, stream=self.stream)
        if not outcome.ok and self._settings.strict_models:
            # strict: no other model may take the seat (it would read every answer and be billed)
            outcome.error = f"{outcome.error}; strict_models=true: no replacement judge was asked"
        elif not outcome.ok and not self.fallback_used:
            replacement = self.replacement(pool, spec)
            if replacement is not None:
                self.substitution = {
                    "round_number": spec.round_number,
                    "agent": JUDGE,
                    "original_provider": self.provider,
                    "original_model": self.model,
                    "substitute_provider": replacement[0],
                    "substitute_model": replacement[1],
                    "reason": "failure",
                    "judge_fallback": True,
                    "error": outcome.error,
                }
                bus.emit(PROVIDER_SUBSTITUTED, **self.substitution)
                self.fallback_used = True
                self.provider, self.model = replacement
                spec = replace(spec, provider=self.provider, model=self.model)
                outcome = await ask_for_artifact(pool, spec, native=self._native(self.provider), bus=bus,
                                                 stream=self.stream)
                if outcome.ok:
                    outcome.status = "fallback"
        if outcome.ok:
            self.actual = (outcome.provider or self.provider, outcome.model or self.model)
        return outcome

    def replacement(self, pool: ProviderPool, spec: CallSpec | None = None) -> tuple[str, str] | None:
        """A judge on a provider other than the failing one, or None when no such provider has a key; with
        ``spec`` (the call it must answer), one whose context limits hold that call's prompt and answer cap."""
        request = None if spec is None else CompletionRequest(
            model=spec.model, system=spec.system, messages=(Message("user", spec.user),),
            json_schema=request_schema(spec.schema_name), max_tokens=spec.max_tokens)
        candidates: list[tuple[str, str]] = []
        backup = pool.backup_for(self.provider, self.model, request)
        if backup is not None:
            candidates.append(backup)
        candidates += [(a.provider, a.model) for a in self._settings.agents.values()]
        for provider, model in candidates:
            if provider != self.provider and pool.has_key(provider) \
                    and pool.unavailable_reason(provider, model) is None \
                    and (request is None or pool.fits(provider, model, request)):
                return provider, model
        return None
