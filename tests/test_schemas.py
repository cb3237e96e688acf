"""Artifact schemas, the validator, strict-mode variants, JSON extraction and ``conclave schemas``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_conclave
from conclave_plugins.openai import strict_variant
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from conclave.artifacts.schema_registry import (
    ArtifactParseError,
    ArtifactValidationError,
    check,
    current_version,
    drop_null_optionals,
    extract_json,
    get_schema,
    now_iso,
    schema_names,
    validate,
)
from conclave.errors import ConclaveError

FIXTURES = Path(__file__).parent / "fixtures" / "artifacts"
SCHEMA_DIR = Path(__file__).parent.parent / "schemas"
PLUGIN_SCHEMA_DIR = Path(__file__).parent.parent / "plugins" / "schemas"
ARTIFACTS = [
    "cross_exam", "cross_exam_reply", "cross_exam_reply_adversarial", "cross_exam_reply_answer",
    "cross_exam_reply_devils_advocate", "cross_exam_reply_explore", "independent", "independent_answer", "objection",
    "safety_evaluation", "synthesis", "synthesis_answer", "verdict", "verdict_answer", "verdict_explore",
]
#: records the engine writes (not model answers): schema-checked when made, no fixtures or generators
RECORDS = ["final_aggregate", "vote_gate"]
# The only properties a schema may leave out of ``required``.
OPTIONAL = {
    ("verdict", "$.properties.per_agent_contributions"),
    ("verdict_answer", "$.properties.per_agent_contributions"),
    ("verdict_explore", "$.properties.recommendations.items.properties.best_when"),
    ("verdict_explore", "$.properties.evidence"),
    ("verdict_explore", "$.properties.dissent"),
    # the debate-quality fields an answer may leave out (claims and references are required since 1.1)
    ("common", "$.$defs.claims.items.properties.supports"),
    ("common", "$.$defs.claims.items.properties.opposes"),
    ("common", "$.$defs.references.items.properties.url"),
    ("common", "$.$defs.references.items.properties.snippet"),
    *((name, f"$.properties.{field}")
      for name in ("independent", "cross_exam_reply", "cross_exam_reply_explore", "cross_exam_reply_adversarial",
                   "cross_exam_reply_devils_advocate")
      for field in ("alternatives", "failure_modes", "uncertainties")),
    ("cross_exam_reply", "$.properties.retracts"),
    ("cross_exam_reply_explore", "$.properties.retracts"),
    ("cross_exam_reply_adversarial", "$.properties.retracts"),
    ("cross_exam_reply_devils_advocate", "$.properties.retracts"),
    ("synthesis", "$.properties.verification"),
    ("synthesis_answer", "$.properties.verification"),
    ("independent_answer", "$.properties.uncertainties"),
    ("cross_exam_reply_answer", "$.properties.uncertainties"),
    ("cross_exam_reply_answer", "$.properties.retracts"),
    ("cross_exam", "$.properties.claim_statuses"),
    # a vote's reason (the vote itself and the confidence are required)
    *((name, "$.properties.vote_reason") for name in (
        "cross_exam_reply", "cross_exam_reply_explore", "cross_exam_reply_adversarial",
        "cross_exam_reply_devils_advocate", "cross_exam_reply_answer")),
    # the critical objection answer: its three mandatory items are required, claims and sources optional
    *(("objection", f"$.properties.{field}") for field in ("claims", "references", "retracts")),
}

# fixture -> the errors it must produce: (json path, failing keyword, text the message must contain)
EXPECTED_FAILURES: dict[str, list[tuple[str, str, str]]] = {
    "safety_evaluation.invalid.verdict_deny.json": [("$.verdict", "enum", "'deny'")],
    "safety_evaluation.invalid.risk_above_1.json": [("$.risk", "maximum", "1.5")],
    "safety_evaluation.invalid.missing_reason.json": [("$", "required", "'reason'")],
    "independent.invalid.missing_created_at.json": [("$", "required", "'created_at'")],
    "independent.invalid.created_at_yesterday.json": [("$.created_at", "format", "date-time")],
    "independent.invalid.round_number_2.json": [("$.round_number", "const", "1")],
    "independent.invalid.empty_key_points.json": [("$.key_points", "minItems", "should be non-empty")],
    "independent.invalid.blank_key_point.json": [("$.key_points[1]", "pattern", "does not match")],
    "independent.invalid.confidence_negative.json": [("$.confidence", "minimum", "-0.1")],
    "independent.invalid.confidence_string.json": [("$.confidence", "type", "'number'")],
    "independent.invalid.schema_version_2.json": [("$.schema_version", "const", "'1.1'")],
    "independent.invalid.extra_field.json": [("$", "additionalProperties", "'mood'")],
    "independent.invalid.claim_label_guess.json": [("$.claims[0].label", "enum", "'GUESS'")],
    "independent.invalid.empty_agent_id.json": [
        ("$.agent_id", "minLength", "should be non-empty"), ("$.agent_id", "pattern", "does not match"),
    ],
    "synthesis.invalid.confidence_above_1.json": [
        ("$.consensus_points[0].confidence", "maximum", "greater than the maximum of 1"),
    ],
    "synthesis.invalid.single_viewpoint.json": [("$.tensions[0].viewpoints", "minItems", "too short")],
    "synthesis.invalid.viewpoint_missing_agent.json": [("$.tensions[0].viewpoints[1]", "required", "'agent'")],
    "synthesis.invalid.camel_case_key.json": [
        ("$", "additionalProperties", "'consensusPoints'"), ("$", "required", "'consensus_points'"),
    ],
    "synthesis.invalid.artifact_type_verdict.json": [("$.artifact_type", "const", "'synthesis'")],
    "synthesis.invalid.tension_uses_area.json": [
        ("$.tensions[0]", "additionalProperties", "'area'"), ("$.tensions[0]", "required", "'topic'"),
    ],
    "cross_exam.invalid.empty_challenge.json": [
        ("$.challenges[0].challenge", "minLength", "should be non-empty"),
        ("$.challenges[0].challenge", "pattern", "does not match"),
    ],
    "cross_exam.invalid.evidence_string.json": [("$.challenges[0].evidence", "type", "'array'")],
    "cross_exam.invalid.missing_unresolved.json": [("$", "required", "'unresolved'")],
    "cross_exam.invalid.rebuttal_extra_field.json": [
        ("$.rebuttals[0]", "additionalProperties", "'target_challenge'"),
    ],
    "verdict.invalid.empty_evidence.json": [("$.evidence", "minItems", "should be non-empty")],
    "verdict.invalid.severity_minor.json": [("$.dissent[0].severity", "enum", "'minor'")],
    "verdict.invalid.blank_recommendation.json": [("$.recommendation", "pattern", "does not match")],
    "verdict.invalid.adopted_string.json": [("$.per_agent_contributions[0].adopted", "type", "'boolean'")],
    "verdict.invalid.round_number_3.json": [("$.round_number", "const", "4")],
    "verdict.invalid.created_at_no_timezone.json": [("$.created_at", "format", "date-time")],
    "verdict_explore.invalid.no_recommendations.json": [("$.recommendations", "minItems", "should be non-empty")],
    "verdict_explore.invalid.empty_description.json": [
        ("$.recommendations[0].description", "minLength", "should be non-empty"),
        ("$.recommendations[0].description", "pattern", "does not match"),
    ],
    "verdict_explore.invalid.missing_summary.json": [("$", "required", "'summary'")],
    "verdict_explore.invalid.best_when_null.json": [("$.recommendations[0].best_when", "type", "'string'")],
    "verdict_explore.invalid.converge_shape.json": [
        ("$", "additionalProperties", "'recommendation'"),
        ("$", "required", "'recommendations'"),
        ("$", "required", "'summary'"),
        ("$", "required", "'synergies'"),
    ],
    "cross_exam_reply.invalid.challenge_missing_target.json": [("$.challenges[0]", "required", "'target_agent'")],
    "cross_exam_reply.invalid.empty_revised_position.json": [
        ("$.revised_position", "minLength", "should be non-empty"),
        ("$.revised_position", "pattern", "does not match"),
    ],
    "cross_exam_reply.invalid.artifact_header.json": [("$", "additionalProperties", "'artifact_type'")],
    "cross_exam_reply.invalid.unknown_vote.json": [("$.vote", "enum", "'MAYBE'")],
    "cross_exam_reply_explore.invalid.gaps_string.json": [("$.gaps", "type", "'array'")],
    "cross_exam_reply_adversarial.invalid.missing_steelman.json": [("$", "required", "'steelman'")],
    "cross_exam_reply_adversarial.invalid.blank_counter_argument.json": [
        ("$.counter_argument", "pattern", "does not match")],
    "cross_exam_reply_devils_advocate.invalid.no_challenges.json": [
        ("$.consensus_challenges", "minItems", "should be non-empty")],
    "cross_exam_reply_devils_advocate.invalid.challenge_missing_point.json": [
        ("$.consensus_challenges[0]", "required", "'consensus_point'")],
    "cross_exam_reply_explore.invalid.missing_refined_position.json": [("$", "required", "'refined_position'")],
    "independent_answer.invalid.missing_final_answer.json": [("$", "required", "'final_answer'")],
    "independent_answer.invalid.blank_final_answer.json": [("$.final_answer", "pattern", "does not match")],
    "independent_answer.invalid.final_answer_too_long.json": [("$.final_answer", "maxLength", "is too long")],
    "synthesis_answer.invalid.missing_final_answer.json": [("$", "required", "'final_answer'")],
    "synthesis_answer.invalid.blank_final_answer.json": [("$.final_answer", "pattern", "does not match")],
    "synthesis_answer.invalid.final_answer_too_long.json": [("$.final_answer", "maxLength", "is too long")],
    "cross_exam_reply_answer.invalid.missing_final_answer.json": [("$", "required", "'final_answer'")],
    "cross_exam_reply_answer.invalid.blank_final_answer.json": [("$.final_answer", "pattern", "does not match")],
    "cross_exam_reply_answer.invalid.final_answer_too_long.json": [("$.final_answer", "maxLength", "is too long")],
    "verdict_answer.invalid.missing_final_answer.json": [("$", "required", "'final_answer'")],
    "verdict_answer.invalid.blank_final_answer.json": [("$.final_answer", "pattern", "does not match")],
    "verdict_answer.invalid.final_answer_too_long.json": [("$.final_answer", "maxLength", "is too long")],
    "objection.invalid.missing_alternative.json": [("$", "required", "'alternative_hypothesis'")],
    "objection.invalid.blank_counterargument.json": [("$.counterargument.text", "pattern", "does not match")],
}


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _schema_of(fixture: str) -> str:
    return fixture.split(".", 1)[0]


def _fixtures(kind: str) -> list[str]:
    return sorted(p.name for p in FIXTURES.glob(f"*.{kind}*.json"))


def _objects(node: Any, path: str = "$") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema with ``properties``, with its location in the schema document."""
    if isinstance(node, dict):
        if "properties" in node:
            yield path, node
        for key, value in node.items():
            yield from _objects(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _objects(value, f"{path}[{index}]")


# ------------------------------------------------------------------------------------------- the schema files


def test_schema_names_are_the_file_stems() -> None:
    assert schema_names() == sorted(["common", *ARTIFACTS, *RECORDS])
    files = [*SCHEMA_DIR.glob("*.schema.json"), *PLUGIN_SCHEMA_DIR.glob("*.schema.json")]  # core, then strategies'
    assert schema_names() == sorted(p.name.removesuffix(".schema.json") for p in files)


@pytest.mark.parametrize("name", ["common", *ARTIFACTS, *RECORDS])
def test_schema_file_is_valid_draft_2020_12_with_id_and_title(name: str) -> None:
    schema = get_schema(name)
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"https://conclave.dev/schemas/{name}.schema.json"
    assert schema["title"].strip()


def test_every_object_is_closed_and_requires_all_but_the_named_optionals() -> None:
    optional = set()
    for name in schema_names():
        for path, node in _objects(get_schema(name)):
            assert node.get("additionalProperties") is False, f"{name} {path}"
            optional |= {(name, f"{path}.properties.{p}") for p in node["properties"] if p not in node["required"]}
    assert optional == OPTIONAL


def test_get_schema_rejects_unknown_name_listing_the_allowed_ones() -> None:
    with pytest.raises(KeyError) as info:
        get_schema("verdicts")
    assert "'verdicts'" in str(info.value)
    assert "verdict_explore" in str(info.value)


def test_get_schema_returns_a_copy_that_cannot_loosen_validation() -> None:
    get_schema("verdict")["properties"]["confidence"] = {}
    assert [e.validator for e in validate("verdict", _load(FIXTURES / "verdict.valid.json") | {"confidence": 7})] == [
        "maximum"
    ]


def test_cross_file_ref_resolves_through_the_registry() -> None:
    # independent.schema.json has no bounds of its own: the maximum comes from common.schema.json.
    assert get_schema("independent")["properties"]["confidence"] == {"$ref": "common.schema.json#/$defs/confidence"}
    errors = validate("independent", _load(FIXTURES / "independent.valid.json") | {"confidence": 1.5})
    assert [(e.path, e.validator) for e in errors] == [("$.confidence", "maximum")]


def test_date_time_format_is_checked() -> None:
    assert "date-time" in Draft202012Validator.FORMAT_CHECKER.checkers
    errors = validate("synthesis", _load(FIXTURES / "synthesis.valid.json") | {"created_at": "yesterday"})
    assert [(e.path, e.validator) for e in errors] == [("$.created_at", "format")]


# ------------------------------------------------------------------------------------------------ fixtures


def test_every_artifact_schema_has_a_valid_and_several_invalid_fixtures() -> None:
    for name in ARTIFACTS:
        assert f"{name}.valid.json" in _fixtures("valid")
        assert sum(_schema_of(f) == name for f in _fixtures("invalid")) >= 2, name


def test_every_invalid_fixture_states_its_expected_failure() -> None:
    assert set(_fixtures("invalid")) == set(EXPECTED_FAILURES)


@pytest.mark.parametrize("fixture", _fixtures("valid"))
def test_valid_fixture_validates(fixture: str) -> None:
    assert validate(_schema_of(fixture), _load(FIXTURES / fixture)) == []


@pytest.mark.parametrize("fixture", sorted(EXPECTED_FAILURES))
def test_invalid_fixture_fails_for_the_reason_in_its_name(fixture: str) -> None:
    errors = validate(_schema_of(fixture), _load(FIXTURES / fixture))
    expected = EXPECTED_FAILURES[fixture]
    assert sorted((e.path, e.validator) for e in errors) == sorted((p, v) for p, v, _ in expected)
    for path, keyword, fragment in expected:
        messages = [e.message for e in errors if (e.path, e.validator) == (path, keyword)]
        assert any(fragment in m for m in messages), (fragment, messages)


@pytest.mark.parametrize("fixture", sorted(EXPECTED_FAILURES))
def test_the_inlined_validator_reports_what_the_registry_validator_reports(fixture: str) -> None:
    from jsonschema import Draft202012Validator

    from conclave.artifacts import schema_refs
    from conclave.artifacts import schema_registry as artifacts

    name, instance = _schema_of(fixture), _load(FIXTURES / fixture)
    by_registry = Draft202012Validator(artifacts.get_schema(name), registry=schema_refs.registry(),
                                       format_checker=Draft202012Validator.FORMAT_CHECKER)
    expected = sorted((e.json_path, e.message, str(e.validator)) for e in by_registry.iter_errors(instance))
    assert "$ref" not in json.dumps({k: v for k, v in schema_refs.inlined(name).items() if k != "$defs"})
    assert sorted((e.path, e.message, e.validator) for e in validate(name, instance)
                  if e.validator != "finite") == expected


# ------------------------------------------------------------------------------------------------ validator


def test_validate_reports_every_error_sorted_by_path() -> None:
    instance = _load(FIXTURES / "synthesis.valid.json")
    instance["consensus_points"][1]["confidence"] = 2
    instance["consensus_points"][0]["confidence"] = -1
    instance["tensions"][0]["viewpoints"] = [{"agent": "a", "viewpoint": "v"}]
    del instance["priority_order"]
    assert [(e.path, e.validator) for e in validate("synthesis", instance)] == [
        ("$", "required"),
        ("$.consensus_points[0].confidence", "minimum"),
        ("$.consensus_points[1].confidence", "maximum"),
        ("$.tensions[0].viewpoints", "minItems"),
    ]


def test_check_raises_a_conclave_error_listing_every_path() -> None:
    instance = _load(FIXTURES / "verdict.valid.json") | {"confidence": 3, "evidence": []}
    with pytest.raises(ArtifactValidationError) as info:
        check("verdict", instance)
    assert isinstance(info.value, ConclaveError)
    assert [e.path for e in info.value.errors] == ["$.confidence", "$.evidence"]
    assert "$.confidence: 3 is greater than the maximum of 1" in str(info.value)
    assert "$.evidence: [] should be non-empty" in str(info.value)


def test_check_accepts_a_valid_artifact() -> None:
    check("cross_exam", _load(FIXTURES / "cross_exam.valid.json"))


def test_nan_is_rejected_although_it_passes_minimum_and_maximum() -> None:
    errors = validate("independent", _load(FIXTURES / "independent.valid.json") | {"confidence": float("nan")})
    assert [(e.path, e.validator) for e in errors] == [("$.confidence", "finite")]


def test_infinity_is_rejected_as_not_finite() -> None:
    errors = validate("verdict", _load(FIXTURES / "verdict.valid.json") | {"confidence": float("-inf")})
    assert [(e.path, e.validator) for e in errors] == [("$.confidence", "finite"), ("$.confidence", "minimum")]


def test_now_iso_is_utc_rfc3339_with_milliseconds() -> None:
    stamp = now_iso()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)
    assert validate("cross_exam", _load(FIXTURES / "cross_exam.valid.json") | {"created_at": stamp}) == []


