"""The final aggregate: after cross-examination, the answer the user gets is decided from the effective answers.

Where anti-conformity is on (by default in ``mode=answer``) and the panel states a ``final_answer``, each agent's
answer that counts (:func:`conclave.engine.conformity.effective_answers`: a changed answer only when supported,
otherwise its earlier answer stands), with the confidence it stated with that answer, goes through the configured
aggregator (``aggregator``; answer mode: ``confidence``). The picked answer is the consultation's answer.

Without ``selective.judge_verdict`` the full debate of such a strategy is its short plan (answer mode: one
cross-examination on the peers' round-1 answers; no synthesis, no cross-examination judgement, no verdict call) and
the verdict is derived from the aggregate, every string from the agents' answers. With it, or with ``rounds=N``
naming the judge's stages, the judge's verdict is kept as written (its text and dissent) beside the aggregate, and
the record says whether the two agree. The record is the result's ``final_aggregate`` (schema
``final_aggregate``), the ``vote:final`` event and a line of the report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from conclave.artifacts import schema_registry as artifacts
from conclave.engine.aggregation import AggregationContext, Ballot, answer_groups, normalise
from conclave.engine.conformity import answer_of, anti_conformity_on, effective_answers
from conclave.engine.extraction import header_for

if TYPE_CHECKING:
    from conclave.engine.session import Session

SCHEMA = "final_aggregate"
#: the judge's rounds an answer-mode debate skips when the aggregate decides and no judge verdict is asked for
JUDGE_ROUNDS = ("cross_exam", "verdict")


def settles(settings: Any, strategy: Any) -> bool:
    """Whether the final answer comes from the aggregate of the effective answers: anti-conformity is on and
    the strategy's answers carry a ``final_answer`` (its round-1 schema declares one)."""
    setting = settings.anti_conformity
    on = bool(strategy.anti_conformity_by_default) if setting is None else bool(setting)
    first = strategy.plan[0].schema if strategy.plan else ""
    return on and "final_answer" in artifacts.declared_properties(first)


def skips_judge(settings: Any, strategy: Any) -> bool:
    """The judge's cross-examination record and verdict are not played: the aggregate decides and the user did
    not ask for a judge verdict (``selective.judge_verdict``)."""
    return settles(settings, strategy) and not settings.selective.judge_verdict


def _stated(artifact: Mapping[str, Any] | None) -> float | None:
    value = (artifact or {}).get("confidence")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def decide(session: Session, aggregator: Any) -> dict[str, Any] | None:
    """The ``final_aggregate`` record once the debate is over, or None when there is nothing to aggregate (no
    cross-examination reply carried an answer: the vote gate decided, or the debate stopped before)."""
    first_round = session.plan.types[0].name
    opening = session.record.by_agent(first_round)
    played = session.context.played
    start = min(played) if played else 1
    replies = [(number, dict(r.agents)) for number, r in sorted(played.items())
               if number != start and r.agents and any(answer_of(a) for a in r.agents.values())]
    if not replies:
        return None
    first = {name: answer_of(a) for name, a in opening.items()}
    effective, _ = effective_answers(first, replies, session.quality.state, enabled=anti_conformity_on(session))
    ballots: list[Ballot] = []
    counted: dict[str, dict[str, Any]] = {}
    for name in session.settings.agents:
        answer = effective.get(name)
        if answer is None:
            continue
        # the confidence stated with the answer that counts: the latest artifact giving that answer
        source, stated = 1, _stated(opening.get(name))
        for number, by_agent in replies:
            reply = by_agent.get(name)
            if answer_of(reply) is not None and normalise(str(answer_of(reply))) == normalise(answer):
                source, stated = number, _stated(reply)
        spec = session.settings.agents[name]
        ballots.append(Ballot(name, spec.persona, spec.provider, spec.model, answer, stated))
        counted[name] = {"answer": answer, "confidence": stated, "round": source}
    if not ballots:
        return None
    groups = answer_groups(ballots)
    synthesis = session.record.round_2
    judged = str(synthesis.get("final_answer") or "").strip() or None if synthesis else None
    result = aggregator.aggregate(ballots, groups, AggregationContext(home=session.settings.home,
                                                                      judge_answer=judged))
    supporters = [ballots[i].agent for i in groups[result.group]] if result.group is not None else []
    answer = None
    if supporters:
        chosen = [b for b in ballots if b.agent in supporters]
        answer = max(chosen, key=lambda b: (result.weights.get(b.agent, 0.0), -ballots.index(b))).answer
    elif judged is None:  # the aggregator cannot decide: the plurality of the effective answers
        top = max(groups, key=len)
        supporters, answer = [ballots[i].agent for i in top], ballots[top[0]].answer
    payload: dict[str, Any] = {
        **header_for(SCHEMA, max(n for n, _ in replies), None),
        "aggregator": result.aggregator,
        "weights": result.weights,
        "basis": result.basis,
        "note": result.note,
        "agreement": round(result.agreement, 4),
        "answer": answer if answer is not None else judged,
        "supporters": supporters,
        "answers": counted,
        "judge_verdict": False,
        "judge_answer": None,
        "agrees_with_judge": None,
    }
    payload["summary"] = summary_line(payload)
    artifacts.check(SCHEMA, payload)
    return payload


def with_judge(payload: Mapping[str, Any], verdict: Mapping[str, Any] | None) -> dict[str, Any]:
    """``payload`` beside the judge's verdict when one was written: its answer and whether the two agree."""
    judged = answer_of(verdict) if verdict is not None else None
    out = dict(payload)
    if judged is not None:
        agree = payload.get("answer") is not None and normalise(str(payload["answer"])) == normalise(judged)
        out.update(judge_verdict=True, judge_answer=judged, agrees_with_judge=agree)
    out["summary"] = summary_line(out)
    artifacts.check(SCHEMA, out)
    return out


def synthesis_of(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A synthesis-shaped record of the aggregate from which the strategy derives the verdict: the answer as
    the one consensus point (its supporters, the agreement as confidence), each other answer as a viewpoint."""
    answers = payload.get("answers") or {}
    supporters = list(payload.get("supporters") or [])
    answer = str(payload.get("answer") or "")
    dissent = [{"agent": a, "viewpoint": str(v.get("answer"))} for a, v in answers.items() if a not in supporters]
    return {
        "final_answer": answer,
        "consensus_points": [{"point": answer, "supporting_agents": supporters,
                              "confidence": float(payload.get("agreement") or 0), "claim_ids": []}],
        "tensions": [{"topic": "answers after cross-examination", "viewpoints": dissent}] if dissent else [],
    }


def summary_line(payload: Mapping[str, Any]) -> str:
    """The report's line: "answer 42 decided by the confidence aggregator over the answers that count after
    cross-examination: 2 of 3, weight 0.71; the judge's verdict agrees"."""
    supporters = payload.get("supporters") or []
    line = (f"answer {payload.get('answer')} decided by the {payload.get('aggregator')} aggregator over the answers "
            f"that count after cross-examination: {len(supporters)} of {len(payload.get('answers') or {})}, "
            f"weight {float(payload.get('agreement') or 0):.2f}")
    if not payload.get("judge_verdict"):
        return line + "; no judge verdict was asked for (selective.judge_verdict=false)"
    if payload.get("agrees_with_judge"):
        return line + "; the judge's verdict agrees"
    return line + f"; the judge's verdict DISAGREES: it answered {payload.get('judge_answer')}"
