"""The three built-in providers against the fake server: wire bodies, answers, streaming, errors, key hygiene."""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import replace
from typing import Any

import pytest

from conclave import artifacts
from conclave.config import ProviderSettings
from conclave.engine.extraction import request_schema
from conclave.plugins import load_plugins
from conclave.providers.base import (
    AuthError,
    BadRequestError,
    CompletionRequest,
    ConnectionFailedError,
    MalformedResponseError,
    Message,
    MissingKeyError,
    ModelNotFoundError,
    OverloadedError,
    ProviderError,
    ProviderTimeoutError,
    RateLimitedError,
    ServerError,
)
from conclave.providers.pool import ProviderPool
from conclave.testing.fake_server import FakeProviderServer, Fault, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"position": {"type": "string"}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["position", "confidence"],
    "additionalProperties": False,
}
ANSWER = {"position": "adopt event sourcing for billing", "confidence": 0.8}
MODELS = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-5", "gemini": "gemini-2.5-pro"}


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai,anthropic,gemini")
    return load_plugins()


def _request(model: str, *, schema: bool = True, **kw: Any) -> CompletionRequest:
    return CompletionRequest(
        model=model,
        system="You are the security reviewer.",
        messages=(Message("user", "Should we move billing to event sourcing?"),),
        json_schema=SCHEMA if schema else None,
        schema_name="independent_opinion" if schema else None,
        **kw,
    )


def _single_attempt(fake: FakeProviderServer) -> dict[str, Any]:
    providers = fake.providers_config()
    for entry in providers.values():
        entry["max_attempts"] = 1
    return providers


async def _complete(fake: FakeProviderServer, plugins: Any, provider: str, request: CompletionRequest,
                    **settings: Any) -> Any:
    settings.setdefault("hedging", {"enabled": False})
    async with ProviderPool(fake.settings(**settings), plugins) as pool:
        return await pool.complete(agent="security", provider=provider, request=request, round_number=1,
                                   allow_substitution=False)


# ------------------------------------------------------------------------------------- request bodies


async def test_openai_sends_strict_json_schema_response_format(fake_provider_server, conclave_env, plugins):
    await _complete(fake_provider_server, plugins, "openai", _request("gpt-4o"))
    sent = fake_provider_server.requests_for("gpt-4o")[0]
    assert sent.path == "/openai/v1/chat/completions"
    assert sent.headers["Authorization"] == "<redacted>"
    assert sent.json == {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are the security reviewer."},
            {"role": "user", "content": "Should we move billing to event sourcing?"},
        ],
        "max_tokens": 2048,
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "independent_opinion",
                # strict mode's dialect: keywords it rejects (minimum, maximum) move into the description; the
                # answer is still validated against the full schema later
                "schema": {
                    "type": "object",
                    "properties": {
                        "position": {"type": "string"},
                        "confidence": {"type": "number",
                                       "description": 'Constraints: {"minimum": 0, "maximum": 1}'},
                    },
                    "required": ["position", "confidence"],
                    "additionalProperties": False,
                },
                "strict": True,
            },
        },
    }


async def test_openai_strict_mode_makes_optionals_nullable_and_drops_their_nulls(fake_provider_server,
                                                                               conclave_env, plugins):
    schema = {"type": "object", "properties": {"position": {"type": "string"}, "caveat": {"type": "string"}},
              "required": ["position"], "additionalProperties": False}
    fake_provider_server.script("gpt-4o", Reply(json={"position": "yes", "caveat": None}))
    request = replace(_request("gpt-4o"), json_schema=schema)
    completion = await _complete(fake_provider_server, plugins, "openai", request)
    sent = fake_provider_server.requests_for("gpt-4o")[0].json["response_format"]["json_schema"]["schema"]
    assert sent["required"] == ["position", "caveat"]
    assert sent["properties"]["caveat"] == {"type": ["string", "null"]}
    assert completion.parsed == {"position": "yes"}
    assert json.loads(completion.text) == {"position": "yes", "caveat": None}  # the raw answer is kept as sent


