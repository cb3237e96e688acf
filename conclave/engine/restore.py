"""Restoring completed rounds into a new run (``conclave resume``): no provider is called for them.

``resume_from`` carries what the journal stored, by round record: ``rounds`` {number: [payload]} where each
payload is a ``consultation:round_artifact``'s data (``agent`` — null for the judge —, ``artifact`` with real
names, and ``round_type`` in journals that record it), for every round that ran to its end; ``interrupted``
{``round_number``, ``artifacts``: [payload]} for the round an earlier run did not finish, whose agents' answers
are reused instead of paid for again; plus ``labels`` and ``shuffle_seed`` so the judge keeps seeing the same
neutral labels. The older form (``round_1`` {agent: artifact}, ``round_2``, ``round_3_replies``, ``round_3``) is
read as the standard plan's rounds 1–3.

Rounds are restored in plan order, each only when every round before it is and it holds what the debate needs
(enough agents' answers, the judge's artifact). An artifact stored in an older format version is read as the
current one (:func:`conclave.artifacts.schema_registry.upgrade`); the journal itself is never rewritten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from conclave.artifacts.schema_registry import in_schema_order, upgrade
from conclave.engine.rounds import VERDICT_ROUND, Step

if TYPE_CHECKING:
    from conclave.engine.session import Session
from conclave.engine.record import RoundOutput, round_runs


def restore_rounds(session: Session, source: Mapping[str, Any]) -> set[int]:
    """Load the completed rounds of ``source`` into ``session.record``; return their numbers.

    When the journal recorded a plan changed while it ran (``source["plan"]``: round type names, e.g. a repeated
    cross-examination), the session plays that plan, so rounds played under it are restored in their place."""
    restore_plan(session, source.get("plan"))
    runs, restored = round_runs(source), set[int]()
    for group in session.plan.rounds():
        number = group[0].number
        if number not in runs or not all(_restore(session, step, runs[number]) for step in group):
            break
        restored.add(number)
        session.record.completed_rounds = number
    return restored


def restore_plan(session: Session, names: list[str] | None) -> None:
    """Make the session's plan the recorded one, when it differs and every round type in it is known (the
    strategy's own and the plan's); otherwise the plan stays as configured."""
    plan = session.plan
    if not names or names == [t.name for t in plan]:
        return
    known = {t.name: t for t in (*session.strategy.plan, *plan.types)}
    if any(name not in known for name in names):
        return
    recorded = [known[name] for name in names]
    # a plan recorded under rounds=N stops at stage N: the stages after it come from this run's plan
    last = max(t.stage for t in recorded)
    plan.restore([*recorded, *(t for t in plan.types if t.stage > last)], "plan restored from the journal")


def interrupted_answers(source: Mapping[str, Any], step: Step) -> dict[str, dict[str, Any]]:
    """Agents' answers to ``step`` that an interrupted earlier run recorded (already paid for)."""
    interrupted = source.get("interrupted") or {}
    if step.type.seat != "agents" or interrupted.get("round_number") != step.number:
        return {}
    return {
        p["agent"]: in_schema_order(step.type.schema, upgrade(step.type.schema, dict(p["artifact"])))
        for p in interrupted.get("artifacts") or []
        if p.get("agent") and p.get("round_type", step.type.name) == step.type.name
    }


def resumed_rounds(source: Mapping[str, Any]) -> list[str]:
    return [f"round_{n}" for n in sorted(round_runs(source))]


def _restore(session: Session, step: Step, payloads: list[dict[str, Any]]) -> bool:
    round_type, record = step.type, session.record
    mine = [p for p in payloads if p.get("round_type", round_type.name) == round_type.name]
    if round_type.seat == "judge":
        judge = next((p["artifact"] for p in reversed(mine) if not p.get("agent")), None)
        if judge is None:
            return False
        judge = in_schema_order(round_type.schema, upgrade(round_type.schema, dict(judge)))
        record.put(round_type.name, RoundOutput(step.number, judge=judge))
        if round_type.name == VERDICT_ROUND:
            record.verdict = dict(judge)
        return True
    first = session.plan.types[0].name == round_type.name
    players = list(session.agents) if first else session.present()
    answers = {p["agent"]: in_schema_order(round_type.schema, upgrade(round_type.schema, dict(p["artifact"])))
               for p in mine if p.get("agent") in players}
    if len(answers) < round_type.min_answers:
        return False
    output = record.put(round_type.name, RoundOutput(step.number, by_agent=answers))
    output.missing = [name for name in players if name not in answers]
    if first:
        for name, state in session.agents.items():
            state.absent = name not in answers
    else:
        session.note_missing(step.number, output.missing)
    return True
