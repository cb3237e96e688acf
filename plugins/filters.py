"""Built-in artifact filters: ``top_n`` keeps the highest-ranked items of each limited array.

Rankings (ties keep their original order):

- synthesis.consensus_points: confidence, highest first
- synthesis.tensions: number of viewpoints (more viewpoints = more disagreement), most first
- cross_exam.challenges: severity = 2 × evidence items + 5 per severity keyword in the challenge + length / 100
- cross_exam_reply.challenges (an agent's reply, converge and answer modes): the same severity
- cross_exam.rebuttals: substantiveness = length / 10 + 3 per substantive keyword in the rebuttal
- synthesis.priority_order and cross_exam.unresolved are always passed whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from conclave.artifacts.artifact_filter import ArtifactFilter, stable_rank
from conclave.hookspecs import hookimpl

SEVERITY_KEYWORDS = (
    "critical", "severe", "major", "fatal", "incorrect", "flawed", "broken", "wrong", "dangerous", "serious",
)
SUBSTANTIVE_KEYWORDS = (
    "because", "evidence", "data", "research", "proven", "demonstrates", "shows", "indicates", "suggests", "confirms",
)


def _keyword_hits(text: str, keywords: Sequence[str]) -> int:
    """How many of ``keywords`` occur in ``text`` (substring match, case-insensitive, each counted once)."""
    lowered = text.lower()
    return sum(1 for keyword in keywords if keyword in lowered)


def severity_score(challenge: Mapping[str, Any]) -> float:
    text = challenge.get("challenge", "")
    return 2 * len(challenge.get("evidence", [])) + 5 * _keyword_hits(text, SEVERITY_KEYWORDS) + len(text) / 100


def substantiveness_score(rebuttal: Mapping[str, Any]) -> float:
    text = rebuttal.get("rebuttal", "")
    return len(text) / 10 + 3 * _keyword_hits(text, SUBSTANTIVE_KEYWORDS)


class TopNArtifactFilter(ArtifactFilter):
    """Keeps the top N items of each limited array of a synthesis or cross-examination artifact."""

    filterable: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "synthesis": ("consensus_points", "tensions"),
        "cross_exam": ("challenges", "rebuttals"),
        "cross_exam_reply": ("challenges",),
        "cross_exam_reply_answer": ("challenges",),
    }
    keep_whole: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "synthesis": ("priority_order",),
        "cross_exam": ("unresolved",),
    }

    def rank(self, artifact_type: str, field: str, items: Sequence[Any]) -> list[int]:
        if field == "consensus_points":
            return stable_rank(float(item["confidence"]) for item in items)
        if field == "tensions":
            return stable_rank(len(item["viewpoints"]) for item in items)
        if field == "challenges":
            return stable_rank(severity_score(item) for item in items)
        if field == "rebuttals":
            return stable_rank(substantiveness_score(item) for item in items)
        raise ValueError(f"top_n cannot rank {artifact_type}.{field}")


@hookimpl
def register_filters(register: Any) -> None:
    register("top_n", TopNArtifactFilter)
