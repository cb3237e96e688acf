"""The debate strategy base class: what a built-in or third-party strategy subclasses to become ``mode=<name>``.

A strategy owns the words of every round (prompt templates in its own package), the artifact schema of each
round, how a verdict is derived from the round-2 synthesis when no verdict round runs, and whether it may stop
early after round 2. The engine owns everything else: calls, extraction, labels, filtering, cost and state.

A minimal third-party strategy::

    class DevilsAdvocate(Strategy):
        name = "devils_advocate"
        prompt_package = "my_plugin"        # templates at my_plugin/prompts/<template>.md (package data)
        prompt_dir = "prompts"
        allows_early_termination = False

    @conclave.hookimpl
    def register_strategies(register):
        register("devils_advocate", DevilsAdvocate)

Templates (``<name>.md``, each starting with a ``---/version: v1/---`` header) and the ``$placeholders`` each
one receives:

=================  =========================================================================================
agent_system       persona_name, persona_focus                       (agent system prompt, every agent round)
judge_system       (none)                                            (judge system prompt, every judge round)
round1             question                                          (agent, independent position)
round2             question, panel, absent, independents             (judge, synthesis)
round3_agent       question, label, own_position, synthesis          (agent, cross-examination reply)
round3_judge       question, panel, absent, synthesis, replies       (judge, cross-examination artifact)
round4             question, panel, absent, independents, synthesis, cross_exam   (judge, verdict)
=================  =========================================================================================

Artifacts arrive as JSON text in which agents appear only under their neutral labels ("Agent A"). The user's
context is appended to both system prompts by the engine (a stable prefix, so providers can cache it).
"""

from __future__ import annotations

from collections.abc import Mapping
from statistics import fmean
from typing import Any, ClassVar

from pydantic import BaseModel

from conclave.config import Persona
from conclave.engine.prompt_template import PromptTemplate, load_template

#: template name -> the ``prompt_versions`` key it is recorded under
TEMPLATE_KEYS = {
    "agent_system": "agent_system",
    "judge_system": "judge_system",
    "round1": "round_1",
    "round2": "round_2",
    "round3_agent": "round_3",
    "round3_judge": "round_3_judge",
    "round4": "round_4",
}

CONTEXT_HEADER = "Context supplied with the question (files and project summary):"


class Strategy:
    """Base class of debate strategies. Subclasses set the class attributes and ship the seven templates."""

    #: the strategy's name, used in template ids (``converge/round2@v1``)
    name: ClassVar[str] = ""
    #: importable package and directory inside it that hold the ``.md`` templates
    prompt_package: ClassVar[str] = ""
    prompt_dir: ClassVar[str] = ""
    #: whether a strong round-2 consensus may end the consultation early
    allows_early_termination: ClassVar[bool] = False
    #: shown (via an event) when the strategy never stops early, e.g. "Explore mode: all rounds will execute"
    all_rounds_notice: ClassVar[str | None] = None
    #: pydantic model of ``mode.options`` (None = takes no options); validated at start-up
    Options: ClassVar[type[BaseModel] | None] = None

    #: artifact schema names (``conclave.artifacts.schema_names()``) per round
    independent_schema: ClassVar[str] = "independent"
    synthesis_schema: ClassVar[str] = "synthesis"
    reply_schema: ClassVar[str] = "cross_exam_reply"
    cross_exam_schema: ClassVar[str] = "cross_exam"
    verdict_schema: ClassVar[str] = "verdict"

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = self.Options.model_validate(dict(options or {})) if self.Options is not None else None

    # ------------------------------------------------------------------------------------- templates

    def template(self, name: str) -> PromptTemplate:
        return load_template(self.prompt_package, self.prompt_dir, self.name, name)

    def prompt_versions(self) -> dict[str, str]:
        """Every template's id, keyed ``round_1`` … ``round_4`` (plus ``round_3_judge`` and the system prompts)."""
        return {key: self.template(name).id for name, key in TEMPLATE_KEYS.items()}

    # ------------------------------------------------------------------------------------- system prompts

    def agent_system(self, persona: Persona, context: str) -> str:
        return _with_context(
            self.template("agent_system").render(persona_name=persona.name, persona_focus=persona.focus), context
        )

    def judge_system(self, context: str) -> str:
        return _with_context(self.template("judge_system").render(), context)

    # ------------------------------------------------------------------------------------- user messages

    def independent(self, *, question: str) -> str:
        return self.template("round1").render(question=question)

    def synthesis(self, *, question: str, panel: str, absent: str, independents: str) -> str:
        return self.template("round2").render(question=question, panel=panel, absent=absent, independents=independents)

    def cross_exam_reply(self, *, question: str, label: str, own_position: str, synthesis: str) -> str:
        return self.template("round3_agent").render(
            question=question, label=label, own_position=own_position, synthesis=synthesis
        )

    def cross_exam(self, *, question: str, panel: str, absent: str, synthesis: str, replies: str) -> str:
        return self.template("round3_judge").render(
            question=question, panel=panel, absent=absent, synthesis=synthesis, replies=replies
        )

    def verdict(
        self, *, question: str, panel: str, absent: str, independents: str, synthesis: str, cross_exam: str
    ) -> str:
        return self.template("round4").render(
            question=question, panel=panel, absent=absent, independents=independents, synthesis=synthesis,
            cross_exam=cross_exam,
        )

    # ------------------------------------------------------------------------------------- derived verdict

    def verdict_from_synthesis(self, synthesis: Mapping[str, Any]) -> dict[str, Any]:
        """The verdict body (header fields excluded) when no verdict round runs: early stop, ``rounds=2|3``.

        The top consensus point is the recommendation, the mean consensus confidence the confidence, every
        consensus point the evidence; tension viewpoints of agents who support no consensus point become dissent,
        with severity by mean confidence (> 0.85 low, > 0.70 medium, else high); with no such outsider every
        viewpoint is recorded as low-severity dissent. Nothing is invented: every string comes from the synthesis.
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
        }


def consensus_confidence(synthesis: Mapping[str, Any]) -> float:
    """Mean confidence of the synthesis' consensus points; 0 when it has none (seed 001)."""
    values = [float(p.get("confidence", 0)) for p in synthesis.get("consensus_points", [])]
    return fmean(values) if values else 0.0


def _tension_text(tension: Mapping[str, Any], viewpoint: Mapping[str, Any]) -> str:
    topic = tension.get("topic") or tension.get("area") or ""
    text = viewpoint.get("viewpoint") or viewpoint.get("concern") or ""
    return f"{topic}: {text}" if topic and text else topic or text


def _with_context(system: str, context: str) -> str:
    if not context.strip():
        return system
    return f"{system.rstrip()}\n\n---\n\n{CONTEXT_HEADER}\n\n{context.strip()}\n"
