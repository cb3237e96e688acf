"""The debate-quality layer in a consultation: anchors, the debate state, citation rules and verification.

:class:`QualityLayer` lives on the session. Its :meth:`after_round` is a controller (it runs after every round,
restored ones included, so a resumed run rebuilds the same state and ids by replaying the same artifacts):

- each agent artifact of the round is absorbed into the :class:`DebateState` (new claims get ``C…`` ids, new
  references ``E…`` ids), its citation rules are checked and the deterministic verification questions answered;
  one ``quality:checks`` event per agent records that. A broken rule never sinks a round;
- the synthesis' ``verification`` answers (the judged questions, for each round-1 position) are recorded the same
  way, under round 1;
- the cross-examination judge's ``claim_statuses`` set claim statuses by id;
- the synthesis is checked for completeness (every round-1 claim and position accounted for,
  :mod:`conclave.quality.coverage`); a miss is a rule violation, journaled as ``quality:coverage``;
- the whole state is journaled as ``quality:debate_state``.

Templates receive two extra values: ``debate_state`` (the bounded DEBATE STATE block, agents under their neutral
labels) and ``verification_questions`` (the judged questions, for the synthesis judge). The block shows each seat
the claims it needs, grouped by agent, and no text the seat already has in its prompt:

- the judge: every claim the latest round introduced or touched, and every contested one (the synthesis judge:
  every round-1 claim, all of which it must account for), in full, with the sources they cite;
- an agent: its own claims shortened (it wrote them; its first-round answer is in its prompt), in full the
  claims that oppose or back them and the contested ones, and by id (label and status) the claims the judge's
  statements in its prompt rest on, which give their gist (shortened when such a claim takes part in an
  exchange); source ids only.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from conclave.events import COVERAGE, DEBATE_STATE, GROUNDING, QUALITY_CHECKS
from conclave.quality import coverage
from conclave.quality.anchors import anchor_prompt, assign_anchors
from conclave.quality.claims import RULES, check_rules, claims_of, unlabelled_points
from conclave.quality.debate_state import DebateState
from conclave.quality.grounding import agent_text, check_grounding
from conclave.quality.objection import GroupthinkMonitor
from conclave.quality.verification import judge_results, prompt_list, questions_for, run_checkers

if TYPE_CHECKING:
    from conclave.engine.rounds import Step
    from conclave.engine.session import Session

_PLACEHOLDERS = ("debate_state", "verification_questions")
_CLAIM_IDS = re.compile(r'"claim_ids": \[([^\]]*)\]')  # a judge's statement's claim ids, in prompt JSON
_STATE_ID = re.compile(r"\bC[1-9][0-9]*\b")
#: fields of a first-round position that later replies inherit unless they restate them
CARRIED = ("alternatives", "failure_modes", "uncertainties")


class QualityLayer:
    def __init__(self, session: Session) -> None:
        settings = session.settings
        self.session = session
        self.anchors = assign_anchors(list(settings.agents), settings.quality.anchors)
        strategy = session.strategy
        #: universal question id -> why the strategy does not ask it
        self.not_applicable = dict(getattr(strategy, "not_applicable_questions", {}))
        self.questions = questions_for(getattr(strategy, "verification_questions", ()),
                                       settings.quality.high_stakes, self.not_applicable)
        self.state = DebateState(session.question, list(settings.agents))
        #: round number -> agent -> {claims, rules, verification, claim_source, labelled, unlabelled}
        self.checks: dict[int, dict[str, dict[str, Any]]] = {}
        self.unknown_ids: list[str] = []  # state ids agents or the judge named that do not exist
        #: round number -> the judge's statements there, each grounded or not
        self.grounding: dict[int, list[dict[str, Any]]] = {}
        #: round number -> what the synthesis of that round left unaccounted (rule violations)
        self.coverage: dict[int, list[dict[str, Any]]] = {}
        self._absorbed: set[tuple[int, str]] = set()  # (round, round type) of the agents' steps absorbed

        #: the groupthink detectors and the objection rounds they cause (a controller of its own)
        self.groupthink = GroupthinkMonitor(settings.quality)

    # ------------------------------------------------------------------------------------------- prompts

    def system_for(self, agent: str, system: str, role: str = "") -> str:
        """An agent's system prompt with its strategy role and perspective anchor appended (after the context
        block that opens it, so the prefix every call shares stays intact)."""
        anchor = self.anchors.get(agent)
        section = "\n".join(s for s in (role, anchor_prompt(anchor) if anchor else "") if s)
        if not section:
            return system
        return f"{system.rstrip()}\n\n{section}"

    def template_values(self, template_text: str, *, empty: bool = False, for_agents: bool = False
                        ) -> dict[str, str]:
        """The quality values a template uses (computed only when it uses them), the debate state as the judge's
        seat sees it; ``empty``: the debate state left blank, for the cost estimate (:meth:`carried_tokens` bounds
        it); ``for_agents``: without the debate state, which each agent gets from :meth:`agent_values`."""
        values: dict[str, str] = {}
        if "debate_state" in template_text and not for_agents:
            values["debate_state"] = "" if empty else self._block(None)
        if "verification_questions" in template_text:
            values["verification_questions"] = prompt_list(self.questions)
        values.update(self.groupthink.template_values(template_text, self._consensus))
        return values

    def _consensus(self) -> str:
        """The judge's latest artifact as the agents are shown it (filtered, under labels; null before the judge
        has spoken): what the objection round asks them to object to."""
        session = self.session
        judged = [o for o in session.record.outputs.values() if o.judge is not None]
        latest = max(judged, key=lambda o: o.number).judge if judged else None
        latest = session.filtering.later(latest, self.state.round + 1, seat="agents", view=session.view,
                                         recipients=len(session.present()))
        return session.shown(latest)

    def agent_values(self, template_text: str, agent: str, shown: Iterable[str] = ()) -> dict[str, str]:
        """The debate state as agent ``agent`` sees it, when its template uses it. ``shown``: the other values of
        its prompt; the claims a judge's statement there names (``"claim_ids": [...]``) are listed by id only."""
        if "debate_state" not in template_text:
            return {}
        return {"debate_state": self._block(agent, claim_ids_in(shown))}

    def _block(self, seat: str | None, seen: Collection[str] = ()) -> str:
        return self.state.block(self.session.labels.label, budget=self.session.settings.quality.state_tokens,
                                focus=self.state.focus(seat, seen), own=seat, evidence=seat is None)

    def carried_tokens(self, template_text: str) -> int:
        """Upper bound of the tokens the quality values add to one call of a template (the state block's budget)."""
        return self.session.settings.quality.state_tokens if "debate_state" in template_text else 0

    def rebuild(self, session: Session, restored: set[int]) -> None:
        """Replay the restored rounds (``show-prompt`` of a stored consultation): the same state and ids."""
        for group in session.plan.rounds():
            if group[0].number in restored:
                self.after_round(session, group, restored)

    # ------------------------------------------------------------------------------------------- the controller

    def after_step(self, session: Session, step: Step) -> None:
        """Absorb an agents' step as soon as it is played, so a judge later in the same round (the round-3
        judge) sees the replies' claims, challenges and retractions in the state."""
        output = session.record.output(step.type.name)
        key = (step.number, step.type.name)
        if step.type.seat != "agents" or output is None or output.number != step.number or key in self._absorbed:
            return
        self._absorbed.add(key)
        for agent in sorted(output.by_agent):  # a fixed order: replaying gives the same ids
            self._agent_artifact(step.number, step.type.name, agent, output.by_agent[agent])
        answered = list(output.by_agent) if step.number > 1 else None
        self.state.mark_agents(step.number, session.present(), answered)

    def after_round(self, session: Session, steps: list[Step], restored: set[int]) -> None:
        number = steps[0].number
        for step in steps:
            output = session.record.output(step.type.name)
            if output is None or output.number != number:
                continue
            if step.type.seat == "agents":
                self.after_step(session, step)
            elif output.judge is not None:
                self._judge_artifact(number, step.type.name, output.judge)
                self._grounding(session, number, output.judge)
                self._coverage(session, number, output.judge)
        self.state.round = max(self.state.round, number)
        session.bus.emit(DEBATE_STATE, round_number=number, state=self.state.as_dict())

    def _agent_artifact(self, number: int, round_type: str, agent: str, artifact: Mapping[str, Any]) -> None:
        claims, references, source = claims_of(artifact)
        absorbed = self.state.absorb(number, agent, artifact)
        self.unknown_ids.extend(absorbed.unknown_ids)
        entry = {
            "round_type": round_type,
            "anchor": self.anchors.get(agent),
            "claim_source": source,
            "claims": absorbed.claims,
            "evidence": {str(k): v for k, v in absorbed.evidence.items()},
            "labelled": len(claims),
            "unlabelled": 0 if claims else unlabelled_points(artifact),
            "facts": sum(1 for c in claims if c.get("label") == "FACT"),
            "facts_cited": sum(1 for c in claims if c.get("label") == "FACT" and c.get("citations")),
            "rules": [v.as_dict() for v in check_rules(claims, references)],
            "verification": run_checkers(self._with_position(round_type, agent, artifact), self.questions),
        }
        self.checks.setdefault(number, {})[agent] = entry
        self.session.bus.emit(QUALITY_CHECKS, round_number=number, agent=agent, **entry)

    def _with_position(self, round_type: str, agent: str, artifact: Mapping[str, Any]) -> Mapping[str, Any]:
        """A later reply checked with what it did not restate of its author's first-round position: alternatives,
        failure modes and uncertainties stand until a reply changes them."""
        first = self.session.plan.types[0].name
        if round_type == first:
            return artifact
        position = self.session.record.by_agent(first).get(agent) or {}
        return {**{k: position[k] for k in CARRIED if k in position}, **artifact}

    def _judge_artifact(self, number: int, round_type: str, artifact: Mapping[str, Any]) -> None:
        answers = artifact.get("verification")
        if isinstance(answers, list):  # the synthesis judge's answers for the round-1 positions
            for agent, entry in sorted(self.checks.get(1, {}).items()):
                judged = judge_results(answers, agent, self.questions)
                entry["verification"] = [r for r in entry["verification"] if r["by"] != "judge"] + judged
                self.session.bus.emit(QUALITY_CHECKS, round_number=1, agent=agent, judged_in=number,
                                      verification=judged)
        for ruling in artifact.get("claim_statuses") or []:
            claim_id = str(ruling.get("claim_id", ""))
            if not self.state.set_status(claim_id, str(ruling.get("status")), number, str(ruling.get("reason", ""))):
                self.unknown_ids.append(claim_id)

    def _grounding(self, session: Session, number: int, artifact: Mapping[str, Any]) -> None:
        """Flag the synthesis' and the verdict's statements that rest on no agent claim and no agent text."""
        if "consensus_points" not in artifact and "evidence" not in artifact:
            return
        answers = [a for output in session.record.outputs.values() for a in output.by_agent.values()]
        names = [*session.settings.agents, *(session.labels.label(n) for n in session.settings.agents)]
        results = check_grounding(artifact, self.state.claims, agent_text(answers), names)
        self.grounding[number] = results
        session.bus.emit(GROUNDING, round_number=number, statements=results,
                         ungrounded=sum(1 for r in results if not r["grounded"]))

    def _coverage(self, session: Session, number: int, artifact: Mapping[str, Any]) -> None:
        """Check that a synthesis accounts for every round-1 claim and every present agent's position."""
        if not coverage.applies(artifact):
            return
        first = session.plan.rounds()[0][0].number
        claims = {c.id: c.agent for c in self.state.claims.values() if c.introduced_round == first}
        present = session.present()
        misses = [v.as_dict() for v in coverage.check_coverage(artifact, claims, present)]
        self.coverage[number] = misses
        session.bus.emit(COVERAGE, round_number=number, claims=len(claims), agents=len(present), violations=misses)

    # ------------------------------------------------------------------------------------------- the record

    def summary(self) -> dict[str, Any]:
        """The quality record of the consultation: anchors, checks per round and agent, the state, the figures."""
        return {
            "anchors": dict(self.anchors),
            "questions": [{"id": q.id, "category": q.category, "question": q.question,
                           "by": "checker" if q.checker else "judge"} for q in self.questions],
            "not_applicable": dict(self.not_applicable),
            "checks": {str(n): agents for n, agents in sorted(self.checks.items())},
            "state": self.state.as_dict(),
            "unknown_ids": sorted(set(self.unknown_ids)),
            "grounding": {str(n): results for n, results in sorted(self.grounding.items())},
            "coverage": {str(n): misses for n, misses in sorted(self.coverage.items())},
            "metrics": {**metrics(self.checks, self.coverage), "ungrounded_statements": sum(
                1 for results in self.grounding.values() for r in results if not r["grounded"])},
            "groupthink": self.groupthink.summary(),
        }


