"""The debate strategy base class: what a built-in or third-party strategy subclasses to become ``mode=<name>``.

A strategy owns its debate's **plan** (which round types it plays, in order: :mod:`conclave.engine.rounds`), the
words of every round (prompt templates in its own package), how a verdict is derived from the synthesis when no
verdict round runs, and whether it may stop early after the synthesis. The engine owns everything else: calls,
extraction, labels, filtering, cost and state.

A minimal third-party strategy::

    class DevilsAdvocate(Strategy):
        name = "devils_advocate"
        prompt_package = "my_plugin"        # templates at my_plugin/prompts/<template>.md (package data)
        prompt_dir = "prompts"
        plan = (INDEPENDENT, SYNTHESIS, REBUTTAL, CROSS_EXAM_REPLIES, CROSS_EXAM, VERDICT)  # REBUTTAL: its own

    @conclave.hookimpl
    def register_strategies(register):
        register("devils_advocate", DevilsAdvocate)

Templates are ``<name>.md`` files, each starting with a ``---/version: v1/---`` header: ``agent_system``
(placeholders ``persona_name``, ``persona_focus``) and ``judge_system`` (none) for the system prompts, plus the
``template`` of every round type in the plan. A round's template receives ``question``, ``panel``, ``absent``
(and ``label`` on the agents' seat) and the round type's ``inputs``; for the standard plan:

=================  =========================================================================================
round1             question                                          (agents: independent position)
round2             question, panel, absent, independents             (judge: synthesis)
round3_agent       question, label, own_position, synthesis          (agents: cross-examination reply)
round3_judge       question, panel, absent, synthesis, replies       (judge: cross-examination artifact)
round4             question, panel, absent, independents, synthesis, cross_exam   (judge: verdict)
=================  =========================================================================================

Artifacts arrive as JSON text in which agents appear only under their neutral labels ("Agent A"). The user's
context opens both system prompts (:func:`context_block`): it is the same leading text in every call of a
consultation, agents' and judge's, so providers can cache it; the seat's own instructions follow it.
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import fmean
from types import MappingProxyType
from typing import Any, ClassVar

from pydantic import BaseModel

from conclave.config.settings import Persona
from conclave.engine.prompt_template import PromptTemplate, TemplateError, load_template
from conclave.engine.rounds import STANDARD_PLAN, VERDICT_ROUND, RoundType
from conclave.quality.verification import Question

#: the system prompt templates every strategy ships, and their ``prompt_versions`` keys
SYSTEM_TEMPLATES = {"agent_system": "agent_system", "judge_system": "judge_system"}

#: template name -> ``prompt_versions`` key, for the standard plan
TEMPLATE_KEYS = {**SYSTEM_TEMPLATES, **{t.template: t.prompt_key for t in STANDARD_PLAN}}

#: templates of round types the engine inserts itself (the critical objection round): (package, directory); a
#: strategy that ships a template of the same name words it its own way
ENGINE_TEMPLATES = {"objection": ("conclave.quality", "prompts")}

CONTEXT_HEADER = "Context supplied with the question (files and project summary):"


class Strategy:
    """Base class of debate strategies. Subclasses set the class attributes and ship the templates."""

    #: the strategy's name, used in template ids (``converge/round2@v1``)
    name: ClassVar[str] = ""
    #: importable package and directory inside it that hold the ``.md`` templates
    prompt_package: ClassVar[str] = ""
    prompt_dir: ClassVar[str] = ""
    #: the round types this strategy plays, in order
    plan: ClassVar[tuple[RoundType, ...]] = STANDARD_PLAN
    #: the full debate when the aggregate of the answers that count decides and no judge verdict is asked for
    #: (:mod:`conclave.engine.settle`); empty: ``plan`` without the judge's cross-examination record and verdict
    short_plan: ClassVar[tuple[RoundType, ...]] = ()
    #: whether a strong consensus in the synthesis may end the consultation early
    allows_early_termination: ClassVar[bool] = False
    #: shown (via an event) when the strategy never stops early, e.g. "Explore mode: all rounds will execute"
    all_rounds_notice: ClassVar[str | None] = None
    #: whether an unsupported answer change in cross-examination keeps the earlier answer for aggregation when
    #: ``anti_conformity`` is null (:mod:`conclave.engine.conformity`)
    anti_conformity_by_default: ClassVar[bool] = False
    #: the strategy's own two verification questions, answered by the round-2 judge for each position
    verification_questions: ClassVar[tuple[Question, ...]] = ()
    #: universal questions that do not fit this strategy's artifacts, each with why: neither checked nor put to
    #: the judge, and listed with their reasons in the quality record and the report (never a silent failure)
    not_applicable_questions: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: rounds in all (the verdict included) when ``exit.round_cap`` is null: how often cross-examination may repeat
    default_round_cap: ClassVar[int] = 6
    #: whether the vote gate after round 1 is on when ``selective.enabled`` is null
    selective_by_default: ClassVar[bool] = False
    #: the aggregator used when ``aggregator`` is null
    default_aggregator: ClassVar[str] = "plurality"
    #: pydantic model of ``mode.options`` (None = takes no options); validated at start-up
    Options: ClassVar[type[BaseModel] | None] = None

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = self.Options.model_validate(dict(options or {})) if self.Options is not None else None

    # ------------------------------------------------------------------------------------- plan

    def round_type(self, name: str) -> RoundType | None:
        """The plan's round type called ``name`` (None when the strategy does not play it)."""
        return next((t for t in reversed(self.plan) if t.name == name), None)

    @property
    def verdict_schema(self) -> str:
        """The schema of this strategy's verdict, also used for a verdict derived from the synthesis."""
        verdict = self.round_type(VERDICT_ROUND)
        return verdict.schema if verdict is not None else "verdict"

    @property
    def allowed_answers(self) -> tuple[str, ...]:
        """The only ``final_answer`` values this consultation accepts (empty: any); sent as an ``enum``."""
        return ()

    # ------------------------------------------------------------------------------------- templates

    def template(self, name: str) -> PromptTemplate:
        """The strategy's template ``name``; for a round type a controller inserts (:data:`ENGINE_TEMPLATES`) the
        engine's own wording when the strategy ships none."""
        try:
            return load_template(self.prompt_package, self.prompt_dir, self.name, name)
        except TemplateError:
            if name not in ENGINE_TEMPLATES:
                raise
            package, directory = ENGINE_TEMPLATES[name]
            return load_template(package, directory, "conclave", name)

    def template_keys(self) -> dict[str, str]:
        """Template name -> ``prompt_versions`` key, for the system prompts and every round of the plan."""
        return {**SYSTEM_TEMPLATES, **{t.template: t.prompt_key for t in (*self.plan, *self.short_plan)}}

    def prompt_versions(self) -> dict[str, str]:
        """Every template's id, keyed ``round_1`` … ``round_4`` (plus ``round_3_judge`` and the system prompts)."""
        return {key: self.template(name).id for name, key in self.template_keys().items()}

    # ------------------------------------------------------------------------------------- prompts

    def agent_system(self, persona: Persona, context: str) -> str:
        return _with_context(
            self.template("agent_system").render(persona_name=persona.name, persona_focus=persona.focus), context
        )

    def panel_problems(self, panel: list[str]) -> list[str]:
        """One line per ``mode.options`` value that does not fit this panel (checked before anything is spent)."""
        return []

    def agent_role(self, agent: str, panel: list[str]) -> str:
        """A section added to one agent's system prompt (e.g. an assigned stance); empty for most strategies.
        ``panel``: every agent's name in configuration order."""
        return ""

    def judge_system(self, context: str) -> str:
        return _with_context(self.template("judge_system").render(), context)

    def user_message(self, round_type: RoundType, values: Mapping[str, str]) -> str:
        """The user message of one call of ``round_type``: its template rendered with ``values``."""
        return self.template(round_type.template).render(**values)

    # ------------------------------------------------------------------------------------- derived verdict

    def verdict_from_synthesis(self, synthesis: Mapping[str, Any]) -> dict[str, Any]:
        """The verdict body (header fields excluded) when no verdict round runs: early stop, ``rounds=2|3``.

        The top consensus point is the recommendation, the mean consensus confidence the confidence, every
        consensus point the evidence; tension viewpoints of agents who support no consensus point become dissent,
        with severity by mean confidence (> 0.85 low, > 0.70 medium, else high); with no such outsider every
        viewpoint is recorded as low-severity dissent; each evidence item rests on its consensus point's claim ids.
        Nothing is invented: every string comes from the synthesis.
        """
        points = sorted(synthesis.get("consensus_points", []), key=lambda p: -float(p.get("confidence", 0)))
        confidence = round(consensus_confidence(synthesis), 4)  # rounded so 0.85 is not 0.8500000000000001
        supporters = {a for p in points for a in p.get("supporting_agents", [])}
        viewpoints = [(t, v) for t in synthesis.get("tensions", []) for v in t.get("viewpoints", [])]
        outsiders = [(t, v) for t, v in viewpoints if v.get("agent") not in supporters]
        severity = "low" if confidence > 0.85 else "medium" if confidence > 0.70 else "high"
        chosen, level = (outsiders, severity) if outsiders else (viewpoints, "low")
        return {
            "recommendation": points[0]["point"] if points else "The synthesis recorded no consensus point.",
            "confidence": confidence,
            "evidence": [p["point"] for p in points] or ["The synthesis recorded no consensus point."],
            "dissent": [
                {"agent": v.get("agent", ""), "concern": _tension_text(t, v), "severity": level} for t, v in chosen
            ],
            "evidence_claims": [{"evidence": p["point"], "claim_ids": list(p.get("claim_ids") or [])} for p in points],
        }


def consensus_confidence(synthesis: Mapping[str, Any]) -> float:
    """Mean confidence of the synthesis' consensus points; 0 when it has none."""
    values = [float(p.get("confidence", 0)) for p in synthesis.get("consensus_points", [])]

    return fmean(values) if values else 0.0


def _tension_text(tension: Mapping[str, Any], viewpoint: Mapping[str, Any]) -> str:
    topic = tension.get("topic") or tension.get("area") or ""
    text = viewpoint.get("viewpoint") or viewpoint.get("concern") or ""
    return f"{topic}: {text}" if topic and text else topic or text


def context_block(context: str) -> str:
    """The leading text of every system prompt of a consultation with ``context`` ("" without one): byte-identical
    in every call, so it is the prefix providers cache."""
    if not context.strip():
        return ""
    return f"{CONTEXT_HEADER}\n\n{context.strip()}\n\n---\n\n"


def _with_context(system: str, context: str) -> str:
    # the context comes first and the seat's instructions after it: the longest prefix every call shares
    return f"{context_block(context)}{system}"
