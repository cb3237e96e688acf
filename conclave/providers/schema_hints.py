"""Keep a schema's validation constraints visible where a structured-output dialect cannot enforce them.

OpenAI's strict mode rejects keywords such as ``minItems`` or ``format``, so its schema variant drops them; the
answer is still validated against the full schema. Copying the constraints into each node's ``description``
(``… Constraints: {"minItems": 3}``) tells the model what the validator will demand, which spares re-asks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

MARKER = "Constraints: "

#: validation keywords some strict-mode models reject (enums, types and structure always survive)
CONSTRAINT_KEYWORDS = (
    "format", "pattern", "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties",
)


def describe_constraints(schema: Any) -> Any:
    """A copy of ``schema`` where every node carrying constraint keywords also states them in its description."""
    if isinstance(schema, list):
        return [describe_constraints(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: describe_constraints(value) for key, value in schema.items()}
    found = {key: schema[key] for key in CONSTRAINT_KEYWORDS if key in schema and not isinstance(schema[key], dict)}
    if found:
        text = MARKER + json.dumps(found, separators=(", ", ": "))
        description = schema.get("description")
        out["description"] = f"{description} {text}" if isinstance(description, str) and description else text
    return out


def described_constraints(node: Mapping[str, Any]) -> dict[str, Any]:
    """The constraints :func:`describe_constraints` wrote into ``node``'s description (empty when none)."""
    description = node.get("description")
    if not isinstance(description, str) or MARKER not in description:
        return {}
    try:
        found = json.loads(description.rsplit(MARKER, 1)[1])
    except ValueError:
        return {}
    return {k: v for k, v in found.items() if k in CONSTRAINT_KEYWORDS} if isinstance(found, dict) else {}


_SCHEMA_MAPS = ("properties", "$defs")  # keyword -> {name: schema}
_SCHEMA_LISTS = ("prefixItems", "anyOf", "oneOf")  # keyword -> [schema]
_SCHEMA_VALUES = ("items", "additionalProperties")  # keyword -> schema (or a boolean)


def restrict_keywords(schema: Any, allowed: frozenset[str]) -> Any:
    """A copy of ``schema`` using only ``allowed`` keywords (a provider's documented list, e.g. Gemini's).

    ``const`` becomes a one-value ``enum``; constraint keywords that are dropped (``pattern``, ``minLength``…) are
    stated in the node's description, as for OpenAI's strict variant; anything else outside the list (``$schema``,
    ``$comment``) is dropped. The answer is still validated against the full schema.
    """
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: restrict_keywords(sub, allowed) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            out[key] = [restrict_keywords(sub, allowed) for sub in value]
        elif key in _SCHEMA_VALUES:
            out[key] = restrict_keywords(value, allowed)
        elif key in allowed:
            out[key] = value
    if "const" in schema and "enum" not in out and "enum" in allowed:
        out["enum"] = [schema["const"]]
    dropped = {key: schema[key] for key in CONSTRAINT_KEYWORDS
               if key in schema and key not in allowed and not isinstance(schema[key], dict)}
    if dropped and "description" in allowed:
        text = MARKER + json.dumps(dropped, separators=(", ", ": "))
        description = out.get("description")
        out["description"] = f"{description} {text}" if isinstance(description, str) and description else text
    return out