def metrics(checks: Mapping[int, Mapping[str, Mapping[str, Any]]],
            coverage_misses: Mapping[int, Sequence[Mapping[str, Any]]] | None = None) -> dict[str, Any]:
    """Label adoption (% of claims labelled), citation compliance (% of FACT claims cited), rule violations by
    rule (the citation rules and the synthesis coverage rules), and the pass rate of each verification question
    (answered ones only)."""
    entries = [e for agents in checks.values() for e in agents.values()]
    labelled = sum(e.get("labelled", 0) for e in entries)
    total = labelled + sum(e.get("unlabelled", 0) for e in entries)
    facts = sum(e.get("facts", 0) for e in entries)
    cited = sum(e.get("facts_cited", 0) for e in entries)
    rules = {rule: sum(1 for e in entries for v in e.get("rules", []) if v.get("rule") == rule) for rule in RULES}
    misses = [v for found in (coverage_misses or {}).values() for v in found]
    rules.update({rule: sum(1 for v in misses if v.get("rule") == rule) for rule in coverage.RULES})
    tally: dict[str, list[int]] = {}
    for e in entries:
        for r in e.get("verification", []):
            if r.get("passed") is not None:
                tally.setdefault(r["question_id"], [0, 0])
                tally[r["question_id"]][0] += int(bool(r["passed"]))
                tally[r["question_id"]][1] += 1
    return {
        "claims": labelled,
        "label_adoption": round(labelled / total, 4) if total else None,
        "citation_compliance": round(cited / facts, 4) if facts else None,
        "rule_violations": rules,
        "pass_rate": {q: round(p / n, 4) for q, (p, n) in sorted(tally.items())},
    }


def claim_ids_in(texts: Iterable[str]) -> set[str]:
    """The claim ids that judge's statements in prompt JSON rest on (their ``"claim_ids": [...]``)."""
    return {i for text in texts for ids in _CLAIM_IDS.findall(text) for i in _STATE_ID.findall(ids)}
