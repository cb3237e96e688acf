"""The substitution tiers from ``conclave/data/tiers.yaml``: which (provider, model) pairs may stand in for a model.

The file is data shipped in the package, not a Hydra config group: it is not composed, overridden or listed in
``conclave --help``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from conclave.yamlload import load_packaged

PACKAGE = "conclave"
DATA_DIR = "data"
_SNAPSHOT = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")


@dataclass(frozen=True)
class Tier:
    name: str
    models: tuple[tuple[str, str], ...]  # (provider, model), in preference order


class Tiers:
    """Tier 1 (premium) first. Backups come from a model's own tier, then lower ones; unknown models start at 1."""

    def __init__(self, tiers: Sequence[Tier]) -> None:
        self.tiers = tuple(tiers)

    @classmethod
    def load(cls) -> Tiers:
        """The tiers shipped as ``conclave/data/tiers.yaml`` (loaded once per process)."""
        return _packaged_tiers()

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], origin: str = "tiers") -> Tiers:
        try:
            return cls([
                Tier(str(t["name"]), tuple((str(m["provider"]), str(m["model"])) for m in t["models"]))
                for t in data["tiers"]
            ])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{origin}: malformed tier list ({type(exc).__name__}: {exc})") from exc

    def tier_of(self, model: str) -> int | None:
        """Index of the first tier listing ``model`` (or its undated alias); None when no tier does."""
        alias = _SNAPSHOT.sub("", model)
        for index, tier in enumerate(self.tiers):
            if any(m in (model, alias) for _, m in tier.models):
                return index
        return None

    def candidates(self, model: str) -> Iterator[tuple[int, tuple[str, str]]]:
        """``(tier index, (provider, model))`` from ``model``'s own tier downwards, excluding ``model`` itself."""
        start = self.tier_of(model) or 0
        for index in range(start, len(self.tiers)):
            for pair in self.tiers[index].models:
                if pair[1] != model:
                    yield index, pair


@functools.cache
def _packaged_tiers() -> Tiers:
    return Tiers.from_mapping(load_packaged(resources.files(PACKAGE).joinpath(DATA_DIR, "tiers.yaml")) or {},
                              "tiers.yaml")
