"""Round 1 — independent positions: every agent answers the question alone, all in parallel."""

from __future__ import annotations

import asyncio

from conclave.engine.budgets import MAX_OUTPUT_TOKENS
from conclave.engine.calls import CallOutcome, CallSpec, ask_for_artifact
from conclave.engine.session import Session


def independent_spec(session: Session, name: str) -> CallSpec:
    """Agent ``name``'s round-1 call: persona + context as the system prompt, the question as the user message."""
    agent = session.settings.agents[name]
    return CallSpec(
        agent=name,
        provider=agent.provider,
        model=agent.model,
        system=session.strategy.agent_system(session.settings.personas[agent.persona], session.context_text),
        user=session.strategy.independent(question=session.question),
        schema_name=session.strategy.independent_schema,
        round_number=1,
        max_tokens=MAX_OUTPUT_TOKENS["independent"],
        agent_id=name,
    )


async def run_independent(session: Session) -> None:
    """Ask every agent at once; each result is recorded the moment it arrives, so none is lost to a sibling."""

    async def one(name: str) -> None:
        spec = independent_spec(session, name)
        outcome = await ask_for_artifact(session.pool, spec, native=session.native(spec.provider), bus=session.bus)
        _record(session, name, outcome)

    async with asyncio.TaskGroup() as group:
        for name in session.settings.agents:
            group.create_task(one(name))


def _record(session: Session, name: str, outcome: CallOutcome) -> None:
    state = session.agents[name]
    state.note(1, outcome)
    if outcome.artifact is None:
        state.absent = True
        return
    session.record.round_1[name] = outcome.artifact
    status = outcome.status or "valid"
    session.emit_artifact(1, outcome.spec.schema_name, name, outcome.artifact, outcome.raw_text, status)
