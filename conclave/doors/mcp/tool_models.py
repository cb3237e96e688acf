"""Output models of the MCP tools. The verdict field carries the verdict artifact schemas themselves, inlined so a
client can validate structured content without fetching anything."""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, WithJsonSchema

from conclave.artifacts import schema_registry as artifacts

Status = Literal["complete", "completed_degraded", "partial", "aborted", "blocked"]


def inlined_schema(name: str) -> dict[str, Any]:
    """Artifact schema ``name`` with every ``$ref`` to the shared definitions replaced by the definition itself."""
    common = artifacts.get_schema("common")["$defs"]

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and "#/$defs/" in ref:
                target = resolve(copy.deepcopy(common[ref.rsplit("/", 1)[1]]))
                rest = {k: resolve(v) for k, v in node.items() if k != "$ref"}
                return {**target, **rest}
            return {k: resolve(v) for k, v in node.items() if k not in ("$id", "$schema")}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    schema = resolve(copy.deepcopy(artifacts.get_schema(name)))
    assert isinstance(schema, dict)
    return schema


def _verdict_schema() -> dict[str, Any]:
    return {"anyOf": [inlined_schema("verdict"), inlined_schema("verdict_explore"), {"type": "null"}],
            "description": "The verdict artifact (converge: one recommendation; explore: a menu of options); null "
                           "when the consultation stopped before one existed."}


class ConsultOutput(BaseModel):
    """The outcome of one consultation (``conclave_consult`` and ``conclave_resume``)."""

    consultation_id: str = Field(description="Id for conclave_show, conclave_resume, conclave_export_record.")
    status: Status = Field(description="complete | completed_degraded | partial | aborted | blocked (the safety "
                                        "evaluator stopped it; abort_reason says why)")
    question: str
    mode: str
    planned_rounds: int
    completed_rounds: int
    recommendation: str | None = Field(description="The verdict's recommendation (or summary, in explore mode).")
    confidence: float | None
    verdict: Annotated[dict[str, Any] | None, WithJsonSchema(_verdict_schema())]
    dissent: list[dict[str, Any]]
    concerns: list[str]
    cost: dict[str, Any] = Field(description="estimated, actual (dollars, every run included), by_provider.")
    tokens: dict[str, Any]
    duration_s: float
    abort_reason: str | None
    resumable: bool = Field(description="True when conclave_resume can continue it (partial or aborted).")


# Nullable columns as one ``type`` list rather than pydantic's ``anyOf``: the official Python client re-checks a
# tool's output schema against the meta-schema on every call, at a cost that grows with the number of nodes.
OptStr = Annotated[str | None, WithJsonSchema({"type": ["string", "null"]})]
OptInt = Annotated[int | None, WithJsonSchema({"type": ["integer", "null"]})]
OptFloat = Annotated[float | None, WithJsonSchema({"type": ["number", "null"]})]


class SessionRow(BaseModel):
    """One consultation as the index has it; ``origin`` is mcp for MCP runs, null for the CLI and library."""

    id: str
    started_at: OptStr
    status: OptStr
    mode: OptStr
    question: OptStr
    rounds_completed: OptInt
    planned_rounds: OptInt
    total_cost: OptFloat
    total_tokens: OptInt
    confidence: OptFloat
    recommendation: OptStr
    origin: OptStr
    client_name: OptStr


class SessionsOutput(BaseModel):
    sessions: list[SessionRow]


class VerifyOutput(BaseModel):
    ok: bool
    journals: int
    records: int
    problems: list[str] = Field(description="One line per journal that failed: the first bad record and why.")
    torn: list[str] = Field(description="Consultations whose last write was cut short by a crash (resumable).")


class ExportOutput(BaseModel):
    format: Literal["markdown", "html", "json", "pdf"]
    record: dict[str, Any] = Field(description="The audit record as JSON, whatever format was asked for.")


class EvalOutput(BaseModel):
    """conclave_eval's structured answer (the report itself is the text part)."""

    run_id: str = Field(description="The evaluation run (conclave eval report RUN; run_id resumes it).")
    exit_code: int = Field(description="conclave eval's exit code: 0 when every item ran.")
    ok: bool
