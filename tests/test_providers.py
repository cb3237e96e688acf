"""The three built-in providers against the fake server: wire bodies, answers, streaming, errors, key hygiene."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import sys
from dataclasses import replace
from typing import Any

import aiohttp
import pytest

from conclave.artifacts import schema_registry as artifacts
from conclave.config.settings import ProviderSettings
from conclave.engine.extraction import request_schema
from conclave.plugin_manager import load_plugins
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
from conclave.providers.schema_hints import bounded_numbers_as_choices, capped_items
from conclave.providers.transport import as_transport_error
from conclave.testing.fake_server import FakeProviderServer, Fault, Reply, key_digest
from conclave.testing.pytest_plugin import FAKE_KEYS

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"position": {"type": "string"}, "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["position", "confidence"],
    "additionalProperties": False,
}
ANSWER = {"position": "adopt event sourcing for billing", "confidence": 0.8}
MODELS = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-5", "gemini": "gemini-2.5-pro"}
KEY_VARS = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "gemini": "GEMINI_API_KEY"}
AUTH_HEADERS = {"authorization", "x-api-key", "x-goog-api-key", "api-key"}


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Any:
    # the three providers, and the plugins whose artifact schemas the schema test below sends through them
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai,anthropic,gemini,strategies,answer")
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


async def test_openai_sends_the_full_schema_to_a_compatible_server(fake_provider_server, conclave_env, plugins):
    # the fake is a custom base_url: like vLLM or llama-server it gets the schema with every constraint
    await _complete(fake_provider_server, plugins, "openai", _request("gpt-4o"))
    sent = fake_provider_server.requests_for("gpt-4o")[0]
    assert sent.path == "/openai/v1/chat/completions"
    assert sent.headers["Authorization"] == "<redacted>"
    # (and its bounded numbers also as the values a grammar can enforce: grammar converters ignore min/max; its
    # arrays capped so no list runs away, strings as long as the model needs)
    assert sent.json["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "independent_opinion",
                                               "schema": capped_items(bounded_numbers_as_choices(SCHEMA))}}


def test_openai_sends_strict_json_schema_response_format_to_api_openai_com(conclave_env, plugins):
    official = plugins.providers.get("openai")("openai", ProviderSettings(api="openai"), None, environ={})
    body = official.body(_request("gpt-4o"), stream=False)
    assert body == {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are the security reviewer."},
            {"role": "user", "content": "Should we move billing to event sourcing?"},
        ],
        "max_completion_tokens": 2048,
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
    official = plugins.providers.get("openai")("openai", ProviderSettings(api="openai"), None, environ={})
    sent = official.body(request, stream=False)["response_format"]["json_schema"]["schema"]
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


def test_openai_uses_max_completion_tokens_on_the_official_endpoint(conclave_env, plugins):
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


def _default_send_key(fake: FakeProviderServer) -> dict[str, dict[str, Any]]:
    """The fake's providers as a user would configure a custom base_url: no ``send_key``, so its default applies."""
    providers = fake.providers_config()
    for entry in providers.values():
        del entry["send_key"]
    return providers


def _auth_headers(sent: Any) -> set[str]:
    return {name.lower() for name in sent.headers} & AUTH_HEADERS


@pytest.mark.parametrize("key_set", [False, True], ids=["no-key", "key-set"])
async def test_local_endpoint_gets_no_authorization_header(fake_provider_server, conclave_env, plugins, monkeypatch,
                                                           key_set):
    if not key_set:
        monkeypatch.delenv("OPENAI_API_KEY")
    completion = await _complete(fake_provider_server, plugins, "openai", _request("llama3.2", schema=False),
                                 providers=_default_send_key(fake_provider_server))
    assert completion.text
    sent = fake_provider_server.requests_for("llama3.2")[0]
    assert "Authorization" not in sent.headers and sent.auth_sha256 == {}


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
async def test_custom_base_url_never_receives_the_vendor_key_by_default(conclave_env, plugins, provider):
    # the fake accepts only the real key: a key sent to it would be accepted, so only the headers tell
    model = MODELS[provider]
    async with FakeProviderServer() as fake:
        providers = _default_send_key(fake)
        async with ProviderPool(fake.settings(providers=providers, hedging={"enabled": False}), plugins) as pool:
            instance = pool.provider(provider)
            assert instance.settings.send_key == "official"
            assert (instance.requires_key(), instance.has_key(), pool.has_key(provider)) == (False, True, True)
            assert instance.api_key() is None and instance.key_source() is None
            completion = await pool.complete(agent="a", provider=provider, request=_request(model), round_number=1,
                                             allow_substitution=False)
            streamed = await pool.complete(agent="a", provider=provider, request=_request(model), round_number=1,
                                           allow_substitution=False, on_chunk=lambda _text: None)
            assert await instance.list_models()
    assert completion.parsed == streamed.parsed is not None
    assert len(fake.requests) == 3
    for sent in fake.requests:
        assert _auth_headers(sent) == set() and sent.auth_sha256 == {} and "key" not in sent.query


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
async def test_send_key_always_sends_the_key_to_a_custom_base_url(conclave_env, plugins, provider):
    key = FAKE_KEYS[KEY_VARS[provider]]
    async with FakeProviderServer(keys={provider: key}) as fake:  # anything but this key is refused
        providers = _default_send_key(fake)
        providers[provider]["send_key"] = "always"
        completion = await _complete(fake, plugins, provider, _request(MODELS[provider]), providers=providers)
    assert completion.parsed is not None
    (sent,) = fake.requests
    assert sent.carries(key)
    assert list(sent.auth_sha256.values()) == [key_digest(key)]
    assert key not in repr(fake.requests)  # only its digest is recorded


