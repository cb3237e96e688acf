"""Built-in debate strategies: converge ("No, because…"), explore ("Yes, and…"), adversarial (steel-man,
then answer) and devils_advocate (every consensus challenged on purpose).

Each strategy's words live in ``prompts/<strategy>/*.md``; see :mod:`conclave.engine.strategy` for the
template contract a third-party strategy follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from conclave.artifacts.schema_refs import schemas_in
from conclave.engine.rounds import CROSS_EXAM, CROSS_EXAM_REPLIES, INDEPENDENT, SYNTHESIS, VERDICT
from conclave.engine.strategy import Strategy, consensus_confidence
from conclave.hookspecs import hookimpl
from conclave.quality.verification import Question

SCHEMA_PACKAGE = "conclave_plugins.schemas"


class ConvergeStrategy(Strategy):
    """Drive toward one defensible recommendation; may stop after round 2 on a strong consensus."""

    name = "converge"
    prompt_package = "conclave_plugins"
    prompt_dir = "prompts/converge"
    plan = (INDEPENDENT, SYNTHESIS, CROSS_EXAM_REPLIES, CROSS_EXAM, VERDICT)
    allows_early_termination = True
    verification_questions = (
        Question("CV1", "mode-specific", "One definite recommendation, with the conditions it depends on named?"),
        Question("CV2", "mode-specific", "Strongest objection to the position answered or conceded?"),
    )


class ExploreStrategy(Strategy):
    """Widen the option space and end with a menu of options; always runs every planned round."""

    name = "explore"
    prompt_package = "conclave_plugins"
    prompt_dir = "prompts/explore"
    plan = (
        INDEPENDENT,
        SYNTHESIS,
        CROSS_EXAM_REPLIES.with_schema("cross_exam_reply_explore"),  # "Yes, and…": build on each other
        CROSS_EXAM,
        VERDICT.with_schema("verdict_explore"),  # a menu of options, not one recommendation
    )
    allows_early_termination = False
    all_rounds_notice = "Explore mode: all rounds will execute"
    verification_questions = (
        Question("EX1", "mode-specific", "Opens at least one option beyond the obvious answer?"),
        Question("EX2", "mode-specific", "States when each option considered is the best choice?"),
    )

    def verdict_from_synthesis(self, synthesis: Mapping[str, Any]) -> dict[str, Any]:
        """A menu built from the synthesis alone: each consensus theme (strongest first), then each agent's
        distinct viewpoint from the tensions, as options. Every string comes from the synthesis."""
        points = sorted(synthesis.get("consensus_points", []), key=lambda p: -float(p.get("confidence", 0)))
        options: list[dict[str, Any]] = [
            {
                "option": p["point"],
                "description": f"Shared theme of round 2 (confidence {float(p.get('confidence', 0)):.0%}).",
                "pros": [],
                "cons": [],
                "championed_by": list(p.get("supporting_agents", [])),
            }
            for p in points
        ]
        for tension in synthesis.get("tensions", []):
            topic = tension.get("topic", "")
            for view in tension.get("viewpoints", []):
                options.append(
                    {
                        "option": view.get("viewpoint", ""),
                        "description": f"One side of the round-2 tension on {topic}." if topic
                        else "One side of a round-2 tension.",
                        "pros": [],
                        "cons": [],
                        "championed_by": [view["agent"]] if view.get("agent") else [],
                    }
                )
        options = [o for o in options if o["option"]] or [{
            "option": "No option emerged from the synthesis.",
            "description": "The round-2 synthesis recorded no consensus theme and no viewpoint to choose from.",
            "pros": [], "cons": [], "championed_by": [],
        }]
        confidence = consensus_confidence(synthesis)
        return {
            "recommendations": options,
            "synergies": [],
            "confidence": round(confidence, 4),
            "summary": (
                f"{len(options)} option(s) taken from the round-2 synthesis; no verdict round ran, so the options "
                "have not been compared."
            ),
            "evidence_claims": [],  # no evidence items: the options are the synthesis' own points
        }


class AdversarialStrategy(Strategy):
    """Test every position against its strongest opponent: agents steel-man the position furthest from theirs
    and name the strongest counter-argument to their own before the verdict."""

    name = "adversarial"
    prompt_package = "conclave_plugins"
    prompt_dir = "prompts/adversarial"
    plan = (INDEPENDENT, SYNTHESIS, CROSS_EXAM_REPLIES.with_schema("cross_exam_reply_adversarial"), CROSS_EXAM,
            VERDICT)
    allows_early_termination = False
    all_rounds_notice = "Adversarial mode: all rounds will execute"
    verification_questions = (
        Question("ADV1", "mode-specific", "Opponent position steel-manned?"),
        Question("ADV2", "mode-specific", "Strongest counter-argument provided?"),
    )


class DevilsAdvocateOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    #: the agent who argues against the consensus whatever it is (default: the first agent of the panel)
    advocate: str | None = None


class DevilsAdvocateStrategy(Strategy):
    """Challenge every consensus on purpose: round-3 replies attack the synthesis point by point, and one agent
    holds the contrary stance throughout."""

    name = "devils_advocate"
    prompt_package = "conclave_plugins"
    prompt_dir = "prompts/devils_advocate"
    plan = (INDEPENDENT, SYNTHESIS, CROSS_EXAM_REPLIES.with_schema("cross_exam_reply_devils_advocate"), CROSS_EXAM,
            VERDICT)
    allows_early_termination = False
    all_rounds_notice = "Devil's advocate mode: all rounds will execute"
    Options = DevilsAdvocateOptions
    verification_questions = (
        Question("DA1", "mode-specific", "Assigned stance maintained throughout?"),
        Question("DA2", "mode-specific", "Consensus actively challenged?"),
    )

    def panel_problems(self, panel: list[str]) -> list[str]:
        advocate = getattr(self.options, "advocate", None)
        if advocate is not None and advocate not in panel:
            return [f"mode.options.advocate: {advocate!r} is not on the panel; allowed: {', '.join(panel)}"]
        return []

    def agent_role(self, agent: str, panel: list[str]) -> str:
        chosen = getattr(self.options, "advocate", None) or (panel[0] if panel else None)
        if agent != chosen:
            return ""
        return ("=== YOUR ASSIGNED STANCE ===\nYou are the panel's devil's advocate: take the position the others "
                "are least likely to take, and argue against any consensus to the end. Concede a point only when the "
                "evidence leaves you no room, and say so explicitly.\n")


@hookimpl
def register_strategies(register: Any) -> None:
    register("converge", ConvergeStrategy)
    register("explore", ExploreStrategy)
    register("adversarial", AdversarialStrategy)
    register("devils_advocate", DevilsAdvocateStrategy)


#: the schemas of these strategies' own artifacts (conclave_plugins/schemas/)
OWN_SCHEMAS = ("cross_exam_reply_explore", "verdict_explore", "cross_exam_reply_adversarial",
               "cross_exam_reply_devils_advocate")


@hookimpl
def register_schemas(register: Any) -> None:
    shipped = schemas_in(SCHEMA_PACKAGE)
    for name in OWN_SCHEMAS:
        register(name, shipped[name])