async def test_anthropic_forces_one_tool_whose_input_schema_is_the_artifact(fake_provider_server, conclave_env,
                                                                            plugins):
    await _complete(fake_provider_server, plugins, "anthropic", _request("claude-sonnet-4-5", temperature=0.2))
    sent = fake_provider_server.requests_for("claude-sonnet-4-5")[0]
    assert sent.path == "/anthropic/v1/messages"
    assert sent.headers["x-api-key"] == "<redacted>"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    tool = sent.json["tools"][0]
    assert sent.json == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 2048,
        "system": "You are the security reviewer.",
        "messages": [{"role": "user", "content": "Should we move billing to event sourcing?"}],
        "temperature": 0.2,
        "tools": [{"name": "independent_opinion", "description": tool["description"], "input_schema": SCHEMA}],
        "tool_choice": {"type": "tool", "name": "independent_opinion"},
    }


async def test_gemini_sends_system_instruction_and_response_json_schema(fake_provider_server, conclave_env, plugins):
    await _complete(fake_provider_server, plugins, "gemini", _request("gemini-2.5-pro"))
    sent = fake_provider_server.requests_for("gemini-2.5-pro")[0]
    assert sent.path == "/gemini/v1beta/models/gemini-2.5-pro:generateContent"
    assert sent.headers["x-goog-api-key"] == "<redacted>"
    assert "key" not in sent.query
    assert sent.json == {
        "contents": [{"role": "user", "parts": [{"text": "Should we move billing to event sourcing?"}]}],
        "systemInstruction": {"parts": [{"text": "You are the security reviewer."}]},
        "generationConfig": {
            "maxOutputTokens": 2048,
            "responseMimeType": "application/json",
            "responseJsonSchema": SCHEMA,
        },
    }


def test_openai_uses_max_completion_tokens_on_the_official_endpoint(plugins):
    cls = plugins.providers.get("openai")
    official = cls("openai", ProviderSettings(api="openai"), None, environ={})
    local = cls("ollama", ProviderSettings(api="openai", base_url="http://localhost:11434/v1"), None, environ={})
    request = _request("gpt-5", schema=False, max_tokens=99)
    assert official.body(request, stream=False)["max_completion_tokens"] == 99
    assert local.body(request, stream=False)["max_tokens"] == 99


# ------------------------------------------------------------------------------------- answers


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
async def test_structured_answer_is_parsed_with_usage_model_and_finish(fake_provider_server, conclave_env, plugins,
                                                                       provider):
    model = MODELS[provider]
    fake_provider_server.script(model, Reply(json=ANSWER, usage=(1200, 300, 1000), model=f"{model}-20260101"))
    completion = await _complete(fake_provider_server, plugins, provider, _request(model))
    assert completion.parsed == ANSWER
    assert json.loads(completion.text) == ANSWER
    assert (completion.usage.input_tokens, completion.usage.output_tokens,
            completion.usage.cached_input_tokens) == (1200, 300, 1000)
    assert completion.model == f"{model}-20260101"
    assert completion.provider == provider
    assert completion.finish_reason in {"stop", "tool_use", "STOP"}
    assert [a.outcome for a in completion.attempts] == ["ok"]


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
async def test_text_answer_without_schema_is_not_parsed(fake_provider_server, conclave_env, plugins, provider):
    model = MODELS[provider]
    fake_provider_server.script(model, Reply(text="Plain words, no JSON."))
    completion = await _complete(fake_provider_server, plugins, provider, _request(model, schema=False))
    assert completion.text == "Plain words, no JSON."
    assert completion.parsed is None


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
async def test_streaming_yields_chunks_and_ends_with_the_same_completion(fake_provider_server, conclave_env, plugins,
                                                                          provider):
    model = MODELS[provider]
    fake_provider_server.script(model, Reply(json=ANSWER, usage=(50, 20, 10)))
    chunks: list[str] = []
    async with ProviderPool(fake_provider_server.settings(hedging={"enabled": False}), plugins) as pool:
        completion = await pool.complete(agent="security", provider=provider, request=_request(model),
                                         round_number=1, on_chunk=chunks.append)
    sent = fake_provider_server.requests_for(model)[0]
    assert sent.stream
    assert len(chunks) > 1
    assert json.loads("".join(chunks)) == ANSWER
    assert completion.parsed == ANSWER
    assert (completion.usage.input_tokens, completion.usage.output_tokens,
            completion.usage.cached_input_tokens) == (50, 20, 10)
    if provider == "openai":
        assert sent.json["stream_options"] == {"include_usage": True}
    if provider == "gemini":
        assert sent.path.endswith(":streamGenerateContent") and sent.query == {"alt": "sse"}


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("name", [n for n in artifacts.schema_names() if n != "common"])
async def test_unscripted_answers_to_every_artifact_schema_validate(fake_provider_server, conclave_env, plugins,
                                                                    provider, name):
    # what the engine sends, through each provider's dialect, to a model that follows the schema it was shown
    request = replace(_request(MODELS[provider]), json_schema=request_schema(name), schema_name=name)
    completion = await _complete(fake_provider_server, plugins, provider, request)
    assert completion.parsed is not None
    assert artifacts.validate(name, completion.parsed) == []


