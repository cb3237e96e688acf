"""An offline provider that answers any request with an instance of the requested JSON Schema.

It makes no network call: answers are derived deterministically from the schema and the last message, which is
enough to drive a whole consultation in a dry run.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from conclave.providers.base import Completion, CompletionRequest, Provider, Usage


class EchoProvider(Provider):
    supports_structured_output = True

    async def attempt(self, request: CompletionRequest) -> Completion:
        started = time.perf_counter()
        prompt = request.messages[-1].content if request.messages else ""
        seed = hashlib.sha256(prompt.encode()).hexdigest()[:8]
        parsed = _instance(dict(request.json_schema), dict(request.json_schema), f"echo {seed}") \
            if request.json_schema else None
        text = json.dumps(parsed) if parsed is not None else f"echo {seed}: {prompt[:80]}"
        return Completion(
            text=text, parsed=parsed, usage=Usage(len(prompt.split()), len(text.split())),
            model=request.model, provider=self.name, finish_reason="stop",
            latency_s=time.perf_counter() - started,
        )


def _instance(node: dict[str, Any], root: dict[str, Any], word: str) -> Any:
    if "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return _instance(target, root, word)
    if "const" in node:
        return node["const"]
    if "enum" in node:
        return node["enum"][0]
    for key in ("anyOf", "oneOf"):
        if key in node:
            options = [o for o in node[key] if o.get("type") != "null"] or node[key]
            return _instance(options[0], root, word)
    kind = node.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = node.get("properties", {})
        return {key: _instance(props[key], root, word) for key in node.get("required", props)}
    if kind == "array":
        return [_instance(node.get("items", {"type": "string"}), root, word)
                for _ in range(max(1, node.get("minItems", 1)))]
    if kind in ("number", "integer"):
        low = node.get("minimum", 0)
        high = node.get("maximum", low + 1)
        return high if kind == "number" and high <= 1 else low
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    if node.get("format") == "date-time":
        return "2026-01-01T00:00:00.000Z"
    return word