# ------------------------------------------------------------------------------------------------ strict mode


def _every_node(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _every_node(value)
    elif isinstance(node, list):
        for value in node:
            yield from _every_node(value)


@pytest.mark.parametrize("name", ARTIFACTS)
def test_strict_variant_is_a_valid_schema_requiring_every_property(name: str) -> None:
    strict = strict_variant(get_schema(name))
    Draft202012Validator.check_schema(strict)
    for node in _every_node(strict):
        assert not {"$ref", "$defs", "const", "minLength", "pattern", "format"} & node.keys()
        if "properties" in node:
            assert node["required"] == list(node["properties"])
            assert node["additionalProperties"] is False


def test_strict_variant_makes_only_the_optional_properties_nullable() -> None:
    strict = strict_variant(get_schema("verdict_explore"))
    props = strict["properties"]
    assert props["evidence"]["type"] == ["array", "null"]
    assert props["dissent"]["type"] == ["array", "null"]
    assert props["recommendations"]["items"]["properties"]["best_when"]["type"] == ["string", "null"]
    assert props["summary"]["type"] == "string"
    assert props["artifact_type"]["enum"] == ["verdict"]


def test_strict_variant_leaves_its_input_alone() -> None:
    schema = get_schema("verdict")
    before = json.dumps(schema, sort_keys=True)
    strict_variant(schema)
    assert json.dumps(schema, sort_keys=True) == before


@pytest.mark.parametrize("fixture", ["verdict.valid.json", "verdict_explore.valid.full.json", "synthesis.valid.json"])
def test_an_answer_with_every_property_fits_the_strict_variant(fixture: str) -> None:
    strict = strict_variant(get_schema(_schema_of(fixture)))
    assert list(Draft202012Validator(strict).iter_errors(_load(FIXTURES / fixture))) == []


def test_strict_nulls_are_dropped_before_validating_against_the_real_schema() -> None:
    schema = get_schema("verdict_explore")
    answer = _load(FIXTURES / "verdict_explore.valid.json") | {"dissent": None}
    for option in answer["recommendations"]:
        option.setdefault("best_when", None)
    assert list(Draft202012Validator(strict_variant(schema)).iter_errors(answer)) == []
    assert validate("verdict_explore", answer) != []
    cleaned = drop_null_optionals(schema, answer)
    assert validate("verdict_explore", cleaned) == []
    assert "dissent" not in cleaned
    assert "best_when" not in cleaned["recommendations"][0]
    assert answer["dissent"] is None  # the input is not modified


def test_drop_null_optionals_keeps_a_null_in_a_required_property() -> None:
    answer = _load(FIXTURES / "verdict.valid.json") | {"recommendation": None}
    cleaned = drop_null_optionals(get_schema("verdict"), answer)
    assert cleaned["recommendation"] is None
    assert [(e.path, e.validator) for e in validate("verdict", cleaned)] == [("$.recommendation", "type")]


# ------------------------------------------------------------------------------------------------ extraction

EXTRACTION_CASES = {
    "fenced json block": ('Here is my answer:\n```json\n{"a": 1}\n```\nThanks.', {"a": 1}),
    "fence without the word json": ('```\n{"a": [1, 2]}\n```', {"a": [1, 2]}),
    "fence preferred over an object in prose": ('Like {"a": 0}, but:\n```JSON\n{"a": 1}\n```', {"a": 1}),
    "python fence ignored": ('```python\nx = {1: 2}\n```\nAnswer: {"ok": true}', {"ok": True}),
    "prose around an object": ('Sure! {"a": {"b": "c"}} Hope that helps {:', {"a": {"b": "c"}}),
    "braces inside strings": ('{"a": "x } y {", "b": 2}', {"a": "x } y {", "b": 2}),
    "prose braces before the object": ('Use {curly} notation:\n{"a": 1}', {"a": 1}),
    "raw newline inside a string": ('{"a": "line one\nline two"}', {"a": "line one\nline two"}),
    "backticks inside a fenced string": ('```json\n{"a": "use ```code``` here"}\n```', {"a": "use ```code``` here"}),
    "trailing commas repaired": ('```json\n{"a": [1, 2,], "b": "x",}\n```', {"a": [1, 2], "b": "x"}),
    "single quotes repaired": ("Result: {'a': 'b', 'n': 3} done", {"a": "b", "n": 3}),
    "truncated answer repaired": ('{"position": "p", "key_points": ["x", "y"', {"position": "p", "key_points": ["x", "y"]}),
}


@pytest.mark.parametrize("case", sorted(EXTRACTION_CASES))
def test_extract_json(case: str) -> None:
    text, expected = EXTRACTION_CASES[case]
    assert extract_json(text) == expected


def test_extract_json_repairs_a_broken_object_rather_than_returning_its_inner_one() -> None:
    assert set(extract_json('{"a": tru, "b": {"c": 1}}')) == {"a", "b"}


@pytest.mark.parametrize("text", ["", "   \n", "I cannot answer that.", "[1, 2, 3]", "```json\n[1, 2]\n```"])
def test_extract_json_raises_when_no_object_is_recoverable(text: str) -> None:
    with pytest.raises(ArtifactParseError) as info:
        extract_json(text)
    assert isinstance(info.value, ConclaveError)
    assert info.value.text == text


def test_extracted_fixture_from_a_chatty_answer_validates() -> None:
    body = json.dumps(_load(FIXTURES / "synthesis.valid.json"), indent=2)
    text = f"After weighing the positions, here is the synthesis.\n\n```json\n{body}\n```\n\nLet me know."
    check("synthesis", extract_json(text))


# ------------------------------------------------------------------------------------------------ CLI


def test_cli_list_names_every_schema_with_its_title(tmp_path: Path) -> None:
    proc = run_conclave("schemas", "list", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(None, 1) for line in proc.stdout.splitlines())
    assert list(lines) == schema_names()
    assert lines["synthesis"] == get_schema("synthesis")["title"]


def test_cli_show_prints_the_schema(tmp_path: Path) -> None:
    proc = run_conclave("schemas", "show", "verdict", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == get_schema("verdict")


def test_cli_show_strict_prints_the_strict_variant(tmp_path: Path) -> None:
    proc = run_conclave("schemas", "show", "verdict", "--strict", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == strict_variant(get_schema("verdict"))


def test_cli_show_dialect_asks_the_provider_plugin_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    proc = run_conclave("schemas", "show", "verdict", "--dialect", "openai-strict", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == strict_variant(get_schema("verdict"))
    proc = run_conclave("schemas", "show", "verdict", "--dialect", "grpc", home=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "conclave schemas: unknown --dialect 'grpc'; allowed: openai-strict (provider plugins register them)"]


def test_cli_validate_ok(tmp_path: Path) -> None:
    proc = run_conclave("schemas", "validate", "independent", str(FIXTURES / "independent.valid.json"), home=tmp_path)
    assert (proc.returncode, proc.stdout) == (0, "OK\n")


def test_cli_validate_invalid_prints_every_error_with_its_path(tmp_path: Path) -> None:
    fixture = FIXTURES / "synthesis.invalid.camel_case_key.json"
    proc = run_conclave("schemas", "validate", "synthesis", str(fixture), home=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout.splitlines() == [
        "$: Additional properties are not allowed ('consensusPoints' was unexpected)",
        "$: 'consensus_points' is a required property",
    ]


def test_cli_validate_reads_stdin(tmp_path: Path) -> None:
    stdin = json.dumps(_load(FIXTURES / "verdict.invalid.severity_minor.json"))
    proc = run_conclave("schemas", "validate", "verdict", "-", home=tmp_path, stdin=stdin)
    assert proc.returncode == 1
    assert proc.stdout.startswith("$.dissent[0].severity: 'minor' is not one of")


def test_cli_unknown_schema_name_exits_2_naming_the_allowed_ones(tmp_path: Path) -> None:
    proc = run_conclave("schemas", "show", "verdicts", home=tmp_path)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1
    assert "'verdicts'" in proc.stderr and "verdict_explore" in proc.stderr


@pytest.mark.parametrize("content", [None, "{not json", b"\xff\xfe{}"])
def test_cli_unreadable_or_non_json_file_exits_2(tmp_path: Path, content: str | bytes | None) -> None:
    target = tmp_path / "answer.json"
    if isinstance(content, str):
        target.write_text(content)
    elif isinstance(content, bytes):
        target.write_bytes(content)
    proc = run_conclave("schemas", "validate", "verdict", str(target), home=tmp_path)
    assert proc.returncode == 2
    assert len(proc.stderr.splitlines()) == 1
    assert str(target) in proc.stderr


# ------------------------------------------------------------------------------------------------ properties

_TEXT = st.text(st.characters(codec="utf-8"), max_size=30)
_NON_EMPTY = _TEXT.filter(lambda s: re.search(r"\S", s) is not None)
_AGENT = st.from_regex(r"[a-z][a-z0-9-]{0,15}", fullmatch=True)
_CONFIDENCE = st.one_of(st.floats(min_value=0, max_value=1), st.sampled_from([0, 1]))
_ZONES = st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))])
_CREATED_AT = st.datetimes(timezones=_ZONES).map(
    lambda d: d.isoformat(timespec="milliseconds").replace("+00:00", "Z")
)
_STRINGS = st.lists(_TEXT, max_size=3)
_VOTE = {"vote": st.sampled_from(["ACCEPT", "MINOR", "BLOCKER"]), "confidence": _CONFIDENCE}
_DISSENT = st.lists(
    st.fixed_dictionaries({"agent": _AGENT, "concern": _NON_EMPTY, "severity": st.sampled_from(["high", "medium", "low"])}),
    max_size=3,
)


_IDS = st.lists(st.sampled_from(["C1", "C2", "C12"]), max_size=2)
_CLAIMS = st.lists(st.fixed_dictionaries({
    "id": _NON_EMPTY, "text": _NON_EMPTY, "label": st.sampled_from(["FACT", "INFER", "ASSUME"]),
    "citations": st.lists(st.integers(1, 9), max_size=2)}, optional={"supports": _IDS, "opposes": _IDS}), max_size=3)
_REFERENCES = st.lists(st.fixed_dictionaries({"id": st.integers(1, 9), "title": _NON_EMPTY},
                                             optional={"url": _TEXT, "snippet": _TEXT}), max_size=2)
_CLAIMED = {"claims": _CLAIMS, "references": _REFERENCES}  # every agent artifact carries them since 1.1
_EVIDENCE_CLAIMS = st.lists(st.fixed_dictionaries({"evidence": _NON_EMPTY, "claim_ids": _IDS}), max_size=2)


def _artifact(artifact_type: str, round_number: int, fields: dict[str, Any], optional: dict[str, Any] | None = None
              ) -> st.SearchStrategy[dict[str, Any]]:
    header = {
        "artifact_type": st.just(artifact_type), "schema_version": st.just(current_version()),
        "round_number": st.just(round_number), "created_at": _CREATED_AT,
    }
    return st.fixed_dictionaries(header | fields, optional=optional or {})


STRATEGIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "independent": _artifact("independent", 1, {
        "agent_id": _AGENT, "position": _NON_EMPTY, "key_points": st.lists(_NON_EMPTY, min_size=1, max_size=4),
        "rationale": _NON_EMPTY, "confidence": _CONFIDENCE, "prose_excerpt": _TEXT, **_CLAIMED,
    }),
    "synthesis": _artifact("synthesis", 2, {
        "consensus_points": st.lists(st.fixed_dictionaries({
            "point": _NON_EMPTY, "supporting_agents": st.lists(_AGENT, max_size=3), "confidence": _CONFIDENCE,
            "claim_ids": _IDS,
        }), max_size=3),
        "tensions": st.lists(st.fixed_dictionaries({
            "topic": _NON_EMPTY,
            "viewpoints": st.lists(st.fixed_dictionaries({"agent": _AGENT, "viewpoint": _NON_EMPTY}),
                                   min_size=2, max_size=4),
            "claim_ids": _IDS,
        }), max_size=3),
        "priority_order": _STRINGS,
        "partial_coverage": st.lists(st.fixed_dictionaries({
            "point": _NON_EMPTY, "agents": st.lists(_AGENT, max_size=2), "claim_ids": _IDS}), max_size=2),
        "unique_insights": st.lists(st.fixed_dictionaries({
            "agent": _AGENT, "insight": _NON_EMPTY, "claim_ids": _IDS}), max_size=2),
        "blind_spots": _STRINGS,
    }),
    "cross_exam": _artifact("cross_exam", 3, {
        "challenges": st.lists(st.fixed_dictionaries({
            "challenger": _AGENT, "target_agent": _AGENT, "challenge": _NON_EMPTY, "evidence": _STRINGS,
        }), max_size=3),
        "rebuttals": st.lists(st.fixed_dictionaries({"agent": _AGENT, "rebuttal": _NON_EMPTY}), max_size=3),
        "unresolved": _STRINGS,
    }),
    "verdict": _artifact("verdict", 4, {
        "recommendation": _NON_EMPTY, "confidence": _CONFIDENCE,
        "evidence": st.lists(_TEXT, min_size=1, max_size=3), "dissent": _DISSENT,
        "evidence_claims": _EVIDENCE_CLAIMS,
    }, optional={
        "per_agent_contributions": st.lists(st.fixed_dictionaries({
            "agent": _AGENT, "key_insight": _NON_EMPTY, "adopted": st.booleans(),
        }), max_size=3),
    }),
    "verdict_explore": _artifact("verdict", 4, {
        "recommendations": st.lists(st.fixed_dictionaries({
            "option": _NON_EMPTY, "description": _NON_EMPTY, "pros": _STRINGS, "cons": _STRINGS,
            "championed_by": st.lists(_AGENT, max_size=3),
        }, optional={"best_when": _TEXT}), min_size=1, max_size=4),
        "synergies": _STRINGS, "confidence": _CONFIDENCE, "summary": _NON_EMPTY, "evidence_claims": _EVIDENCE_CLAIMS,
    }, optional={"evidence": _STRINGS, "dissent": _DISSENT}),
    "cross_exam_reply": st.fixed_dictionaries({
        "critique": _TEXT,
        "challenges": st.lists(st.fixed_dictionaries({
            "target_agent": _AGENT, "challenge": _NON_EMPTY, "evidence": _STRINGS,
        }), max_size=3),
        "defense": _TEXT, "revised_position": _NON_EMPTY, **_CLAIMED, **_VOTE,
    }, optional={"vote_reason": _TEXT}),
    "cross_exam_reply_explore": st.fixed_dictionaries({
        "extensions": _STRINGS, "bridges": _STRINGS, "gaps": _STRINGS, "refined_position": _NON_EMPTY, **_CLAIMED, **_VOTE,
    }),
    "cross_exam_reply_adversarial": st.fixed_dictionaries({
        "target_agent": _AGENT, "steelman": _NON_EMPTY, "counter_argument": _NON_EMPTY, "rebuttal": _NON_EMPTY,
        "revised_position": _NON_EMPTY, **_CLAIMED, **_VOTE,
    }, optional={"uncertainties": _STRINGS}),
    "cross_exam_reply_devils_advocate": st.fixed_dictionaries({
        "consensus_challenges": st.lists(st.fixed_dictionaries({"consensus_point": _NON_EMPTY,
                                                                "challenge": _NON_EMPTY}), min_size=1, max_size=3),
        "concessions": _STRINGS, "revised_position": _NON_EMPTY, **_CLAIMED, **_VOTE,
    }, optional={"retracts": _STRINGS}),
    "objection": st.fixed_dictionaries({
        "counterargument": st.fixed_dictionaries({"text": _NON_EMPTY, "opposes": _STRINGS}),
        "alternative_hypothesis": st.fixed_dictionaries({"text": _NON_EMPTY}),
        "challenged_assumption": st.fixed_dictionaries({"assumption": _NON_EMPTY, "challenge": _NON_EMPTY,
                                                        "opposes": _STRINGS}),
        "revised_position": _NON_EMPTY, "confidence": _CONFIDENCE,
    }, optional={"retracts": _STRINGS}),
}
STRATEGIES["safety_evaluation"] = st.fixed_dictionaries({
    "artifact_type": st.just("safety_evaluation"), "schema_version": st.just(current_version()), "created_at": _CREATED_AT,
    "verdict": st.sampled_from(["allow", "caution", "block"]), "risk": _CONFIDENCE,
    "categories": st.lists(st.sampled_from(["weapons", "malware", "self_harm", "security", "other"]), unique=True,
                           max_size=3),
    "concerns": _STRINGS, "recommendations": _STRINGS, "reason": _NON_EMPTY,
})
# answer mode: each answer-bearing artifact of converge plus a short final_answer; its agents state uncertainties
# but neither alternatives nor failure modes (U3 and U4 are not asked of one checkable answer)
_NOT_IN_ANSWER = ("alternatives", "failure_modes")


