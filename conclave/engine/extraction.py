"""Turning a model's answer into a validated artifact (DESIGN.md §5), and the words used to ask for JSON.

Order: the provider's native structured output → the text as JSON → ``artifacts.extract_json`` (fenced block,
outermost object, json-repair) → nulls for absent optionals dropped → absent lists added in format 1.1 read as
empty → header fields filled by us → validation
against the full schema file → citation numbers below 1 dropped (:func:`_drop_impossible_citations`) and the rest
validated again. What fails validation is described (path + message per error) so that one re-ask can quote it back
to the model.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from conclave.artifacts import schema_registry as artifacts

log = logging.getLogger(__name__)

#: fields the engine owns; the model's values for them are never trusted
HEADER_KEYS = ("artifact_type", "schema_version", "round_number", "created_at", "agent_id")
#: where a citation number sits: ``$.claims[2].citations[0]``, at any depth
_CITATION_PATH = re.compile(r"^(?P<claim>\$.*\.claims\[\d+\])\.citations\[(?P<index>\d+)\]$")
_PATH_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")

Status = Literal["valid", "repaired", "reasked", "fallback"]


@dataclass(frozen=True)
class Extraction:
    """The outcome of one answer: an artifact (None on failure), how it was obtained, and what was wrong."""

    artifact: dict[str, Any] | None
    status: Status | None
    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.artifact is not None


@functools.cache
def _schema(schema_name: str) -> dict[str, Any]:
    """The schema file, read once and shared: only ever read here, never modified."""
    return artifacts.get_schema(schema_name)


def header_for(schema_name: str, round_number: int, agent_id: str | None) -> dict[str, Any]:
    """The header values we set on an artifact of ``schema_name``: only keys the schema declares.

    A schema that pins ``round_number`` names the debate stage its artifacts belong to (a verdict is a round-4
    artifact even when a longer plan plays it as round 5); the journal's events carry the consultation's own
    round number."""
    props = _schema(schema_name).get("properties", {})
    values: dict[str, Any] = {
        "artifact_type": _const(props.get("artifact_type"), schema_name),
        "schema_version": _const(props.get("schema_version"), artifacts.current_version()),
        "round_number": _const(props.get("round_number"), round_number),
        "created_at": artifacts.now_iso(),
        "agent_id": agent_id,
    }
    return {k: v for k, v in values.items() if k in props and v is not None}


def _const(prop: Any, default: Any) -> Any:
    if isinstance(prop, Mapping):
        if "const" in prop:
            return prop["const"]
        if isinstance(prop.get("enum"), list) and len(prop["enum"]) == 1:
            return prop["enum"][0]
    return default


def extract(
    text: str, parsed: Mapping[str, Any] | None, schema_name: str, header: Mapping[str, Any]
) -> Extraction:
    """Parse and validate one answer. ``parsed`` is the provider's native structured output, if any."""
    status: Status = "valid"
    obj: Any = dict(parsed) if isinstance(parsed, Mapping) else None
    if obj is None:
        try:
            obj = json.loads(text)
        except ValueError:
            status = "repaired"
            try:
                obj = artifacts.extract_json(text)
            except artifacts.ArtifactParseError as exc:
                return Extraction(None, None, (f"(root): the answer is not a JSON object ({exc})",))
    if not isinstance(obj, dict):
        return Extraction(None, None, (f"(root): expected a JSON object, got {type(obj).__name__}",))
    # Strict structured output answers an absent optional field with null; null is never a valid value here.
    obj = artifacts.drop_null_optionals(_schema(schema_name), obj)
    # A list the format added in 1.1 (claims, references, claim ids, coverage) left out means none was named.
    obj = artifacts.fill_added_lists(schema_name, obj)
    candidate = {**obj, **header}
    errors = artifacts.validate(schema_name, candidate)
    if errors and _drop_impossible_citations(candidate, errors):
        status = "repaired"
        errors = artifacts.validate(schema_name, candidate)
    if errors:
        return Extraction(None, None, tuple(describe_error(e) for e in errors))
    return Extraction(candidate, status)


def _drop_impossible_citations(candidate: dict[str, Any], errors: Sequence[artifacts.ArtifactError]) -> bool:
    """Drop, in place, the citation numbers below the schema's ``minimum`` (1): they name no reference. Whether any
    was dropped.

    A grammar server's schema converter ignores ``minimum`` on an integer inside an array (llama-cpp-python's
    writes ``citations: [0]``), and the re-ask runs under the same grammar, so it would only repeat the number. Such
    a citation points at nothing: removing it changes no claim and invents nothing (the answer counts as
    ``repaired``, its raw text keeps what was written, and a FACT left without citations is flagged by the
    citation rules). Every other error, a citation of the wrong type included, still fails validation."""
    drops: dict[str, set[int]] = {}
    for error in errors:
        match = _CITATION_PATH.match(error.path)
        if match is not None and error.validator == "minimum":
            drops.setdefault(match["claim"], set()).add(int(match["index"]))
    dropped = False
    for path, indexes in drops.items():
        claim = _at(candidate, path)
        citations = claim.get("citations") if isinstance(claim, dict) else None
        if not isinstance(citations, list):
            continue
        log.debug("dropping citation numbers below 1 at %s.citations: %s", path,
                  [citations[i] for i in sorted(indexes) if i < len(citations)])
        claim["citations"] = [n for i, n in enumerate(citations) if i not in indexes]
        dropped = True
    return dropped


