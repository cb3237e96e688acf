"""The fake provider server on its own, spoken to with plain aiohttp: scripting, schemas, faults, recording."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import jsonschema
import pytest

from conclave.artifacts import schema_registry as artifacts
from conclave.engine.extraction import request_schema
from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest, Reply
from conclave.testing.schema_instances import instance_for

RICH_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "point": {
            "type": "object",
            "properties": {
                "text": {"type": "string", "minLength": 20},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "supporting_agents": {"type": "array", "items": {"type": "string"}, "minItems": 2,
                                      "uniqueItems": True},
            },
            "required": ["text", "confidence", "supporting_agents"],
            "additionalProperties": False,
        },
    },
    "properties": {
        "schema_version": {"const": "1.0"},
        "artifact_type": {"type": "string", "enum": ["synthesis"]},
        "created_at": {"type": "string", "format": "date-time"},
        "rounds": {"type": "integer", "exclusiveMinimum": 0, "maximum": 4},
        "score": {"type": "number", "multipleOf": 0.25, "minimum": 0.3, "maximum": 0.9},
        "consensus_points": {"type": "array", "items": {"$ref": "#/$defs/point"}, "minItems": 3, "maxItems": 5},
        "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 5}]},
        "mixed": {"allOf": [{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
                            {"properties": {"b": {"type": ["integer", "null"]}}, "required": ["b"]}]},
        "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "minItems": 2},
    },
    "required": ["schema_version", "artifact_type", "created_at", "rounds", "consensus_points", "mixed"],
    "additionalProperties": False,
}


def _validate(instance: Any, schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    errors = [e.message for e in validator.iter_errors(instance)]
    assert errors == []


# ------------------------------------------------------------------------------------- schema instances


def test_generated_instance_is_valid_against_a_rich_schema():
    instance = instance_for(RICH_SCHEMA)
    _validate(instance, RICH_SCHEMA)
    assert len(instance["consensus_points"]) == 3
    assert instance["created_at"] == "2026-01-01T00:00:00Z"


def test_generated_instance_accepts_gemini_style_upper_case_types():
    schema = {"type": "OBJECT", "properties": {"n": {"type": "INTEGER", "minimum": 5}}, "required": ["n"]}
    assert instance_for(schema) == {"n": 5}


@pytest.mark.parametrize("name", [n for n in artifacts.schema_names() if n != "common"])
def test_an_unscripted_model_answers_every_artifact_schema_validly(name):
    # what the engine sends (refs inlined) is all the fake sees; the answer must pass the schema file itself
    assert artifacts.validate(name, instance_for(request_schema(name))) == []


# ------------------------------------------------------------------------------------- scripting


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> tuple[int, Any, dict[str, str]]:
    async with session.post(url, json=body, headers=headers or {}) as resp:
        raw = await resp.read()
        try:
            payload: Any = json.loads(raw)
        except ValueError:
            payload = raw
        return resp.status, payload, dict(resp.headers)


def _chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


async def test_unscripted_model_answers_from_the_request_schema(fake_provider_server):
    fake = fake_provider_server
    body = _chat("gpt-4o", response_format={"type": "json_schema",
                                            "json_schema": {"name": "s", "schema": RICH_SCHEMA, "strict": True}})
    async with aiohttp.ClientSession() as session:
        status, payload, _ = await _post(session, fake.base_url("openai") + "/chat/completions", body)
        _, plain, _ = await _post(session, fake.base_url("openai") + "/chat/completions", _chat("gpt-4o"))
    assert status == 200
    _validate(json.loads(payload["choices"][0]["message"]["content"]), RICH_SCHEMA)
    assert fake.requests[0].schema == RICH_SCHEMA
    assert "gpt-4o" in plain["choices"][0]["message"]["content"]


async def test_a_sequence_answers_in_order_and_its_last_item_repeats(fake_provider_server):
    fake = fake_provider_server
    fake.script("m", [Reply(text="one"), Fault.server_error(502), Reply(text="three")])
    url = fake.base_url("openai") + "/chat/completions"
    async with aiohttp.ClientSession() as session:
        results = [await _post(session, url, _chat("m")) for _ in range(5)]
    assert [status for status, _, _ in results] == [200, 502, 200, 200, 200]
    assert [p["choices"][0]["message"]["content"] for s, p, _ in results if s == 200] == ["one", "three", "three",
                                                                                         "three"]
    assert len(fake.requests_for("m")) == 5


async def test_a_function_script_sees_the_recorded_request(fake_provider_server):
    fake = fake_provider_server
    seen: list[RecordedRequest] = []

    def answer(request: RecordedRequest) -> Reply:
        seen.append(request)
        return Reply(text=request.json["messages"][0]["content"].upper())

    fake.script("echo", answer)
    async with aiohttp.ClientSession() as session:
        _, payload, _ = await _post(session, fake.base_url("openai") + "/chat/completions", _chat("echo"))
    assert payload["choices"][0]["message"]["content"] == "HI"
    assert seen[0].api == "openai" and seen[0].path == "/openai/v1/chat/completions"


def test_script_rejects_what_is_not_a_reply_or_fault():
    with pytest.raises(TypeError):
        FakeProviderServer().script("m", "just a string")


async def test_latency_may_be_a_distribution(fake_provider_server):
    fake = fake_provider_server
    fake.script("slow", Reply(text="x", latency=lambda rng: 0.1 + rng.random() * 0.05))
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as session:
        started = loop.time()
        await _post(session, fake.base_url("openai") + "/chat/completions", _chat("slow"))
    assert 0.1 <= loop.time() - started < 0.5


# ------------------------------------------------------------------------------------- recording


async def test_auth_headers_and_key_query_are_redacted(fake_provider_server):
    fake = fake_provider_server
    async with aiohttp.ClientSession() as session:
        await _post(session, fake.base_url("openai") + "/chat/completions", _chat("m"),
                    {"Authorization": "Bearer sk-secret"})
        await _post(session, fake.base_url("anthropic") + "/v1/messages", _chat("c", max_tokens=5),
                    {"x-api-key": "sk-ant-secret"})
        await _post(session, fake.base_url("gemini") + "/models/g:generateContent?key=gem-secret",
                    {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}, {"x-goog-api-key": "gem-secret"})
    assert fake.requests[0].headers["Authorization"] == "<redacted>"
    assert fake.requests[1].headers["x-api-key"] == "<redacted>"
    assert fake.requests[2].headers["x-goog-api-key"] == "<redacted>"
    assert fake.requests[2].query == {"key": "<redacted>"}
    assert [r.model for r in fake.requests] == ["m", "c", "g"]
    assert "secret" not in repr(fake.requests)


async def test_models_lists_include_scripted_models(fake_provider_server):
    fake = fake_provider_server
    fake.script("my-model", Reply(text="x"))
    async with aiohttp.ClientSession() as session:
        async with session.get(fake.base_url("openai") + "/models") as resp:
            openai_ids = [m["id"] for m in (await resp.json())["data"]]
        async with session.get(fake.base_url("anthropic") + "/v1/models") as resp:
            anthropic_ids = [m["id"] for m in (await resp.json())["data"]]
        async with session.get(fake.base_url("gemini") + "/models") as resp:
            gemini_names = [m["name"] for m in (await resp.json())["models"]]
    assert "gpt-4o" in openai_ids and "my-model" in openai_ids
    assert "claude-sonnet-4-6" in anthropic_ids
    assert "models/gemini-2.5-pro" in gemini_names


async def test_keys_option_rejects_other_keys_in_each_apis_format():
    async with FakeProviderServer(keys={"anthropic": "right", "gemini": "right"}) as fake, \
            aiohttp.ClientSession() as session:
        messages = fake.base_url("anthropic") + "/v1/messages"
        wrong = await _post(session, messages, _chat("c"), {"x-api-key": "wrong"})
        right = await _post(session, messages, _chat("c"), {"x-api-key": "right"})
        gemini = await _post(session, fake.base_url("gemini") + "/models/g:generateContent", {"contents": []},
                             {"x-goog-api-key": "wrong"})
    assert (wrong[0], wrong[1]["error"]["type"]) == (401, "authentication_error")
    assert right[0] == 200
    assert (gemini[0], gemini[1]["error"]["status"]) == (400, "INVALID_ARGUMENT")


# ------------------------------------------------------------------------------------- faults


async def test_rate_limit_and_overload_faults_use_each_apis_status_and_headers(fake_provider_server):
    fake = fake_provider_server
    fake.script("limited", Fault.rate_limited(retry_after=2))
    fake.script("busy", Fault.overloaded())
    async with aiohttp.ClientSession() as session:
        limited = await _post(session, fake.base_url("openai") + "/chat/completions", _chat("limited"))
        busy_openai = await _post(session, fake.base_url("openai") + "/chat/completions", _chat("busy"))
        busy_anthropic = await _post(session, fake.base_url("anthropic") + "/v1/messages", _chat("busy"))
    assert limited[0] == 429 and limited[2]["Retry-After"] == "2"
    assert busy_openai[0] == 503
    assert (busy_anthropic[0], busy_anthropic[1]["error"]["type"]) == (529, "overloaded_error")


async def test_malformed_and_truncated_bodies_are_not_json(fake_provider_server):
    fake = fake_provider_server
    fake.script("bad", [Fault.malformed(), Fault.truncated_stream()])
    async with aiohttp.ClientSession() as session:
        first = await _post(session, fake.base_url("openai") + "/chat/completions", _chat("bad"))
        second = await _post(session, fake.base_url("openai") + "/chat/completions", _chat("bad"))
    assert first[0] == second[0] == 200
    assert isinstance(first[1], bytes) and isinstance(second[1], bytes)


async def test_truncated_stream_stops_before_its_terminator(fake_provider_server):
    fake = fake_provider_server
    fake.script("cut", [Fault.truncated_stream(), Reply(text="whole answer")])
    url = fake.base_url("openai") + "/chat/completions"
    body = _chat("cut", stream=True, stream_options={"include_usage": True})
    async with aiohttp.ClientSession() as session:
        streams = []
        for _ in range(2):
            async with session.post(url, json=body) as resp:
                streams.append((await resp.read()).decode())
    assert "[DONE]" not in streams[0]
    assert streams[1].rstrip().endswith("data: [DONE]") and '"usage"' in streams[1]


async def test_reset_drops_the_connection(fake_provider_server):
    fake = fake_provider_server
    fake.script("gone", Fault.reset())
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            await _post(session, fake.base_url("openai") + "/chat/completions", _chat("gone"))


async def test_hang_is_released_when_the_client_gives_up(fake_provider_server):
    fake = fake_provider_server
    fake.script("stuck", Fault.hang())
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.1)) as session:
        with pytest.raises(TimeoutError):
            await _post(session, fake.base_url("openai") + "/chat/completions", _chat("stuck"))
    for _ in range(100):
        if fake.requests_for("stuck")[0].disconnected:
            break
        await asyncio.sleep(0.01)
    assert fake.requests_for("stuck")[0].disconnected


async def test_anthropic_streams_tool_input_as_json_deltas(fake_provider_server):
    fake = fake_provider_server
    fake.script("claude-x", Reply(json={"a": 1}))
    body = {"model": "claude-x", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "q"}],
            "tools": [{"name": "answer", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "answer"}}
    async with aiohttp.ClientSession() as session, \
            session.post(fake.base_url("anthropic") + "/v1/messages", json=body) as resp:
        text = (await resp.read()).decode()
    events = [line.removeprefix("event: ") for line in text.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "input_json_delta" in text and '"name": "answer"' in text
