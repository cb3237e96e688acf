"""Early termination after the synthesis: when to offer it, the rubber-stamp guard, and the decision.

Offered only when the strategy allows it, rounds after 2 are planned, the mean consensus confidence reaches
``early_termination.threshold``, and the panel is not a rubber stamp. With ``quality.stage=on`` the groupthink
detectors decide that (:mod:`conclave.quality.objection`): after a firing or an escalation nothing is offered.
Otherwise (``shadow``, detectors off) the rubber-stamp rule does: every round-1 confidence above 0.85 and a
synthesis without tensions is agreement too easy to trust without cross-examination.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.config.settings import Settings
from conclave.engine.interaction import Interaction
from conclave.engine.strategy import Strategy, consensus_confidence

REASON_ACCEPTED = "high_confidence_after_synthesis"
RUBBER_STAMP_CONFIDENCE = 0.85


def is_rubber_stamp(round_1: Mapping[str, Mapping[str, Any]], synthesis: Mapping[str, Any]) -> bool:
    confidences = [float(a.get("confidence", 0)) for a in round_1.values()]
    return (
        len(confidences) >= 2
        and all(c > RUBBER_STAMP_CONFIDENCE for c in confidences)
        and not synthesis.get("tensions")
    )


def decide_early_termination(
    *,
    strategy: Strategy,
    settings: Settings,
    round_1: Mapping[str, Mapping[str, Any]],
    synthesis: Mapping[str, Any],
    interaction: Interaction,
    cost_saved: float | None,
    groupthink: bool | None = None,
) -> dict[str, Any]:
    """The ``early_termination:decided`` payload (also the result's ``early_termination``).

    ``groupthink``: the groupthink detectors' say (``quality.stage=on``): True — they fired or an objection round
    escalated, so a strong consensus is not trusted to skip cross-examination; False — they found nothing. None
    (shadow stage, detectors off): the rubber-stamp rule decides instead."""
    threshold = settings.early_termination.threshold
    confidence = round(consensus_confidence(synthesis), 4)
    skipped = settings.planned_rounds - 2
    decision: dict[str, Any] = {
        "offered": False,
        "accepted": False,
        "reason": "",
        "confidence": confidence,
        "threshold": threshold,
        "rounds_skipped": 0,
        "estimated_cost_saved": None,
    }
    if not strategy.allows_early_termination:
        return {**decision, "reason": "strategy_runs_all_rounds", "notice": strategy.all_rounds_notice}
    if confidence < threshold:
        return {**decision, "reason": "below_threshold"}
    if groupthink:
        return {**decision, "reason": "groupthink_detected"}
    if groupthink is None and is_rubber_stamp(round_1, synthesis):
        return {**decision, "reason": "rubber_stamp_guard"}
    decision["offered"] = True
    if interaction.interactive:
        rounds = "Rounds 3-4" if skipped == 2 else "Round 3"
        answer = interaction.ask(
            f"Strong consensus reached (confidence {confidence:.0%}). Terminate early and skip {rounds}? [Y/n]"
        )
        accepted = answer.strip().lower()[:1] in ("", "y")
        declined_reason = "declined_by_user"
    else:
        accepted = settings.early_termination.non_interactive == "accept"
        declined_reason = "declined_non_interactive"
    if not accepted:
        return {**decision, "reason": declined_reason}
    return {
        **decision,
        "accepted": True,
        "reason": REASON_ACCEPTED,
        "rounds_skipped": skipped,
        "estimated_cost_saved": cost_saved,
    }
