"""Artifact schemas: loading, validation, and recovering a JSON object from a model's text answer.

``schemas/*.schema.json`` (shipped as the package ``conclave.schemas``) are the single source of truth,
and this module is the only validator the code uses. jsonschema and referencing are imported on first
use, so ``import conclave`` stays fast.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import TYPE_CHECKING, Any

import json_repair
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from conclave.errors import ConclaveError, PluginError
from conclave.plugin_manager import get_plugins

if TYPE_CHECKING:
    from jsonschema.protocols import Validator
    from referencing import Registry
    from referencing._core import Resolver

SCHEMA_PACKAGE = "conclave.schemas"
_SUFFIX = ".schema.json"
_Path = tuple[str | int, ...]

__all__ = [
    "ArtifactError",
    "ArtifactParseError",
    "ArtifactValidationError",
    "check",
    "current_version",
    "drop_null_optionals",
    "extract_json",
    "fill_added_lists",
    "get_schema",
    "now_iso",
    "schema_names",
    "upgrade",
    "validate",
]


@dataclass(frozen=True)
class ArtifactError:
    """One validation failure: where (a JSON path like ``$.tensions[0]``), why, and which keyword failed."""

    path: str
    message: str
    validator: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class ArtifactValidationError(ConclaveError):
    """An artifact does not match its schema; ``errors`` holds every failure, sorted by path."""

    def __init__(self, name: str, errors: Sequence[ArtifactError]) -> None:
        self.name = name
        self.errors = list(errors)
        count = f"{len(self.errors)} error" + ("" if len(self.errors) == 1 else "s")
        super().__init__("\n".join([f"invalid {name} artifact ({count}):", *(f"  {e}" for e in self.errors)]))


class ArtifactParseError(ConclaveError):
    """No JSON object could be recovered from a model's answer; ``text`` keeps the raw answer."""

    def __init__(self, message: str, text: str) -> None:
        self.text = text
        super().__init__(message)


def schemas_in(package: str) -> dict[str, dict[str, Any]]:
    """Every ``<name>.schema.json`` shipped in ``package``, by name: what a plugin's ``register_schemas`` registers."""
    found: dict[str, dict[str, Any]] = {}
    for entry in resources.files(package).iterdir():
        if entry.name.endswith(_SUFFIX):
            found[entry.name.removesuffix(_SUFFIX)] = json.loads(entry.read_text(encoding="utf-8"))
    return found


@functools.cache
def _schemas() -> dict[str, dict[str, Any]]:
    """The core schemas (``schemas/``) and every schema a loaded plugin registered."""
    found = schemas_in(SCHEMA_PACKAGE)
    registered = get_plugins().schemas
    for name, schema in registered.items():
        if name in found:
            raise PluginError(f"plugin {registered.owner(name)!r} registered schema {name!r}, a core schema's name")
        found[name] = schema
    return dict(sorted(found.items()))


def schema_names() -> list[str]:
    """Names of the shipped schemas (file stem without ``.schema``), sorted."""
    return list(_schemas())


def _schema(name: str) -> dict[str, Any]:
    try:
        return _schemas()[name]
    except KeyError:
        raise KeyError(f"unknown schema {name!r}; allowed: {', '.join(schema_names())}") from None


def get_schema(name: str) -> dict[str, Any]:
    """A copy of schema ``name``; raises ``KeyError`` naming the allowed names for an unknown one."""
    return copy.deepcopy(_schema(name))


@functools.cache
def declared_properties(name: str) -> frozenset[str]:
    """The top-level properties schema ``name`` declares (``KeyError`` for an unknown name, as :func:`get_schema`)."""
    return frozenset(_schema(name).get("properties", {}))


@functools.cache
def _registry() -> Registry[Any]:
    # Every file is registered under its $id, so relative $refs between files resolve without any retrieval.
    return Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in _schemas().values())


@functools.cache
def _validator(name: str) -> Validator:
    # Validated against the schema with every $ref inlined: the same keywords at the same instance paths (so the
    # same errors), without resolving a reference through the registry at every node of every artifact.
    return Draft202012Validator(
        _inlined(name), registry=_registry(), format_checker=Draft202012Validator.FORMAT_CHECKER
    )


@functools.cache
def _inlined(name: str) -> dict[str, Any]:
    """Schema ``name`` with every ``$ref`` replaced by what it points to; the schema itself when it is recursive.

    A ``$ref`` alone becomes the referenced schema; a ``$ref`` beside other keywords becomes ``allOf: [target]``
    beside them (both apply in 2020-12, and ``allOf`` reports its subschema's errors unchanged, as ``$ref``
    does).
    """
    schema = _schema(name)
    try:
        inlined = _inline(schema, resolver_for(schema), ())
    except RecursionError:
        return schema
    if "$ref" in json.dumps({k: v for k, v in inlined.items() if k != "$defs"}):
        return schema  # a $ref under a keyword taken as data: the registry resolves them all, as before
    return dict(inlined)


def _inline(node: Any, resolver: Resolver[Any], seen: tuple[int, ...]) -> Any:
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
    if name not in _schemas():
        return artifact
    ordered = _ordered(artifact, _inlined(name))
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


