"""The groupthink controller: runs the detectors after every round and, when one fires, a critical objection round.

:class:`GroupthinkMonitor` lives on the quality layer (``session.quality.groupthink``); the runner calls
:meth:`~GroupthinkMonitor.after_round` after every round, after the debate state is updated and before early
termination is decided.

- After each agents' round the detectors of :mod:`conclave.quality.groupthink` look at the answers; every check
  is journaled (``groupthink:check``) with its figures, the stage and what was done.
- With ``quality.stage=on``, a firing inserts one :data:`OBJECTION` round right after the round just played —
  so it runs before the next judge step — unless the consultation was planned short (``rounds=1|2``, ``quick``:
  they keep their meaning), ``quality.groupthink.max_objection_rounds`` objection rounds were already planned,
  no judge step is left to weigh it, or a later round was restored from a journal. With ``shadow`` nothing is
  inserted: the check records that an objection round would have run.
- Every present agent answers the objection round with one counterargument, one alternative hypothesis and one
  challenged assumption (schema ``objection``). Its answers become claims in the debate state; the next judge
  step is shown them in full (:meth:`~GroupthinkMonitor.judge_addendum`).
- After it, the outcome (``groupthink:objection``): the claims it introduced that are *new* (no earlier claim,
  position or key point is as close as ``novelty_similarity``), and the claims whose status it changed. Nothing
  new and no status change marks the consultation **escalated**: on a terminal the user is asked whether to go
  on (declining ends the debate after the synthesis, which still runs if it has not yet); otherwise it goes on
  and the report opens with a banner asking a human to look.

With ``stage=on`` the early-termination offer defers to the detectors (:meth:`~GroupthinkMonitor.guard`): it is
not offered after a firing or an escalation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from conclave.engine.record import prompt_json, round_runs
from conclave.engine.rounds import Input, RoundType
from conclave.events import GROUPTHINK_CHECK, OBJECTION_OUTCOME
from conclave.quality.claims import claims_of
from conclave.quality.groupthink import (
    EARLY_CONVERGENCE,
    Check,
    StagnationDetector,
    check_early_convergence,
    new_ones,
    position_text,
)

if TYPE_CHECKING:
    from conclave.config.settings import QualitySettings
    from conclave.engine.interaction import Interaction
    from conclave.engine.labels import JudgeLabels
    from conclave.engine.record import Record
    from conclave.engine.rounds import Plan, Step
    from conclave.quality.debate_state import StateClaim

#: the critical objection round: every present agent objects to the consensus before the next judge step
OBJECTION = RoundType(
    name="objection",
    title="Critical objection",
    seat="agents",
    template="objection",
    prompt_key="objection",
    schema="objection",
    max_tokens=1536,
    state="OBJECTION",
    stage=2,  # replaced by the stage of the round it follows
    inputs={"own_position": Input("independent", "own"), "positions": Input("independent", "each_by_label")},
    min_answers=0,  # an objection round nobody answers produced nothing new: it escalates, it never stops the debate
    short="objections",
)


def objection_round(first: str, stage: int) -> RoundType:
    """The objection round as inserted after a round of ``stage``: it shows the first round's answers (``first``
    names that round type)."""
    return replace(OBJECTION, stage=stage,
                   inputs={"own_position": Input(first, "own"), "positions": Input(first, "each_by_label")})


#: a consultation planned with fewer rounds (``rounds=1|2``, ``quick``) asks for a short run: a firing is recorded,
#: no objection round is added
QUICK_ROUNDS = 3

CONTINUE_PROMPT = ("The critical objection round produced nothing new (no new claim, no claim status change): the "
                   "panel may be rubber-stamping. Continue the debate? [Y/n]")


@dataclass(frozen=True)
class RoundInputs:
    """What the monitor reads after a round: the record of artifacts, the plan (it may insert an objection round
    or end it), the debate state's claims, the rounds planned, the objection template's id, and ``emit`` to journal
    what it found and did."""

    record: Record
    plan: Plan
    claims: Mapping[str, StateClaim]
    planned_rounds: int
    objection_template: str
    emit: Callable[..., Any]


class GroupthinkMonitor:
    """The detectors' state for one consultation, what they found, and the objection rounds they caused."""

    def __init__(self, quality: QualitySettings) -> None:
        self.settings = quality.groupthink
        self.stage = quality.stage
        self.stagnation = StagnationDetector(self.settings)
        self.checks: list[dict[str, Any]] = []
        self.objections: list[dict[str, Any]] = []
        self.escalated = False
        self.escalation: dict[str, Any] | None = None
        self._planned = 0  # objection rounds inserted so far
        self._early_fired = False
        self._pending: dict[str, Any] | None = None  # the firing the next objection round answers
        self._said: list[tuple[int, str]] = []  # (round, text) of every position, key point and claim so far

    # ------------------------------------------------------------------------------------------- prompts

    def template_values(self, template_text: str, consensus: Callable[[], str]) -> dict[str, str]:
        """The objection template's own values: ``groupthink_trigger`` (what fired) and ``consensus`` (the judge's
        latest artifact, under labels, as ``consensus()`` shows it; null before the judge has spoken)."""
        values: dict[str, str] = {}
        if _uses(template_text, "groupthink_trigger"):
            values["groupthink_trigger"] = (self._pending or {}).get("why") or (
                "<what the detector found, e.g. early-convergence after round 1: 3 of 3 agents at confidence ≥ 0.85; "
                "diversity gate failed: 0 distinct source(s) < 3>")
        if _uses(template_text, "consensus"):
            values["consensus"] = consensus()
        return values

    def judge_addendum(self, number: int, record: Record, labels: JudgeLabels,
                       view: Callable[[Any], Any]) -> str:
        """What the judge of round ``number`` is shown besides its template: the objection round played right
        before it, in full, under ``labels``, each answer as ``view`` shows it ("" when there is none)."""
        output = record.output(OBJECTION.name)
        if output is None or output.number != number - 1 or not output.by_agent:
            return ""
        outcome = next((o for o in self.objections if o["round_number"] == output.number), {})
        order = [name for name in labels.order() if name in output.by_agent]
        body = prompt_json({labels.label(n): view(output.by_agent[n]) for n in order})
        why = (outcome.get("trigger") or {}).get("why", "")
        return (f"\n\n=== CRITICAL OBJECTION ROUND (round {output.number}) ===\nGroupthink was detected ({why}); "
                "every panel member had to give one counterargument, one alternative hypothesis and one challenged "
                f"assumption. Their answers, by label, as JSON:\n{body}\nWeigh these objections explicitly: say "
                "which ones change the picture and why the others do not.\n")

    # ------------------------------------------------------------------------------------------- the controller

    def guard(self) -> bool | None:
        """Whether early termination must not be offered: True after a firing or an escalation, False when the
        detectors found nothing; None when they do not decide (``stage=shadow`` or disabled), so the old
        rubber-stamp rule applies and the debate runs as it would without them."""
        if self.stage != "on" or not self.settings.enabled:
            return None
        return self.escalated or any(c["fired"] for c in self.checks)

    def after_round(self, steps: list[Step], restored: set[int], inputs: RoundInputs,
                    interaction: Interaction | None = None) -> None:
        if not self.settings.enabled:
            return
        number = steps[0].number
        if steps[0].type.name == OBJECTION.name:
            self._objection_played(inputs, number, number in restored, interaction)
            return
        fired: list[Check] = []
        for step in steps:
            output = inputs.record.output(step.type.name)
            if step.type.seat != "agents" or output is None or output.number != number or not output.by_agent:
                continue
            answers = output.by_agent
            checks = []
            stagnation = self.stagnation.observe(number, answers, self._new_facts(inputs.claims, number))
            if stagnation is not None:
                checks.append(stagnation)
            early = self.settings.early_convergence
            if not self._early_fired and number <= early.by_round and len(answers) >= 2:
                checks.append(check_early_convergence(number, answers, self.settings))
                self._early_fired = checks[-1].fired
            self._remember(number, answers)
            fired += [c for c in checks if c.fired]
            for check in checks:
                if not check.fired:
                    self._record(inputs, check, acted=False, action="none", because=None)
        if fired:
            self._act(inputs, steps, restored, fired)

    def _act(self, inputs: RoundInputs, steps: list[Step], restored: set[int], fired: list[Check]) -> None:
        plan, number = inputs.plan, steps[0].number
        rest = plan.types[plan.played:]
        later = [s.number for s in plan.steps()[plan.played:]]
        if self.stage == "on" and rest and rest[0].name == OBJECTION.name:
            self._planned_objection(inputs, number, fired)  # resumed: an earlier run inserted it (replay_plan)
            return
        because = None
        if self.stage != "on":
            because = "shadow"
        elif inputs.planned_rounds < QUICK_ROUNDS:
            because = "rounds"  # rounds=1|2 and quick ask for a short run: no round is added to it
        elif self._planned >= self.settings.max_objection_rounds:
            because = "objection_cap"
        elif not any(t.seat == "judge" for t in rest):
            because = "no_judge_step_left"
        elif any(n in restored for n in later):
            because = "resumed"
        if because is None:
            self._planned_objection(inputs, number, fired)
            plan.insert_next([objection_round(plan.types[0].name, steps[-1].type.stage)],
                             f"groupthink: {', '.join(c.detector for c in fired)} after round {number}")
            return
        for check in fired:
            self._record(inputs, check, acted=False, action="objection_round", because=because)

    def _planned_objection(self, inputs: RoundInputs, number: int, fired: list[Check]) -> None:
        """Remember the firing the coming objection round answers, and the claims' statuses before it."""
        self._pending = {
            "detectors": [c.detector for c in fired], "round_number": number,
            "why": "; ".join(f"{c.detector.replace('_', '-')} after round {number}: {c.why}" for c in fired),
            "before": {cid: c.status for cid, c in inputs.claims.items()},
        }
        self._planned += 1
        self.stagnation.reset()
        for check in fired:
            self._record(inputs, check, acted=True, action="objection_round", because=None)

    @staticmethod
    def replay_plan(plan: Plan, source: Mapping[str, Any]) -> bool:
        """On resume, before rounds are restored: put the objection rounds an earlier run played back into the plan
        where it played them, so their answers are restored, not paid for again. True when the plan changed."""
        changed = False
        for number, payloads in sorted(round_runs(source).items()):
            if not any(p.get("round_type") == OBJECTION.name for p in payloads):
                continue
            steps = plan.steps()
            before = [i for i, s in enumerate(steps) if s.number == number - 1]
            if not before:
                continue
            at = before[-1] + 1
            if at < len(steps) and steps[at].type.name == OBJECTION.name:
                continue
            plan.types.insert(at, objection_round(plan.types[0].name, steps[at - 1].type.stage))
            changed = True
        return changed

    def _record(self, inputs: RoundInputs, check: Check, *, acted: bool, action: str, because: str | None) -> None:
        entry = {**check.as_dict(), "stage": self.stage, "action": action, "acted": acted,
                 "not_acted_because": because}
        self.checks.append(entry)
        inputs.emit(GROUPTHINK_CHECK, **entry)

    # ------------------------------------------------------------------------------------------- the outcome

    def _objection_played(self, inputs: RoundInputs, number: int, restored: bool,
                          interaction: Interaction | None) -> None:
        pending, self._pending = self._pending or {}, None
        claims = inputs.claims
        before: Mapping[str, str] = pending.get("before", {})
        earlier = [text for r, text in self._said if r < number]
        introduced = [cid for cid, c in claims.items() if c.introduced_round == number]
        fresh = new_ones([claims[cid].text for cid in introduced], earlier, self.settings)
        new = [cid for cid, is_fresh in zip(introduced, fresh, strict=True) if is_fresh]
        changes = [{"claim_id": cid, "from": before[cid], "to": c.status}
                   for cid, c in claims.items() if cid in before and before[cid] != c.status]
        output = inputs.record.output(OBJECTION.name)
        self._remember(number, output.by_agent if output is not None and output.number == number else {})
        produced = bool(new or changes)
        continued: bool | None = None
        if not produced:
            self.escalated = True
            if interaction is not None and interaction.interactive and not restored:
                continued = interaction.ask(CONTINUE_PROMPT).strip().lower()[:1] in ("", "y")
                if not continued:
                    self._stop_after(inputs.plan, inputs.record)
            self.escalation = {"round_number": number, "asked": continued is not None, "continued": continued,
                               "reason": "the critical objection round produced no new claim and changed no "
                                         "claim's status"}
        entry = {
            "round_number": number,
            "template": inputs.objection_template,  # the words the agents were given
            "trigger": {k: pending.get(k) for k in ("detectors", "round_number", "why")},
            "answers": sorted(output.by_agent) if output is not None and output.number == number else [],
            "new_claims": new, "restated_claims": [c for c in introduced if c not in new], "status_changes": changes,
            "produced_new": produced, "escalated": not produced, "continued": continued,
        }
        self.objections.append(entry)
        inputs.emit(OBJECTION_OUTCOME, **entry)

    @staticmethod
    def _stop_after(plan: Plan, record: Record) -> None:
        """The user declined to go on: nothing more is played, except a synthesis not yet played (the verdict is
        derived from it)."""
        rest = plan.types[plan.played:]
        plan.end_here("the user stopped the debate after an objection round produced nothing new")
        synthesis = next((t for t in rest if t.name == "synthesis"), None)
        if record.round_2 is None and synthesis is not None:
            plan.insert_next([synthesis], "the synthesis runs so that a verdict can be derived from it")

    # ------------------------------------------------------------------------------------------- helpers

    def _remember(self, number: int, answers: Mapping[str, Mapping[str, Any]]) -> None:
        for artifact in answers.values():
            texts = [position_text(artifact), *(str(c.get("text") or "") for c in claims_of(artifact)[0])]
            self._said += [(number, t) for t in texts if t.strip()]

    def _new_facts(self, claims: Mapping[str, StateClaim], number: int) -> int:
        earlier = [text for r, text in self._said if r < number]
        facts = [c.text for c in claims.values()
                 if c.introduced_round == number and c.label == "FACT"]
        return sum(new_ones(facts, earlier, self.settings))

    # ------------------------------------------------------------------------------------------- the record

    def summary(self) -> dict[str, Any]:
        fired = [c for c in self.checks if c["fired"]]
        return {
            "stage": self.stage,
            "enabled": self.settings.enabled,
            "checks": self.checks,
            "objection_rounds": self.objections,
            "escalated": self.escalated,
            "escalation": self.escalation,
            "figures": {
                "firings": {d: sum(1 for c in fired if c["detector"] == d) for d in ("stagnation", EARLY_CONVERGENCE)},
                "acted": sum(1 for c in fired if c["acted"]),
                "objection_rounds": len(self.objections),
                "objection_rounds_changed_status": sum(1 for o in self.objections if o["status_changes"]),
                "objection_rounds_new_claims": sum(1 for o in self.objections if o["new_claims"]),
                "escalations": sum(1 for o in self.objections if o["escalated"]),
            },
        }


def _uses(template_text: str, placeholder: str) -> bool:
    return f"${placeholder}" in template_text or f"${{{placeholder}}}" in template_text
