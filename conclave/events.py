"""Typed consultation events and the per-consultation bus that delivers them to subscribers.

The journal records every event verbatim, so the payloads below are a storage contract: add keys freely, never
rename or drop one. All payloads are JSON-serialisable, snake_case, and never contain an API key.

=====================================  ===========================================================================
type                                   data
=====================================  ===========================================================================
consultation:started                   question, mode, strategy, agents [{name, persona, provider, model}],
                                       judge {provider, model}, planned_rounds, plan
                                       [round type names, in order], config (the validated settings as
                                       JSON, secrets-free), config_hash (sha256 of canonical config JSON),
                                       prompt_versions {round_1..round_4: id}, conclave_version, scrub_report
                                       {total, by_type {type: count}}, judge_labels {agent: "Agent A"}, shuffle_seed;
                                       over MCP also origin ("mcp") and client {name, version}
state:transition                       from, to, reason
consultation:cost_estimated            estimated_cost (float | null when a model's price is unknown),
                                       input_tokens, output_tokens, unknown_prices [model]
consultation:user_consent              approved, auto_approved, reason
round:started                          round_number, round_type (the name of the round's last round type:
                                       independent|synthesis|cross_exam|verdict, or a strategy's own)
provider:queued                        round_number, agent, provider, model, max_concurrency, hedge: the call
                                       waits for a free slot of its endpoint (``providers.<name>.max_concurrency``)
provider:attempt                       round_number, agent (agent name, or "judge"), provider, model, number,
                                       started_at (epoch s), latency_s, outcome, status, error, hedge,
                                       input_tokens, output_tokens, cached_input_tokens, cost (null = unknown),
                                       estimated (true: an abandoned attempt whose tokens conclave counted itself)
provider:hedged                        round_number, agent, provider, model (the primary), backup_provider,
                                       backup_model, after_s (how long the primary had been silent), winner
                                       (primary|backup|none: both failed), same_model (the backup was the same
                                       model on the same provider: a win is no substitution and does not degrade
                                       the consultation)
consultation:provider_substituted      round_number, agent, original_provider, original_model,
                                       substitute_provider, substitute_model, reason (timeout|failure)
agent:completed                        round_number, agent, ok, duration_s, input_tokens, output_tokens, cost,
                                       error (null when ok)
consultation:round_artifact            round_number, round_type (the round type that produced it), artifact_type,
                                       schema (schema name), agent (null for the judge's artifacts), artifact (the
                                       validated JSON), raw_text, status (valid|repaired|reasked|fallback|restored:
                                       an answer an interrupted earlier run paid for, recorded again)
filter:applied                         round_number (3|4), artifact_type, filter, limits {field: n},
                                       tokens_before, tokens_after
round:completed                        round_number, round_type, duration_s, input_tokens, output_tokens, cost,
                                       ok (false: the round ran to its end but failed in a way that stops the
                                       consultation; ``conclave resume`` restores only ok rounds). Written only
                                       when the round ran to its end, never for a cancelled one
round:interrupted                      round_number, round_type, duration_s, input_tokens, output_tokens, cost,
                                       reason (cancelled|stopped|error), detail: the round did not run to its end
                                       (Ctrl-C, the cost gate inside it, an unexpected error); never restored
plan:changed                           action (insert|end), after_step (steps played when it changed), round_types
                                       [name] (inserted, or dropped by end), reason, plan [name] (the plan now)
early_termination:decided              offered, accepted, confidence, threshold, reason, rounds_skipped,
                                       estimated_cost_saved
cost:gate_triggered                    estimated_cost, actual_cost, abort_ratio, phase
consultation:resumed                   restored_rounds [n], spent {cost, input_tokens, output_tokens,
                                       cached_input_tokens, by_provider {provider: cost}, unknown_prices}, from_seq
                                       (written by ``conclave resume`` before the engine continues)
consultation:completed                 status (complete|completed_degraded|partial|aborted), result (the full
                                       result JSON, see conclave.engine.result)
agent:chunk                            round_number, agent (name, or "judge"), text: streamed text of an answer
                                       being written; live only (published when a consultation streams, for the
                                       live view and the terminal), never journaled, carries no sequence number
=====================================  ===========================================================================
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

CONSULTATION_STARTED = "consultation:started"
STATE_TRANSITION = "state:transition"
COST_ESTIMATED = "consultation:cost_estimated"
USER_CONSENT = "consultation:user_consent"
ROUND_STARTED = "round:started"
PROVIDER_QUEUED = "provider:queued"
PROVIDER_ATTEMPT = "provider:attempt"
PROVIDER_HEDGED = "provider:hedged"
PROVIDER_SUBSTITUTED = "consultation:provider_substituted"
AGENT_COMPLETED = "agent:completed"
ROUND_ARTIFACT = "consultation:round_artifact"
FILTER_APPLIED = "filter:applied"
ROUND_COMPLETED = "round:completed"
ROUND_INTERRUPTED = "round:interrupted"
EARLY_TERMINATION = "early_termination:decided"
PLAN_CHANGED = "plan:changed"
COST_GATE_TRIGGERED = "cost:gate_triggered"
CONSULTATION_RESUMED = "consultation:resumed"
CONSULTATION_COMPLETED = "consultation:completed"
#: live only (:meth:`EventBus.publish`), never journaled: a piece of an answer while it streams in
AGENT_CHUNK = "agent:chunk"
QUALITY_CHECKS = "quality:checks"
DEBATE_STATE = "quality:debate_state"
GROUNDING = "quality:grounding"


@dataclass(frozen=True)
class Event:
    type: str
    consultation_id: str
    seq: int
    ts: float
    data: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.type, "consultation_id": self.consultation_id, "seq": self.seq, "ts": self.ts,
                "data": self.data}


Subscriber = Callable[[Event], None]


class EventBus:
    """Delivers one consultation's events, in order, to every subscriber.

    Subscribers marked ``critical`` (the journal) propagate their exceptions: a consultation that cannot be
    recorded must not go on spending money. Others are isolated: their failure is logged, never fatal.
    """

    def __init__(self, consultation_id: str, *, first_seq: int = 0) -> None:
        self.consultation_id = consultation_id
        self._seq = first_seq
        self._subscribers: list[tuple[Subscriber, bool]] = []

    def subscribe(self, subscriber: Subscriber, *, critical: bool = False) -> None:
        self._subscribers.append((subscriber, critical))

    def publish(self, type_: str, **data: Any) -> Event:
        """Deliver a live-only event (``agent:chunk``) to the non-critical subscribers: it takes no sequence
        number (it carries the last one) and is never journaled — the artifact that follows holds the text."""
        return self._deliver(Event(type_, self.consultation_id, self._seq - 1, time.time(), data), journal=False)

    def emit(self, type_: str, **data: Any) -> Event:
        event = Event(type_, self.consultation_id, self._seq, time.time(), data)
        self._seq += 1
        return self._deliver(event, journal=True)

    def _deliver(self, event: Event, *, journal: bool) -> Event:
        for subscriber, critical in self._subscribers:
            if critical:
                if journal:
                    subscriber(event)
                continue
            try:
                subscriber(event)
            except Exception:
                log.exception("event subscriber %r failed on %s", subscriber, event.type)
        return event
