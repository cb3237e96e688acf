"""Every hook a conclave plugin may implement.

Hooks follow the register-callback style: conclave calls each hook with a ``register`` callable and the plugin
calls it once per thing it contributes. Names are global: registering a name another plugin already registered
is an error that names both plugins. All hooks are synchronous; the objects they register do their I/O in
async methods.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

PROJECT = "conclave"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

Register = Callable[..., None]


@hookspec
def register_providers(register: Register) -> None:
    """Register provider classes: ``register("openai", OpenAIProvider)``.

    Called once when the plugin manager is built. A provider class implements
    :class:`conclave.providers.base.Provider`; ``providers.<name>.api`` in the config selects it.
    """


@hookspec
def register_strategies(register: Register) -> None:
    """Register debate strategies: ``register("converge", ConvergeStrategy)``.

    ``mode.strategy`` in the config selects one (``conclave mode=<file>`` picks the mode file that names it).
    """


@hookspec
def register_filters(register: Register) -> None:
    """Register artifact filters: ``register("top_n", TopNArtifactFilter)``; ``filtering.filter`` selects one."""


@hookspec
def register_aggregators(register: Register) -> None:
    """Register aggregators: ``register("plurality", Plurality())``; ``aggregator`` in the config selects one.

    An aggregator turns the round-1 answers into one and says how strongly the panel agrees on it
    (:class:`conclave.engine.aggregation.Aggregator`); the vote gate after round 1 and ``conclave eval`` use it.
    """


@hookspec
def register_event_subscribers(register: Register) -> None:
    """Register event subscriber factories: ``register("my-sink", factory)``.

    Each factory is called once per consultation with the typed settings and returns a callable that receives
    every event of that consultation (or ``None`` to opt out).
    """


@hookspec
def register_config_paths(register: Register) -> None:
    """Register Hydra config search paths: ``register("pkg://my_plugin.conf")``.

    The package behind a ``pkg://`` path needs an ``__init__.py``. Files there join conclave's config groups,
    e.g. ``mode/mymode.yaml`` makes ``conclave mode=mymode`` work.
    """


@hookspec
def register_schemas(register: Register) -> None:
    """Register the JSON Schemas of a plugin's own artifacts: ``register("verdict_explore", schema)``, e.g. every
    file of a package with :func:`conclave.artifacts.schema_registry.schemas_in`. A round type names one as its
    ``schema``; it is validated, sent as structured output and listed by ``conclave schemas`` like a core schema."""


@hookspec
def register_schema_dialects(register: Register) -> None:
    """Register a provider's schema dialect: ``register("openai-strict", to_dialect)``, a function from an artifact
    schema to the variant the provider's structured output accepts (``conclave schemas show NAME --dialect D``)."""


@hookspec
def register_price_sheets(register: Register) -> None:
    """Register the price sheet of each provider a plugin prices: ``register("openai", path)``, the path (or
    :mod:`importlib.resources` file) of a YAML sheet whose ``provider:`` is that name. Costs, estimates and context
    limits read every registered sheet (:mod:`conclave.providers.pricing`)."""


def all_hook_names() -> list[str]:
    """The names of every hook above, in declaration order."""
    return [name for name, obj in globals().items() if name.startswith("register_") and callable(obj)]


__all__ = ["PROJECT", "Register", "all_hook_names", "hookimpl", "hookspec"]
_ = Any
