"""Artifact filtering: what later rounds see of earlier artifacts, and how much that saves.

A filter only drops array items, ranked by a documented score; it never invents or rewrites content. That
contract lives in :class:`ArtifactFilter`: a subclass only *ranks* items (returns indices), and the base class
copies the kept items and leaves every other field untouched. The engine re-validates the result against the
schema (:func:`conclave.engine.filtering.checked_filter`), so this module, which filter plugins import at
registration, imports no schema validator.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar

#: printed when ``filtering.enabled=false`` turns filtering off
FILTERING_OFF_NOTICE = "🔍 Filtering off: using full debate artifacts (higher token cost)"

FILTERING_METHOD = "structured_artifact_array_truncation"


class ArtifactFilter(ABC):
    """Base class of registered filters (``register("top_n", TopNArtifactFilter)``).

    Subclasses declare which array fields they may shorten per artifact type (``filterable``) and rank a
    field's items in :meth:`rank`; :meth:`filter` does the rest.
    """

    #: artifact_type -> the array fields this filter may shorten
    filterable: ClassVar[Mapping[str, tuple[str, ...]]] = {}
    #: artifact_type -> array fields always passed whole (a limit on one of them is an error)
    keep_whole: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    @abstractmethod
    def rank(self, artifact_type: str, field: str, items: Sequence[Any]) -> Sequence[int]:
        """Indices of ``items``, most important first (every index once)."""

    def filter(self, artifact: Mapping[str, Any], limits: Mapping[str, int]) -> dict[str, Any]:
        """A new artifact whose ``limits`` fields keep only their top-N items, in rank order.

        Raises ``ValueError`` for a limit naming a field the artifact lacks or this filter may not shorten.
        :func:`conclave.engine.filtering.checked_filter` calls this and checks the result against its schema.
        """
        artifact_type = artifact.get("artifact_type")
        if not isinstance(artifact_type, str):
            raise ValueError("filter: the artifact has no artifact_type")
        filtered = copy.deepcopy(dict(artifact))
        for field, limit in limits.items():
            self._check_limit(artifact, artifact_type, field, limit)
            items = artifact[field]
            order = list(self.rank(artifact_type, field, items))
            if sorted(order) != list(range(len(items))):
                raise ValueError(f"{type(self).__name__}.rank({field}) must return each index of the items once")
            filtered[field] = [copy.deepcopy(items[i]) for i in order[:limit]]
        return filtered

    def _check_limit(self, artifact: Mapping[str, Any], artifact_type: str, field: str, limit: int) -> None:
        if field not in artifact:
            raise ValueError(f"filter limit {field!r}: {artifact_type} artifacts have no field {field!r}")
        if field in self.keep_whole.get(artifact_type, ()):
            raise ValueError(f"filter limit {field!r}: {artifact_type}.{field} is always kept whole")
        if field not in self.filterable.get(artifact_type, ()):
            allowed = ", ".join(self.filterable.get(artifact_type, ())) or "none"
            raise ValueError(f"filter limit {field!r}: not filterable in {artifact_type} artifacts; allowed: {allowed}")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"filter limit {field!r}: must be a non-negative integer, got {limit!r}")


def stable_rank(scores: Iterable[float]) -> list[int]:
    """Indices ordered by score, highest first; equal scores keep their original order."""
    scored = list(scores)
    return sorted(range(len(scored)), key=lambda i: -scored[i])  # sorted() is stable


def limits_for(artifact: Mapping[str, Any], limits: Mapping[str, int]) -> dict[str, int]:
    """The subset of a round's limits that names fields of ``artifact``.

    ``filtering.round4`` covers both the synthesis and the cross-examination; each artifact gets its share.
    """
    return {field: n for field, n in limits.items() if field in artifact}


def token_efficiency_stats(tokens_before: int, tokens_after: int, filtered_rounds: Iterable[int]) -> dict[str, Any]:
    """The ``token_efficiency_stats`` record: ``tokens_after`` input tokens were sent in the filtered rounds
    where ``tokens_before`` would have been sent without filtering.

    efficiency_percentage = saved / (used + saved) × 100, one decimal: the share of those rounds' input that
    filtering removed. Reordering kept items can make the filtered text a token longer than the original;
    savings are then reported as 0, never negative.
    """
    if tokens_before < 0 or tokens_after < 0:
        raise ValueError("token counts must be non-negative")
    saved = max(0, tokens_before - tokens_after)
    total = tokens_after + saved
    return {
        "tokens_used": tokens_after,
        "tokens_saved_via_filtering": saved,
        "efficiency_percentage": round(saved / total * 100, 1) if total else 0.0,
        "filtering_method": FILTERING_METHOD,
        "filtered_rounds": sorted(set(filtered_rounds)),
    }


__all__ = [
    "FILTERING_METHOD",
    "FILTERING_OFF_NOTICE",
    "ArtifactFilter",
    "limits_for",
    "stable_rank",
    "token_efficiency_stats",
]