# ------------------------------------------------------------------------------------- errors


ERROR_CASES = [
    (Fault.rate_limited(retry_after=7), RateLimitedError, 429),
    (Fault.server_error(500), ServerError, 500),
    (Fault.overloaded(), OverloadedError, None),
    (Fault.unknown_model(), ModelNotFoundError, 404),
    (Fault.bad_request("response_format.schema: 'minimum' is not permitted"), BadRequestError, 400),
    (Fault.reset(), ConnectionFailedError, None),
    (Fault.malformed(), MalformedResponseError, None),
    (Fault.truncated_stream(), MalformedResponseError, None),
]


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize(("fault", "error", "status"), ERROR_CASES,
                         ids=["429", "500", "overloaded", "404", "400", "reset", "malformed", "truncated"])
async def test_each_failure_maps_to_its_typed_error(fake_provider_server, conclave_env, plugins, provider, fault,
                                                    error, status):
    model = MODELS[provider]
    fake_provider_server.script(model, fault)
    with pytest.raises(error) as caught:
        await _complete(fake_provider_server, plugins, provider, _request(model),
                        providers=_single_attempt(fake_provider_server))
    assert caught.value.provider == provider
    assert caught.value.status == (status if status else caught.value.status)
    if isinstance(caught.value, RateLimitedError):
        assert caught.value.retry_after_s == 7
    if isinstance(caught.value, BadRequestError):
        assert "'minimum' is not permitted" in str(caught.value)
    if isinstance(caught.value, OverloadedError):
        assert caught.value.status == (529 if provider == "anthropic" else 503)


@pytest.mark.parametrize("streaming", [False, True])
async def test_truncated_or_malformed_stream_is_a_malformed_answer(fake_provider_server, conclave_env, plugins,
                                                                    streaming):
    fake_provider_server.script("gpt-4o", Fault.truncated_stream())
    async with ProviderPool(fake_provider_server.settings(hedging={"enabled": False},
                                                          providers=_single_attempt(fake_provider_server)),
                            plugins) as pool:
        with pytest.raises(MalformedResponseError, match=r"truncated|not a JSON object"):
            await pool.complete(agent="a", provider="openai", request=_request("gpt-4o"), round_number=1,
                                on_chunk=(lambda _text: None) if streaming else None, allow_substitution=False)


@pytest.mark.parametrize(("provider", "variable"), [("openai", "OPENAI_API_KEY"), ("anthropic", "ANTHROPIC_API_KEY"),
                                                    ("gemini", "GEMINI_API_KEY"), ("grok", "XAI_API_KEY")])
async def test_rejected_key_names_the_variable_never_the_key(conclave_env, plugins, provider, variable):
    api = "openai" if provider == "grok" else provider
    async with FakeProviderServer(keys={api: "the-only-valid-key"}) as fake:
        model = "grok-4" if provider == "grok" else MODELS[provider]
        with pytest.raises(AuthError) as caught:
            await _complete(fake, plugins, provider, _request(model))
    assert str(caught.value).startswith(f"{variable} was rejected by {provider}")
    assert FAKE_KEYS[variable] not in str(caught.value)
    assert len(fake.requests) == 1  # auth errors are never retried


