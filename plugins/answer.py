"""The ``answer`` strategy: a debate over a question with one checkable answer (``mode=answer``).

Every artifact that states an answer carries a short ``final_answer`` (round-1 positions, the round-2 synthesis,
the round-3 replies and the verdict), so an evaluation can score each round and each protocol built from them:
one agent alone, the round-1 majority vote, the judge's synthesis of round 1, the full debate. Its words live in
``prompts/answer/*.md``; its schemas are ``schemas/*_answer.schema.json``. It may stop after round 2 on strong
consensus, like converge, so ``early_termination.threshold`` is a real knob to sweep.

Answer mode is in the debate-quality layer like converge: agents label and cite their claims (the engine numbers
them C1…, their sources E1…), round-3 agents see the DEBATE STATE, the synthesis accounts for every claim and
carries the judged verification questions, the verdict ties its evidence to claim ids. Of the universal questions
it does not ask U3 and U4 (:attr:`AnswerStrategy.not_applicable_questions` says why); U5 reads the answer's
``uncertainties``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from conclave.artifacts.schema_refs import schemas_in
from conclave.engine.rounds import CROSS_EXAM, CROSS_EXAM_REPLIES, INDEPENDENT, SYNTHESIS, VERDICT, Input
from conclave.engine.strategy import Strategy
from conclave.hookspecs import hookimpl
from conclave.quality.verification import Question

#: cross-examination on the panel's round-1 answers themselves (under each agent's neutral labels), with no
#: synthesis before it: what answer mode plays when the aggregate decides
PEER_REPLIES = replace(
    CROSS_EXAM_REPLIES.with_schema("cross_exam_reply_answer"), template="round3_peers", prompt_key="round_3_peers",
    inputs={"own_position": Input("independent", "own"), "peers": Input("independent", "each_by_label")})


class AnswerOptions(BaseModel):
    """``mode.options`` of answer mode."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: the only final answers allowed (a multiple-choice item's letters, set per item by ``conclave eval``): every
    #: ``final_answer`` is constrained to them in the structured-output schema, and another answer is re-asked
    choices: list[Annotated[str, Field(min_length=1)]] = Field(default_factory=list)


class AnswerStrategy(Strategy):
    """Converge on one short, scorable answer; every answer-bearing artifact has a ``final_answer``."""

    name = "answer"
    prompt_package = "conclave_plugins"
    prompt_dir = "prompts/answer"
    # a changed answer counts only with evidence the debate accepts: conformity alone does not move the aggregate
    anti_conformity_by_default = True
    plan = (
        INDEPENDENT.with_schema("independent_answer"),
        SYNTHESIS.with_schema("synthesis_answer"),
        CROSS_EXAM_REPLIES.with_schema("cross_exam_reply_answer"),
        CROSS_EXAM,
        VERDICT.with_schema("verdict_answer"),
    )
    # the aggregate of the answers that count decides (anti-conformity, selective.judge_verdict=false): one call
    # per agent on its peers' round-1 answers, no synthesis, no judge's record, no verdict call
    short_plan = (INDEPENDENT.with_schema("independent_answer"), PEER_REPLIES)
    allows_early_termination = True
    # short by default: one cross-examination round (rounds 1-4) unless exit.round_cap raises it; easy questions
    # are decided by the confidence-weighted vote after round 1
    default_round_cap = 4
    selective_by_default = True
    default_aggregator = "confidence"
    Options = AnswerOptions
    verification_questions = (
        Question("AN1", "mode-specific", "Does the working shown derive the final_answer, with no gap or "
                 "contradicting step?"),
        Question("AN2", "mode-specific", "Is the final_answer exactly what the question asks for, in the form it "
                 "asks (a number, a choice letter, yes or no…)?"),
    )
    not_applicable_questions: ClassVar[Mapping[str, str]] = {
        "U3": "a question with one checkable answer is settled by its working, not by choosing among options (a "
              "yes/no question has one alternative); rival answers are the synthesis' tensions",
        "U4": "an answer is not a plan: it has no failure modes to mitigate; where it could be wrong is U5's "
              "uncertainties",
    }

    @property
    def allowed_answers(self) -> tuple[str, ...]:
        return tuple(self.options.choices) if isinstance(self.options, AnswerOptions) else ()

    def verdict_from_synthesis(self, synthesis: Mapping[str, Any]) -> dict[str, Any]:
        """Converge's derived verdict (its evidence tied to the consensus points' claim ids), answering with the
        synthesis' own ``final_answer`` (the judge's answer from round 1 alone); nothing is invented."""
        verdict = super().verdict_from_synthesis(synthesis)
        verdict["final_answer"] = str(synthesis.get("final_answer") or "").strip() or "(no answer)"
        return verdict


@hookimpl
def register_strategies(register: Any) -> None:
    register("answer", AnswerStrategy)


@hookimpl
def register_schemas(register: Any) -> None:
    shipped = schemas_in("conclave_plugins.schemas")
    for name in ("independent_answer", "synthesis_answer", "cross_exam_reply_answer", "verdict_answer"):
        register(name, shipped[name])
