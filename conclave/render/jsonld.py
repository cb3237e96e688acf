"""The result as JSON-LD: every key of the result plus an inline ``@context``, ``@type`` and ``@id``.

Unmapped terms fall into the conclave vocabulary (``@vocab``); a few map to schema.org. Maps keyed by data
(agent names, round names, secret types) are JSON literals (``@json``) so a JSON-LD processor does not read
their keys as properties.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.cli.panel import TOY_BANNER, TOY_DETAIL, is_toy_result

VOCABULARY = "https://conclave.dev/ns#"

CONTEXT: dict[str, Any] = {
    "@version": 1.1,
    "@vocab": VOCABULARY,
    "conclave": VOCABULARY,
    "schema": "https://schema.org/",
    "xsd": "http://www.w3.org/2001/XMLSchema#",
    "consultation_id": "schema:identifier",
    "question": "schema:text",
    "schema_version": "schema:schemaVersion",
    "created_at": {"@id": "schema:dateCreated", "@type": "xsd:dateTime"},
    "completed_at": {"@id": "schema:endTime", "@type": "xsd:dateTime"},
    "recommendation": "schema:result",
    "parent": "schema:isBasedOn",
    "artifacts": {"@type": "@json"},
    "judge_labels": {"@type": "@json"},
    "prompt_versions": {"@type": "@json"},
    "by_provider": {"@type": "@json"},
    "by_type": {"@type": "@json"},
}


def to_jsonld(result: Mapping[str, Any]) -> dict[str, Any]:
    """``result`` unchanged, preceded by ``@context``, ``@type`` ``conclave:Consultation`` and ``@id``, and by a
    ``notice`` when the toy offline panel answered (:func:`conclave.cli.panel.is_toy_result`)."""
    notice = {"notice": f"{TOY_BANNER} {TOY_DETAIL}"} if is_toy_result(result) else {}
    return {
        "@context": CONTEXT,
        "@type": "conclave:Consultation",
        "@id": f"urn:conclave:{result.get('consultation_id')}",
        **notice,
        **result,
    }


__all__ = ["CONTEXT", "VOCABULARY", "to_jsonld"]