def validate(name: str, instance: Any) -> list[ArtifactError]:
    """Every way ``instance`` fails schema ``name``, sorted by path; empty when it is valid."""
    keyed = [
        (_path_key(e.absolute_path), ArtifactError(e.json_path, e.message, str(e.validator)))
        for e in _validator(name).iter_errors(instance)
    ]
    # JSON Schema cannot reject NaN or Infinity (NaN even passes minimum/maximum), and they are not JSON.
    keyed += [(_path_key(parts), error) for parts, error in _non_finite_numbers(instance, ())]
    keyed.sort(key=lambda k: (k[0], k[1].validator, k[1].message))
    return [error for _, error in keyed]


def prepare_checks(names: Iterable[str]) -> None:
    """Build what validating, filling and reading answers of schemas ``names`` needs (validators, reference
    lookups), so the first answer of each is checked as fast as the later ones. Unknown names are skipped."""
    for name in names:
        if name not in _schemas():
            continue
        _validator(name)
        plan = _fill_plan(name)
        if plan is not None:
            plan.expand()
        _inlined_resolver(name)
        validate(name, {})  # the validator's own lazily built parts (format checkers, keyword functions)


def check(name: str, instance: Any) -> None:
    """Raise ``ArtifactValidationError`` listing every failure unless ``instance`` matches schema ``name``."""
    errors = validate(name, instance)
    if errors:
        raise ArtifactValidationError(name, errors)


def current_version() -> str:
    """The artifact format version: the one place it is defined is ``common.schema.json``'s ``schema_version``."""
    return str(_schema("common")["$defs"]["schema_version"]["const"])


#: older format versions a stored artifact may carry; :func:`upgrade` reads each as the current version
READABLE_VERSIONS = ("1.0",)
#: the lists 1.1 made required (claims and references of agents' artifacts, the synthesis' coverage and claim ids,
#: the verdicts' evidence_claims); an absent one means "none named"
ADDED_LISTS = frozenset({"claims", "references", "claim_ids", "partial_coverage", "unique_insights", "blind_spots",
                         "evidence_claims"})
#: schemas that gained :data:`ADDED_LISTS` while the format was already 1.1: answer mode joined the quality layer
#: later, so its artifacts journaled at 1.1 before that carry none of those lists and read the way 1.0 ones do
LATE_1_1 = frozenset({"independent_answer", "synthesis_answer", "cross_exam_reply_answer", "verdict_answer"})


def upgrade(name: str, artifact: dict[str, Any]) -> dict[str, Any]:
    """A stored artifact of schema ``name`` as the current format version (the input is not modified).

    Between 1.0 and 1.1 only lists became required (:data:`ADDED_LISTS`), so a 1.0 artifact reads as a 1.1 one
    with each of them empty where absent — the same meaning it had; so does a 1.1 artifact of a schema that gained
    those lists later (:data:`LATE_1_1`). A header-less artifact (a round-3 reply carries no version) gets the same
    treatment whatever its age. Any other artifact of the current or an unknown version, or of an unknown schema,
    is returned as is.
    """
    schema = _schemas().get(name)
    if schema is None:
        return artifact
    if "schema_version" not in schema.get("properties", {}):  # a header-less artifact (a reply): any version
        return fill_added_lists(name, artifact)
    if artifact.get("schema_version") not in READABLE_VERSIONS and not (
            name in LATE_1_1 and artifact.get("schema_version") == "1.1"):
        return artifact
    upgraded = fill_added_lists(name, artifact)
    upgraded["schema_version"] = current_version()
    return upgraded


