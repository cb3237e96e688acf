"""Artifact schemas: loading, validation, and recovering a JSON object from a model's text answer.

``schemas/*.schema.json`` (shipped as the package ``conclave.schemas``) are the single source of truth,
and this module is the only validator the code uses. Loading schemas and following their ``$ref`` s (no
validation) is :mod:`conclave.artifacts.schema_refs`, re-exported here; plugins import that one, so registering
them does not import jsonschema or json_repair.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import json_repair
from jsonschema import Draft202012Validator

from conclave.artifacts.schema_refs import (
    ADDED_LISTS,
    SCHEMA_PACKAGE,
    all_schemas,
    declared_properties,
    deref,
    drop_null_optionals,
    fill_added_lists,
    fill_plan,
    get_schema,
    in_schema_order,
    inlined,
    inlined_resolver,
    known_schema,
    registry,
    resolver_for,
    schema_names,
    schemas_in,
)
from conclave.errors import ConclaveError

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

_Path = tuple[str | int, ...]

__all__ = [
    "ADDED_LISTS",
    "SCHEMA_PACKAGE",
    "ArtifactError",
    "ArtifactParseError",
    "ArtifactValidationError",
    "check",
    "current_version",
    "declared_properties",
    "deref",
    "drop_null_optionals",
    "extract_json",
    "fill_added_lists",
    "get_schema",
    "in_schema_order",
    "known_schema",
    "now_iso",
    "prepare_checks",
    "resolver_for",
    "schema_names",
    "schemas_in",
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


@functools.cache
def _validator(name: str) -> Validator:
    # Validated against the schema with every $ref inlined: the same keywords at the same instance paths (so the
    # same errors), without resolving a reference through the registry at every node of every artifact.
    return Draft202012Validator(
        inlined(name), registry=registry(), format_checker=Draft202012Validator.FORMAT_CHECKER
    )


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
        if name not in all_schemas():
            continue
        _validator(name)
        plan = fill_plan(name)
        if plan is not None:
            plan.expand()
        inlined_resolver(name)
        validate(name, {})  # the validator's own lazily built parts (format checkers, keyword functions)


def check(name: str, instance: Any) -> None:
    """Raise ``ArtifactValidationError`` listing every failure unless ``instance`` matches schema ``name``."""
    errors = validate(name, instance)
    if errors:
        raise ArtifactValidationError(name, errors)


def current_version() -> str:
    """The artifact format version: the one place it is defined is ``common.schema.json``'s ``schema_version``."""
    return str(known_schema("common")["$defs"]["schema_version"]["const"])


#: older format versions a stored artifact may carry; :func:`upgrade` reads each as the current version
READABLE_VERSIONS = ("1.0",)
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
    schema = all_schemas().get(name)
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
