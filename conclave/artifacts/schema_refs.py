"""Artifact schemas as data: loading them (core and plugin-registered), following their ``$ref`` s, and the
edits made from a schema alone (absent lists filled, ``null`` optionals dropped, keys in declared order).

Nothing here validates: that is :mod:`conclave.artifacts.schema_registry`, which imports jsonschema and
json_repair. Plugins import what they need at registration from this module, so registering them (``--help``,
``conclave plugins``) loads neither.
"""

from __future__ import annotations

import copy
import functools
import json
from importlib import resources
from typing import Any, Protocol

from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from conclave.errors import PluginError
from conclave.plugin_manager import Plugins, get_plugins

__all__ = [
    "ADDED_LISTS",
    "SCHEMA_PACKAGE",
    "all_schemas",
    "declared_properties",
    "deref",
    "drop_null_optionals",
    "fill_added_lists",
    "fill_plan",
    "get_schema",
    "in_schema_order",
    "inlined",
    "inlined_resolver",
    "known_schema",
    "registry",
    "resolver_for",
    "schema_names",
    "schemas_in",
]


class Resolved(Protocol):
    """What a resolver's lookup answers: the schema a ``$ref`` names, and a resolver relative to that schema."""

    @property
    def contents(self) -> Any: ...

    @property
    def resolver(self) -> Resolver: ...


class Resolver(Protocol):
    """The part of ``referencing``'s resolver (what ``Registry.resolver`` returns) used here; the package exports
    no public name for that type."""

    def lookup(self, ref: str) -> Resolved: ...


SCHEMA_PACKAGE = "conclave.schemas"
_SUFFIX = ".schema.json"


def schemas_in(package: str) -> dict[str, dict[str, Any]]:
    """Every ``<name>.schema.json`` shipped in ``package``, by name: what a plugin's ``register_schemas`` registers."""
    found: dict[str, dict[str, Any]] = {}
    for entry in resources.files(package).iterdir():
        if entry.name.endswith(_SUFFIX):
            found[entry.name.removesuffix(_SUFFIX)] = json.loads(entry.read_text(encoding="utf-8"))
    return found


def all_schemas() -> dict[str, dict[str, Any]]:
    """The core schemas (``schemas/``) and every schema a loaded plugin registered."""
    return _schemas_of(get_plugins())


# The caches built from the loaded plugins are keyed by them: the process-wide plugins are loaded once for each value
# of CONCLAVE_PLUGINS, so a narrower set asked for once (a test, a restricted run) never stands for the full one later.
@functools.cache
def _schemas_of(plugins: Plugins) -> dict[str, dict[str, Any]]:
    found = schemas_in(SCHEMA_PACKAGE)
    registered = plugins.schemas
    for name, schema in registered.items():
        if name in found:
            raise PluginError(f"plugin {registered.owner(name)!r} registered schema {name!r}, a core schema's name")
        found[name] = schema
    return dict(sorted(found.items()))


def schema_names() -> list[str]:
    """Names of the shipped schemas (file stem without ``.schema``), sorted."""
    return list(all_schemas())


def known_schema(name: str) -> dict[str, Any]:
    try:
        return all_schemas()[name]
    except KeyError:
        raise KeyError(f"unknown schema {name!r}; allowed: {', '.join(schema_names())}") from None


def get_schema(name: str) -> dict[str, Any]:
    """A copy of schema ``name``; raises ``KeyError`` naming the allowed names for an unknown one."""
    return copy.deepcopy(known_schema(name))


@functools.cache
def declared_properties(name: str) -> frozenset[str]:
    """The top-level properties schema ``name`` declares (``KeyError`` for an unknown name, as :func:`get_schema`)."""
    return frozenset(known_schema(name).get("properties", {}))


def registry() -> Registry[Any]:
    return _registry_of(get_plugins())


@functools.cache
def _registry_of(plugins: Plugins) -> Registry[Any]:
    # Every file is registered under its $id, so relative $refs between files resolve without any retrieval.
    return Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in _schemas_of(plugins).values())