def fill_added_lists(name: str, instance: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``instance`` with every absent required list of :data:`ADDED_LISTS` set to ``[]``, at any depth.

    Used on stored 1.0 artifacts and on answers: a model that leaves out ``claims`` named no claims, which is not
    worth a paid re-ask. Every other missing field still fails validation."""
    plan = _fill_plan(name)
    if plan is None:
        return instance
    filled: dict[str, Any] = _fill_lists(copy.deepcopy(instance), plan)
    return filled


class _FillPlan:
    """What :func:`fill_added_lists` does at one schema node, with its ``$ref`` followed once: the lists to add
    (``lists``) and the plans of its properties and items, each made the first time an artifact reaches it
    (every answer is filled, so no reference is looked up twice)."""

    __slots__ = ("_children", "_item", "_items", "_props", "_resolver", "lists")

    def __init__(self, node: dict[str, Any], resolver: Resolver[Any]) -> None:
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


@functools.cache
def _fill_plan(name: str) -> _FillPlan | None:
    schema = _schemas().get(name)
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


def _path_key(parts: Iterable[str | int]) -> tuple[tuple[int, int, str], ...]:
    # Tag indices and keys so [2] sorts before [10] and an int is never compared with a str.
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, str(p)) for p in parts)


def _json_path(parts: Iterable[str | int]) -> str:
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)


def _non_finite_numbers(value: Any, parts: _Path) -> Iterator[tuple[_Path, ArtifactError]]:
    if isinstance(value, float) and not math.isfinite(value):
        yield parts, ArtifactError(_json_path(parts), f"{value!r} is not a finite number", "finite")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _non_finite_numbers(item, (*parts, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _non_finite_numbers(item, (*parts, index))


def drop_null_optionals(schema: dict[str, Any], instance: Any) -> Any:
    """A copy of ``instance`` without ``null`` in optional properties: strict structured output (a provider's
    schema dialect) answers an absent optional with ``null``, never a valid value in an artifact.

    Only properties ``schema`` does not require are dropped: a ``null`` in a required one still fails.
    """
    name = _names_by_id().get(schema.get("$id", ""))
    if name is not None and schema == _schema(name):  # a shipped schema: walk its inlined form, no lookups
        return _drop_nulls(instance, _inlined(name), _inlined_resolver(name))
    return _drop_nulls(instance, schema, resolver_for(schema))


@functools.cache
def _names_by_id() -> dict[str, str]:
    return {s["$id"]: name for name, s in _schemas().items() if "$id" in s}


@functools.cache
def _inlined_resolver(name: str) -> Resolver[Any]:
    return resolver_for(_schema(name))


def resolver_for(schema: dict[str, Any]) -> Resolver[Any]:
    """A resolver for the ``$ref`` s in ``schema``: relative to its ``$id``, the shipped schemas registered."""
    uri = schema.get("$id", "urn:conclave:schema")
    resource = Resource.from_contents(schema, default_specification=DRAFT202012)
    return _registry().with_resource(uri, resource).resolver(base_uri=uri)


def deref(node: dict[str, Any], resolver: Resolver[Any]) -> tuple[dict[str, Any], Resolver[Any]]:
    """Follow ``$ref`` until ``node`` has none; keywords beside a ``$ref`` override the referenced ones."""
    while "$ref" in node:
        resolved = resolver.lookup(node["$ref"])
        node = {**resolved.contents, **{k: v for k, v in node.items() if k != "$ref"}}
        resolver = resolved.resolver
    return node, resolver


def _drop_nulls(value: Any, node: dict[str, Any], resolver: Resolver[Any]) -> Any:
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
_FENCE = re.compile(r"```[ \t]*(?P<lang>[\w.+-]*)[^\n]*\n(?P<body>.*?)\n[ \t]*```", re.DOTALL)
_JSON_LANGS = frozenset({"", "json", "json5", "jsonc"})
# Where a JSON object plausibly starts: a brace followed by a quoted key or the closing brace.
_OBJECT_START = re.compile(r"\{\s*[\"'}]")
# strict=False keeps raw control characters inside strings (a common model slip) instead of failing on them.
_DECODER = json.JSONDecoder(strict=False)


def extract_json(text: str) -> dict[str, Any]:
    """The JSON object in a model's text answer, for providers without native structured output.

    Tries each ```json (or unlabelled) fenced block, then the whole text; in each, the first outermost
    ``{...}`` that ``json.loads`` accepts, else what ``json_repair`` recovers from it. Repair fixes syntax
    only and never adds keys. Raises ``ArtifactParseError`` when no object can be recovered.
    """
    if not text.strip():
        raise ArtifactParseError("the answer is empty", text)
    fences = [m["body"] for m in _FENCE.finditer(text) if m["lang"].lower() in _JSON_LANGS]
    for region in [*fences, text]:
        found = _first_object(region)
        if found is None:
            found = _repaired_object(region)
        if found is not None:
            return found
    raise ArtifactParseError("no JSON object could be recovered from the answer", text)


def _first_object(region: str) -> dict[str, Any] | None:
    """The first top-level ``{...}`` in ``region`` that parses as strict JSON."""
    start = region.find("{")
    while start != -1:
        try:
            value, _ = _DECODER.raw_decode(region, start)
        except ValueError:
            # Skip past this brace group: an object nested in a broken one is a fragment, not the answer.
            end = _closing_brace(region, start)
            if end is None:
                return None
            start = region.find("{", end + 1)
            continue
        return value if isinstance(value, dict) else None
    return None


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the ``}`` matching the ``{`` at ``start`` (strings skipped), or None if unbalanced."""
    depth, in_string, escaped = 0, False, False
    for index in range(start, len(text)):
        char = text[index]
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def _repaired_object(region: str) -> dict[str, Any] | None:
    """What ``json_repair`` recovers from the first object-like ``{`` onwards, if it is an object."""
    match = _OBJECT_START.search(region)
    start = match.start() if match else region.find("{")
    if start == -1:
        return None

    try:
        value = json_repair.loads(region[start:], skip_json_loads=True)
    except Exception:  # the repairer is best-effort; any failure means "nothing recovered"
        return None
    # Trailing prose with braces makes the repairer return a list; its first item is the object found.
    if isinstance(value, list) and value:
        value = value[0]
    return value if isinstance(value, dict) else None


def now_iso() -> str:
    """The current UTC time in RFC 3339 with milliseconds and ``Z``, e.g. ``2025-12-28T14:00:00.000Z``."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