def _at(document: Any, path: str) -> Any:
    """The node at a JSON path of the form ``$.a[0].b``, or None."""
    node = document
    for key, index in _PATH_STEP.findall(path[1:]):
        try:
            node = node[key] if key else node[int(index)]
        except (KeyError, IndexError, TypeError):
            return None
    return node


def describe_error(error: Any) -> str:
    path = getattr(error, "path", "") or ""
    if not isinstance(path, str):
        path = "/".join(str(p) for p in path)
    return f"{path or '(root)'}: {getattr(error, 'message', str(error))}"


@functools.cache
def _request_schema(schema_name: str) -> str:
    schema = _schema(schema_name)
    inlined = _inline_refs(schema, schema)
    inlined.pop("$id", None)
    return json.dumps(inlined, ensure_ascii=False)


def request_schema(schema_name: str) -> dict[str, Any]:
    """The schema sent to providers: the schema file with every ``$ref`` inlined (no provider API resolves
    the files' cross-file references), every constraint kept. Provider dialects (e.g. OpenAI strict mode) are
    the provider's business; answers are validated against the schema file itself."""
    result: dict[str, Any] = json.loads(_request_schema(schema_name))
    return result


def constrained(schema: dict[str, Any], answers: Sequence[str]) -> dict[str, Any]:
    """``schema`` with its ``final_answer`` limited to ``answers`` (an ``enum``), e.g. a multiple-choice item's
    letters; unchanged without ``answers`` or without a ``final_answer`` field."""
    props = schema.get("properties")
    if not answers or not isinstance(props, dict) or not isinstance(props.get("final_answer"), dict):
        return schema
    final = {k: v for k, v in props["final_answer"].items() if k not in ("pattern", "minLength", "maxLength")}
    return {**schema, "properties": {**props, "final_answer": {**final, "enum": list(answers)}}}


def answer_errors(artifact: Mapping[str, Any], answers: Sequence[str]) -> tuple[str, ...]:
    """The error a re-ask quotes when an artifact's ``final_answer`` is not one of the allowed ``answers``."""
    if not answers or "final_answer" not in artifact or artifact["final_answer"] in answers:
        return ()
    return (f"$.final_answer: {artifact['final_answer']!r} is not one of {list(answers)!r}",)


def _inline_refs(node: Any, document: Mapping[str, Any]) -> Any:
    """A copy of ``node`` with ``$ref``s (``file.schema.json#/pointer`` or ``#/pointer``) replaced by their
    targets; ``document`` is the file ``node`` belongs to. Artifact schemas are not recursive."""
    if isinstance(node, list):
        return [_inline_refs(item, document) for item in node]
    if not isinstance(node, Mapping):
        return node
    if "$ref" in node:
        target_file, _, pointer = str(node["$ref"]).partition("#")
        target_doc = _schema(target_file.removesuffix(".schema.json")) if target_file else document
        target: Any = target_doc
        for part in filter(None, pointer.split("/")):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        siblings = {k: v for k, v in node.items() if k != "$ref"}
        return {**_inline_refs(target, target_doc), **_inline_refs(siblings, document)}
    return {k: _inline_refs(v, document) for k, v in node.items() if k != "$defs"}


def json_instruction(schema_name: str, native: bool) -> str:
    """Appended to every user message that expects an artifact. Without native structured output the schema
    itself is included, because the model has no other way to learn it."""
    text = (
        "Answer with one JSON object only — no introduction, no closing remarks. Use exactly the field names "
        "described above (snake_case)."
    )
    if native:
        return text
    schema = json.dumps(request_schema(schema_name), ensure_ascii=False, separators=(",", ":"))
    return f"{text} The object must validate against this JSON Schema:\n```json\n{schema}\n```"


def reask_message(errors: tuple[str, ...]) -> str:
    """The follow-up that quotes the validator's findings (each as ``path: message``)."""
    listed = "\n".join(f"- {e}" for e in errors[:20])
    more = f"\n- … and {len(errors) - 20} more" if len(errors) > 20 else ""
    return (
        "Your previous answer could not be accepted. The validator reported:\n"
        f"{listed}{more}\n\n"
        "Reply again with the complete, corrected JSON object only."
    )
