"""Round 3 — cross-examination: each present agent answers the filtered synthesis with its own round-1
position in hand (in parallel); the judge then records challenges, rebuttals and what is unresolved."""

from __future__ import annotations

import asyncio

from conclave.engine.budgets import MAX_OUTPUT_TOKENS
from conclave.engine.calls import JUDGE, CallSpec, ask_for_artifact
from conclave.engine.session import Session


def reply_spec(session: Session, name: str, own_position: str, synthesis: str) -> CallSpec:
    """Agent ``name``'s round-3 call: same system prompt as round 1 (cacheable prefix), the debate in the user turn."""
    agent = session.settings.agents[name]
    return CallSpec(
        agent=name,
        provider=agent.provider,
        model=agent.model,
        system=session.strategy.agent_system(session.settings.personas[agent.persona], session.context_text),
        user=session.strategy.cross_exam_reply(
            question=session.question,
            label=session.labels.label(name),
            own_position=own_position,
            synthesis=synthesis,
        ),
        schema_name=session.strategy.reply_schema,
        round_number=3,
        max_tokens=MAX_OUTPUT_TOKENS["cross_exam_reply"],
        agent_id=name,
    )


def cross_exam_spec(session: Session, synthesis: str, replies: str) -> CallSpec:
    return CallSpec(
        agent=JUDGE,
        provider=session.judge.provider,
        model=session.judge.model,
        system=session.strategy.judge_system(session.context_text),
        user=session.strategy.cross_exam(
            question=session.question,
            panel=session.labels.panel(),
            absent=session.absent_notice(3),
            synthesis=synthesis,
            replies=replies,
        ),
        schema_name=session.strategy.cross_exam_schema,
        round_number=3,
        max_tokens=MAX_OUTPUT_TOKENS["cross_exam"],
    )


async def run_replies(session: Session) -> None:
    """Every present agent replies at once; replies are stored with names, missing ones noted for the judge."""
    record = session.record
    assert record.round_2 is not None
    present = session.present()
    filtered = session.filtering.apply(record.round_2, 3, view=session.labels.judge_view, recipients=len(present))
    synthesis = session.shown(filtered)

    async def one(name: str) -> None:
        spec = reply_spec(session, name, session.shown(record.round_1[name]), synthesis)
        outcome = await ask_for_artifact(session.pool, spec, native=session.native(spec.provider), bus=session.bus)
        session.agents[name].note(3, outcome)
        if outcome.artifact is None:
            return
        reply = session.labels.to_names(outcome.artifact)
        record.round_3_replies[name] = reply
        session.emit_artifact(3, spec.schema_name, name, reply, outcome.raw_text, outcome.status or "valid")

    async with asyncio.TaskGroup() as group:
        for name in present:
            group.create_task(one(name))
    record.missing_replies = [name for name in present if name not in record.round_3_replies]


async def run_cross_exam_judge(session: Session) -> bool:
    """True when a valid cross-examination artifact was recorded."""
    record = session.record
    if not record.round_3_replies:
        record.abort_reason = "no agent gave a valid reply in round 3"
        return False
    spec = cross_exam_spec(session, session.shown(record.round_2), session.shown_replies())
    outcome = await session.judge.ask(session.pool, spec, session.bus)
    if outcome.artifact is None:
        record.abort_reason = f"the judge failed in round 3: {outcome.error}"
        return False
    artifact = session.labels.to_names(outcome.artifact)
    record.round_3 = artifact
    session.emit_artifact(3, spec.schema_name, None, artifact, outcome.raw_text, outcome.status or "valid")
    return True
