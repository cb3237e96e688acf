"""The plugin manager: entry-point group ``conclave`` (built-ins included) and the registries the hooks fill.

``CONCLAVE_PLUGINS`` restricts loading to a comma-separated list of entry-point names (empty: load none).
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pluggy

from conclave import hookspecs
from conclave.errors import PluginError

ENTRY_POINT_GROUP = "conclave"
ENV_ALLOW = "CONCLAVE_PLUGINS"

#: registry kind -> hook that fills it
REGISTRY_HOOKS = {
    "providers": "register_providers",
    "strategies": "register_strategies",
    "filters": "register_filters",
    "aggregators": "register_aggregators",
    "event_subscribers": "register_event_subscribers",
    "config_paths": "register_config_paths",
    "schemas": "register_schemas",
    "schema_dialects": "register_schema_dialects",
    "price_sheets": "register_price_sheets",
}


@dataclass
class PluginInfo:
    """What ``conclave plugins`` shows for one plugin."""

    name: str
    version: str | None
    distribution: str | None
    hooks: list[str]
    registered: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "distribution": self.distribution,
            "hooks": self.hooks,
            "registered": {k: v for k, v in self.registered.items() if v},
        }


class Registry:
    """Name → object for one kind of contribution, remembering which plugin registered each name."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, Any] = {}
        self._owners: dict[str, str] = {}

    def add(self, name: str, obj: Any, owner: str) -> None:
        if not isinstance(name, str) or not name:
            raise PluginError(f"plugin {owner!r} registered a {self.kind[:-1]} with an invalid name {name!r}")
        if name in self._items:
            raise PluginError(
                f"{self.kind[:-1]} name {name!r} is registered by both plugin {self._owners[name]!r} "
                f"and plugin {owner!r}; uninstall one or restrict {ENV_ALLOW}"
            )
        self._items[name] = obj
        self._owners[name] = owner

    def get(self, name: str) -> Any:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(name) from None

    def owner(self, name: str) -> str:
        return self._owners[name]

    def names(self) -> list[str]:
        return sorted(self._items)

    def items(self) -> Iterable[tuple[str, Any]]:
        return sorted(self._items.items())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __len__(self) -> int:
        return len(self._items)


class Plugins:
    """A loaded plugin manager plus the filled registries."""

    def __init__(self, pm: pluggy.PluginManager, dists: dict[str, DistInfo] | None = None) -> None:
        self.pm = pm
        self.dists = dists or {}
        self.registries = {kind: Registry(kind) for kind in REGISTRY_HOOKS}
        self._fill()

    @property
    def providers(self) -> Registry:
        return self.registries["providers"]

    @property
    def strategies(self) -> Registry:
        return self.registries["strategies"]

    @property
    def filters(self) -> Registry:
        return self.registries["filters"]

    @property
    def aggregators(self) -> Registry:
        return self.registries["aggregators"]

    @property
    def event_subscribers(self) -> Registry:
        return self.registries["event_subscribers"]

    @property
    def schemas(self) -> Registry:
        return self.registries["schemas"]

    @property
    def schema_dialects(self) -> Registry:
        return self.registries["schema_dialects"]

    def key_variables(self) -> list[str]:
        """Every environment variable a loaded provider plugin reads keys from (``Provider.KEY_VARIABLES``)."""
        return list(dict.fromkeys(v for _, cls in self.providers.items() for v in getattr(cls, "KEY_VARIABLES", ())))

    @property
    def config_paths(self) -> list[str]:
        return [path for path, _ in self.registries["config_paths"].items()]

    def _fill(self) -> None:
        # Each plugin's implementation is called through pluggy (so its tracing and hook-call monitoring see it),
        # one plugin at a time, so a clash or a failure can name the plugin that caused it.
        for kind, hook_name in REGISTRY_HOOKS.items():
            registry = self.registries[kind]
            caller = getattr(self.pm.hook, hook_name)
            impls = caller.get_hookimpls()  # registration order (pluggy calls them LIFO)
            for impl in impls:
                owner = impl.plugin_name

                def register(name: str, obj: Any = True, *, _owner: str = owner, _reg: Registry = registry) -> None:
                    _reg.add(name, obj, _owner)

                others = [other.plugin for other in impls if other.plugin is not impl.plugin]
                only_this = self.pm.subset_hook_caller(hook_name, remove_plugins=others)
                try:
                    only_this(register=register)
                except PluginError:
                    raise
                except Exception as exc:
                    raise PluginError(f"plugin {owner!r} failed in its {hook_name} hook: "
                                      f"{type(exc).__name__}: {exc}") from exc

    def info(self) -> list[PluginInfo]:
        infos = []
        for name, plugin in sorted(self.pm.list_name_plugin(), key=lambda np: np[0]):
            if plugin is None:
                continue
            hooks = sorted(h.name for h in self.pm.get_hookcallers(plugin) or [])
            dist = self.dists.get(name)
            registered = {
                kind: sorted(n for n, _ in reg.items() if reg.owner(n) == name) for kind, reg in self.registries.items()
            }
            infos.append(
                PluginInfo(
                    name=name,
                    version=dist.version if dist is not None else None,
                    distribution=dist.name if dist is not None else None,
                    hooks=hooks,
                    registered=registered,
                )
            )
        return infos


