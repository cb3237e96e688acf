"""The safety evaluator in a consultation: what runs when, what a hit does, and what is recorded.

:class:`SafetyGuard` lives on the session (``session.safety``). The rules themselves are in
:mod:`conclave.quality.safety_rules`; here they are applied:

- **before anything is spent** (:meth:`SafetyGuard.screen_question`): tier 1 and tier 2 over the question and the
  supplied context, plus the mode trigger. A tier-1 hit ends the consultation as ``blocked`` before the cost gate
  and before any provider call. Which triggers fired sets how closely the debate is watched: ``full`` (the mode, an
  intent or a context trigger — every step gets a full evaluation), ``light`` (a topic only — the synthesis and the
  verdict, what the user acts on) or ``none``;
- **after consent, before round 1** (:meth:`SafetyGuard.preflight`): when the question triggered tier 2, the judge
  seat evaluates the question (tier 3) before any agent is asked;
- **on every agent and judge artifact** (:meth:`SafetyGuard.note_artifact`, called as the artifact is recorded):
  tier 1 and the intent and context triggers, timed;
- **after every step** (:meth:`SafetyGuard.after_step`): a tier-1 hit blocks (``tier1_action: block``); a response
  trigger, a tier-1 hit under ``tier1_action: evaluate`` or the watch level asks the judge for a full evaluation of
  the step's answers, which blocks at ``thresholds.block_risk`` or a ``block`` verdict.

A block stops the consultation with status ``blocked`` and a one-line reason; every artifact stays in the journal,
and the report withholds the blocked answers and says where and why. In the ``shadow`` stage everything runs and is
recorded (``would_block``) but nothing is blocked. Each screening is journaled as one ``safety:checked`` record; a
full evaluation is a judge call like any other (``provider:attempt``, costed, in the estimate when planned), and a
resumed run reuses an evaluation of the same text instead of paying for it again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from conclave.engine.calls import JUDGE, CallSpec, ask_for_artifact
from conclave.engine.cost.estimate import PlannedText
from conclave.engine.extraction import json_instruction
from conclave.engine.prompt_template import load_template
from conclave.engine.record import prompt_json
from conclave.events import SAFETY_CHECKED
from conclave.quality.safety_rules import RESPONSE_TRIGGER_KINDS, TIER_NAMES, Hit, Rules, Scan, artifact_text

if TYPE_CHECKING:
    from conclave.engine.cost.estimate import PlannedText
    from conclave.engine.rounds import Step
    from conclave.engine.session import Session

SCHEMA = "safety_evaluation"
TEMPLATE = "safety_evaluation"
#: round types a ``light`` watch evaluates: what the user acts on
LIGHT_STEPS = frozenset({"synthesis", "verdict"})
#: the round number of checks of the question (before round 1)
QUESTION_ROUND = 0
#: how much of the supplied context a full evaluation of the question reads
CONTEXT_CHARS = 8000
SYSTEM = ("You evaluate text for safety before a decision-support tool answers or shows it. Answer only with the "
          "JSON object the schema describes.")
SELF_HARM_HELP = (" If you are thinking about harming yourself, please reach out now to someone you trust or a local "
                  "crisis line.")


def _template() -> Any:
    return load_template("conclave.quality", "prompts", "safety", TEMPLATE)


def prompt_version() -> str:
    """The id of the full-evaluation template (``safety/safety_evaluation@v1#sha256:…``)."""
    return str(_template().id)


class SafetyGuard:
    def __init__(self, session: Session) -> None:
        self.session = session
        settings = session.settings
        self.cfg = cfg = settings.quality.safety
        self.enabled = cfg.enabled
        # quality.stage (shadow | on) governs every detector; quality.safety.stage overrides it for this one
        self.stage: str = cfg.stage or str(getattr(settings.quality, "stage", None) or "on")
        self.rules = Rules.load(cfg.patterns.model_dump()) if self.enabled else Rules([])
        self.kinds = ["block", *(("topic", "intent", "context") if cfg.max_tier >= 2 else ())]
        self.response_kinds = ["block", *(RESPONSE_TRIGGER_KINDS if cfg.max_tier >= 2 else ())]
        #: content sha256 -> a full evaluation an earlier run of this consultation paid for
        self.cache: dict[str, dict[str, Any]] = {}
        self.records: list[dict[str, Any]] = []  # every safety:checked payload, in order
        self.blocked: dict[str, Any] | None = None  # the check that blocked (stage on)
        self.would_block: dict[str, Any] | None = None  # the first check that would have blocked (shadow)
        self.session_triggers: list[dict[str, Any]] = []
        self.watch = "none"
        self.preflight_needed = False
        self.tier1_seconds: list[float] = []  # tier 1's time on each response (the benchmark reads it)
        self._pending: dict[tuple[int, str], list[tuple[Scan, float]]] = {}
        self._question_flags: list[Hit] = []

    # ------------------------------------------------------------------------------------------- before spending

    def screen_question(self) -> bool:
        """Tiers 1 and 2 over the question, the context and the mode; True when the consultation is blocked."""
        if not self.enabled:
            return False
        session, cfg = self.session, self.cfg
        t0 = time.perf_counter()
        scans = [self.rules.scan("question", session.question, self.kinds)]
        if session.context_text:
            scans.append(self.rules.scan("context", session.context_text, self.kinds))
        elapsed = time.perf_counter() - t0
        triggers = [h.as_dict() for s in scans for h in s.triggers]
        mode = session.settings.mode.strategy
        if cfg.max_tier >= 2 and mode in cfg.modes:
            triggers.insert(0, {"rule": "mode", "kind": "mode", "category": "mode", "target": "mode",
                                "description": f"debates in mode {mode} always get a full evaluation",
                                "matched": mode})
        self.session_triggers = triggers
        kinds = {t["kind"] for t in triggers}
        self.watch = "full" if kinds & {"mode", "intent", "context"} else "light" if "topic" in kinds else "none"
        flags = [h for s in scans for h in s.blocks]
        self._question_flags = flags
        evaluate_flags = bool(flags) and cfg.tier1_action == "evaluate" and cfg.max_tier >= 3
        self.preflight_needed = cfg.max_tier >= 3 and (bool(triggers) or evaluate_flags)
        block = self._tier1_block(flags, QUESTION_ROUND, "the question") if flags and not evaluate_flags else None
        self._emit(QUESTION_ROUND, "question", responses=len(scans), tier1_s=elapsed, flags=flags,
                   triggers=triggers, evaluation=None, block=block, withheld=[])
        return self.blocked is not None

    async def preflight(self) -> bool:
        """Tier 3 on the question when tier 2 asked for it; True when the consultation is blocked."""
        if not (self.enabled and self.preflight_needed) or self.blocked is not None:
            return self.blocked is not None
        session = self.session
        text = session.question
        if any(t["target"] == "context" for t in self.session_triggers) or any(
                h.target == "context" for h in self._question_flags):
            text += "\n\nContext supplied with the question (excerpt):\n" + session.context_text[:CONTEXT_CHARS]
        reasons = self._reasons(self.session_triggers, self._question_flags)
        evaluation = await self._evaluate(QUESTION_ROUND, "The text to evaluate is the question itself:", text,
                                          reasons)
        block = self._evaluation_block(evaluation, QUESTION_ROUND, "the question")
        if block is None and self._question_flags and evaluation.get("status") == "failed":
            block = self._tier1_block(self._question_flags, QUESTION_ROUND, "the question")  # no judge: tier 1 holds
        self._emit(QUESTION_ROUND, "question", responses=0, tier1_s=0.0, flags=self._question_flags,
                   triggers=self.session_triggers, evaluation=evaluation, block=block, withheld=[])
        return self.blocked is not None

    # ------------------------------------------------------------------------------------------- every response

    def note_artifact(self, round_number: int, round_type: str | None, agent: str | None,
                      artifact: Mapping[str, Any]) -> None:
        """Tier 1 (and the response triggers) on one artifact as it is recorded; judged after its step."""
        if not self.enabled:
            return
        t0 = time.perf_counter()
        scan = self.rules.scan(agent or JUDGE, artifact_text(artifact), self.response_kinds)
        elapsed = time.perf_counter() - t0
        self.tier1_seconds.append(elapsed)
        self._pending.setdefault((round_number, str(round_type)), []).append((scan, elapsed))

    async def after_step(self, step: Step) -> str | None:
        """Decide on the step's answers: the block reason when the consultation must stop, else None."""
        if not self.enabled:
            return None
        scans = self._pending.pop((step.number, step.type.name), [])
        if not scans:
            return None
        cfg = self.cfg
        flags = [h for s, _ in scans for h in s.blocks]
        triggers = [h.as_dict() for s, _ in scans for h in s.triggers]
        elapsed = sum(t for _, t in scans)
        where = f"round {step.number} ({step.type.title.lower()})"
        evaluate_flags = bool(flags) and cfg.tier1_action == "evaluate"
        block = None
        evaluation = None
        if flags and not (evaluate_flags and cfg.max_tier >= 3):
            block = self._tier1_block(flags, step.number, where)
        elif cfg.max_tier >= 3 and (
            triggers or evaluate_flags or self.watch == "full"
            or (self.watch == "light" and step.type.name in LIGHT_STEPS)
        ):
            reasons = self._reasons(triggers or self.session_triggers, flags)
            evaluation = await self._evaluate(step.number, f"The text to evaluate is the {where} answers, as JSON:",
                                              self._step_text(step), reasons)
            block = self._evaluation_block(evaluation, step.number, where)
            if block is None and flags and evaluation.get("status") == "failed":
                block = self._tier1_block(flags, step.number, where)  # no judge to overrule it: tier 1 holds
        withheld = self._withheld(step, flags, block)
        self._emit(step.number, step.type.name, responses=len(scans), tier1_s=elapsed, flags=flags,
                   triggers=triggers, evaluation=evaluation, block=block, withheld=withheld)
        return self.blocked["reason"] if self.blocked is not None else None

    # ------------------------------------------------------------------------------------------- tier 3

    async def _evaluate(self, round_number: int, subject: str, text: str, reasons: str) -> dict[str, Any]:
        """The judge seat's full evaluation of ``text`` (reused when an earlier run evaluated the same text)."""
        session = self.session
        digest = hashlib.sha256(f"{session.question}\0{text}".encode()).hexdigest()
        if digest in self.cache:
            return {**self.cache[digest], "status": "reused"}
        spec = self.call_spec(round_number, subject, text, reasons)
        outcome = await ask_for_artifact(session.pool, spec, native=session.native(spec.provider), bus=session.bus)
        if outcome.artifact is None:
            return {"status": "failed", "error": outcome.error, "content_sha256": digest}
        artifact = outcome.artifact
        evaluation = {"status": "evaluated", "content_sha256": digest,
                      "provider": outcome.provider, "model": outcome.model,
                      **{k: artifact.get(k) for k in ("verdict", "risk", "categories", "concerns", "recommendations",
                                                      "reason")}}
        self.cache[digest] = evaluation
        return evaluation

    def call_spec(self, round_number: int, subject: str, text: str, reasons: str) -> CallSpec:
        session = self.session
        user = _template().render(question=session.question, subject=subject, text=text, reasons=reasons)
        return CallSpec(agent=JUDGE, provider=session.judge.provider, model=session.judge.model, system=SYSTEM,
                        user=user, schema_name=SCHEMA, round_number=round_number, max_tokens=self.cfg.max_tokens,
                        allow_substitution=False)

    def _step_text(self, step: Step) -> str:
        session = self.session
        output = session.record.output(step.type.name)
        if output is None:
            return ""
        if step.type.seat == "judge":
            return prompt_json(session.labels.judge_view(output.judge) if output.judge else None)
        return prompt_json({session.labels.label(name): session.labels.judge_view(artifact)
                            for name, artifact in output.by_agent.items()})

    @staticmethod
    def _reasons(triggers: list[dict[str, Any]], flags: list[Hit]) -> str:
        parts = [f"{t['kind']} trigger: {t['description']}" for t in triggers]
        parts += [f"pattern ({h.category}): {h.description}" for h in flags]
        return "; ".join(dict.fromkeys(parts)) or "routine check of a watched debate"

    # ------------------------------------------------------------------------------------------- decisions

    def _tier1_block(self, flags: list[Hit], round_number: int, where: str) -> dict[str, Any]:
        first = flags[0]
        target = "" if first.target in ("question", "context") else f", {first.target}"
        place = "the supplied context" if first.target == "context" else f"{where}{target}"
        reason = f"blocked by the safety evaluator (tier 1, {first.category}) in {place}: {first.description}"
        if first.category == "self_harm":
            reason += "." + SELF_HARM_HELP
        return {"tier": 1, "category": first.category, "rule": first.rule, "target": first.target,
                "round_number": round_number, "reason": reason}

    def _evaluation_block(self, evaluation: Mapping[str, Any], round_number: int, where: str) -> dict[str, Any] | None:
        thresholds = self.cfg.thresholds
        if evaluation.get("status") == "failed":
            if self.cfg.on_evaluation_failure != "block":
                return None
            return {"tier": 3, "category": "unevaluated", "rule": None, "target": None, "round_number": round_number,
                    "reason": f"blocked by the safety evaluator (tier 3) in {where}: the full evaluation failed "
                              f"({evaluation.get('error')}) and quality.safety.on_evaluation_failure=block"}
        risk = float(evaluation.get("risk") or 0.0)
        if evaluation.get("verdict") != "block" and risk < thresholds.block_risk:
            return None
        categories = list(dict.fromkeys(str(c) for c in evaluation.get("categories") or [])) or ["unspecified"]
        reason = (f"blocked by the safety evaluator (tier 3, {', '.join(categories)}) in {where}: "
                  f"{' '.join(str(evaluation.get('reason') or 'judged unsafe').split())} (risk {risk:.2f})")
        if "self_harm" in categories:
            reason += SELF_HARM_HELP
        return {"tier": 3, "category": categories[0], "rule": None, "target": None, "round_number": round_number,
                "reason": reason}

    def _withheld(self, step: Step, flags: list[Hit], block: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        """The answers a block keeps out of the report (the journal keeps them): the flagged ones on tier 1,
        the whole step on tier 3."""
        if block is None:
            return []
        if block["tier"] == 1:
            names = sorted({h.target for h in flags})
        else:
            output = self.session.record.output(step.type.name)
            names = sorted(output.by_agent) if output is not None and step.type.seat == "agents" else [JUDGE]
        return [{"round_number": step.number, "round_type": step.type.name,
                 "agent": None if name == JUDGE else name} for name in names]

    # ------------------------------------------------------------------------------------------- the record

    def _emit(self, round_number: int, round_type: str, *, responses: int, tier1_s: float, flags: list[Hit],
              triggers: list[dict[str, Any]], evaluation: dict[str, Any] | None, block: dict[str, Any] | None,
              withheld: list[dict[str, Any]]) -> None:
        concern = bool(evaluation) and evaluation is not None and evaluation.get("status") != "failed" and (
            evaluation.get("verdict") == "caution"
            or float(evaluation.get("risk") or 0.0) >= self.cfg.thresholds.concern_risk)
        tier = 3 if evaluation is not None else 2 if (triggers or (round_number and self.session_triggers)) else 1
        shadow = self.stage == "shadow"
        record = {
            "round_number": round_number,
            "round_type": round_type,
            "stage": self.stage,
            "tier": tier,
            "tier_name": TIER_NAMES[tier],
            "responses": responses,
            "tier1_ms": round(tier1_s * 1000, 4),
            "flags": [h.as_dict() for h in flags],
            "triggers": triggers,
            "evaluation": evaluation,
            "concern": concern,
            "passed": block is None,
            "blocked": block is not None and not shadow,
            "would_block": block is not None and shadow,
            "block": block,
            "withheld": withheld if not shadow else [],
        }
        self.records.append(record)
        if block is not None:
            if shadow:
                self.would_block = self.would_block or record
            elif self.blocked is None:
                self.blocked = {**block, "withheld": withheld}
                self._withhold(withheld)
        self.session.bus.emit(SAFETY_CHECKED, **record)

    def _withhold(self, withheld: list[dict[str, Any]]) -> None:
        """Keep blocked answers out of the result (and so out of the report and stdout); the journal has them."""
        record = self.session.record
        for item in withheld:
            output = record.output(item["round_type"])
            if output is None:
                continue
            if item["agent"] is not None:
                output.by_agent.pop(item["agent"], None)
            else:
                if record.verdict is not None and record.verdict is output.judge:
                    record.verdict = None
                output.judge = None

    def round_summary(self, number: int) -> dict[str, Any] | None:
        """What a round's end record carries: the highest tier its checks reached, and whether they passed."""
        mine = [r for r in self.records if r["round_number"] == number]
        if not mine:
            return None
        return {"tier": max(r["tier"] for r in mine), "passed": all(r["passed"] for r in mine),
                "blocked": any(r["blocked"] for r in mine), "would_block": any(r["would_block"] for r in mine)}

    def summary(self) -> dict[str, Any]:
        """The result's ``safety`` record."""
        if not self.enabled:
            return {"enabled": False, "stage": self.stage}
        records = self.records
        seen: set[tuple[str, str]] = set()
        triggers = []
        for record in records:
            for t in record["triggers"]:
                if (t["rule"], t["target"]) not in seen:
                    seen.add((t["rule"], t["target"]))
                    triggers.append(t)
        evaluations = [r["evaluation"] for r in records if r["evaluation"] is not None]
        block = self.blocked or (self.would_block or {}).get("block")
        timings = self.tier1_seconds
        return {
            "enabled": True,
            "stage": self.stage,
            "max_tier": self.cfg.max_tier,
            "prompt_version": prompt_version() if self.cfg.max_tier >= 3 else None,
            "watch": self.watch,
            "tier_reached": max((r["tier"] for r in records), default=0),
            "checks": len(records),
            "responses_checked": len(timings),
            "tier1_ms_mean": round(1000 * sum(timings) / len(timings), 4) if timings else None,
            "triggers": triggers,
            "flags": [f for r in records for f in r["flags"]],
            "evaluations": len([e for e in evaluations if e.get("status") == "evaluated"]),
            "concerns": [c for r in records if r["concern"] and r["evaluation"]
                         for c in (r["evaluation"].get("concerns") or [])],
            "blocked": self.blocked is not None,
            "would_block": self.would_block is not None,
            "block": dict(block) if block else None,
        }

    # ------------------------------------------------------------------------------------------- the estimate

    def estimate_rounds(self, rounds: list[int]) -> list[int]:
        """The round numbers the estimate covers: the question's full evaluation (round 0) when it is planned."""
        return [QUESTION_ROUND, *rounds] if self.enabled and self.preflight_needed else rounds

    def planned_texts(self, numbers: list[int]) -> list[PlannedText]:
        """The full evaluations known before round 1: the question's, and each step's that the watch level asks
        for; the answers they read are counted at their producers' output caps."""
        if not self.enabled or self.cfg.max_tier < 3:
            return []
        session = self.session
        specs: list[tuple[CallSpec, int]] = []
        if self.preflight_needed:
            specs.append((self.call_spec(QUESTION_ROUND, "", session.question, ""), 0))
        agents = len(session.settings.agents)
        for step in session.plan.steps():
            if step.number not in numbers:
                continue
            if self.watch == "full" or (self.watch == "light" and step.type.name in LIGHT_STEPS):
                carried = step.type.max_tokens * (agents if step.type.seat == "agents" else 1)
                specs.append((self.call_spec(step.number, "", "", ""), carried))
        return [PlannedText(spec, f"{spec.system}\n{spec.user}\n"
                            f"{json_instruction(SCHEMA, session.native(spec.provider))}", carried)
                for spec, carried in specs]
