"""Round 4 — verdict: the judge weighs all round-1 artifacts (full) with the filtered synthesis and
cross-examination. Also the verdict derived from the synthesis when no verdict round runs."""

from __future__ import annotations

from typing import Any

from conclave import artifacts
from conclave.engine.budgets import MAX_OUTPUT_TOKENS
from conclave.engine.calls import JUDGE, CallSpec
from conclave.engine.extraction import header_for
from conclave.engine.session import Session


def verdict_spec(session: Session, independents: str, synthesis: str, cross_exam: str) -> CallSpec:
    return CallSpec(
        agent=JUDGE,
        provider=session.judge.provider,
        model=session.judge.model,
        system=session.strategy.judge_system(session.context_text),
        user=session.strategy.verdict(
            question=session.question,
            panel=session.labels.panel(),
            absent=session.absent_notice(4),
            independents=independents,
            synthesis=synthesis,
            cross_exam=cross_exam,
        ),
        schema_name=session.strategy.verdict_schema,
        round_number=4,
        max_tokens=MAX_OUTPUT_TOKENS["verdict"],
    )


async def run_verdict(session: Session) -> bool:
    """True when a valid verdict was recorded."""
    record = session.record
    assert record.round_2 is not None and record.round_3 is not None
    synthesis = session.filtering.apply(record.round_2, 4, view=session.labels.judge_view)
    cross_exam = session.filtering.apply(record.round_3, 4, view=session.labels.judge_view)
    spec = verdict_spec(session, session.shown_independents(), session.shown(synthesis), session.shown(cross_exam))
    outcome = await session.judge.ask(session.pool, spec, session.bus)
    if outcome.artifact is None:
        record.abort_reason = f"the judge failed in round 4: {outcome.error}"
        return False
    artifact = session.labels.to_names(outcome.artifact)
    record.round_4 = record.verdict = artifact
    session.emit_artifact(4, spec.schema_name, None, artifact, outcome.raw_text, outcome.status or "valid")
    return True


def derive_verdict(session: Session) -> dict[str, Any]:
    """The verdict taken from the synthesis (early termination, ``rounds=2|3``), validated like any artifact."""
    record = session.record
    assert record.round_2 is not None
    schema = session.strategy.verdict_schema
    verdict = {**session.strategy.verdict_from_synthesis(record.round_2), **header_for(schema, 4, None)}
    artifacts.check(schema, verdict)
    record.verdict = verdict
    return verdict
