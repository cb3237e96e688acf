"""The ``answer`` strategy: a debate over a question with one checkable answer (``mode=answer``).

Every artifact that states an answer carries a short ``final_answer`` (round-1 positions, the round-2 synthesis,
the round-3 replies and the verdict), so an evaluation can score each round and each protocol built from them:
one agent alone, the round-1 majority vote, the judge's synthesis of round 1, the full debate. Its words live in
``prompts/answer/*.md``; its schemas are ``schemas/*_answer.schema.json``. It may stop after round 2 on strong
consensus, like converge, so ``early_termination.threshold`` is a real knob to sweep.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.engine.rounds import CROSS_EXAM, CROSS_EXAM_REPLIES, INDEPENDENT, SYNTHESIS, VERDICT
from conclave.engine.strategy import Strategy
from conclave.hookspecs import hookimpl


class AnswerStrategy(Strategy):
    """Converge on one short, scorable answer; every answer-bearing artifact has a ``final_answer``."""

    name = "answer"
    prompt_package = "conclave_plugins"
    prompt_dir = "prompts/answer"
    plan = (
        INDEPENDENT.with_schema("independent_answer"),
        SYNTHESIS.with_schema("synthesis_answer"),
        CROSS_EXAM_REPLIES.with_schema("cross_exam_reply_answer"),
        CROSS_EXAM,
        VERDICT.with_schema("verdict_answer"),
    )
    allows_early_termination = True

    def verdict_from_synthesis(self, synthesis: Mapping[str, Any]) -> dict[str, Any]:
        """Converge's derived verdict, answering with the synthesis' own ``final_answer`` (the judge's answer
        from round 1 alone); nothing is invented."""
        verdict = super().verdict_from_synthesis(synthesis)
        verdict.pop("evidence_claims", None)  # answer mode's artifacts carry no claim ids
        verdict["final_answer"] = str(synthesis.get("final_answer") or "").strip() or "(no answer)"
        return verdict


@hookimpl
def register_strategies(register: Any) -> None:
    register("answer", AnswerStrategy)
