"""Generate a small instance that is valid against a JSON Schema, so a fake model can answer any artifact schema.

Covers what artifact schemas use: ``type`` (also lists and Gemini's upper-case names), ``enum``, ``const``,
``required``/``properties``, ``minItems``/``maxItems``/``uniqueItems``/``prefixItems``, ``minimum``/``maximum``
(also exclusive), ``multipleOf``, ``minLength``/``maxLength``, common ``format`` values, ``allOf``/``anyOf``/
``oneOf`` and ``$ref`` into ``$defs``/``definitions`` of the same document. ``pattern`` is not solved.
Constraints a dialect moved into descriptions (:mod:`conclave.providers.schema_hints`) are honoured too, as a
model reading the schema would.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from conclave.providers.schema_hints import described_constraints

_FORMATS = {
    "date-time": "2026-01-01T00:00:00Z",
    "date": "2026-01-01",
    "time": "00:00:00Z",
    "email": "agent@example.com",
    "uri": "https://example.com/",
    "uri-reference": "https://example.com/",
    "uuid": "00000000-0000-4000-8000-000000000000",
    "hostname": "example.com",
    "ipv4": "192.0.2.1",
}
_MAX_DEPTH = 12


def instance_for(schema: Mapping[str, Any] | bool, *, root: Mapping[str, Any] | None = None) -> Any:
    """A value valid against ``schema``; ``root`` is the document ``$ref`` pointers resolve in (default: schema)."""
    if isinstance(schema, bool):
        return None
    return _Generator(root if root is not None else schema).value(schema, "value", 0)


class _Generator:
    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def resolve(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#"):
            raise ValueError(f"only local $ref pointers are supported, got {ref!r}")
        node: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def merged(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        """``schema`` with ``$ref`` and ``allOf`` folded in, and the first ``anyOf``/``oneOf`` branch chosen."""
        out: dict[str, Any] = {}
        if "$ref" in schema:
            out.update(self.merged(self.resolve(schema["$ref"])))
        for part in schema.get("allOf", []):
            for key, value in self.merged(part).items():
                _fold(out, key, value)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                branches = [b for b in schema[key] if not _is_null(b)] or schema[key]
                out.update(self.merged(branches[0]))
        for key, value in {**described_constraints(schema), **schema}.items():
            if key not in ("$ref", "allOf", "anyOf", "oneOf"):
                _fold(out, key, value)
        return out

    def value(self, schema: Mapping[str, Any] | bool, name: str, depth: int) -> Any:
        if isinstance(schema, bool):
            return f"sample {name}"
        schema = self.merged(schema)
        if "const" in schema:
            return schema["const"]
        if schema.get("enum"):
            return schema["enum"][0]
        kind = _type_of(schema)
        if kind == "object":
            return self.object(schema, depth)
        if kind == "array":
            return self.array(schema, name, depth)
        if kind in ("number", "integer"):
            return _number(schema, integer=kind == "integer")
        if kind == "boolean":
            return True
        if kind == "null":
            return None
        return _string(schema, name)

    def object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        properties: Mapping[str, Any] = schema.get("properties") or {}
        required = list(schema.get("required") or [])
        # Below the depth limit only required keys are filled, which ends recursive schemas.
        names = list(properties) if depth < _MAX_DEPTH else required
        names += [n for n in required if n not in names]
        out = {n: self.value(properties.get(n, {}), n, depth + 1) for n in names}
        want = int(schema.get("minProperties") or 0)
        extra = schema.get("additionalProperties", True)
        index = 0
        while len(out) < want and extra is not False:
            out[f"extra_{index}"] = self.value(extra if isinstance(extra, Mapping) else {}, "extra", depth + 1)
            index += 1
        return out

    def array(self, schema: Mapping[str, Any], name: str, depth: int) -> list[Any]:
        prefix = list(schema.get("prefixItems") or [])
        items = schema.get("items", {})
        low = int(schema.get("minItems") or 0)
        high = schema.get("maxItems")
        count = max(low, len(prefix), 1 if depth < _MAX_DEPTH else 0)
        if high is not None:
            count = min(count, int(high))
        out = []
        for index in range(count):
            item_schema = prefix[index] if index < len(prefix) else items
            value = self.value(item_schema, f"{name} {index + 1}", depth + 1)
            if schema.get("uniqueItems") and value in out:
                value = _distinct(value, index)
            out.append(value)
        return out


def _fold(out: dict[str, Any], key: str, value: Any) -> None:
    """Fold one keyword into a merged schema: properties add up, required names unite, anything else replaces."""
    if key == "properties":
        out.setdefault("properties", {}).update(value)
    elif key == "required":
        out["required"] = sorted(set(out.get("required", [])) | set(value))
    else:
        out[key] = value


def _is_null(schema: Any) -> bool:
    return isinstance(schema, Mapping) and schema.get("type") in ("null", "NULL")


def _type_of(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if str(k).lower() != "null"), kind[0] if kind else None)
    if kind is None:
        if "properties" in schema or "required" in schema:
            return "object"
        if "items" in schema or "prefixItems" in schema:
            return "array"
        return "string"
    return str(kind).lower()


def _number(schema: Mapping[str, Any], *, integer: bool) -> int | float:
    low = schema.get("minimum")
    high = schema.get("maximum")
    ex_low = schema.get("exclusiveMinimum")
    ex_high = schema.get("exclusiveMaximum")
    if isinstance(ex_low, bool):  # draft-04 boolean form
        ex_low, low = (low if ex_low else None), (None if ex_low else low)
    if isinstance(ex_high, bool):
        ex_high, high = (high if ex_high else None), (None if ex_high else high)
    lower = max((v for v in (low, ex_low) if v is not None), default=None)
    upper = min((v for v in (high, ex_high) if v is not None), default=None)
    # A value in the middle of the range satisfies exclusive bounds too (confidence in [0, 1] gives 0.5).
    if lower is not None and upper is not None:
        value: float = (lower + upper) / 2
    elif lower is not None:
        value = lower if ex_low is None or (low is not None and low > ex_low) else lower + 1
    elif upper is not None:
        value = upper if ex_high is None or (high is not None and high < ex_high) else upper - 1
    else:
        value = 1
    step = schema.get("multipleOf")
    if step:
        value = math.ceil(value / step) * step
        if upper is not None and value > upper:
            value -= step
    if integer:
        result = math.ceil(value) if lower is not None else math.floor(value)
        if ex_low is not None and result <= ex_low:
            result = math.floor(ex_low) + 1
        if ex_high is not None and result >= ex_high:
            result = math.ceil(ex_high) - 1
        return int(result)
    return float(value)


def _string(schema: Mapping[str, Any], name: str) -> str:
    fmt = schema.get("format")
    text = _FORMATS.get(fmt, f"sample {name}") if isinstance(fmt, str) else f"sample {name}"
    low = int(schema.get("minLength") or 0)
    high = schema.get("maxLength")
    if len(text) < low:
        text = text + "x" * (low - len(text))
    if high is not None and len(text) > int(high):
        text = text[: int(high)]
    return text


def _distinct(value: Any, index: int) -> Any:
    if isinstance(value, str):
        return f"{value} #{index + 1}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value + index
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, str):
                return {**value, key: f"{item} #{index + 1}"}
    return value