@functools.cache
def inlined(name: str) -> dict[str, Any]:
    """Schema ``name`` with every ``$ref`` replaced by what it points to; the schema itself when it is recursive.

    A ``$ref`` alone becomes the referenced schema; a ``$ref`` beside other keywords becomes ``allOf: [target]``
    beside them (both apply in 2020-12, and ``allOf`` reports its subschema's errors unchanged, as ``$ref``
    does).
    """
    schema = known_schema(name)
    try:
        inlined = _inline(schema, resolver_for(schema), ())
    except RecursionError:
        return schema
    if "$ref" in json.dumps({k: v for k, v in inlined.items() if k != "$defs"}):
        return schema  # a $ref under a keyword taken as data: the registry resolves them all, as before
    return dict(inlined)


def _inline(node: Any, resolver: Resolver, seen: tuple[int, ...]) -> Any:
    if isinstance(node, list):
        return [_inline(item, resolver, seen) for item in node]
    if not isinstance(node, dict):
        return node
    if isinstance(node.get("$ref"), str):
        ref = node["$ref"]
        resolved = resolver.lookup(ref)
        key = id(resolved.contents)
        if key in seen:
            raise RecursionError(ref)
        target = _inline(resolved.contents, resolved.resolver, (*seen, key))
        if isinstance(target, dict):
            target = {k: v for k, v in target.items() if k not in ("$id", "$schema", "$defs")}
        rest = {k: _inline(v, resolver, seen) for k, v in node.items() if k != "$ref"}
        return {"allOf": [target], **rest} if rest else target
    return {k: v if k in ("$defs", "const", "enum", "default", "examples") else _inline(v, resolver, seen)
            for k, v in node.items()}


def in_schema_order(name: str, artifact: dict[str, Any]) -> dict[str, Any]:
    """``artifact`` with its keys, nested ones too, in the order schema ``name`` declares them (undeclared keys
    after, as they came). Prompts show artifacts in this one order, whether a model just wrote them or the journal
    (which stores sorted keys) gave them back: a resumed run and ``show-prompt --from`` send the same bytes."""
    if name not in all_schemas():
        return artifact
    ordered = _ordered(artifact, inlined(name))
    assert isinstance(ordered, dict)
    return ordered


def _ordered(value: Any, node: Any) -> Any:
    if not isinstance(node, dict):
        return value
    for branch in (*node.get("allOf", ()), *node.get("anyOf", ()), *node.get("oneOf", ())):
        if isinstance(branch, dict) and ("properties" in branch if isinstance(value, dict) else "items" in branch):
            value = _ordered(value, branch)
    if isinstance(value, list):
        return [_ordered(item, node.get("items")) for item in value]
    if not isinstance(value, dict) or not isinstance(node.get("properties"), dict):
        return value
    declared = node["properties"]
    first = [k for k in declared if k in value]
    return {**{k: _ordered(value[k], declared[k]) for k in first},
            **{k: v for k, v in value.items() if k not in declared}}




#: the lists 1.1 made required (claims and references of agents' artifacts, the synthesis' coverage and claim ids,
#: the verdicts' evidence_claims); an absent one means "none named"
ADDED_LISTS = frozenset({"claims", "references", "claim_ids", "partial_coverage", "unique_insights", "blind_spots",
                         "evidence_claims"})


