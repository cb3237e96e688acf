"""Model prices from the price sheets provider plugins register (``register_price_sheets``: one YAML file per
provider, package data of the plugin — the built-in ones in ``conclave_plugins/pricing/``) and the cost of real
usage.

Prices are USD per million tokens. ``Usage.input_tokens`` includes cached input and cache writes; the cached part
is billed at ``cached_input`` (or the input price when a provider gives no discount), the written part at
``cache_write_input`` (or the input price: OpenAI's automatic cache writes cost nothing extra). An unknown model
costs ``None``: unknown, never a silent 0.

A model's entry may say ``vision: true``: it takes image input (``context=[diagram.png]`` is sent to it; other
models get a notice instead).

A model's entry may also give its context limits, as the provider documents them (:class:`ContextLimits`):
``context_window``, the tokens one call holds, prompt and answer together, and ``max_input_tokens``, a separate
limit on the prompt alone (gpt-5: a 400,000-token window of which at most 272,000 prompt; Gemini: 1,048,576 input
tokens, its answer limited apart). A model with neither is not checked (its provider rejects what does not fit).
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conclave.plugin_manager import Plugins, get_plugins
from conclave.yamlload import load_packaged

if TYPE_CHECKING:
    from conclave.providers.base import Usage

MILLION = 1_000_000

# Dated snapshots (claude-haiku-4-5-20251001, gpt-4o-2024-08-06) cost what their alias costs.
_SNAPSHOT = re.compile(r"-(\d{8}|\d{4}-\d{2}-\d{2})$")


@dataclass(frozen=True)
class ModelPrice:
    input: float
    output: float
    cached_input: float | None = None
    cache_write_input: float | None = None

    def scaled(self, factor: float) -> ModelPrice:
        """Every price of this model times ``factor`` (a batch API's discount)."""
        return ModelPrice(self.input * factor, self.output * factor,
                          None if self.cached_input is None else self.cached_input * factor,
                          None if self.cache_write_input is None else self.cache_write_input * factor)

    def cost(self, usage: Usage) -> float:
        cached = min(usage.cached_input_tokens, usage.input_tokens)
        written = min(usage.cache_write_tokens, usage.input_tokens - cached)
        cached_price = self.input if self.cached_input is None else self.cached_input
        write_price = self.input if self.cache_write_input is None else self.cache_write_input
        return ((usage.input_tokens - cached - written) * self.input + cached * cached_price
                + written * write_price + usage.output_tokens * self.output) / MILLION


@dataclass(frozen=True)
class ContextLimits:
    """What one call to a model can hold. ``window``: prompt and answer together (the provider refuses a request
    whose prompt plus its answer cap exceeds it); ``max_input``: the prompt alone. ``answer_shrinks``: the
    endpoint shortens the answer to the room the prompt leaves (llama.cpp), so only the prompt must fit."""

    window: int | None = None
    max_input: int | None = None
    answer_shrinks: bool = False

    def prompt_room(self, answer_cap: int) -> int | None:
        """The largest prompt (tokens) a call with answer cap ``answer_cap`` may send; None when unlimited."""
        rooms = []
        if self.window is not None:
            rooms.append(self.window - (1 if self.answer_shrinks else answer_cap))
        if self.max_input is not None:
            rooms.append(self.max_input)
        return min(rooms) if rooms else None

    def describe(self) -> str:
        """The limits in words, for a message: ``a context window of 128,000 tokens``."""
        parts = []
        if self.window is not None:
            parts.append(f"a context window of {self.window:,} tokens")
        if self.max_input is not None:
            parts.append(f"at most {self.max_input:,} prompt tokens")
        return " and ".join(parts) or "no known limit"


@dataclass(frozen=True)
class PriceSheet:
    """One provider's prices, with when and where they were taken."""

    provider: str
    taken: dt.date | None
    source: str | None
    models: Mapping[str, ModelPrice]
    #: the price of any model the sheet does not list (e.g. ``local``: every GGUF runs on your own hardware)
    default: ModelPrice | None = None
    #: each listed model's context limits, when the sheet gives them
    limits: Mapping[str, ContextLimits] = field(default_factory=dict)
    #: the listed models that take image input (``vision: true``)
    vision: frozenset[str] = frozenset()
    #: what the provider's batch API bills, as a share of every interactive price (None: no batch API priced)
    batch: float | None = None


class PriceTable:
    """Every provider's sheet; look a price up by provider name(s) and model."""

    def __init__(self, sheets: Iterable[PriceSheet]) -> None:
        self.sheets = {sheet.provider: sheet for sheet in sheets}

    @classmethod
    def load(cls) -> PriceTable:
        """The sheets the loaded plugins registered (loaded once per process)."""
        return _packaged_table(get_plugins())

    def price(self, providers: str | Iterable[str], model: str, *, batch: bool = False) -> ModelPrice | None:
        """The price of ``model`` in the first of ``providers`` that lists it (exact id, then its alias); with
        ``batch``, its batch API's price (None when that sheet prices no batch API)."""
        names = [providers] if isinstance(providers, str) else list(providers)
        model = model.removeprefix("models/")
        alias = _SNAPSHOT.sub("", model)
        for name in names:
            sheet = self.sheets.get(name)
            if sheet is None:
                continue
            found = sheet.models.get(model) or sheet.models.get(alias) or sheet.default
            if found is not None and batch:
                return None if sheet.batch is None else found.scaled(sheet.batch)
            if found is not None:
                return found
        return None

    def cost(self, providers: str | Iterable[str], model: str, usage: Usage, *, batch: bool = False
             ) -> float | None:
        price = self.price(providers, model, batch=batch)
        return None if price is None else price.cost(usage)

    def context_limits(self, providers: str | Iterable[str], model: str) -> ContextLimits | None:
        """``model``'s context limits from the first of ``providers`` whose sheet gives them (exact id, then its
        alias); None when no sheet does (a model without a figure is not checked)."""
        names = [providers] if isinstance(providers, str) else list(providers)
        model = model.removeprefix("models/")
        alias = _SNAPSHOT.sub("", model)
        for name in names:
            sheet = self.sheets.get(name)
            if sheet is not None:
                found = sheet.limits.get(model) or sheet.limits.get(alias)
                if found is not None:
                    return found
        return None

    def accepts_images(self, providers: str | Iterable[str], model: str) -> bool:
        """Whether the first of ``providers`` whose sheet lists ``model`` (exact id, then its alias) marks it
        ``vision: true``; False for a model no sheet lists."""
        names = [providers] if isinstance(providers, str) else list(providers)
        model = model.removeprefix("models/")
        alias = _SNAPSHOT.sub("", model)
        for name in names:
            sheet = self.sheets.get(name)
            if sheet is not None and (model in sheet.models or alias in sheet.models):
                return model in sheet.vision or alias in sheet.vision
        return False

    def models_with_limits(self, provider: str) -> list[tuple[str, ContextLimits, ModelPrice]]:
        """Every model of ``provider``'s sheet with context limits: (model, limits, price)."""
        sheet = self.sheets.get(provider)
        if sheet is None:
            return []
        return [(model, limits, sheet.models[model]) for model, limits in sheet.limits.items()]


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
        unknown = set(entry) - _ENTRY_KEYS
        if unknown:
            raise ValueError(f"unknown field {sorted(unknown)[0]!r}; allowed: {', '.join(sorted(_ENTRY_KEYS))}")
        return ModelPrice(
            input=float(entry["input"]),
            output=float(entry["output"]),
            cached_input=None if entry.get("cached_input") is None else float(entry["cached_input"]),
            cache_write_input=(None if entry.get("cache_write_input") is None
                               else float(entry["cache_write_input"])),
        )

    def tokens(model: str, entry: Mapping[str, Any], key: str) -> int | None:
        value = entry.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{model}: {key} must be a positive whole number of tokens, got {value!r}")
        return value

    def context_limits(model: str, entry: Mapping[str, Any]) -> ContextLimits | None:
        window, max_input = tokens(model, entry, "context_window"), tokens(model, entry, "max_input_tokens")
        if window is not None and max_input is not None and max_input > window:
            raise ValueError(f"{model}: max_input_tokens {max_input} is over its context_window {window}")
        return None if window is None and max_input is None else ContextLimits(window, max_input)

    try:
        entries = dict(data.get("models") or {})
        models = {str(model): model_price(entry) for model, entry in entries.items()}
        limits = {str(model): found for model, entry in entries.items()
                  if (found := context_limits(str(model), entry)) is not None}
        vision = frozenset(str(model) for model, entry in entries.items() if _vision(str(model), entry))
        taken = data.get("taken")
        default = data.get("default")
        return PriceSheet(
            provider=str(data["provider"]),
            taken=taken if isinstance(taken, dt.date) else None,
            source=data.get("source"),
            models=models,
            default=None if default is None else model_price(default),
            limits=limits,
            vision=vision,
            batch=_share(data.get("batch")),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"{origin}: malformed price sheet ({type(exc).__name__}: {exc})") from exc


def _share(value: Any) -> float | None:
    """A sheet's ``batch`` share of the interactive price: a number in (0, 1], or absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"batch must be a share of the interactive price in (0, 1], got {value!r}")
    return float(value)


#: the fields a model's entry may have: its prices, its context limits and whether it takes images
_ENTRY_KEYS = frozenset({"input", "output", "cached_input", "cache_write_input", "context_window",
                         "max_input_tokens", "vision"})


def _vision(model: str, entry: Mapping[str, Any]) -> bool:
    value = entry.get("vision", False)
    if not isinstance(value, bool):
        raise ValueError(f"{model}: vision must be true or false, got {value!r}")
    return value


@functools.cache
def _packaged_table(plugins: Plugins) -> PriceTable:
    """The sheets ``plugins`` register (keyed by them: a narrower CONCLAVE_PLUGINS asked for once never stands for
    the full set later)."""
    registered = plugins.registries["price_sheets"]
    sheets = []
    for provider, path in registered.items():
        origin = f"pricing/{provider}.yaml of plugin {registered.owner(provider)!r}"
        entry = Path(path) if isinstance(path, str) else path  # a path, or an importlib.resources file
        sheet = parse_sheet(load_packaged(entry) or {}, origin)
        if sheet.provider != provider:
            raise ValueError(f"{origin}: the sheet prices provider {sheet.provider!r}, registered as {provider!r}")
        sheets.append(sheet)
    return PriceTable(sheets)
