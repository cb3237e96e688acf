"""Model prices from ``conclave/data/pricing/*.yaml`` (one file per provider; package data, not a Hydra config
group) and the cost of real usage.

Prices are USD per million tokens. ``Usage.input_tokens`` includes cached input and cache writes; the cached part
is billed at ``cached_input`` (or the input price when a provider gives no discount), the written part at
``cache_write_input`` (or the input price: OpenAI's automatic cache writes cost nothing extra). An unknown model
costs ``None``: unknown, never a silent 0.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any

from conclave.providers.base import Usage
from conclave.yamlload import load_packaged

PACKAGE = "conclave"
DATA_DIR = "data"
MILLION = 1_000_000

# Dated snapshots (claude-haiku-4-5-20251001, gpt-4o-2024-08-06) cost what their alias costs.
_SNAPSHOT = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")


@dataclass(frozen=True)
class ModelPrice:
    input: float
    output: float
    cached_input: float | None = None
    cache_write_input: float | None = None

    def cost(self, usage: Usage) -> float:
        cached = min(usage.cached_input_tokens, usage.input_tokens)
        written = min(usage.cache_write_tokens, usage.input_tokens - cached)
        cached_price = self.input if self.cached_input is None else self.cached_input
        write_price = self.input if self.cache_write_input is None else self.cache_write_input
        return ((usage.input_tokens - cached - written) * self.input + cached * cached_price
                + written * write_price + usage.output_tokens * self.output) / MILLION


@dataclass(frozen=True)
class PriceSheet:
    """One provider's prices, with when and where they were taken."""

    provider: str
    taken: dt.date | None
    source: str | None
    models: Mapping[str, ModelPrice]
    #: the price of any model the sheet does not list (e.g. ``local``: every GGUF runs on your own hardware)
    default: ModelPrice | None = None


class PriceTable:
    """Every provider's sheet; look a price up by provider name(s) and model."""

    def __init__(self, sheets: Iterable[PriceSheet]) -> None:
        self.sheets = {sheet.provider: sheet for sheet in sheets}

    @classmethod
    def load(cls) -> PriceTable:
        """The sheets shipped in ``conclave/data/pricing`` (loaded once per process)."""
        return _packaged_table()

    def price(self, providers: str | Iterable[str], model: str) -> ModelPrice | None:
        """The price of ``model`` in the first of ``providers`` that lists it (exact id, then its alias)."""
        names = [providers] if isinstance(providers, str) else list(providers)
        model = model.removeprefix("models/")
        alias = _SNAPSHOT.sub("", model)
        for name in names:
            sheet = self.sheets.get(name)
            if sheet is None:
                continue
            found = sheet.models.get(model) or sheet.models.get(alias) or sheet.default
            if found is not None:
                return found
        return None

    def cost(self, providers: str | Iterable[str], model: str, usage: Usage) -> float | None:
        price = self.price(providers, model)
        return None if price is None else price.cost(usage)


def same_model(requested: str, reported: str) -> bool:
    """Whether a provider's reported model id names the model that was requested: the same id, ``models/`` prefixed,
    or a dated snapshot of it (``gpt-4o`` → ``gpt-4o-2024-08-06``). Never a prefix or substring match:
    ``gpt-4o-mini`` is not ``gpt-4o``."""
    reported = reported.removeprefix("models/")
    requested = requested.removeprefix("models/")
    return reported == requested or _SNAPSHOT.sub("", reported) == requested


def parse_sheet(data: Mapping[str, Any], origin: str) -> PriceSheet:
    """Validate one pricing YAML document; a malformed file is a packaging bug, reported with its name."""
    def model_price(entry: Mapping[str, Any]) -> ModelPrice:
        return ModelPrice(
            input=float(entry["input"]),
            output=float(entry["output"]),
            cached_input=None if entry.get("cached_input") is None else float(entry["cached_input"]),
            cache_write_input=(None if entry.get("cache_write_input") is None
                               else float(entry["cache_write_input"])),
        )

    try:
        models = {str(model): model_price(entry) for model, entry in (data.get("models") or {}).items()}
        taken = data.get("taken")
        default = data.get("default")
        return PriceSheet(
            provider=str(data["provider"]),
            taken=taken if isinstance(taken, dt.date) else None,
            source=data.get("source"),
            models=models,
            default=None if default is None else model_price(default),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{origin}: malformed price sheet ({type(exc).__name__}: {exc})") from exc


@functools.cache
def _packaged_table() -> PriceTable:
    folder = resources.files(PACKAGE).joinpath(DATA_DIR, "pricing")
    sheets = [
        parse_sheet(load_packaged(entry) or {}, f"pricing/{entry.name}")
        for entry in sorted(folder.iterdir(), key=lambda e: e.name)
        if entry.name.endswith(".yaml")
    ]
    return PriceTable(sheets)
