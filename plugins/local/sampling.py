"""Constrained decoding for the ``local`` provider: a GBNF grammar built from an artifact schema, with caps that
keep every grammatical answer within the token budget. llama.cpp's engine enforces it the way its server does:
top-k and min-p first, the grammar checked on the token drawn, the whole vocabulary only when that token fails.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urldefrag, urljoin

from conclave.errors import ConclaveError
from conclave.providers.schema_hints import DEFAULT_MAX_ITEMS, MAX_STRING_CHARS, MIN_STRING_CHARS

if TYPE_CHECKING:
    pass

# The string and array caps (MAX_STRING_CHARS, MIN_STRING_CHARS, DEFAULT_MAX_ITEMS) are shared with the schema
# variant sent to grammar servers, and documented there.

# One JSON string character without escapes: no quote, no backslash, no control character. Forbidding escapes
# keeps every character one code point, so the character caps below bound the token count.
_CHAR = r'[^"\\\x00-\x1F\x7F]'
# The first character of a non-empty string: also not whitespace (Python's \S, Unicode included), which
# satisfies both ``minLength: 1`` and ``pattern: "\\S"``.
_VISIBLE = r'[^"\\\x00-\x20\x7F-\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]'
_SUPPORTED_PATTERNS = frozenset({r"\S"})
_IGNORED = frozenset({"$schema", "$id", "$comment", "$defs", "title", "description", "examples", "default"})


class GrammarError(ConclaveError, ValueError):
    """The schema uses a keyword or combination the grammar builder cannot express; the message names it."""


@dataclass(frozen=True)
class JsonGrammar:
    """A schema as GBNF: ``prefix`` is the forced opening text (fed with the prompt, not sampled), ``gbnf``
    generates the rest, and no output is longer than ``max_chars`` characters."""

    gbnf: str
    prefix: str
    max_chars: int
    string_chars: int


@dataclass(frozen=True)
class _Piece:
    expr: str  # a GBNF expression
    fixed: int  # worst-case characters, string contents excluded
    slots: int  # free string contents, each up to the string cap
    literal: str | None = None  # the only text this piece can produce, when there is one


def build_grammar(schema: Mapping[str, Any], *, max_tokens: int, now: str,
                  documents: Callable[[str], Mapping[str, Any]] | None = None) -> JsonGrammar:
    """The grammar of compact JSON objects valid against ``schema`` that fit in ``max_tokens``.

    Only required properties are generated (the smallest valid artifact), forced properties first;
    ``format: date-time`` is filled with ``now`` (a model cannot know the time). Array lengths and string
    lengths are capped so that the worst case fits the budget: a token is at least one character.
    ``documents`` resolves the URI of a ``$ref``'d file (default: the shipped schemas by ``$id``).
    """
    resolve = documents or _shipped_document
    # Fewer array items before shorter strings: three 16-character points say less than one 60-character one.
    # At the smallest budgets a list with no minItems may have to stay empty (0): a valid, if thin, artifact.
    for max_items in range(DEFAULT_MAX_ITEMS, -1, -1):
        probe = _Builder(resolve, now, string_chars=1, max_items=max_items).root(schema)
        room = max_tokens - probe.fixed - 8  # a few tokens for the end-of-turn marker and slack
        if probe.slots == 0 or room // probe.slots >= MIN_STRING_CHARS:
            break
    cap = MAX_STRING_CHARS if probe.slots == 0 else max(MIN_STRING_CHARS, min(MAX_STRING_CHARS, room // probe.slots))
    builder = _Builder(resolve, now, string_chars=cap, max_items=max_items)
    prefix, rest = builder.root_parts(schema)
    builder.rules["root"] = rest.expr
    gbnf = "\n".join(f"{name} ::= {body}" for name, body in builder.rules.items())
    return JsonGrammar(gbnf=gbnf + "\n", prefix=prefix, max_chars=rest.fixed + rest.slots * cap,
                       string_chars=cap)


def _shipped_document(uri: str) -> Mapping[str, Any]:
    from conclave.artifacts import schema_registry as artifacts

    for name in artifacts.schema_names():
        document = artifacts.get_schema(name)
        if document.get("$id") == uri:
            return document
    raise GrammarError(f"$ref to an unknown schema document {uri!r}")


def _literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    escaped = "".join(ch if 0x20 <= ord(ch) != 0x7F else f"\\x{ord(ch):02X}" for ch in escaped)
    return f'"{escaped}"'


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class _Builder:
    def __init__(self, resolve: Callable[[str], Mapping[str, Any]], now: str, *, string_chars: int,
                 max_items: int) -> None:
        self.resolve = resolve
        self.now = now
        self.string_chars = string_chars
        self.max_items = max_items
        self.rules: dict[str, str] = {}
        self._names: dict[str, str] = {}
        self._documents: dict[str, Mapping[str, Any]] = {}

    # ------------------------------------------------------------------------------------- rules and refs

    def _rule(self, hint: str, body: str) -> str:
        """A named rule for ``body`` (shared by every use of the same body)."""
        if body in self._names:
            return self._names[body]
        name, n = hint, 1
        while name in self.rules or name == "root":
            n += 1
            name = f"{hint}{n}"
        self.rules[name] = body
        self._names[body] = name
        return name

    def _deref(self, node: Mapping[str, Any], base: str) -> tuple[Mapping[str, Any], str]:
        while "$ref" in node:
            target, pointer = urldefrag(urljoin(base, node["$ref"]))
            resolved: Any = self._documents.get(target) or self.resolve(target)
            for part in [p for p in pointer.split("/") if p]:
                resolved = resolved[part.replace("~1", "/").replace("~0", "~")]
            # keywords beside a $ref (a description, usually) refine the referenced node
            node = {**resolved, **{k: v for k, v in node.items() if k != "$ref"}}
            base = target
        return node, base

    # ------------------------------------------------------------------------------------- values

    def root(self, schema: Mapping[str, Any]) -> _Piece:
        return self.root_parts(schema)[1]

    def root_parts(self, schema: Mapping[str, Any]) -> tuple[str, _Piece]:
        """The forced prefix of the root object and the piece that generates the rest."""
        base = str(schema.get("$id", "urn:conclave:root"))
        self._documents = {base: schema}
        node, base = self._deref(schema, base)
        if node.get("type") != "object":
            raise GrammarError("the root of an artifact schema must be an object")
        parts = self._object_parts(node, base)
        prefix = ""
        while parts and parts[0].literal is not None:
            prefix += parts.pop(0).literal or ""
        return prefix, self._seq(parts)

    def value(self, node: Mapping[str, Any], base: str, hint: str) -> _Piece:
        node, base = self._deref(node, base)
        unknown = set(node) - _IGNORED - {
            "type", "const", "enum", "properties", "required", "additionalProperties", "items", "minItems",
            "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "anyOf",
        }
        if unknown:
            raise GrammarError(f"{hint}: unsupported keyword(s) {', '.join(sorted(unknown))}")
        if "const" in node:
            return self._literal_piece(_json(node["const"]))
        if "enum" in node:
            return self._choice([_json(v) for v in node["enum"]], hint)
        if "anyOf" in node:
            options = [self.value(sub, base, hint) for sub in node["anyOf"]]
            return self._alternatives(options, hint)
        kind = node.get("type")
        if isinstance(kind, list):
            options = [self.value({**node, "type": k}, base, hint) for k in kind]
            return self._alternatives(options, hint)
        if kind == "object":
            parts = self._object_parts(node, base)
            return self._sequence_rule(parts, hint)
        if kind == "array":
            return self._array(node, base, hint)
        if kind == "string":
            return self._string(node, hint)
        if kind in ("number", "integer"):
            return self._number(node, kind, hint)
        if kind == "boolean":
            return self._choice(["true", "false"], "boolean")
        if kind == "null":
            return self._literal_piece("null")
        raise GrammarError(f"{hint}: unsupported or missing type {kind!r}")

    def _object_parts(self, node: Mapping[str, Any], base: str) -> list[_Piece]:
        if node.get("additionalProperties", False) is not False:
            raise GrammarError("objects must set additionalProperties: false")
        properties: Mapping[str, Any] = node.get("properties", {})
        required = [name for name in properties if name in set(node.get("required", ()))]
        values = {name: self.value(properties[name], base, name.replace("_", "-")) for name in required}
        # Forced values first: at the start of the root object they join the prompt instead of being sampled.
        order = sorted(required, key=lambda name: values[name].literal is None)
        parts = [self._literal_piece("{")]
        for index, name in enumerate(order):
            parts.append(self._literal_piece(("," if index else "") + _json(name) + ":"))
            parts.append(values[name])
        parts.append(self._literal_piece("}"))
        return _merge_literals(parts)

    def _array(self, node: Mapping[str, Any], base: str, hint: str) -> _Piece:
        low = int(node.get("minItems", 0))
        high = int(node.get("maxItems", max(low, self.max_items)))
        if high < low:
            raise GrammarError(f"{hint}: maxItems < minItems")
        item = self.value(node.get("items", {}), base, f"{hint}-item")
        if high == 0:
            return self._literal_piece("[]")
        more = "" if high == 1 else f' ("," {item.expr}){{{max(low - 1, 0)},{high - 1}}}'
        body = f"{item.expr}{more}"
        body = f'"[" {body} "]"' if low >= 1 else f'"[" ({body})? "]"'
        return _Piece(self._rule(hint, body), 2 + high * item.fixed + (high - 1), high * item.slots)

    def _string(self, node: Mapping[str, Any], hint: str) -> _Piece:
        fmt = node.get("format")
        if fmt == "date-time":
            return self._literal_piece(_json(self.now))
        if fmt is not None:
            raise GrammarError(f"{hint}: unsupported string format {fmt!r}")
        pattern = node.get("pattern")
        if pattern is not None and pattern not in _SUPPORTED_PATTERNS:
            raise GrammarError(f"{hint}: unsupported pattern {pattern!r}")
        low = int(node.get("minLength", 0))
        cap = max(low, min(int(node.get("maxLength", self.string_chars)), self.string_chars))
        visible = pattern is not None or low >= 1
        if visible:
            tail = f" {_CHAR}{{{max(low - 1, 0)},{cap - 1}}}" if cap > 1 else ""
            body = f'"\\"" {_VISIBLE}{tail} "\\""'
            name = self._rule("text", body)
        else:
            name = self._rule("string", f'"\\"" {_CHAR}{{0,{cap}}} "\\""')
        # the cap is counted through ``slots`` so that the probe pass sees how many strings share the budget
        return _Piece(name, 2 + max(0, low - 1), 1)

    def _number(self, node: Mapping[str, Any], kind: str, hint: str) -> _Piece:
        low, high = node.get("minimum"), node.get("maximum")
        if low is None and high is None:
            digits = '"-"? ("0" | [1-9] [0-9]{0,8})'
            if kind == "integer":
                return _Piece(self._rule("integer", digits), 10, 0)
            return _Piece(self._rule("number", f'{digits} ("." [0-9]{{1,4}})?'), 15, 0)
        if kind == "integer" and high is None and low in (0, 1):  # a count, or a 1-based number (a citation)
            positive = "[1-9] [0-9]{0,8}"
            return _Piece(self._rule("positive" if low else "count", positive if low else f'"0" | {positive}'), 9, 0)
        if kind == "integer" and low is not None and high is not None and 0 <= high - low <= 100:
            return self._choice([str(v) for v in range(math.ceil(low), math.floor(high) + 1)], hint)
        if kind == "number" and (low, high) == (0, 1):
            # A probability: 0, 1, or a decimal fraction with one or two digits (0.85).
            return _Piece(self._rule("unit", '"0" ("." [0-9] [0-9]?)? | "1" (".0")?'), 4, 0)
        raise GrammarError(f"{hint}: unsupported numeric range [{low}, {high}] for type {kind}")

    # ------------------------------------------------------------------------------------- combinators

    def _literal_piece(self, text: str) -> _Piece:
        return _Piece(_literal(text), len(text), 0, text)

    def _choice(self, texts: list[str], hint: str) -> _Piece:
        if len(texts) == 1:
            return self._literal_piece(texts[0])
        body = " | ".join(_literal(t) for t in texts)
        return _Piece(self._rule(hint, body), max(len(t) for t in texts), 0)

    def _alternatives(self, options: list[_Piece], hint: str) -> _Piece:
        if len(options) == 1:
            return options[0]
        body = " | ".join(o.expr for o in options)
        return _Piece(self._rule(hint, body), max(o.fixed for o in options), max(o.slots for o in options))

    def _seq(self, parts: list[_Piece]) -> _Piece:
        return _Piece(" ".join(p.expr for p in parts) or '""', sum(p.fixed for p in parts),
                      sum(p.slots for p in parts))

    def _sequence_rule(self, parts: list[_Piece], hint: str) -> _Piece:
        if all(p.literal is not None for p in parts):
            return self._literal_piece("".join(p.literal or "" for p in parts))
        seq = self._seq(parts)
        return _Piece(self._rule(hint, seq.expr), seq.fixed, seq.slots)


def _merge_literals(parts: list[_Piece]) -> list[_Piece]:
    merged: list[_Piece] = []
    for part in parts:
        if merged and part.literal is not None and merged[-1].literal is not None:
            text = (merged[-1].literal or "") + part.literal
            merged[-1] = _Piece(_literal(text), len(text), 0, text)
        else:
            merged.append(part)
    return merged