def _answer_body(body: dict[str, Any], answer: str, uncertainties: list[str] | None) -> dict[str, Any]:
    out = {k: v for k, v in body.items() if k not in _NOT_IN_ANSWER} | {"final_answer": answer}
    return out | ({"uncertainties": uncertainties} if uncertainties is not None and "claims" in body else {})


for _base in ("independent", "synthesis", "cross_exam_reply", "verdict"):
    STRATEGIES[f"{_base}_answer"] = st.builds(_answer_body, STRATEGIES[_base], _NON_EMPTY, st.none() | _STRINGS)


def test_there_is_a_strategy_for_every_artifact_schema() -> None:
    assert sorted(STRATEGIES) == ARTIFACTS


@pytest.mark.parametrize("name", ARTIFACTS)
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_generated_artifacts_validate_and_survive_a_json_round_trip(name: str, data: st.DataObject) -> None:
    instance = data.draw(STRATEGIES[name])
    assert validate(name, instance) == []
    again = json.loads(json.dumps(instance))
    assert again == instance
    assert validate(name, again) == []


@pytest.mark.parametrize("name", ["independent", "verdict_explore"])
@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_generated_artifacts_survive_extraction_from_a_chatty_answer(name: str, data: st.DataObject) -> None:
    instance = data.draw(STRATEGIES[name])
    text = f"Here is my answer {{as asked}}:\n```json\n{json.dumps(instance, indent=2)}\n```\nAnything else?"
    assert extract_json(text) == instance