def fill_added_lists(name: str, instance: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``instance`` with every absent required list of :data:`ADDED_LISTS` set to ``[]``, at any depth.

    Used on stored 1.0 artifacts and on answers: a model that leaves out ``claims`` named no claims, which is not
    worth a paid re-ask. Every other missing field still fails validation."""
    plan = fill_plan(name)
    if plan is None:
        return instance
    filled: dict[str, Any] = _fill_lists(copy.deepcopy(instance), plan)
    return filled


class _FillPlan:
    """What :func:`fill_added_lists` does at one schema node, with its ``$ref`` followed once: the lists to add
    (``lists``) and the plans of its properties and items, each made the first time an artifact reaches it
    (every answer is filled, so no reference is looked up twice)."""

    __slots__ = ("_children", "_item", "_items", "_props", "_resolver", "lists")

    def __init__(self, node: dict[str, Any], resolver: Resolver) -> None:
        node, self._resolver = deref(node, resolver)
        props = node.get("properties")
        self._props: dict[str, Any] | None = props if isinstance(props, dict) else None
        self.lists: tuple[str, ...] = tuple(
            key for key in node.get("required", ()) if key in ADDED_LISTS and key in (self._props or {})
        )
        items = node.get("items")
        self._items: dict[str, Any] | None = items if isinstance(items, dict) else None
        self._children: dict[str, _FillPlan] = {}
        self._item: _FillPlan | None = None

    @property
    def has_properties(self) -> bool:
        return self._props is not None

    @property
    def has_items(self) -> bool:
        return self._items is not None

    def child(self, key: str) -> _FillPlan | None:
        if self._props is None or key not in self._props:
            return None
        plan = self._children.get(key)
        if plan is None:
            plan = self._children[key] = _FillPlan(self._props[key], self._resolver)
        return plan

    def item(self) -> _FillPlan:
        assert self._items is not None
        if self._item is None:
            self._item = _FillPlan(self._items, self._resolver)
        return self._item

    def expand(self, depth: int = 8) -> None:
        """Make the plans of every property and item down to ``depth`` levels (a recursive schema stops there)."""
        if depth <= 0:
            return
        for key in self._props or {}:
            child = self.child(key)
            if child is not None:
                child.expand(depth - 1)
        if self._items is not None:
            self.item().expand(depth - 1)


def fill_plan(name: str) -> _FillPlan | None:
    return _fill_plan_of(name, get_plugins())


@functools.cache
def _fill_plan_of(name: str, plugins: Plugins) -> _FillPlan | None:
    schema = _schemas_of(plugins).get(name)
    return None if schema is None else _FillPlan(schema, resolver_for(schema))


def _fill_lists(value: Any, plan: _FillPlan) -> Any:
    if isinstance(value, dict) and plan.has_properties:
        for key in plan.lists:
            if key not in value:
                value[key] = []
        for key, item in value.items():
            child = plan.child(key)
            if child is not None:
                value[key] = _fill_lists(item, child)
    elif isinstance(value, list) and plan.has_items:
        item_plan = plan.item()
        return [_fill_lists(item, item_plan) for item in value]
    return value




def drop_null_optionals(schema: dict[str, Any], instance: Any) -> Any:
    """A copy of ``instance`` without ``null`` in optional properties: strict structured output (a provider's
    schema dialect) answers an absent optional with ``null``, never a valid value in an artifact.

    Only properties ``schema`` does not require are dropped: a ``null`` in a required one still fails.
    """
    name = _names_by_id().get(schema.get("$id", ""))
    if name is not None and schema == known_schema(name):  # a shipped schema: walk its inlined form, no lookups
        return _drop_nulls(instance, inlined(name), inlined_resolver(name))
    return _drop_nulls(instance, schema, resolver_for(schema))


def _names_by_id() -> dict[str, str]:
    return _names_by_id_of(get_plugins())


@functools.cache
def _names_by_id_of(plugins: Plugins) -> dict[str, str]:
    return {s["$id"]: name for name, s in _schemas_of(plugins).items() if "$id" in s}


@functools.cache
def inlined_resolver(name: str) -> Resolver:
    return resolver_for(known_schema(name))


def resolver_for(schema: dict[str, Any]) -> Resolver:
    """A resolver for the ``$ref`` s in ``schema``: relative to its ``$id``, the shipped schemas registered."""
    uri = schema.get("$id", "urn:conclave:schema")
    resource = Resource.from_contents(schema, default_specification=DRAFT202012)
    return registry().with_resource(uri, resource).resolver(base_uri=uri)


def deref(node: dict[str, Any], resolver: Resolver) -> tuple[dict[str, Any], Resolver]:
    """Follow ``$ref`` until ``node`` has none; keywords beside a ``$ref`` override the referenced ones."""
    while "$ref" in node:
        resolved = resolver.lookup(node["$ref"])
        node = {**resolved.contents, **{k: v for k, v in node.items() if k != "$ref"}}
        resolver = resolved.resolver
    return node, resolver


def _drop_nulls(value: Any, node: dict[str, Any], resolver: Resolver) -> Any:
    node, resolver = deref(node, resolver)
    if isinstance(value, dict) and isinstance(node.get("properties"), dict):
        required, props = set(node.get("required", ())), node["properties"]
        return {
            key: _drop_nulls(item, props[key], resolver) if key in props else item
            for key, item in value.items()
            if not (item is None and key in props and key not in required)
        }
    if isinstance(value, list) and isinstance(node.get("items"), dict):
        return [_drop_nulls(item, node["items"], resolver) for item in value]
    return value


# A fenced block; the info string is captured so ```python blocks are not mistaken for the answer. The closing
# fence must start a line, so ``` inside a JSON string value does not end the block.