def _allowed_names() -> set[str] | None:
    raw = os.environ.get(ENV_ALLOW)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


@dataclass(frozen=True)
class DistInfo:
    """The distribution that installed a plugin."""

    name: str
    version: str | None


def build_plugin_manager(
    extra_plugins: Iterable[tuple[str, object]] = (),
) -> tuple[pluggy.PluginManager, dict[str, DistInfo]]:
    """A fresh manager with conclave's hookspecs, entry-point plugins (``CONCLAVE_PLUGINS`` blocks every other
    entry-point name) and any ``extra_plugins`` given as ``(name, module_or_object)`` pairs (tests use these)."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    allowed = _allowed_names()
    if allowed is not None:
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name not in allowed:
                pm.set_blocked(ep.name)
    try:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    except Exception as exc:  # a broken third-party plugin must say who it is
        failed = _first_unloaded(pm)
        who = f"plugin {failed.name!r} ({failed.value})" if failed is not None else "a plugin"
        raise PluginError(f"{who} failed to load: {exc}") from exc
    dists = {name: DistInfo(dist.project_name, dist.version)
             for plugin, dist in pm.list_plugin_distinfo() if (name := pm.get_name(plugin)) is not None}
    for name, plugin in extra_plugins:
        pm.register(plugin, name=name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        raise PluginError(f"plugin {name!r} implements an unknown hook: {exc}") from exc
    return pm, dists


def _first_unloaded(pm: pluggy.PluginManager) -> importlib.metadata.EntryPoint | None:
    """The entry point ``load_setuptools_entrypoints`` stopped at: the first of the group, in the order it reads
    them, that is neither registered nor blocked."""
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP and pm.get_plugin(ep.name) is None and not pm.is_blocked(ep.name):
                return ep
    return None


def get_plugins() -> Plugins:
    """The process-wide plugins (entry points), loaded once for each value of ``CONCLAVE_PLUGINS``: whoever asks
    first, every caller sees the plugins that setting allows."""
    return _plugins_allowed(os.environ.get(ENV_ALLOW))


@functools.cache
def _plugins_allowed(allow: str | None) -> Plugins:
    # ``allow`` only keys the cache: build_plugin_manager reads the same variable
    return Plugins(*build_plugin_manager())


def load_plugins(extra_plugins: Iterable[tuple[str, object]] = ()) -> Plugins:
    """A fresh, uncached set of plugins: entry points plus ``extra_plugins``."""
    return Plugins(*build_plugin_manager(extra_plugins))


Factory = Callable[..., Any]
