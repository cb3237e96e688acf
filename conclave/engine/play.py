"""Playing one round type: building each call from its declaration, asking, and recording the artifacts.

Every round goes through here, whatever its type (:mod:`conclave.engine.rounds` declares them):

- on the agents' seat every participating agent is asked at once — in the first round every agent, later only
  the agents present (a valid first-round answer); each answer is recorded the moment it arrives, so none is
  lost to a sibling's failure;
- on the judge's seat the judge is asked once (:class:`~conclave.engine.judge.JudgeSeat` replaces a failing
  judge once);
- a call's system prompt is the strategy's agent (context + persona) or judge (context + judge) system prompt —
  the same for every round, and its context block the same for every call, so providers can cache it (the call
  carries :attr:`Session.prompt_cache`) — and its user message the round's template rendered with ``question``,
  ``panel``, ``absent``, the agent's ``label`` and the round type's inputs, shown under neutral labels and
  filtered where the input says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from conclave.artifacts import schema_registry as artifacts
from conclave.engine.caching import warm_prompt_caches
from conclave.engine.calls import JUDGE, CallOutcome, CallSpec, ask_for_artifact
from conclave.engine.extraction import header_for, json_instruction
from conclave.engine.prompt_template import user_message
from conclave.engine.record import RoundOutput, prompt_json
from conclave.engine.rounds import VERDICT_ROUND, Input, RoundType, Step
from conclave.engine.session import Session

T = TypeVar("T")

# ------------------------------------------------------------------------------------------------ inputs


def shared_inputs(session: Session, round_type: RoundType, number: int, *, recipients: int = 1) -> dict[str, str]:
    """The template values every call of this round receives (everything but an agent's own answer)."""
    values = {"question": session.question, "panel": session.labels.panel(), "absent": session.absent_notice()}
    values.update(session.quality.template_values(session.strategy.template(round_type.template).text,
                                                  for_agents=round_type.seat == "agents"))
    for placeholder, source in round_type.inputs.items():
        if source.take != "own":
            values[placeholder] = _shown(session, source, number, recipients, round_type.seat)
    return values


def own_inputs(session: Session, round_type: RoundType, agent: str, shared: Mapping[str, str] | None = None
               ) -> dict[str, str]:
    """The values only agent ``agent`` receives: its label, its own earlier answers in full, and the debate state
    as its seat sees it (``shared``: the values every agent of the round receives, whose judge's statements give
    the gist of the claims they name)."""
    values = {"label": session.labels.label(agent),
              **session.quality.agent_values(session.strategy.template(round_type.template).text, agent,
                                             (shared or {}).values())}
    for placeholder, source in round_type.inputs.items():
        if source.take == "own":
            values[placeholder] = session.shown(session.record.by_agent(source.source).get(agent))
    return values


def _shown(session: Session, source: Input, number: int, recipients: int, seat: str = "judge") -> str:
    record, labels = session.record, session.labels
    if source.take == "judge":
        artifact = record.judged(source.source)
        if artifact is not None and source.filtered is not None:
            artifact = session.filtering.apply(
                artifact, source.filtered, number, view=lambda a: session.view(a, seat), recipients=recipients
            )
        return session.shown(artifact, seat)
    answers = record.by_agent(source.source)
    order = [name for name in labels.order() if name in answers]
    if source.take == "each":
        return prompt_json([session.view(answers[name]) for name in order])
    return prompt_json({labels.label(name): session.view(answers[name]) for name in order})


# ------------------------------------------------------------------------------------------------ calls


def call_spec(session: Session, round_type: RoundType, number: int, values: Mapping[str, str],
              agent: str | None = None, *, measure: bool = False) -> CallSpec:
    """One call of ``round_type``: ``agent``'s (agents' seat) or the judge's, with its template ``values``
    (earlier rounds added, summarized in long debates: :mod:`conclave.quality.summarize`); ``measure``: a call
    that is really sent, whose context tokens are recorded."""
    user = user_message(session.strategy, round_type,
                        session.context.prepare(round_type, number, values, agent=agent, measure=measure))
    if round_type.seat == "judge":
        # an objection round just before it
        user += session.quality.groupthink.judge_addendum(number, session.record, session.labels, session.view)
        return CallSpec(
            agent=JUDGE,
            provider=session.judge.provider,
            model=session.judge.model,
            system=session.strategy.judge_system(session.context_text),
            user=user,
            schema_name=round_type.schema,
            round_number=number,
            max_tokens=round_type.max_tokens,
            cache=session.prompt_cache,
            answers=session.strategy.allowed_answers,
            images=session.images_for(session.judge.provider, session.judge.model),
        )
    assert agent is not None
    spec = session.settings.agents[agent]
    return CallSpec(
        agent=agent,
        provider=spec.provider,
        model=spec.model,
        system=session.quality.system_for(
            agent, session.strategy.agent_system(session.settings.personas[spec.persona], session.context_text),
            session.strategy.agent_role(agent, list(session.settings.agents))),
        user=user,
        schema_name=round_type.schema,
        round_number=number,
        max_tokens=round_type.max_tokens,
        agent_id=agent,
        cache=session.prompt_cache,
        answers=session.strategy.allowed_answers,
        images=session.images_for(spec.provider, spec.model),
    )


def participants(session: Session, round_type: RoundType) -> list[str]:
    """Who plays an agents' round: everyone in the first round, afterwards the agents present."""
    if session.plan.types[0].name == round_type.name:
        return list(session.settings.agents)
    return session.present()


# ------------------------------------------------------------------------------------------------ playing


async def play(session: Session, step: Step, restored: Mapping[str, dict[str, Any]] | None = None) -> str | None:
    """Play one step; None when it produced what the debate needs, else why the consultation must stop.

    ``restored``: agents' answers to this very step that an interrupted earlier run already paid for; they are
    recorded again (status ``restored``) and those agents are not asked a second time.
    """
    if step.type.seat == "agents":
        failure = await _play_agents(session, step, restored or {})
        session.quality.after_step(session, step)
        return failure
    return await _play_judge(session, step)


async def _play_agents(session: Session, step: Step, restored: Mapping[str, dict[str, Any]]) -> str | None:
    round_type, number = step.type, step.number
    players = participants(session, round_type)
    output = session.record.put(round_type.name, RoundOutput(number))
    for name, artifact in restored.items():
        if name in players:
            output.by_agent[name] = artifact
            session.emit_artifact(number, round_type.schema, name, artifact, "", "restored", round_type.name)
    to_ask = [name for name in players if name not in output.by_agent]
    if to_ask:  # the judge's artifacts are filtered (and the filtering recorded) once for all the round's calls
        shared_inputs(session, round_type, number, recipients=len(to_ask))
    counted = bool(to_ask) and _counted(session)
    if to_ask and session.plan.types[0].name == round_type.name:
        await warm_prompt_caches(session, to_ask)

    unanswered: dict[str, CallOutcome] = {}  # agents whose provider failed them

    async def one(name: str) -> None:
        spec = _agent_call(session, round_type, number, name, counted)
        outcome = await ask_for_artifact(session.pool, spec, native=session.native(spec.provider), bus=session.bus,
                                         stream=session.stream)
        _record_agent(session, step, name, outcome)
        if outcome.provider_failed:
            unanswered[name] = outcome

    async with asyncio.TaskGroup() as group:
        for name in to_ask:
            group.create_task(one(name))
    if session.settings.strict_models and unanswered:
        return _strict_failure(session, number, [(name, unanswered[name]) for name in to_ask if name in unanswered])
    output.missing = [name for name in players if name not in output.by_agent]
    if session.plan.types[0].name != round_type.name:
        session.note_missing(number, output.missing)
    got, needed = len(output.by_agent), round_type.min_answers
    if got >= needed:
        return None
    return round_type.too_few.format(got=got, of=len(players), needed=needed, number=number, title=round_type.title)


def _agent_call(session: Session, round_type: RoundType, number: int, name: str, counted: bool) -> CallSpec:
    """Agent ``name``'s call, everything in it shown under its own view of the panel (its labels, its order).
    An agent's DEBATE STATE names the claims its prompt shows, so each rendering gets its own."""
    with session.seen_by(name):
        with session.filtering.unrecorded():  # recorded once, for every call of the round
            shared = shared_inputs(session, round_type, number)
        spec = call_spec(session, round_type, number, {**shared, **own_inputs(session, round_type, name, shared)},
                         name, measure=True)
        if counted:
            whole = _unfiltered(session, lambda: shared_inputs(session, round_type, number))
            _count(session, spec, _unfiltered(session, lambda: call_spec(
                session, round_type, number, {**whole, **own_inputs(session, round_type, name, whole)}, name)))
    return spec


def _strict_failure(session: Session, number: int, unanswered: list[tuple[str, CallOutcome]]) -> str:
    """Why the consultation stops under ``strict_models=true``: a seat its configured model could not answer is
    neither substituted nor left absent (the panel would not be the one configured). One line naming the seats,
    their models and the first cause."""
    name, outcome = unanswered[0]
    spec = session.settings.agents[name]
    others = f" (and {', '.join(n for n, _ in unanswered[1:])})" if len(unanswered) > 1 else ""
    cause = " ".join((outcome.error or "no answer").split())
    return (f"strict_models=true: agent {name!r}{others} got no answer from its configured model "
            f"{spec.provider}/{spec.model} in round {number}: {cause}")


def _record_agent(session: Session, step: Step, name: str, outcome: CallOutcome) -> None:
    round_type = step.type
    state = session.agents[name]
    state.note(step.number, outcome)
    if outcome.artifact is None:
        if session.plan.types[0].name == round_type.name:
            state.absent = True  # no first-round answer: takes no part in the debate
        return
    # the agent named its peers as it saw them: stored in the judge's form (``name (Agent B)``)
    artifact = session.peer_labels(name).to_names(outcome.artifact) if round_type.sees_labels else outcome.artifact
    artifact = artifacts.in_schema_order(round_type.schema, artifact)  # shown later as a restored one would be
    session.record.outputs[round_type.name].by_agent[name] = artifact
    session.emit_artifact(step.number, round_type.schema, name, artifact, outcome.raw_text,
                          outcome.status or "valid", round_type.name)


async def _play_judge(session: Session, step: Step) -> str | None:
    round_type, number = step.type, step.number
    counted = _counted(session)
    spec = call_spec(session, round_type, number, shared_inputs(session, round_type, number), measure=True)
    if counted:
        _count(session, spec, _unfiltered(session, lambda: call_spec(
            session, round_type, number, shared_inputs(session, round_type, number))))
    outcome = await session.judge.ask(session.pool, spec, session.bus)
    if outcome.artifact is None:
        return f"the judge failed in round {number}: {outcome.error}"
    artifact = artifacts.in_schema_order(round_type.schema, session.labels.to_names(outcome.artifact))
    session.record.put(round_type.name, RoundOutput(number, judge=artifact))
    if round_type.name == VERDICT_ROUND:
        session.record.verdict = artifact
    session.emit_artifact(number, round_type.schema, None, artifact, outcome.raw_text, outcome.status or "valid",
                          round_type.name)
    return None


# ------------------------------------------------------------------------------------------------ savings


def _counted(session: Session) -> bool:
    """Whether the calls about to be made count towards ``token_efficiency_stats``: filtering is on and the
    consultation already has an artifact some round filters (every call after the synthesis)."""
    if not session.filtering.enabled:
        return False
    sources = {i.source for t in session.plan for i in t.inputs.values() if i.filtered is not None}
    return any(session.record.judged(source) is not None for source in sources)


def _unfiltered(session: Session, render: Callable[[], T]) -> T:
    """``render()`` as it would be with filtering off (the counterpart a call's savings are measured against);
    it leaves no trace in the record of the consultation."""
    over_budget = len(session.context.over_budget)
    with session.filtering.bypassed():
        try:
            return render()
        finally:
            del session.context.over_budget[over_budget:]


def _count(session: Session, spec: CallSpec, unfiltered: CallSpec) -> None:
    """Count a call's prompt as sent beside its unfiltered counterpart (system prompt and user message with its
    JSON instruction, exactly as the provider receives them)."""
    instruction = json_instruction(spec.schema_name, session.native(spec.provider))

    def prompt(s: CallSpec) -> str:
        return f"{s.system}\n{s.user.rstrip()}\n\n{instruction}"

    session.filtering.count_call(prompt(spec), prompt(unfiltered), spec.model)


def derive_verdict(session: Session, synthesis: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The verdict taken from the synthesis when no verdict round runs (early termination, ``rounds=2|3``), or
    from ``synthesis`` (the vote gate's record of the round-1 vote), validated like any artifact."""
    synthesis = synthesis if synthesis is not None else session.record.round_2
    assert synthesis is not None
    schema = session.strategy.verdict_schema
    verdict = {**session.strategy.verdict_from_synthesis(synthesis), **header_for(schema, 4, None)}
    artifacts.check(schema, verdict)
    session.record.verdict = verdict
    return verdict