def anchored_patterns_only(schema: Any) -> Any:
    """A copy of ``schema`` for grammar-constrained decoding: an unanchored ``pattern`` is stated in the description
    instead of sent.

    JSON Schema's ``pattern`` matches anywhere in the string (``"\\\\S"``: some non-space character), while the
    grammar converters of llama.cpp and llama-cpp-python read a pattern as the whole string and reject (or
    mistranslate) one without ``^…$``. Every other constraint is kept; the answer is validated against the full
    schema either way.
    """
    if isinstance(schema, list):
        return [anchored_patterns_only(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: (value if key in ("enum", "const", "required") else anchored_patterns_only(value))
           for key, value in schema.items()}
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and not (pattern.startswith("^") and pattern.endswith("$")):
        del out["pattern"]
        text = MARKER + json.dumps({"pattern": pattern}, separators=(", ", ": "))
        description = schema.get("description")
        out["description"] = f"{description} {text}" if isinstance(description, str) and description else text
    return out


#: how many steps a number bounded on both sides is cut into for a grammar (0, 0.05, …, 1 for a confidence): a
#: grammar checks every alternative for every candidate token, so a finer grid slows a server's sampling
GRID_STEPS = 20
#: the widest integer range listed value by value
MAX_INTEGER_CHOICES = 101


def bounded_numbers_as_choices(schema: Any, *, open_above: int | None = None) -> Any:
    """A copy of ``schema`` where every number or integer bounded on both sides is also an ``enum`` a grammar can
    enforce; with ``open_above``, every integer bounded below only too, as its first ``open_above`` values.

    The grammar converters of llama.cpp and llama-cpp-python ignore ``minimum``/``maximum`` on numbers (and
    llama-cpp-python on integers too), so a model under such a grammar may write ``"confidence": 50`` for a 0..1
    field, or ``"citations": [0]`` for reference numbers from 1 — valid JSON, rejected by validation, re-asked,
    rejected again. Listing the allowed values turns the bound into grammar: a number in [lo, hi] takes one of
    ``GRID_STEPS + 1`` evenly spaced values; an integer in [lo, hi] any of them (up to ``MAX_INTEGER_CHOICES``).
    The integers bounded below only are the artifacts' reference numbers and citations: where the grammar caps
    every list (at most :data:`CAPPED_MAX_ITEMS` references) the first ``open_above`` numbers are all an answer can
    use. Every listed value satisfies the original node, which keeps its bounds and which the answer is still
    validated against.
    """
    if isinstance(schema, list):
        return [bounded_numbers_as_choices(item, open_above=open_above) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out = {key: (value if key in ("enum", "const", "required")
                 else bounded_numbers_as_choices(value, open_above=open_above))
           for key, value in schema.items()}
    choices = _grid(schema, open_above)
    if choices is not None:
        out["enum"] = choices
    return out


def _bound(node: Mapping[str, Any], closed: str, open_: str) -> tuple[float | None, bool]:
    for key, is_open in ((closed, False), (open_, True)):
        value = node.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value, is_open
    return None, False


def _grid(node: Mapping[str, Any], open_above: int | None = None) -> list[int | float] | None:
    kind = node.get("type")
    if kind not in ("number", "integer") or "enum" in node or "const" in node:
        return None
    lo, lo_open = _bound(node, "minimum", "exclusiveMinimum")
    hi, hi_open = _bound(node, "maximum", "exclusiveMaximum")
    if kind == "integer" and lo is not None and hi is None and open_above:
        first = math.floor(lo) + 1 if lo_open else math.ceil(lo)
        return list(range(first, first + open_above))
    if lo is None or hi is None or hi <= lo:
        return None
    if kind == "integer":
        first, last = int(lo) + int(lo_open), int(hi) - int(hi_open)
        return list(range(first, last + 1)) if 0 <= last - first < MAX_INTEGER_CHOICES else None
    values = [round(lo + (hi - lo) * i / GRID_STEPS, 10) for i in range(GRID_STEPS + 1)]
    values = values[int(lo_open):len(values) - int(hi_open)]
    return [int(v) if float(v).is_integer() else v for v in values]


# Lengths for grammar-constrained decoding. These caps are the one place both the in-process ``local`` provider's
# grammar and the schema variant sent to grammar servers (llama.cpp, llama-cpp-python, vLLM, Ollama) take them from.
#: longest string value a grammar allows when the schema sets no ``maxLength``, in characters: a small model
#: rambles inside a string until a limit stops it
MAX_STRING_CHARS = 240
#: shortest string cap worth generating when the token budget is tight
MIN_STRING_CHARS = 16
#: items an array may hold when its schema sets no ``maxItems``: a small model adds items until a limit stops it
#: (a 270M judge once listed 36 tensions until the round's token budget ran out)
DEFAULT_MAX_ITEMS = 3
#: characters a server's token is assumed to carry at least on average when a grammar variant's lengths are fitted
#: to a call's ``max_tokens`` (English prose averages about four in Gemma's and Llama's vocabularies)
CHARS_PER_TOKEN = 3
#: items an array may hold by default (``providers.NAME.grammar_lengths: cap``): no list a capable model writes
#: for an artifact comes near it, and it ends the list a small model would loop in
CAPPED_MAX_ITEMS = 12
#: worst-case characters of a value the grammar writes without a free string (a number, a date-time, a pattern)
_SCALAR_CHARS = 32


def bounded_lengths(schema: Any, *, max_tokens: int) -> Any:
    """A copy of ``schema`` where every array without ``maxItems`` and every free string without ``maxLength`` gets
    one, chosen so that the longest answer the grammar allows fits in ``max_tokens``.

    A grammar that bounds nothing lets a small model loop inside an array or a string until the token budget cuts
    the answer, which then fails validation. Arrays are capped at ``DEFAULT_MAX_ITEMS`` (or their ``minItems``) and
    cut to fewer items before strings get shorter than ``MIN_STRING_CHARS``; strings share what the budget leaves,
    up to ``MAX_STRING_CHARS``. Strings with a ``format``, a ``pattern``, an ``enum`` or a ``const`` keep their own
    rules. Every bound keeps the node's own minimum, so each answer the variant allows is one the original accepts
    (the answer is still validated against the original).
    """
    room = slots = 0
    for items in range(DEFAULT_MAX_ITEMS, -1, -1):
        fixed, slots = _worst_case(schema, items)
        room = max_tokens * CHARS_PER_TOKEN - fixed
        if slots == 0 or room // slots >= MIN_STRING_CHARS:
            break
    chars = MAX_STRING_CHARS if slots == 0 else max(MIN_STRING_CHARS, min(MAX_STRING_CHARS, room // slots))
    return _with_lengths(schema, items, chars)


def _free_string(node: Mapping[str, Any]) -> bool:
    return (node.get("type") == "string" and not any(key in node for key in ("enum", "const", "format", "pattern")))


def _worst_case(node: Any, items: int) -> tuple[int, int]:
    """The longest answer ``node`` allows once bounded: (characters outside free strings, free strings)."""
    if not isinstance(node, Mapping):
        return 0, 0
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else list(node["enum"])
        return max((len(json.dumps(value)) for value in values), default=0), 0
    alternatives = node.get("anyOf") or node.get("oneOf")
    if isinstance(alternatives, list) and alternatives:
        cases = [_worst_case(sub, items) for sub in alternatives]
        return max(case[0] for case in cases), max(case[1] for case in cases)
    kind = node.get("type")
    if kind == "object" or "properties" in node:
        fixed, slots = 2, 0
        for name, sub in node.get("properties", {}).items():  # optional properties too: the grammar allows them
            sub_fixed, sub_slots = _worst_case(sub, items)
            fixed += len(json.dumps(name)) + 3 + sub_fixed  # "name": value, (and a space the grammar allows)
            slots += sub_slots
        return fixed, slots
    if kind == "array":
        count = _item_cap(node, items)
        sub_fixed, sub_slots = _worst_case(node.get("items", {}), items)
        return 2 + count * (sub_fixed + 2), count * sub_slots
    if kind == "string":
        if isinstance(node.get("maxLength"), int):
            return node["maxLength"] + 2, 0
        return (2, 1) if _free_string(node) else (_SCALAR_CHARS, 0)
    return _SCALAR_CHARS, 0


def _item_cap(node: Mapping[str, Any], items: int) -> int:
    cap = node.get("maxItems")
    return cap if isinstance(cap, int) else max(int(node.get("minItems", 0)), items)


def capped_items(schema: Any) -> Any:
    """A copy of ``schema`` where every array without ``maxItems`` gets ``CAPPED_MAX_ITEMS`` (or its ``minItems``);
    strings keep their own lengths. The default for grammar servers: a list cannot run away, and no answer of a
    capable model is cut (see :func:`bounded_lengths` for small models)."""
    return _with_lengths(schema, CAPPED_MAX_ITEMS, None)


def _with_lengths(node: Any, items: int, chars: int | None) -> Any:
    if isinstance(node, list):
        return [_with_lengths(sub, items, chars) for sub in node]
    if not isinstance(node, Mapping):
        return node
    out = {key: (value if key in ("enum", "const", "required") else _with_lengths(value, items, chars))
           for key, value in node.items()}
    if node.get("type") == "array" and "maxItems" not in node:
        out["maxItems"] = _item_cap(node, items)
    elif chars is not None and _free_string(node) and "maxLength" not in node:
        out["maxLength"] = max(int(node.get("minLength", 0)), chars)
    return out