async def test_send_key_always_needs_the_key_before_any_request(conclave_env, plugins, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    async with FakeProviderServer() as fake:
        providers = _default_send_key(fake)
        providers["openai"]["send_key"] = "always"
        async with ProviderPool(fake.settings(providers=providers), plugins) as pool:
            assert not pool.has_key("openai")
            with pytest.raises(MissingKeyError, match="set OPENAI_API_KEY"):
                await pool.complete(agent="a", provider="openai", request=_request("gpt-4o"), round_number=1)
    assert fake.requests == []


async def test_a_custom_endpoint_that_wants_a_key_says_how_to_send_it(conclave_env, plugins):
    key = FAKE_KEYS["OPENAI_API_KEY"]
    async with FakeProviderServer(keys={"openai": key}) as fake:
        with pytest.raises(AuthError) as caught:
            await _complete(fake, plugins, "openai", _request("gpt-4o"), providers=_default_send_key(fake))
    assert "providers.openai.send_key=always" in str(caught.value) and "OPENAI_API_KEY" in str(caught.value)
    assert key not in str(caught.value)
    assert fake.requests[0].auth_sha256 == {}


@pytest.mark.parametrize(("base_url", "send_key", "sent"), [
    (None, "official", True),
    ("https://api.openai.com/v1", "official", True),
    ("https://api.x.ai/v1", "official", True),
    ("https://API.OPENAI.COM/v1", "official", True),  # host names are case-insensitive
    ("https://api.openai.com/v1", "never", False),
    ("http://api.openai.com/v1", "official", False),  # the official host, but the key would travel in the clear
    # userinfo, not the host (config refuses any user info in a base_url; the provider must not be fooled either)
    ("https://api.openai.com@127.0.0.1/v1", "official", False),
    ("https://api.openai.com.example.net/v1", "official", False),
    ("https://openai-proxy.example.net/v1", "official", False),
    ("https://openai-proxy.example.net/v1", "always", True),
    ("http://localhost:11434/v1", "never", False),
])
def test_send_key_decides_which_hosts_get_the_key(plugins, base_url, send_key, sent):
    key = "sk-proj-Qm3v9XzT1pLr8sWk4YhN2bJc7DfGa5Ue6Ri0Ot"
    cls = plugins.providers.get("openai")
    settings = ProviderSettings.model_construct(api="openai", base_url=base_url, api_key_env=["OPENAI_API_KEY"],
                                                send_key=send_key)  # unvalidated: the provider's own check
    instance = cls("openai", settings, None, environ={"OPENAI_API_KEY": key})
    headers = instance.headers("gpt-4o")
    assert (headers.get("Authorization") == f"Bearer {key}") is sent
    assert ("Authorization" in headers) is sent
    assert instance.requires_key() is sent and instance.has_key()
    assert (instance.key_source() == "OPENAI_API_KEY") is sent
    keyless = cls("openai", settings, None, environ={})
    assert keyless.has_key() is not sent  # a host that would get the key needs one
    assert instance.redact(f"echo {key}") == "echo <redacted>"  # redaction covers withheld keys too


@pytest.mark.parametrize("send_key", ["official", "always"])
def test_the_shipped_provider_config_sends_keys_only_to_official_hosts(fake_provider_server, send_key):
    from conclave.api import compose_settings

    url = fake_provider_server.base_url("openai")
    overrides = ["agents=openai_only", f"providers.openai.base_url={url}"]
    if send_key == "always":
        overrides.append("providers.openai.send_key=always")
    settings = compose_settings("Q?", overrides)
    assert {name: p.send_key for name, p in settings.providers.items()} == {
        "openai": send_key, "anthropic": "official", "gemini": "official", "grok": "official", "mistral": "official",
        "local": "official"}


@pytest.mark.slow
async def test_cli_does_not_send_the_vendor_key_to_a_custom_base_url(fake_provider_server, conclave_env):
    # the reported reproduction: a real-looking key, the shipped config, and only base_url pointed elsewhere
    key = "sk-proj-REALSECRET-" + "k" * 40
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(conclave_env), CONCLAVE_PROGRESS="0", OPENAI_API_KEY=key)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "Q?", "agents=openai_only",
        f"providers.openai.base_url={fake_provider_server.base_url('openai')}", "rounds=1", "cost.auto_approve=true",
        "output.format=json", stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=str(conclave_env), env=env,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, err.decode()
    assert fake_provider_server.requests
    for sent in fake_provider_server.requests:
        assert _auth_headers(sent) == set() and sent.auth_sha256 == {} and not sent.carries(key)
    assert key not in out.decode() + err.decode()


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


