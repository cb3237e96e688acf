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
                                       {total, by_type {type: count}}, judge_labels {agent: "Agent A"}, shuffle_seed,
                                       peer_labels {agent: {agent: label it sees}};
                                       over MCP also origin ("mcp") and client {name, version}
state:transition                       from, to, reason
consultation:cost_estimated            estimated_cost (float | null when a model's price is unknown),
                                       input_tokens, cached_input_tokens (expected from prompt caches),
                                       output_tokens, unknown_prices [model], rounds [n], may_stop_after_round
                                       (1 when the vote gate may end it after round 1, else null), round_1_cost
consultation:user_consent              approved, auto_approved, reason
round:started                          round_number, round_type (the name of the round's last round type:
                                       independent|synthesis|cross_exam|verdict, or a strategy's own)
provider:queued                        round_number, agent, provider, model, max_concurrency, hedge: the call
                                       waits for a free slot of its endpoint (``providers.<name>.max_concurrency``)
provider:attempt                       round_number, agent (agent name, or "judge"), provider, model, number,
                                       started_at (epoch s), latency_s, outcome, status, error, hedge,
                                       input_tokens, output_tokens, cached_input_tokens, cache_write_tokens,
                                       cost (null = unknown), estimated (true: an abandoned attempt whose
                                       tokens conclave counted itself)
provider:hedged                        round_number, agent, provider, model (the primary), backup_provider,
                                       backup_model, after_s (how long the primary had been silent), winner
                                       (primary|backup|none: both failed), same_model (the backup was the same
                                       model on the same provider: a win is no substitution and does not degrade
                                       the consultation), reason (why the backup was needed: timeout,
                                       rate_limited or failure)
consultation:provider_substituted      round_number, agent, original_provider, original_model,
                                       substitute_provider, substitute_model, reason (timeout: the primary was
                                       slow; rate_limited: it was waiting out a 429; failure: it failed;
                                       unavailable: it failed for good earlier in the consultation and is not
                                       asked again), detail (with unavailable: which round, what failure)
agent:completed                        round_number, agent, ok, duration_s, input_tokens, output_tokens, cost,
                                       error (null when ok)
consultation:round_artifact            round_number, round_type (the round type that produced it), artifact_type,
                                       schema (schema name), agent (null for the judge's artifacts), artifact (the
                                       validated JSON), raw_text, status (valid|repaired|reasked|fallback|restored:
                                       an answer an interrupted earlier run paid for, recorded again)
filter:applied                         round_number (any round after the synthesis), artifact_type, filter,
                                       limits {field: n}, tokens_before, tokens_after (the artifact's JSON as
                                       shown), recipients (calls shown it), agent (the author of an agent's
                                       reply shown again; null for the judge's artifacts), error
round:completed                        round_number, round_type, duration_s, input_tokens, output_tokens, cost,
                                       ok (false: the round ran to its end but failed in a way that stops the
                                       consultation; ``conclave resume`` restores only ok rounds), safety (the
                                       safety checks of the round: {tier, passed, blocked, would_block}, or null
                                       when none ran). Written only
                                       when the round ran to its end, never for a cancelled one
round:interrupted                      round_number, round_type, duration_s, input_tokens, output_tokens, cost,
                                       reason (cancelled|stopped|error), detail: the round did not run to its end
                                       (Ctrl-C, the cost gate inside it, an unexpected error); never restored
plan:changed                           action (insert|end|restore), after_step (steps played when it changed),
                                       round_types [name] (inserted, dropped by end, or the whole restored plan),
                                       reason, plan [name] (the plan now)
exit:evaluated                         round_number, votes {agent: vote}, confidence {agent: c}, consensus {share,
                                       blockers, low_confidence, min_confidence, met}, change, new_facts, plateau,
                                       reason (consensus|convergence|round-cap|user-stop|null), action
                                       (stop|repeat), can_repeat, overridden, asked, answer, restored: the exit
                                       controller after a cross-examination round (conclave.quality.exit)
early_termination:decided              offered, accepted, confidence, threshold, reason, rounds_skipped,
                                       estimated_cost_saved
vote:gate                              the vote gate after round 1 (schema ``vote_gate``): decided, reason, tau,
                                       agreement, aggregator, weights, basis, note, answer, supporters, answers
                                       (conclave.engine.vote_gate)
vote:final                             the final aggregate after cross-examination (schema ``final_aggregate``):
                                       aggregator, weights, answer, supporters, the answers that count, the judge's
                                       verdict answer and whether it agrees (conclave.engine.settle)
cost:gate_triggered                    estimated_cost, actual_cost, abort_ratio, phase
consultation:resumed                   restored_rounds [n], spent {cost, input_tokens, output_tokens,
                                       cached_input_tokens, by_provider {provider: cost}, unknown_prices}, from_seq
                                       (written by ``conclave resume`` before the engine continues)
consultation:completed                 status (complete|completed_degraded|partial|aborted|blocked), result (the full
                                       result JSON, see conclave.engine.result)
safety:checked                         round_number (0: the question, before round 1), round_type ("question" or
                                       the step's round type), stage (on|shadow), tier (1|2|3), tier_name
                                       (lightweight|triggered|full-evaluation), responses (texts checked),
                                       tier1_ms, flags [tier-1 hits {rule, kind, category, description, target,
                                       matched}], triggers [tier-2 triggers, same shape; kind mode|topic|intent|
                                       context], evaluation (the judge's full evaluation {status evaluated|reused|
                                       failed, verdict, risk, categories, concerns, recommendations, reason,
                                       content_sha256} or null), concern, passed, blocked, would_block (shadow),
                                       block {tier, category, rule, target, round_number, reason} or null,
                                       withheld [{round_number, round_type, agent}] (answers the report withholds)
groupthink:check                       round_number, detector (stagnation|early_convergence), fired, figures,
                                       thresholds, why, stage (on|shadow), action (objection_round|none), acted,
                                       not_acted_because (shadow, rounds: a short run, objection_cap,
                                       no_judge_step_left, resumed; null when acted)
groupthink:objection                   round_number, template (id of the words sent), trigger {detectors,
                                       round_number, why}, answers [agent], new_claims [id],
                                       restated_claims [id], status_changes [{claim_id, from, to}], produced_new,
                                       escalated, continued (the terminal user's answer; null when not asked)
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
#: the vote gate after round 1: whether the aggregated answer decided (schema ``vote_gate``)
VOTE_GATE = "vote:gate"
#: the final aggregate after cross-examination: the answer the user gets (schema ``final_aggregate``)
FINAL_AGGREGATE = "vote:final"
EXIT_EVALUATED = "exit:evaluated"
COST_GATE_TRIGGERED = "cost:gate_triggered"
CONSULTATION_RESUMED = "consultation:resumed"
CONSULTATION_COMPLETED = "consultation:completed"
#: live only (:meth:`EventBus.publish`), never journaled: a piece of an answer while it streams in
AGENT_CHUNK = "agent:chunk"
QUALITY_CHECKS = "quality:checks"
DEBATE_STATE = "quality:debate_state"
GROUNDING = "quality:grounding"
COVERAGE = "quality:coverage"
SAFETY_CHECKED = "safety:checked"
#: a groupthink detector looked at a round (fired or not, with its figures, the stage and what was done)
GROUPTHINK_CHECK = "groupthink:check"
#: what a critical objection round produced (new claims, status changes) and whether it escalated
OBJECTION_OUTCOME = "groupthink:objection"


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