async def test_each_configured_instance_sends_its_own_key(conclave_env, plugins):
    # grok and mistral are openai-api instances; the fake accepts only XAI's key on its openai endpoint
    async with FakeProviderServer(keys={"openai": FAKE_KEYS["XAI_API_KEY"]}) as fake:
        completion = await _complete(fake, plugins, "grok", _request("grok-4"))
        assert completion.provider == "grok"
        with pytest.raises(AuthError, match="MISTRAL_API_KEY was rejected"):
            await _complete(fake, plugins, "mistral", _request("mistral-large-latest"))


async def test_hung_endpoint_times_out_at_the_call_deadline(fake_provider_server, conclave_env, plugins):
    fake_provider_server.script("gpt-4o", Fault.hang())
    with pytest.raises(ProviderTimeoutError, match="deadline"):
        await _complete(fake_provider_server, plugins, "openai", _request("gpt-4o", timeout_s=0.2))
    assert len(fake_provider_server.requests_for("gpt-4o")) == 1  # no time was left for a retry


async def test_unreachable_endpoint_is_a_connection_error(conclave_env, plugins):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with FakeProviderServer() as fake:
        providers = _single_attempt(fake)
        providers["openai"]["base_url"] = f"http://127.0.0.1:{port}/v1"
        with pytest.raises(ConnectionFailedError, match=f"cannot reach openai at 127.0.0.1:{port}"):
            await _complete(fake, plugins, "openai", _request("gpt-4o"), providers=providers)


# ------------------------------------------------------------------------------------- keys and endpoints


async def test_local_endpoint_without_a_key_gets_no_authorization_header(fake_provider_server, conclave_env, plugins,
                                                                        monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    completion = await _complete(fake_provider_server, plugins, "openai", _request("llama3.2", schema=False))
    assert completion.text
    assert "Authorization" not in fake_provider_server.requests_for("llama3.2")[0].headers


async def test_official_endpoint_without_a_key_fails_before_any_request(conclave_env, plugins, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    async with FakeProviderServer() as fake:
        providers = fake.providers_config()
        providers["anthropic"]["base_url"] = "https://api.anthropic.com"
        async with ProviderPool(fake.settings(providers=providers), plugins) as pool:
            assert not pool.has_key("anthropic")
            with pytest.raises(MissingKeyError, match="set ANTHROPIC_API_KEY"):
                await pool.complete(agent="a", provider="anthropic", request=_request("claude-sonnet-4-5"),
                                    round_number=1)


async def test_bare_openai_provider_honours_openai_base_url(fake_provider_server, conclave_env, plugins):
    providers = fake_provider_server.providers_config()
    del providers["openai"]  # "openai" is then the registered provider with its defaults
    settings = fake_provider_server.settings(providers=providers, hedging={"enabled": False})
    environ = {"OPENAI_BASE_URL": fake_provider_server.base_url("openai"), **FAKE_KEYS}
    async with ProviderPool(settings, plugins, environ=environ) as pool:
        completion = await pool.complete(agent="a", provider="openai", request=_request("gpt-4o"), round_number=1)
    assert completion.provider == "openai"
    assert fake_provider_server.requests_for("gpt-4o")


async def test_the_key_never_appears_in_logs_errors_attempts_or_recorded_headers(fake_provider_server, conclave_env,
                                                                                plugins, caplog):
    caplog.set_level(logging.DEBUG)
    key = FAKE_KEYS["OPENAI_API_KEY"]
    fake = fake_provider_server
    fake.script("gpt-4o", [Fault.http(400, f"Invalid 'messages' near {key}"), Fault.auth_rejected(),
                           Fault.rate_limited(retry_after=0), Reply(text="fine")])
    texts: list[str] = []
    async with ProviderPool(fake.settings(hedging={"enabled": False}), plugins) as pool:
        for _ in range(2):
            with pytest.raises(ProviderError) as caught:
                await pool.complete(agent="a", provider="openai", request=_request("gpt-4o"), round_number=1)
            texts += [str(caught.value), repr(caught.value), *getattr(caught.value, "__notes__", [])]
        await pool.complete(agent="a", provider="openai", request=_request("gpt-4o"), round_number=1)
        texts += [repr(a) for a in pool.attempts]
    assert "<redacted>" in texts[0]  # the provider echoed the key; we passed its message on without it
    texts += [caplog.text, repr(fake.requests)]
    for text in texts:
        assert key not in text