# ------------------------------------------------------------------------------------- keys in error messages

REAL_LOOKING_KEYS = {
    "OPENAI_API_KEY": "sk-proj-Qm3v9XzT1pLr8sWk4YhN2bJc7DfGa5Ue6Ri0OtVb",
    "ANTHROPIC_API_KEY": "sk-ant-api03-Zq8Lm2Xv7Nc4Bt1Rk9Hs6Wd3Fp0Gj5Ye",
    "GEMINI_API_KEY": "AIzaSyD4k9Lm2Qv7Xn1Rt8Bw5Hc3Js6Fp0Gz",
}
PADDINGS = range(250, 311)  # puts the key before, across and after the 300-character cut


def _fragments(key: str, size: int = 8) -> list[str]:
    return [key[i:i + size] for i in range(len(key) - size + 1)]


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("status", [400, 429, 500])
async def test_a_key_across_the_message_cut_leaves_no_fragment(conclave_env, plugins, monkeypatch, provider, status):
    key = REAL_LOOKING_KEYS[KEY_VARS[provider]]
    monkeypatch.setenv(KEY_VARS[provider], key)
    model = MODELS[provider]
    errors: list[str] = []
    for n in PADDINGS:  # a server per call: a 429 paces its endpoint for the loop (providers/pacing.py)
        async with FakeProviderServer() as fake:
            fake.script(model, Fault.http(status, "x" * n + key))
            settings = fake.settings(providers=_single_attempt(fake), hedging={"enabled": False})
            # a pool per call: a model that failed for good is not asked again by the same pool
            async with ProviderPool(settings, plugins) as pool:
                with pytest.raises(ProviderError) as caught:
                    await pool.complete(agent="a", provider=provider, request=_request(model), round_number=1,
                                        allow_substitution=False)
                assert caught.value.status == status
                errors.append(str(caught.value))
                errors += [a.error or "" for a in pool.attempts]
    assert len(errors) == 2 * len(PADDINGS)
    assert any("<redacted>" in e for e in errors) and any("…" in e for e in errors)
    for text in errors:
        for fragment in _fragments(key):
            assert fragment not in text


def test_transport_and_in_band_errors_are_redacted(plugins):
    key = REAL_LOOKING_KEYS["OPENAI_API_KEY"]
    cls = plugins.providers.get("openai")
    other = REAL_LOOKING_KEYS["ANTHROPIC_API_KEY"]
    instance = cls("openai", ProviderSettings(api="openai", api_key_env=["OPENAI_API_KEY"]), None,
                   environ={"OPENAI_API_KEY": key, "ANTHROPIC_API_KEY": other})
    texts = [
        str(instance.transport_error(as_transport_error(aiohttp.ClientError(f"proxy said {key}")), "gpt-4o")),
        str(instance.malformed(f"error event: bad key {key[:20]}", "gpt-4o")),  # an echoed prefix
        instance.redact(f"{key}{key[:12]} and {key[:30]}"),
        instance.redact(f"a proxy mixed up its keys: {other[:40]}"),  # another provider's key, cut short
    ]
    for text in texts:
        assert "<redacted>" in text
        for fragment in [*_fragments(key), *_fragments(other)]:
            assert fragment not in text
    assert instance.redact("sk-proj short prefixes stay") == "sk-proj short prefixes stay"
