"""Structured output negotiated per endpoint, single-slot servers, and streams that end empty (fake server)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from conclave import events
from conclave.config.settings import ProviderSettings
from conclave.events import EventBus
from conclave.plugin_manager import load_plugins
from conclave.providers.base import (
    CompletionRequest,
    MalformedResponseError,
    Message,
    StructuredOutputRejectedError,
)
from conclave.providers.pool import ProviderPool
from conclave.providers.retry import RetryPolicy
from conclave.providers.structured import MEMORY_FILE, FormMemory, is_local_url, is_rejection
from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest, Reply

FAST_RETRIES = RetryPolicy(base_s=0.01, cap_s=0.02)
SCHEMA = {
    "type": "object",
    "properties": {"position": {"type": "string", "minLength": 3},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1}},
    "required": ["position", "confidence"],
    "additionalProperties": False,
}
# what a grammar-compiling server receives: every constraint, and the bounded confidence listed as 0, 0.05, …, 1
# (strings as long as the model needs with the default grammar_lengths=cap, which bounds only arrays)
GRAMMAR_SCHEMA = {**SCHEMA, "properties": {
    "position": SCHEMA["properties"]["position"],
    "confidence": {**SCHEMA["properties"]["confidence"],
                   "enum": [round(i * 0.05, 2) if i % 20 else i // 20 for i in range(21)]}}}
# a vendor's own host (xAI, Mistral) enforces its schema as written: no lengths are added there either
GRAMMAR_SCHEMA_ON_VENDOR_HOST = GRAMMAR_SCHEMA
ANSWER = {"position": "yes", "confidence": 0.7}
# what llama-cpp-python 0.3.x's server answers to response_format json_schema (HTTP 500)
LLAMA_CPP_PYTHON_REJECTION = ("[{'type': 'literal_error', 'loc': ('body', 'response_format', 'type'), 'msg': "
                              "\"Input should be 'text' or 'json_object'\", 'input': 'json_schema', "
                              "'ctx': {'expected': \"'text' or 'json_object'\"}}]")


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai,anthropic,gemini")
    return load_plugins()


def _request(model: str = "local-model", **kw: Any) -> CompletionRequest:
    kw.setdefault("json_schema", SCHEMA)
    return CompletionRequest(model=model, messages=(Message("user", "Should we?"),), schema_name="opinion", **kw)


def _local_server_config(fake: FakeProviderServer, **entry: Any) -> dict[str, Any]:
    """``providers`` where ``openai`` is a keyless server on 127.0.0.1 (what a user's llama.cpp or Ollama is)."""
    providers = fake.providers_config()
    providers["openai"] = {"api": "openai", "base_url": fake.base_url("openai"), "max_attempts": 3, **entry}
    return providers


def _pool(fake: FakeProviderServer, plugins: Any, bus: EventBus | None = None, **entry: Any) -> ProviderPool:
    settings = fake.settings(providers=_local_server_config(fake, **entry), hedging={"enabled": False})
    return ProviderPool(settings, plugins, bus, retry_policy=FAST_RETRIES)


def _llama_cpp_python(request: RecordedRequest) -> Any:
    """A server that rejects json_schema with a 500 and enforces a json_object schema, like llama-cpp-python."""
    fmt = (request.json or {}).get("response_format") or {}
    if fmt.get("type") == "json_schema":
        return Fault.http(500, LLAMA_CPP_PYTHON_REJECTION)
    return Reply(json=ANSWER)


async def _ask(pool: ProviderPool, request: CompletionRequest | None = None, **kw: Any) -> Any:
    return await pool.complete(agent="architect", provider="openai", request=request or _request(), round_number=1,
                               allow_substitution=False, **kw)


# ------------------------------------------------------------------------------------- negotiation


async def test_a_500_naming_json_schema_falls_back_to_json_object_with_the_full_schema(
        fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("local-model", _llama_cpp_python)
    async with _pool(fake, plugins) as pool:
        completion = await _ask(pool)
    sent = [r.json["response_format"] for r in fake.requests_for("local-model")]
    assert [f["type"] for f in sent] == ["json_schema", "json_object"]  # the rejected form is not retried
    # a server that takes a raw schema gets all of it: minimum, maximum and minLength survive
    assert sent[0]["json_schema"]["schema"] == GRAMMAR_SCHEMA and "strict" not in sent[0]["json_schema"]
    assert sent[1]["schema"] == GRAMMAR_SCHEMA
    assert (completion.parsed, completion.structured_output) == (ANSWER, "json_object")
    # the rejection is not a provider failure: one attempt, and it succeeded
    assert [(a.outcome, a.number) for a in completion.attempts] == [("ok", 1)]
    assert pool.health.snapshot("openai").consecutive_failures == 0


async def test_the_working_form_is_remembered_across_runs_per_base_url_and_model(fake_provider_server,
                                                                                conclave_env, plugins):
    fake = fake_provider_server
    fake.script("local-model", _llama_cpp_python)
    async with _pool(fake, plugins) as pool:
        await _ask(pool)
    stored = json.loads((conclave_env / MEMORY_FILE).read_text())
    assert stored == {f"{fake.base_url('openai')} local-model": "json_object"}
    fake.requests.clear()
    # a later run in a new process reads the file: it starts with json_object
    fresh = FormMemory(conclave_env)
    assert fresh.get(fake.base_url("openai"), "local-model") == "json_object"
    async with _pool(fake, plugins) as pool:
        await _ask(pool)
        await _ask(pool, _request("other-model"))
    assert [r.json["response_format"]["type"] for r in fake.requests_for("local-model")] == ["json_object"]
    # another model on the same server negotiates for itself
    assert fake.requests_for("other-model")[0].json["response_format"]["type"] == "json_schema"


async def test_a_server_that_takes_no_structured_form_gets_the_schema_in_the_prompt(fake_provider_server,
                                                                                  conclave_env, plugins):
    fake = fake_provider_server

    def plain(request: RecordedRequest) -> Any:
        if "response_format" in request.json:
            return Fault.http(400, "Unrecognized request argument supplied: response_format")
        return Reply(text="Sure:\n```json\n" + json.dumps(ANSWER) + "\n```")

    fake.script("local-model", plain)
    async with _pool(fake, plugins) as pool:
        completion = await _ask(pool)
    sent = fake.requests_for("local-model")
    assert [r.json.get("response_format", {}).get("type") for r in sent] == ["json_schema", "json_object", None]
    prompt = sent[-1].json["messages"][-1]["content"]
    assert prompt.startswith("Should we?") and json.dumps(SCHEMA, separators=(",", ":")) in prompt
    assert completion.structured_output == "prompt" and "```json" in completion.text


async def test_an_unrelated_server_error_is_retried_not_taken_for_a_rejection(fake_provider_server, conclave_env,
                                                                            plugins):
    fake = fake_provider_server
    fake.script("local-model", Fault.server_error(500), Reply(json=ANSWER))
    async with _pool(fake, plugins) as pool:
        completion = await _ask(pool)
    assert [r.json["response_format"]["type"] for r in fake.requests_for("local-model")] == [
        "json_schema", "json_schema"]
    assert [a.outcome for a in completion.attempts] == ["server_error", "ok"]
    assert not (conclave_env / MEMORY_FILE).exists()


async def test_a_forced_form_is_not_negotiated_and_its_rejection_says_which_key(fake_provider_server,
                                                                               conclave_env, plugins):
    fake = fake_provider_server
    fake.script("local-model", _llama_cpp_python)
    async with _pool(fake, plugins, structured_output="json_schema") as pool:
        with pytest.raises(StructuredOutputRejectedError, match=r"providers\.openai\.structured_output=json_schema"):
            await _ask(pool)
    assert len(fake.requests_for("local-model")) == 1  # not retried


@pytest.mark.parametrize("form", ["json_object", "prompt", "off"])
async def test_a_forced_form_is_sent_as_configured(fake_provider_server, conclave_env, plugins, form):
    fake = fake_provider_server
    fake.script("local-model", Reply(json=ANSWER))
    async with _pool(fake, plugins, structured_output=form) as pool:
        completion = await _ask(pool)
    body = fake.requests_for("local-model")[0].json
    assert body.get("response_format", {}).get("type") == {"json_object": "json_object"}.get(form)
    schema_in_prompt = json.dumps(SCHEMA, separators=(",", ":")) in body["messages"][-1]["content"]
    assert schema_in_prompt is (form == "prompt")
    assert completion.structured_output == form


async def test_streamed_calls_negotiate_too(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("local-model", _llama_cpp_python)
    chunks: list[str] = []
    async with _pool(fake, plugins) as pool:
        completion = await _ask(pool, on_chunk=chunks.append)
    assert [r.json["response_format"]["type"] for r in fake.requests_for("local-model")] == [
        "json_schema", "json_object"]
    assert json.loads("".join(chunks)) == ANSWER and completion.structured_output == "json_object"


def test_only_api_openai_com_gets_the_strict_variant(conclave_env, plugins):
    cls = plugins.providers.get("openai")
    official = cls("openai", ProviderSettings(api="openai"), None, environ={})
    xai = cls("grok", ProviderSettings(api="openai", base_url="https://api.x.ai/v1"), None, environ={})
    vllm = cls("vllm", ProviderSettings(api="openai", base_url="http://gpu-box:8000/v1"), None, environ={})
    strict = official.body(_request("gpt-4o"), stream=False)["response_format"]["json_schema"]
    assert strict["strict"] is True and "minimum" not in strict["schema"]["properties"]["confidence"]
    for other, expected in ((xai, GRAMMAR_SCHEMA_ON_VENDOR_HOST), (vllm, GRAMMAR_SCHEMA)):
        raw = other.body(_request("m"), stream=False)["response_format"]["json_schema"]
        assert raw["schema"] == expected and "strict" not in raw
    # the vendors' json_object takes no schema, so the schema goes into the prompt there
    official_object = official.body(_request("gpt-4o"), stream=False, form="json_object")
    assert official_object["response_format"] == {"type": "json_object"}
    assert json.dumps(SCHEMA, separators=(",", ":")) in official_object["messages"][-1]["content"]


@pytest.mark.parametrize(("status", "message", "rejected"), [
    (500, LLAMA_CPP_PYTHON_REJECTION, True),
    (400, "Invalid schema for response_format 'opinion': 'minimum' is not permitted", True),
    (422, "json_schema: unsupported keyword", True),
    (400, "Either \"json_schema\" or \"grammar\" can be specified, but not both", True),
    (500, "The server had an error while processing your request", False),
    (400, "This model's maximum context length is 8192 tokens", False),
    (429, "response_format rate limit", False),
])
def test_a_rejection_is_recognised_by_status_and_message(status, message, rejected):
    assert is_rejection(status, message) is rejected


@pytest.mark.parametrize(("url", "local"), [
    ("http://127.0.0.1:8080/v1", True), ("http://localhost:11434/v1", True), ("http://[::1]:8000/v1", True),
    ("http://192.168.1.20:8000/v1", True), ("http://gpu.local:8000/v1", True),
    ("https://api.openai.com/v1", False), ("https://example.com/v1", False), (None, False),
])
def test_local_base_urls(url, local):
    assert is_local_url(url) is local


# ------------------------------------------------------------------------------------- single-slot servers


async def test_a_local_server_gets_one_call_at_a_time_and_timeouts_start_when_sent(fake_provider_server,
                                                                                  conclave_env, plugins):
    fake = fake_provider_server
    fake.script("local-model", Reply(json=ANSWER, latency=0.4))
    bus = EventBus("c-test")
    seen: list[events.Event] = []
    bus.subscribe(seen.append)
    # each call takes 0.4 s and may take 0.7 s: three in parallel on one slot finish only if queueing is not timed
    async with _pool(fake, plugins, bus, timeout_s=0.7, max_attempts=1) as pool:
        results = await asyncio.gather(*(
            pool.complete(agent=name, provider="openai", request=_request(), round_number=1,
                          allow_substitution=False) for name in ("a", "b", "c")))
    assert all(r.parsed == ANSWER for r in results)
    starts = sorted(r.ts for r in fake.requests_for("local-model"))
    assert starts[1] - starts[0] >= 0.35 and starts[2] - starts[1] >= 0.35  # one after another
    queued = [e.data for e in seen if e.type == events.PROVIDER_QUEUED]
    assert len(queued) == 2 and {q["agent"] for q in queued} < {"a", "b", "c"}
    assert queued[0]["max_concurrency"] == 1


async def test_a_one_slot_server_is_not_hedged_with_itself(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("local-model", Reply(json=ANSWER, latency=0.3))
    bus = EventBus("c-test")
    seen: list[events.Event] = []
    bus.subscribe(seen.append)
    settings = fake.settings(providers=_local_server_config(fake), hedging={
        "enabled": True, "hedge_after_s": 0.05, "floor_s": 0.01, "burst": 5})
    # a backup on the same one-slot server can only be sent once the primary has finished: it would make the
    # server generate a whole answer nobody reads (llama-cpp-python does not stop when the client goes away)
    async with ProviderPool(settings, plugins, bus, retry_policy=FAST_RETRIES) as pool:
        await asyncio.gather(*(
            pool.complete(agent=name, provider="openai", request=_request(), round_number=1,
                          allow_substitution=False) for name in ("a", "b")))
    assert len(fake.requests_for("local-model")) == 2
    assert not [e for e in seen if e.type == events.PROVIDER_HEDGED]


async def test_max_concurrency_zero_lifts_the_cap_on_a_local_server(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("local-model", Reply(json=ANSWER, latency=0.3))
    async with _pool(fake, plugins, max_concurrency=0) as pool:
        await asyncio.gather(*(
            pool.complete(agent=name, provider="openai", request=_request(), round_number=1,
                          allow_substitution=False) for name in ("a", "b", "c")))
    starts = sorted(r.ts for r in fake.requests_for("local-model"))
    assert starts[2] - starts[0] < 0.2


def test_hosted_apis_have_no_default_cap_and_local_servers_one(plugins):
    cls = plugins.providers.get("openai")
    hosted = cls("openai", ProviderSettings(api="openai"), None, environ={})
    local = cls("ollama", ProviderSettings(api="openai", base_url="http://localhost:11434/v1"), None, environ={})
    two = cls("vllm", ProviderSettings(api="openai", base_url="http://10.0.0.5:8000/v1", max_concurrency=2), None,
              environ={})
    assert (hosted.max_concurrency(), local.max_concurrency(), two.max_concurrency()) == (None, 1, 2)


def test_the_in_process_model_takes_one_call_at_a_time_and_is_never_hedged_with_itself(monkeypatch):
    # one worker thread runs the local model: a backup on it could only start after the call it backs up (an
    # offline run used to hedge a queued round-1 call after 10 s and bill the cancelled copy's input)
    monkeypatch.setenv("CONCLAVE_PLUGINS", "local")
    cls = load_plugins().providers.get("local")
    assert cls("local", ProviderSettings(api="local"), None, environ={}).max_concurrency() == 1
    assert cls("local", ProviderSettings(api="local", max_concurrency=0), None, environ={}).max_concurrency() is None


# ------------------------------------------------------------------------------------- empty streams


@pytest.mark.parametrize("provider", ["openai", "anthropic", "gemini"])
@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_with_no_content_and_no_finish_reason_is_truncated(fake_provider_server, conclave_env,
                                                                          plugins, provider, stream):
    fake = fake_provider_server
    model = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-5", "gemini": "gemini-2.5-pro"}[provider]
    fake.script(model, Fault.empty_stream(), Reply(json=ANSWER))
    settings = fake.settings(hedging={"enabled": False})
    async with ProviderPool(settings, plugins, retry_policy=FAST_RETRIES) as pool:
        completion = await pool.complete(agent="a", provider=provider, request=_request(model), round_number=1,
                                         allow_substitution=False, on_chunk=(lambda _t: None) if stream else None)
    assert completion.parsed == ANSWER  # retried like any truncated answer
    first = completion.attempts[0]
    assert (first.outcome, "truncated" in (first.error or "")) == ("malformed", True)


async def test_an_empty_openai_stream_alone_is_an_error_not_an_empty_answer(fake_provider_server, conclave_env,
                                                                           plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Fault.empty_stream())
    settings = fake.settings(hedging={"enabled": False}, providers={
        **fake.providers_config(), "openai": {**fake.providers_config()["openai"], "max_attempts": 1}})
    async with ProviderPool(settings, plugins, retry_policy=FAST_RETRIES) as pool:
        with pytest.raises(MalformedResponseError, match="truncated"):
            await pool.complete(agent="a", provider="openai", request=_request("gpt-4o"), round_number=1,
                                allow_substitution=False, on_chunk=lambda _t: None)


def test_grammar_servers_get_every_constraint_but_unanchored_patterns(conclave_env, plugins):
    from conclave.providers.schema_hints import anchored_patterns_only, capped_items

    schema = {"type": "object", "properties": {
        "text": {"type": "string", "minLength": 1, "pattern": "\\S", "description": "said"},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "tags": {"type": "array", "minItems": 1, "items": {"type": "string", "pattern": "\\S"}}},
        "required": ["text"]}
    variant = anchored_patterns_only(schema)
    # JSON Schema's pattern searches; grammar converters read it as the whole string (and llama-cpp-python
    # rejects one without ^...$), so an unanchored one is only described
    assert variant["properties"]["text"] == {"type": "string", "minLength": 1,
                                             "description": 'said Constraints: {"pattern": "\\\\S"}'}
    assert variant["properties"]["code"] == {"type": "string", "pattern": "^[A-Z]{3}$"}
    assert "pattern" not in variant["properties"]["tags"]["items"] and variant["properties"]["tags"]["minItems"] == 1
    vllm = plugins.providers.get("openai")("vllm", ProviderSettings(api="openai", base_url="http://h:8000/v1"),
                                           None, environ={})
    for form in ("json_schema", "json_object"):
        body = vllm.body(_request("m", json_schema=schema), stream=False, form=form)["response_format"]
        assert (body.get("json_schema") or {}).get("schema", body.get("schema")) == capped_items(variant)


def test_grammar_servers_get_bounded_numbers_as_values_the_grammar_can_enforce(conclave_env, plugins):
    import jsonschema

    from conclave.providers.schema_hints import bounded_numbers_as_choices

    confidence = {"type": "number", "minimum": 0, "maximum": 1}
    schema = {"type": "object", "properties": {
        "confidence": confidence, "citation": {"type": "integer", "minimum": 1},
        "share": {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5},
        "weight": {"type": "number"}, "level": {"type": "integer", "minimum": 1, "maximum": 5}}}
    variant = bounded_numbers_as_choices(schema)["properties"]
    # llama.cpp's converters ignore minimum/maximum on numbers: a judge wrote "confidence": 50 and was re-asked in vain
    assert variant["confidence"]["enum"][:3] == [0, 0.05, 0.1] and variant["confidence"]["enum"][-1] == 1
    assert len(variant["confidence"]["enum"]) == 21 and 50 not in variant["confidence"]["enum"]
    assert "enum" not in variant["citation"]  # bounded on one side only: no finite list…
    # …unless the grammar caps every list: then a reference number (from 1) is one of the first CAPPED_MAX_ITEMS,
    # which keeps llama-cpp-python's grammar (it ignores minimum on integers) from writing "citations": [0]
    capped = bounded_numbers_as_choices(schema, open_above=12)["properties"]
    assert capped["citation"]["enum"] == list(range(1, 13)) and capped["level"]["enum"] == [1, 2, 3, 4, 5]
    for value in capped["citation"]["enum"]:
        jsonschema.validate(value, schema["properties"]["citation"])
    assert variant["share"]["enum"][0] == 0.025 and variant["share"]["enum"][-1] == 0.5
    assert variant["level"]["enum"] == [1, 2, 3, 4, 5]
    assert "enum" not in variant["weight"]  # unbounded: nothing to list
    for name, node in schema["properties"].items():  # every listed value is one the validator accepts
        for value in variant[name].get("enum", []):
            jsonschema.validate(value, node)
    vllm = plugins.providers.get("openai")("vllm", ProviderSettings(api="openai", base_url="http://h:8000/v1"),
                                           None, environ={})
    sent = vllm.body(_request("m", json_schema={"type": "object", "properties": {"confidence": confidence}}),
                     stream=False, form="json_object")["response_format"]["schema"]
    assert sent["properties"]["confidence"]["enum"] == variant["confidence"]["enum"]


def test_every_artifact_schema_compiles_to_a_llama_cpp_python_grammar():
    grammar = pytest.importorskip("llama_cpp.llama_grammar")
    from conclave.engine.extraction import request_schema
    from conclave.providers.schema_hints import anchored_patterns_only, bounded_lengths, bounded_numbers_as_choices

    for name in ("independent", "synthesis", "cross_exam", "cross_exam_reply", "verdict", "verdict_explore",
                 "cross_exam_reply_explore"):
        variant = bounded_lengths(bounded_numbers_as_choices(anchored_patterns_only(request_schema(name))),
                                  max_tokens=2048)
        gbnf = grammar.json_schema_to_gbnf(json.dumps(variant))
        assert "root ::=" in gbnf and "char*" not in gbnf  # no string left without a length bound


def _nodes(schema: Any) -> Any:
    if isinstance(schema, dict):
        yield schema
        for key, value in schema.items():
            if key not in ("enum", "const", "required"):
                yield from _nodes(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _nodes(item)


@pytest.mark.parametrize(("name", "max_tokens"), [("independent", 2048), ("synthesis", 4096), ("synthesis", 600)])
def test_grammar_servers_get_array_and_string_lengths_that_fit_the_calls_token_budget(name, max_tokens):
    from conclave.engine.extraction import request_schema
    from conclave.providers.schema_hints import (
        CHARS_PER_TOKEN,
        DEFAULT_MAX_ITEMS,
        MAX_STRING_CHARS,
        _worst_case,
        anchored_patterns_only,
        bounded_lengths,
    )

    schema = anchored_patterns_only(request_schema(name))
    variant = bounded_lengths(schema, max_tokens=max_tokens)
    # a 270M judge listed 36 tensions until the budget cut the synthesis: now every list and free string has an end
    arrays = [node for node in _nodes(variant) if node.get("type") == "array"]
    strings = [node for node in _nodes(variant) if node.get("type") == "string" and "const" not in node
               and "enum" not in node and "format" not in node]
    assert arrays and all(node["maxItems"] >= node.get("minItems", 0) for node in arrays)
    assert all(node["maxItems"] <= max(DEFAULT_MAX_ITEMS, node.get("minItems", 0)) for node in arrays)
    assert strings and all(node.get("minLength", 0) <= node["maxLength"] <= MAX_STRING_CHARS for node in strings)
    # the longest answer the grammar allows fits the call's budget (and a tight budget means fewer, shorter items)
    fixed, _ = _worst_case(variant, 0)
    assert fixed <= max_tokens * CHARS_PER_TOKEN
    if max_tokens < 1000:
        assert max(node["maxItems"] for node in arrays) < DEFAULT_MAX_ITEMS
    # only lengths were added: every other keyword is the original's, which the answer is still validated against
    assert variant["required"] == schema["required"] and variant["properties"].keys() == schema["properties"].keys()


def test_only_servers_that_are_not_a_vendors_own_host_get_lengths_and_fitted_ones_only_when_asked(
        conclave_env, plugins):
    from conclave.providers.schema_hints import CAPPED_MAX_ITEMS

    schema = {"type": "object", "properties": {"points": {"type": "array", "items": {"type": "string"}}},
              "required": ["points"]}
    make = plugins.providers.get("openai")

    def sent_to(lengths: str) -> dict:
        llama = make("llama", ProviderSettings(api="openai", base_url="http://127.0.0.1:8080/v1",
                                               grammar_lengths=lengths), None, environ={})
        return llama.body(_request("m", json_schema=schema, max_tokens=512), stream=False,
                          form="json_object")["response_format"]["schema"]["properties"]["points"]

    # default: a list cannot run away, and no string a capable model writes is cut
    assert sent_to("cap") == {"type": "array", "items": {"type": "string"}, "maxItems": CAPPED_MAX_ITEMS}
    assert ProviderSettings(api="openai").grammar_lengths == "cap"
    fitted = sent_to("fit")  # for tiny models: lengths fitted to the call's 512 tokens
    assert fitted["maxItems"] == 3 and fitted["items"]["maxLength"] <= 240
    assert sent_to("off") == schema["properties"]["points"]
    mistral = make("mistral", ProviderSettings(api="openai", base_url="https://api.mistral.ai/v1"), None,
                   environ={})
    sent = mistral.body(_request("m", json_schema=schema, max_tokens=512), stream=False,
                        form="json_schema")["response_format"]["json_schema"]["schema"]["properties"]["points"]
    assert "maxItems" not in sent and "maxLength" not in sent["items"]


async def test_a_keyless_local_server_costs_nothing_whatever_its_model_is_called(fake_provider_server,
                                                                                conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Reply(json=ANSWER, usage=(1000, 500, 0)))
    async with _pool(fake, plugins) as pool:  # openai -> a keyless server on 127.0.0.1
        completion = await _ask(pool, _request("gpt-4o"))
        assert pool.cost("openai", "gpt-4o", completion.usage) == 0.0
        assert pool.estimate_cost("openai", "gpt-4o", 1000, 500) == 0.0
        # the same model on a keyed endpoint is billed
        assert (pool.cost("grok", "grok-4", completion.usage) or 0) > 0
