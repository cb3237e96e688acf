"""Two strategies: devil's advocate (every agent attacks the most popular answer) and gauntlet (a round type of
its own: every agent rebuts the synthesis before cross-examination)."""

from __future__ import annotations

from dataclasses import replace

from pydantic import BaseModel, ConfigDict

from conclave.engine.rounds import (
    CROSS_EXAM,
    CROSS_EXAM_REPLIES,
    INDEPENDENT,
    SYNTHESIS,
    VERDICT,
    Input,
    RoundType,
)
from conclave.engine.strategy import Strategy
from conclave.quality.verification import Question


class DevilsAdvocateOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ferocity: int = 1


class DevilsAdvocateStrategy(Strategy):
    name = "devil"
    prompt_package = "conclave_example_plugin"
    prompt_dir = "prompts"
    allows_early_termination = False
    all_rounds_notice = "Devil's advocate mode: every round runs"
    Options = DevilsAdvocateOptions
    verification_questions = (
        Question("DA1", "mode-specific", "Assigned stance maintained throughout?"),
        Question("DA2", "mode-specific", "Consensus actively challenged?"),
    )


# A round type of this plugin's own: after the synthesis, every agent rebuts it before cross-examination.
REBUTTAL = RoundType(
    name="rebuttal",
    title="Rebuttal",
    seat="agents",
    template="rebuttal",
    prompt_key="rebuttal",
    schema="cross_exam_reply",
    max_tokens=1024,
    state="REBUTTAL",
    stage=3,  # part of the cross-examination: `rounds=2` stops before it
    inputs={"own_position": Input("independent", "own"), "synthesis": Input("synthesis", "judge", filtered="round3")},
    too_few="no agent rebutted the synthesis in round {number}",
)


class GauntletStrategy(Strategy):
    """Every agent must rebut the synthesis before cross-examination; the verdict weighs the rebuttals."""

    name = "gauntlet"
    prompt_package = "conclave_example_plugin"
    prompt_dir = "prompts"
    verification_questions = (
        Question("GA1", "mode-specific", "Every rebuttal answers the synthesis point it targets?"),
        Question("GA2", "mode-specific", "The position survives its own strongest rebuttal?"),
    )
    plan = (
        INDEPENDENT,
        SYNTHESIS,
        REBUTTAL,
        CROSS_EXAM_REPLIES,
        CROSS_EXAM,
        replace(VERDICT, template="verdict_gauntlet",
                inputs={**VERDICT.inputs, "rebuttals": Input("rebuttal", "each_by_label")}),
    )