def test_an_answer_leaving_out_a_list_added_in_1_1_reads_as_naming_none() -> None:
    from conclave.engine.extraction import extract, header_for

    body = {"position": "p", "key_points": ["k"], "rationale": "r", "confidence": 0.5, "prose_excerpt": ""}
    done = extract(json.dumps(body), None, "independent", header_for("independent", 1, "architect"))
    assert done.ok and done.artifact is not None
    assert done.artifact["claims"] == [] and done.artifact["references"] == []
    assert done.artifact["schema_version"] == current_version() == "1.1"
    # any other missing field still fails and is quoted back in the re-ask
    without = {k: v for k, v in body.items() if k != "key_points"}
    failed = extract(json.dumps(without), None, "independent", header_for("independent", 1, "architect"))
    assert not failed.ok and failed.errors == ("$: 'key_points' is a required property",)


def test_a_stored_1_0_artifact_upgrades_to_the_current_version_and_nothing_else_changes() -> None:
    from conclave.artifacts.schema_registry import upgrade

    old = _load(FIXTURES / "synthesis.valid.json") | {"schema_version": "1.0"}
    for key in ("partial_coverage", "unique_insights", "blind_spots"):
        old.pop(key, None)
    for item in old["consensus_points"] + old["tensions"]:
        item.pop("claim_ids", None)
    new = upgrade("synthesis", old)
    assert validate("synthesis", new) == [] and new["schema_version"] == current_version()
    assert new["partial_coverage"] == [] and all(p["claim_ids"] == [] for p in new["consensus_points"])
    assert {k: v for k, v in new.items() if k not in ("partial_coverage", "unique_insights", "blind_spots",
                                                      "consensus_points", "tensions", "schema_version")} == \
        {k: v for k, v in old.items() if k not in ("consensus_points", "tensions", "schema_version")}
    assert "partial_coverage" not in old  # the input is not modified
    assert upgrade("synthesis", new) is new  # a current artifact is returned as is
