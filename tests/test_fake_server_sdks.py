"""The fake provider server checked against the official SDKs (openai, anthropic, google-genai): what the real APIs'
own clients parse from it, including its error bodies, must be what they would parse from the real APIs.

Development-only: the SDKs are in the ``dev`` extra, never in conclave's own dependencies.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from conclave.testing.fake_server import FakeProviderServer, Fault, Reply

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
genai = pytest.importorskip("google.genai")

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
          "additionalProperties": False}
ANSWER = {"answer": "yes"}


@pytest.fixture
async def fake() -> Any:
    async with FakeProviderServer(keys={"openai": "sk-fake", "anthropic": "sk-ant-fake", "gemini": "g-fake"}) as f:
        yield f


def _openai(fake: FakeProviderServer, **kw: Any) -> Any:
    return openai.AsyncOpenAI(api_key="sk-fake", base_url=fake.base_url("openai"), **kw)


def _anthropic(fake: FakeProviderServer, **kw: Any) -> Any:
    kw.setdefault("api_key", "sk-ant-fake")
    return anthropic.AsyncAnthropic(base_url=fake.base_url("anthropic"), **kw)


def _gemini(fake: FakeProviderServer) -> Any:
    from google.genai import types

    return genai.Client(api_key="g-fake", http_options=types.HttpOptions(
        base_url=fake.url + "/gemini", api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)))


# ------------------------------------------------------------------------------------- OpenAI


async def test_openai_sdk_parses_a_structured_answer_and_a_streamed_one(fake):
    fake.script("gpt-4o", Reply(json=ANSWER, usage=(30, 5, 10)))
    client = _openai(fake)
    fmt = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}}
    answer = await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "q"}],
                                                  response_format=fmt)
    assert json.loads(answer.choices[0].message.content) == ANSWER
    assert answer.usage.prompt_tokens_details.cached_tokens == 10
    stream = await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "q"}],
                                                  response_format=fmt, stream=True,
                                                  stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(text) == ANSWER and chunks[-1].usage.completion_tokens == 5


async def test_openai_sdk_sees_a_refusal_streamed_and_not(fake):
    fake.script("gpt-4o", Reply(refusal="I can't help with that."))
    client = _openai(fake)
    answer = await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "q"}])
    assert (answer.choices[0].message.refusal, answer.choices[0].message.content) == ("I can't help with that.", None)
    stream = await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "q"}],
                                                  stream=True)
    refusal = "".join([c.choices[0].delta.refusal or "" async for c in stream if c.choices])
    assert refusal == "I can't help with that."


async def test_openai_sdk_reads_insufficient_quota_as_the_real_api_sends_it(fake):
    fake.script("gpt-4o", Fault.insufficient_quota())
    with pytest.raises(openai.RateLimitError) as caught:
        await _openai(fake, max_retries=0).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "q"}])
    assert caught.value.code == "insufficient_quota" and caught.value.type == "insufficient_quota"


@pytest.mark.parametrize(("fault", "requests"), [
    (Fault.server_error(500, should_retry=False), 1),  # the SDK obeys x-should-retry: false
    (Fault.conflict(), 2),  # and retries 409
    (Fault.request_timeout(), 2),  # and 408
])
async def test_openai_sdk_retries_what_the_fake_says_to_retry(fake, fault, requests):
    fake.script("gpt-4o", fault)
    with pytest.raises(openai.APIStatusError):
        await _openai(fake, max_retries=1).with_options(timeout=5).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "q"}])
    assert len(fake.requests_for("gpt-4o")) == requests


async def test_openai_sdk_rejects_a_wrong_key_from_the_fake(fake):
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(api_key="sk-wrong", base_url=fake.base_url("openai"), max_retries=0).models.list()


# ------------------------------------------------------------------------------------- Anthropic


async def test_anthropic_sdk_parses_a_forced_tool_call_and_its_stream(fake):
    fake.script("claude-sonnet-4-6", Reply(json=ANSWER))
    client = _anthropic(fake)
    tool = {"name": "record", "description": "d", "input_schema": SCHEMA}
    kw: dict[str, Any] = {"model": "claude-sonnet-4-6", "max_tokens": 100, "tools": [tool],
                          "tool_choice": {"type": "tool", "name": "record"},
                          "messages": [{"role": "user", "content": "q"}]}
    message = await client.messages.create(**kw)
    assert message.content[0].type == "tool_use" and message.content[0].input == ANSWER
    async with client.messages.stream(**kw) as stream:
        final = await stream.get_final_message()
    assert final.content[0].input == ANSWER and final.stop_reason == "tool_use"


async def test_anthropic_sdk_may_send_the_key_as_a_bearer_token(fake):
    fake.script("claude-sonnet-4-6", Reply(text="hello"))
    client = _anthropic(fake, api_key=None, auth_token="sk-ant-fake")
    message = await client.messages.create(model="claude-sonnet-4-6", max_tokens=10,
                                           messages=[{"role": "user", "content": "q"}])
    assert message.content[0].text == "hello"
    assert fake.requests_for("claude-sonnet-4-6")[0].carries("sk-ant-fake")


async def test_anthropic_sdk_reads_the_fakes_overloaded_error(fake):
    fake.script("claude-sonnet-4-6", Fault.overloaded())
    with pytest.raises(anthropic.APIStatusError) as caught:
        await _anthropic(fake, max_retries=0).messages.create(
            model="claude-sonnet-4-6", max_tokens=10, messages=[{"role": "user", "content": "q"}])
    assert caught.value.status_code == 529 and caught.value.body["error"]["type"] == "overloaded_error"


# ------------------------------------------------------------------------------------- Gemini


async def test_google_genai_sdk_parses_a_json_answer_and_its_stream(fake):
    fake.script("gemini-2.5-pro", Reply(json=ANSWER, usage=(20, 4, 0)))
    client = _gemini(fake)
    config = {"response_mime_type": "application/json", "response_json_schema": SCHEMA}
    answer = await client.aio.models.generate_content(model="gemini-2.5-pro", contents="q", config=config)
    assert json.loads(answer.text) == ANSWER and answer.usage_metadata.prompt_token_count == 20
    text = "".join([c.text or "" async for c in await client.aio.models.generate_content_stream(
        model="gemini-2.5-pro", contents="q", config=config)])
    assert json.loads(text) == ANSWER


async def test_google_genai_sdk_reads_resource_exhausted_with_retry_info(fake):
    from google.genai import errors

    fake.script("gemini-2.5-pro", Fault.resource_exhausted("33s", per_day=True))
    with pytest.raises(errors.ClientError) as caught:
        await _gemini(fake).aio.models.generate_content(model="gemini-2.5-pro", contents="q")
    assert caught.value.code == 429 and caught.value.status == "RESOURCE_EXHAUSTED"
    details = {d["@type"].rsplit(".", 1)[-1]: d for d in caught.value.details["error"]["details"]}
    assert details["RetryInfo"]["retryDelay"] == "33s"
    assert "PerDay" in details["QuotaFailure"]["violations"][0]["quotaId"]


# ------------------------------------------------------------------------------------- prompt caching


def _cached_request(model: str, schema: bool = True) -> Any:
    from conclave.providers.base import CompletionRequest, Message, PromptCache

    stable, own = "Context supplied with the question:\n\n" + "C" * 8000 + "\n\n---\n\n", "You review security."
    return CompletionRequest(model=model, messages=(Message("user", "q"),), system=stable + own,
                             json_schema=SCHEMA if schema else None, schema_name="record" if schema else None,
                             cache=PromptCache("conclave-k", len(stable), (("record", SCHEMA),)))


def _ours(cls: Any, api: str, fake: FakeProviderServer) -> Any:
    from conclave.config.settings import ProviderSettings

    return cls(api, ProviderSettings(api=api, base_url=fake.base_url(api), prompt_cache="on"), None, environ={})


async def test_anthropic_sdk_sends_our_cache_breakpoints_unchanged_and_reads_cache_usage(fake):
    from plugins.anthropic import AnthropicProvider

    body = _ours(AnthropicProvider, "anthropic", fake).body(_cached_request("claude-sonnet-4-6"), stream=False)
    client = _anthropic(fake)
    first = await client.messages.create(**body)
    second = await client.messages.create(**body)
    assert [r.json for r in fake.requests_for("claude-sonnet-4-6")] == [body, body]  # the SDK's shape is ours
    assert first.usage.cache_creation_input_tokens > 0 and first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    warm = _ours(AnthropicProvider, "anthropic", fake).body(_cached_request("claude-sonnet-4-6", schema=False),
                                                            stream=False)
    assert (await client.messages.create(**warm)).usage.cache_read_input_tokens > 0  # tool_choice none is valid


async def test_openai_sdk_sends_our_prompt_cache_key_unchanged_and_reads_cached_tokens(fake):
    from plugins.openai import OpenAIProvider

    body = _ours(OpenAIProvider, "openai", fake).body(_cached_request("gpt-4o"), stream=False)
    client = _openai(fake)
    await client.chat.completions.create(**body)
    again = await client.chat.completions.create(**body)
    assert [r.json for r in fake.requests_for("gpt-4o")] == [body, body] and body["prompt_cache_key"] == "conclave-k"
    assert again.usage.prompt_tokens_details.cached_tokens >= 1024


async def test_openai_sdk_sends_our_tools_layout_byte_for_byte_and_reads_the_forced_call(fake):
    import httpx

    from conclave.providers.base import PromptCache
    from plugins.openai import OpenAIProvider

    other = {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"],
             "additionalProperties": False}
    base = _cached_request("gpt-4o")
    request = type(base)(**{**base.__dict__, "cache": PromptCache("conclave-k", base.cache.stable_chars,
                                                                  (("record", SCHEMA), ("summary", other)))})
    ours = _ours(OpenAIProvider, "openai", fake)
    sent: list[bytes] = []

    async def keep(req: Any) -> None:
        sent.append(req.read())

    fake.script("gpt-4o", Reply(json=ANSWER))
    client = _openai(fake, http_client=httpx.AsyncClient(event_hooks={"request": [keep]}))
    for stream in (False, True):
        body = ours.body(request, stream=stream)
        assert [t["function"]["name"] for t in body["tools"]] == ["record", "summary"] and "response_format" not in body
        answer = await client.chat.completions.create(**body)
        # the SDK sends exactly the bytes we send for the same arguments
        assert sent[-1] == ours.encode(body)
        if stream:
            chunks = [chunk async for chunk in answer]
            calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or []]
            assert calls[0].function.name == "record" and calls[0].id
            arguments = "".join(call.function.arguments or "" for call in calls)
            assert json.loads(arguments) == ANSWER and chunks[-1].usage.prompt_tokens_details.cached_tokens >= 1024
        else:
            (call,) = answer.choices[0].message.tool_calls
            assert call.function.name == "record" and json.loads(call.function.arguments) == ANSWER
            assert answer.choices[0].finish_reason == "stop"
    await client.close()


async def test_google_genai_sdk_creates_uses_and_deletes_a_cached_content_as_we_do(fake):
    from google.genai import types

    from plugins.gemini import CACHE_TTL_S

    client = _gemini(fake)
    request = _cached_request("gemini-2.5-flash")
    stable, own = request.cache.split(request.system)
    cache = await client.aio.caches.create(model="gemini-2.5-flash", config=types.CreateCachedContentConfig(
        system_instruction=stable, ttl=f"{CACHE_TTL_S}s", display_name="conclave-k"))
    (created,) = [r for r in fake.requests if r.path.endswith("/cachedContents")]
    ours = {"model": "models/gemini-2.5-flash", "displayName": "conclave-k",
            "systemInstruction": {"parts": [{"text": stable}]}, "ttl": f"{CACHE_TTL_S}s"}
    sdk = {**created.json, "systemInstruction": {"parts": created.json["systemInstruction"]["parts"]}}
    assert sdk == ours and cache.name.startswith("cachedContents/") and cache.usage_metadata.total_token_count > 0
    from plugins.gemini import GeminiProvider

    body = _ours(GeminiProvider, "gemini", fake).body(request, cache.name)
    answer = await client.aio.models.generate_content(
        model="gemini-2.5-flash", contents=[types.Content(role="user", parts=[types.Part(text=own),
                                                                              types.Part(text="q")])],
        config=types.GenerateContentConfig(cached_content=cache.name, max_output_tokens=2048,
                                           response_mime_type="application/json", response_json_schema=SCHEMA))
    sent = fake.requests_for("gemini-2.5-flash")[-1].json
    assert sent["cachedContent"] == body["cachedContent"] and sent["contents"] == body["contents"]
    assert answer.usage_metadata.cached_content_token_count == cache.usage_metadata.total_token_count
    await client.aio.caches.delete(name=cache.name)
    assert fake.requests[-1].method == "DELETE" and fake.requests[-1].path == f"/gemini/v1beta/{cache.name}"
    assert not fake.cache.contents


# ------------------------------------------------------------------------------------- images


def _image_request(model: str) -> Any:
    import base64

    from conclave.providers.base import CompletionRequest, ImagePart, Message

    pixel = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
    return CompletionRequest(model=model, system="You answer.", messages=(Message("user", "What is drawn?"),),
                             images=(ImagePart("dot.png", "image/png", pixel),))


async def test_the_sdks_send_our_image_parts_unchanged_and_the_fake_accepts_them(fake):
    import base64

    from google.genai import types

    from plugins.anthropic import AnthropicProvider
    from plugins.gemini import GeminiProvider
    from plugins.openai import OpenAIProvider

    body = _ours(OpenAIProvider, "openai", fake).body(_image_request("gpt-4o"), stream=False)
    answer = await _openai(fake).chat.completions.create(**body)
    assert answer.choices[0].message.content and fake.requests_for("gpt-4o")[-1].json == body
    assert body["messages"][1]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,iVBOR")

    body = _ours(AnthropicProvider, "anthropic", fake).body(_image_request("claude-sonnet-4-6"), stream=False)
    answer = await _anthropic(fake).messages.create(**body)
    assert answer.content[0].text and fake.requests_for("claude-sonnet-4-6")[-1].json == body

    # google-genai builds the body from its own types: our first turn must parse as its Content, image included
    ours = _ours(GeminiProvider, "gemini", fake).body(_image_request("gemini-2.5-pro"))
    content = types.Content.model_validate(ours["contents"][0])
    assert content.parts is not None and content.parts[1].inline_data is not None
    assert content.parts[1].inline_data.mime_type == "image/png"
    answer = await _gemini(fake).aio.models.generate_content(model="gemini-2.5-pro", contents=[content])
    sent = fake.requests_for("gemini-2.5-pro")[-1].json["contents"][0]["parts"][1]["inlineData"]
    assert answer.text and (sent.get("mimeType") or sent.get("mime_type")) == "image/png"
    assert base64.urlsafe_b64decode(sent["data"]) == _image_request("x").images[0].data  # it sends URL-safe base64


@pytest.mark.parametrize(("api", "model", "part"), [
    ("openai", "gpt-4o", {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}),
    ("anthropic", "claude-sonnet-4-6", {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                     "data": "not base64!"}}),
])
async def test_the_fake_rejects_a_malformed_image_as_the_api_would(fake, api, model, part):
    message = {"role": "user", "content": [{"type": "text", "text": "q"}, part]}
    if api == "openai":
        with pytest.raises(openai.BadRequestError):
            await _openai(fake, max_retries=0).chat.completions.create(model=model, messages=[message])
    else:
        with pytest.raises(anthropic.BadRequestError):
            await _anthropic(fake, max_retries=0).messages.create(model=model, max_tokens=10, messages=[message])
