"""Round 2 — synthesis: the judge reads every round-1 artifact (unfiltered, labelled) and maps consensus."""

from __future__ import annotations

from conclave.engine.budgets import MAX_OUTPUT_TOKENS
from conclave.engine.calls import JUDGE, CallSpec
from conclave.engine.session import Session


def synthesis_spec(session: Session, independents: str) -> CallSpec:
    return CallSpec(
        agent=JUDGE,
        provider=session.judge.provider,
        model=session.judge.model,
        system=session.strategy.judge_system(session.context_text),
        user=session.strategy.synthesis(
            question=session.question,
            panel=session.labels.panel(),
            absent=session.absent_notice(2),
            independents=independents,
        ),
        schema_name=session.strategy.synthesis_schema,
        round_number=2,
        max_tokens=MAX_OUTPUT_TOKENS["synthesis"],
    )


async def run_synthesis(session: Session) -> bool:
    """True when a valid synthesis was recorded (by the judge or its one replacement)."""
    outcome = await session.judge.ask(session.pool, synthesis_spec(session, session.shown_independents()), session.bus)
    if outcome.artifact is None:
        session.record.abort_reason = f"the judge failed in round 2: {outcome.error}"
        return False
    artifact = session.labels.to_names(outcome.artifact)
    session.record.round_2 = artifact
    session.emit_artifact(2, outcome.spec.schema_name, None, artifact, outcome.raw_text, outcome.status or "valid")
    return True
