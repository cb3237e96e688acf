"""Verification questions: 7 universal ones, 2 per strategy, and the opt-in high-stakes one.

A question with a ``checker`` is answered by deterministic code over the artifact's structure (U1–U5). The rest
need judgement (U6, U7, a strategy's own two, HS1): the round-2 judge answers them for every round-1 position
inside its synthesis artifact (``verification``), so they cost no extra call. Round-3 replies get the checkers.

A result is ``{question_id, passed, reason, by}``: ``by`` is ``checker`` or ``judge``; ``passed`` is None when the
judge left a question unanswered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from conclave.quality.claims import claims_of

Checker = Callable[[Mapping[str, Any]], tuple[bool, str]]


@dataclass(frozen=True)
class Question:
    id: str
    category: str  # universal | mode-specific | high-stakes
    question: str
    checker: Checker | None = None


def _position(artifact: Mapping[str, Any]) -> tuple[bool, str]:
    for key in ("position", "revised_position", "refined_position"):
        if str(artifact.get(key) or "").strip():
            return True, f"{key} states it"
    return False, "no position stated"


def _facts_cited(artifact: Mapping[str, Any]) -> tuple[bool, str]:
    claims, _, _ = claims_of(artifact)
    if not claims:
        return False, "no labelled claims"
    facts = [c for c in claims if c.get("label") == "FACT"]
    uncited = [str(c.get("id")) for c in facts if not c.get("citations")]
    if uncited:
        return False, f"{len(uncited)} of {len(facts)} FACT claim(s) cite nothing: {', '.join(uncited)}"
    return True, f"all {len(facts)} FACT claim(s) cited"


def _alternatives(artifact: Mapping[str, Any]) -> tuple[bool, str]:
    rejected = [a for a in artifact.get("alternatives") or [] if str(a.get("rejected_because") or "").strip()]
    return len(rejected) >= 2, f"{len(rejected)} alternative(s) with a rejection rationale (2 needed)"


def _failure_modes(artifact: Mapping[str, Any]) -> tuple[bool, str]:
    mitigated = [f for f in artifact.get("failure_modes") or [] if str(f.get("mitigation") or "").strip()]
    return len(mitigated) >= 3, f"{len(mitigated)} failure mode(s) with a mitigation (3 needed)"


def _uncertainties(artifact: Mapping[str, Any]) -> tuple[bool, str]:
    stated = [u for u in artifact.get("uncertainties") or [] if str(u).strip()]
    return bool(stated), f"{len(stated)} uncertainty(ies) stated"


UNIVERSAL: tuple[Question, ...] = (
    Question("U1", "universal", "Core position stated explicitly?", _position),
    Question("U2", "universal", "All [FACT] claims cited?", _facts_cited),
    Question("U3", "universal", ">=2 alternatives considered with rejection rationale?", _alternatives),
    Question("U4", "universal", "Top 3 failure modes + mitigations identified?", _failure_modes),
    Question("U5", "universal", "What remains uncertain explicitly stated?", _uncertainties),
    Question("U6", "universal", "No internal contradictions?"),
    Question("U7", "universal", "Avoids harmful guidance?"),
)

HIGH_STAKES = Question(
    "HS1", "high-stakes", "Safety controls defined? (scope boundaries, approval gates, abort mechanisms)")

HIGH_STAKES_CATEGORIES = ("security", "medical-legal", "agentic", "safety-critical")


def questions_for(mode_specific: Sequence[Question], high_stakes: str | None,
                  not_applicable: Iterable[str] = ()) -> list[Question]:
    """The questions a consultation asks: the universal ones (less those the strategy declares not applicable),
    the strategy's own, HS1 when opted in."""
    skipped = set(not_applicable)
    unknown = skipped - {q.id for q in UNIVERSAL}
    if unknown:
        raise ValueError(f"not universal verification questions: {', '.join(sorted(unknown))}")
    return [*(q for q in UNIVERSAL if q.id not in skipped), *mode_specific, *([HIGH_STAKES] if high_stakes else [])]


def judged(questions: Iterable[Question]) -> list[Question]:
    """The questions the judge answers (no deterministic checker)."""
    return [q for q in questions if q.checker is None]


def run_checkers(artifact: Mapping[str, Any], questions: Iterable[Question]) -> list[dict[str, Any]]:
    """The deterministic questions' results for one artifact."""
    out = []
    for q in questions:
        if q.checker is not None:
            passed, reason = q.checker(artifact)
            out.append({"question_id": q.id, "passed": passed, "reason": reason, "by": "checker"})
    return out


def judge_results(answers: Iterable[Mapping[str, Any]], agent: str, questions: Iterable[Question]
                  ) -> list[dict[str, Any]]:
    """The judge's answers for ``agent`` to the judged questions; an unanswered one is recorded as such."""
    mine = {str(a.get("question_id")): a for a in answers if a.get("agent") == agent}
    out: list[dict[str, Any]] = []
    for q in judged(questions):
        answer = mine.get(q.id)
        if answer is None:
            out.append({"question_id": q.id, "passed": None, "reason": "the judge did not answer", "by": "judge"})
        else:
            out.append({"question_id": q.id, "passed": bool(answer.get("passed")),
                        "reason": str(answer.get("reason") or ""), "by": "judge"})
    return out


def prompt_list(questions: Iterable[Question], *, category_note: str = "") -> str:
    """The judged questions as a list for the judge's prompt."""
    lines = [f"- {q.id}: {q.question}" for q in judged(questions)]
    return "\n".join(lines) + (f"\n{category_note}" if category_note else "")
