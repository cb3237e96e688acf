"""Building the :class:`ConsultationResult` from a finished (or stopped) consultation, and its status.

Status: ``complete``; ``completed_degraded`` when it completed but the judge fallback was used, an agent was
absent or missed round 3, or any call was answered by a substitute; ``partial`` when it stopped with at least
one round-1 artifact; ``aborted`` when it stopped with none; ``blocked`` when the safety evaluator stopped it
(:mod:`conclave.engine.safety_gate`).

Cost and tokens (``cost.actual``, ``cost.by_provider``, ``cost.unknown_prices``, ``tokens``) cover every billed
call of the consultation across all its runs: a resumed run adds what its earlier runs spent (``prior``, from the
journal) to its own calls. ``cost.estimated`` is the estimate the actual cost is held against: every planned
round's calls, restored rounds included, so both figures describe the whole consultation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conclave.artifacts import schema_registry as artifacts
from conclave.engine.conformity import conformity_record
from conclave.engine.cost.estimate import CostEstimate, SpentSoFar, spent
from conclave.engine.result import (
    AgentRecord,
    Artifacts,
    ConsultationResult,
    CostRecord,
    EarlyTerminationRecord,
    JudgeRecord,
    RoundRecord,
    TokenRecord,
    TransitionRecord,
)
from conclave.engine.session import Session
from conclave.engine.state import ConsultState, StateMachine

if TYPE_CHECKING:  # the result models are imported when a result is built (a CLI run warms them up in round 1)
    from conclave.engine.result import ConsultationResult, Status


@dataclass(frozen=True)
class Provenance:
    """The parts of a result fixed before the first round: identity, inputs and how they were prepared."""

    consultation_id: str
    created_at: str
    started_monotonic: float
    scrub_report: dict[str, Any]
    context_sources: list[dict[str, Any]]
    prompt_versions: dict[str, str]
    config_hash: str


def consultation_status(session: Session, machine: StateMachine, substitutions: list[dict[str, Any]]) -> Status:
    record = session.record
    if session.safety.blocked is not None:
        return "blocked"
    if machine.state is not ConsultState.COMPLETE:
        return "partial" if record.round_1 else "aborted"
    degraded = (
        session.judge.fallback_used
        or any(a.absent or a.substituted for a in session.agents.values())
        or bool(record.missing_replies)
        or bool(substitutions)
    )
    return "completed_degraded" if degraded else "complete"


def assemble_result(
    session: Session,
    machine: StateMachine,
    provenance: Provenance,
    estimate: CostEstimate | None,
    prior: SpentSoFar | None = None,
) -> ConsultationResult:
    """The result; ``prior`` is what earlier runs of a resumed consultation were billed (None: a first run)."""
    record, settings, labels = session.record, session.settings, session.labels
    substitutions = [dict(s) for s in getattr(session.pool, "substitutions", [])]
    if session.judge.substitution is not None:
        substitutions.append(dict(session.judge.substitution))
    substituted_agents = {s.get("agent") for s in substitutions}
    money = spent(session.pool) + (prior or SpentSoFar.nothing())
    verdict = record.verdict
    order = list(settings.agents)
    agents = [
        AgentRecord(
            name=name,
            persona=state.spec.persona,
            provider=state.spec.provider,
            model=state.spec.model,
            label=labels.label(name),
            actual_provider=state.actual_provider,
            actual_model=state.actual_model,
            substituted=state.substituted or name in substituted_agents,
            absent=state.absent,
            error="; ".join(state.errors) or None,
            raw_text=state.raw_text,
            anchor=session.quality.anchors.get(name),
        )
        for name, state in session.agents.items()
    ]
    early = record.early_termination
    unknown = set(money.unknown_prices) | set(estimate.unknown_prices if estimate else [])
    return ConsultationResult(
        consultation_id=provenance.consultation_id,
        question=session.question,
        mode=settings.mode.strategy,
        strategy=settings.mode.strategy,
        status=consultation_status(session, machine, substitutions),
        created_at=provenance.created_at,
        completed_at=artifacts.now_iso(),
        duration_s=round(time.monotonic() - provenance.started_monotonic, 3),
        planned_rounds=session.planned_rounds,
        completed_rounds=record.completed_rounds,
        agents=agents,
        judge=JudgeRecord(
            provider=session.judge.configured[0],
            model=session.judge.configured[1],
            actual_provider=session.judge.actual[0] if session.judge.actual else None,
            actual_model=session.judge.actual[1] if session.judge.actual else None,
            fallback_used=session.judge.fallback_used,
        ),
        rounds=[RoundRecord(number=output.number, round_type=name, judge=output.judge,
                            agents={n: output.by_agent[n] for n in order if n in output.by_agent})
                for name, output in record.played],
        artifacts=Artifacts(
            round_1={name: record.round_1[name] for name in order if name in record.round_1},
            round_2=record.round_2,
            round_3_replies={name: record.round_3_replies[name] for name in order if name in record.round_3_replies},
            round_3=record.round_3,
            round_4=record.round_4,
        ),
        verdict=verdict,
        quality=session.quality.summary(),
        safety=session.safety.summary(),
        escalated=session.quality.groupthink.escalated,
        recommendation=_recommendation(verdict),
        confidence=float(verdict["confidence"]) if verdict and "confidence" in verdict else None,
        dissent=list(verdict.get("dissent", [])) if verdict else [],
        concerns=list(record.round_3.get("unresolved", [])) if record.round_3 else [],
        early_termination=(
            EarlyTerminationRecord(**{k: v for k, v in early.items() if k in EarlyTerminationRecord.model_fields})
            if early is not None
            else None
        ),
        cost=CostRecord(
            estimated=estimate.total if estimate else None,
            actual=money.total,
            unknown_prices=sorted(unknown),
            by_provider=money.by_provider,
        ),
        tokens=TokenRecord(
            input=money.usage.input_tokens,
            output=money.usage.output_tokens,
            cached_input=money.usage.cached_input_tokens,
            total=money.usage.total_tokens,
        ),
        token_efficiency_stats=session.filtering.stats(),
        substitutions=substitutions,
        scrub_report=provenance.scrub_report,
        context_sources=provenance.context_sources,
        prompt_versions=provenance.prompt_versions,
        judge_labels=dict(labels.by_name),
        shuffle_seed=labels.seed,
        peer_labels=session.all_peer_labels(),
        anti_conformity=conformity_record(session),
        absent_agents=[name for name, state in session.agents.items() if state.absent],
        abort_reason=record.abort_reason,
        config_hash=provenance.config_hash,
        transitions=[TransitionRecord.model_validate(t.as_dict()) for t in machine.transitions],
        vote_gate=record.vote_gate,
        final_aggregate=record.final_aggregate,
        parent=session.settings.parent,
    )


def _recommendation(verdict: dict[str, Any] | None) -> str | None:
    """Converge verdicts carry ``recommendation``; explore verdicts a ``summary`` of their options."""
    if not verdict:
        return None
    value = verdict.get("recommendation") or verdict.get("summary")
    return str(value) if value else None
