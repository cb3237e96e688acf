"""OpenAI's prompt cache across rounds: every artifact schema as a strict function tool, one fixed list, the round's
own forced; the call's arguments are the artifact (plain and streamed); other OpenAI-compatible hosts unchanged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_engine_support import JUDGE_MODEL, run_consultation

from conclave.config.settings import ProviderSettings
from conclave.providers.base import CompletionRequest, Message, PromptCache
from conclave.providers.transport import HTTPClient
from conclave.testing.fake_server import FakeProviderServer, Reply
from plugins.openai import OpenAIProvider

STABLE = "Context supplied with the question:\n\n" + "C" * 8000 + "\n\n---\n\n"
OPINION = {"type": "object", "properties": {"position": {"type": "string"}, "caveat": {"type": "string"}},
           "required": ["position"], "additionalProperties": False}
SYNTHESIS = {"type": "object", "properties": {"summary": {"type": "string"}}, "required": ["summary"],
             "additionalProperties": False}
HINT = PromptCache("conclave-k", len(STABLE), (("independent_opinion", OPINION), ("synthesis", SYNTHESIS)))


def _request(schema: str | None = "synthesis", *, stable: str = STABLE, own: str = "You are the judge.",
             hint: PromptCache | None = HINT) -> CompletionRequest:
    schemas = {"independent_opinion": OPINION, "synthesis": SYNTHESIS}
    return CompletionRequest(model="gpt-4o", messages=(Message("user", "Q?"),), system=stable + own,
                             json_schema=schemas[schema] if schema else None, schema_name=schema,
                             cache=hint and PromptCache(hint.key, len(stable), hint.schemas))


def _provider(base_url: str, mode: str = "auto", name: str = "openai", session: Any = None,
              **kw: Any) -> OpenAIProvider:
    return OpenAIProvider(name, ProviderSettings(api="openai", base_url=base_url, prompt_cache=mode, **kw), session,
                          environ={})


async def _ask(fake: FakeProviderServer, *requests: CompletionRequest, stream: bool = False) -> list[Any]:
    """Each request's completion from the fake (streamed: its text pieces, then the completion)."""
    out: list[Any] = []
    async with aiohttp.ClientSession() as session:
        provider = _provider(fake.base_url("openai"), "on", session=HTTPClient(session))
        for request in requests:
            if stream:
                out.append([item async for item in provider.attempt_stream(request)])
            else:
                out.append(await provider.attempt(request))
    return out


OFFICIAL = "https://api.openai.com/v1"


def test_api_openai_com_gets_every_schema_as_a_strict_tool_and_forces_the_rounds_own() -> None:
    provider = _provider(OFFICIAL)
    judge, agent = (provider.body(_request(s), stream=False) for s in ("synthesis", "independent_opinion"))
    assert "response_format" not in judge and judge["prompt_cache_key"] == "conclave-k"
    assert [t["function"]["name"] for t in judge["tools"]] == ["independent_opinion", "synthesis"]
    assert all(t["type"] == "function" and t["function"]["strict"] is True for t in judge["tools"])
    # strict mode: every property required, optionals nullable
    assert judge["tools"][0]["function"]["parameters"]["properties"]["caveat"] == {"type": ["string", "null"]}
    assert judge["tool_choice"] == {"type": "function", "function": {"name": "synthesis"}}
    assert agent["tool_choice"] == {"type": "function", "function": {"name": "independent_opinion"}}
    # the cached prefix (tools, then the system message's context) is the same bytes for both rounds
    assert json.dumps(judge["tools"]) == json.dumps(agent["tools"])
    assert judge["messages"][0]["content"].startswith(STABLE) and agent["messages"][0]["content"].startswith(STABLE)


def test_a_call_without_a_schema_sends_the_same_tools_and_calls_none() -> None:
    body = _provider(OFFICIAL).body(_request(None), stream=False)
    assert [t["function"]["name"] for t in body["tools"]] == ["independent_opinion", "synthesis"]
    assert body["tool_choice"] == "none"


@pytest.mark.parametrize(("base_url", "mode", "name"), [
    (OFFICIAL, "off", "openai"),  # caching off: the schema stays in response_format
    ("https://api.x.ai/v1", "on", "grok"),  # xAI and Mistral keep response_format whatever the mode
    ("https://api.mistral.ai/v1", "auto", "mistral"),
    ("http://127.0.0.1:8080/v1", "auto", "llamacpp"),  # a local server keeps its negotiated form by default
])
def test_other_hosts_and_caching_off_keep_the_schema_in_response_format(base_url: str, mode: str,
                                                                        name: str) -> None:
    body = _provider(base_url, mode, name).body(_request(), stream=False)
    assert "tools" not in body and "tool_choice" not in body and body["response_format"]["type"] == "json_schema"


def test_no_tools_without_the_hint_or_below_the_cacheable_length_or_after_a_fallback_form() -> None:
    provider = _provider(OFFICIAL)
    assert "tools" not in provider.body(_request(hint=None), stream=False)
    assert "tools" not in provider.body(_request(stable="short context\n\n"), stream=False)
    assert "tools" not in _provider(OFFICIAL, structured_output="json_object").body(_request(), stream=False)


def test_the_estimate_shares_the_prefix_across_schemas_only_in_the_tools_layout() -> None:
    assert _provider(OFFICIAL).cache_rule("gpt-4o", 5000).shared_by == "model"
    assert _provider(OFFICIAL, "off").cache_rule("gpt-4o", 5000).shared_by == "model+schema"
    assert _provider("https://api.x.ai/v1", "on", "grok").cache_rule("grok-4", 5000).shared_by == "model+schema"


@pytest.mark.parametrize("stream", [False, True])
async def test_the_forced_calls_arguments_are_the_artifact_plain_and_streamed(
        fake_provider_server: FakeProviderServer, stream: bool) -> None:
    fake = fake_provider_server
    fake.script("gpt-4o", Reply(json={"position": "yes", "caveat": None}))
    (answer,) = await _ask(fake, _request("independent_opinion"), stream=stream)
    if stream:
        pieces, completion = answer[:-1], answer[-1]
        assert len(pieces) > 1 and "".join(pieces) == completion.text  # argument deltas arrive as text
    else:
        completion = answer
    sent = fake.requests_for("gpt-4o")[-1].json
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "independent_opinion"}}
    assert completion.parsed == {"position": "yes"}  # strict mode's null stand-in dropped
    assert completion.finish_reason == "stop"  # a call forced by name ends with stop, as on the real API


@pytest.mark.parametrize("stream", [False, True])
async def test_a_call_cut_off_at_the_token_limit_is_no_artifact(fake_provider_server: FakeProviderServer,
                                                                stream: bool) -> None:
    fake = fake_provider_server
    fake.script("gpt-4o", Reply(text='{"position": "ye', finish_reason="length"))
    (answer,) = await _ask(fake, _request("independent_opinion"), stream=stream)
    completion = answer[-1] if stream else answer
    assert completion.parsed is None and completion.finish_reason == "length"
    assert completion.text == '{"position": "ye'  # kept for the re-ask's repair


async def test_fake_openai_serves_calls_of_different_forced_tools_from_one_prefix(
        fake_provider_server: FakeProviderServer) -> None:
    first, second = await _ask(fake_provider_server, _request("independent_opinion"),
                               _request("synthesis", own="You are someone else entirely."))
    assert first.usage.cached_input_tokens == 0
    # tools + the context block (over 2,000 tokens) are read from the cache; the persona after them is not
    assert second.usage.cached_input_tokens >= 2048


async def test_an_openai_panel_reads_the_context_from_the_cache_in_every_round(
        fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path) -> None:
    fake = fake_provider_server
    context = tmp_path / "notes.md"
    context.write_text("The ledger service appends every invoice event to a partitioned stream.\n" * 200)
    run = await run_consultation(fake, f"context=[{context}]", "agents=openai_only")
    assert run.result.status == "complete"
    calls = [r for r in fake.requests if r.api == "openai" and r.path.endswith("/chat/completions")]
    assert all("response_format" not in r.json for r in calls)
    # one tool list per model: the schemas its seats are asked for, in plan order (the agents' model also carries
    # the objection round's, which groupthink detection may insert later; the judge's model only the judge's)
    tools = {r.model: [t["function"]["name"] for t in r.json["tools"]] for r in calls}
    assert all([t["function"]["name"] for t in r.json["tools"]] == tools[r.model] for r in calls)
    assert tools == {"gpt-4o": ["independent", "cross_exam_reply", "objection"],
                     JUDGE_MODEL: ["synthesis", "cross_exam", "verdict"]}
    forced = {r.json["tool_choice"]["function"]["name"] for r in calls if isinstance(r.json["tool_choice"], dict)}
    assert len(forced) >= 3  # answers, synthesis, replies, verdict: one tool list for all of them
    # the three agents share gpt-4o: one warm-up (no schema, tool_choice none) writes tools + context first,
    # then every call, whatever its round's schema, reads them
    warmups = [r for r in calls if r.json["tool_choice"] == "none"]
    assert len(warmups) == 1 and warmups[0] is calls[0]
    # every call after a model's first reads tools + context, whatever its round's schema (the judge's first call,
    # to another model, writes that model's cache)
    for model in {r.model for r in calls}:
        mine = [r for r in calls if r.model == model]
        assert all(r.cached_tokens >= 1024 for r in mine[1:])
    read = {r.json["tool_choice"]["function"]["name"] for r in calls if r.cached_tokens and r.json["tool_choice"]
            != "none"}
    assert {"independent", "cross_exam_reply", "cross_exam", "verdict"} <= read
    estimate = run.of("consultation:cost_estimated")[-1]
    assert estimate["cached_input_tokens"] > 0 and run.result.cost.actual <= estimate["estimated_cost"]


async def test_the_estimate_counts_the_tool_list_in_every_calls_input_and_cached_prefix(
        fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path) -> None:
    from conclave.tokens import count_tokens

    fake = fake_provider_server
    context = tmp_path / "notes.md"
    context.write_text("The ledger service appends every invoice event to a partitioned stream.\n" * 200)
    run = await run_consultation(fake, f"context=[{context}]", "agents=openai_only", "rounds=1")
    (estimate,) = run.of("consultation:cost_estimated")[-1:]
    tools = count_tokens(json.dumps(fake.requests_for("gpt-4o")[-1].json["tools"]), "gpt-4o")
    per_agent = estimate["cached_input_tokens"] / 3  # one warm-up writes the prefix, the three agents read it
    assert tools > 1000 and tools + count_tokens(context.read_text(), "gpt-4o") <= per_agent <= tools + count_tokens(
        context.read_text(), "gpt-4o") + 100


async def test_fake_openai_puts_the_tool_list_first_in_the_prefix_and_answers_required_with_tool_calls(
        fake_provider_server: FakeProviderServer) -> None:
    fake = fake_provider_server
    tool = {"type": "function", "function": {"name": "a", "parameters": OPINION, "strict": True}}
    body = {"model": "gpt-4o", "messages": [{"role": "system", "content": "S" * 8000}, {"role": "user", "content": "q"}],
            "tools": [tool], "tool_choice": "required"}
    async with aiohttp.ClientSession() as session:
        answers = []
        for sent in (body, {**body, "tools": [tool, {**tool, "function": {**tool["function"], "name": "b"}}]}, body):
            async with session.post(fake.base_url("openai") + "/chat/completions", json=sent) as resp:
                answers.append(await resp.json())
    cached = [a["usage"]["prompt_tokens_details"]["cached_tokens"] for a in answers]
    assert cached[1] == 0 and cached[2] >= 1024  # another tool list is another prefix; the same one is read
    choice = answers[0]["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["tool_calls"][0]["function"]["name"] == "a"


async def test_a_malformed_call_is_re_asked_in_the_same_layout_and_recovers(
        fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path) -> None:
    import itertools

    from conclave.testing.fake_server import RecordedRequest
    from conclave.testing.schema_instances import instance_for

    fake = fake_provider_server
    context = tmp_path / "notes.md"
    context.write_text("The ledger service appends every invoice event to a partitioned stream.\n" * 200)
    calls = itertools.count()

    def reply(request: RecordedRequest) -> Reply:
        if request.json.get("tool_choice") == "none":
            return Reply(text="OK")  # the warm-up
        return Reply(text='{"position": "cut') if next(calls) == 0 else Reply(json=instance_for(request.schema))

    fake.script("gpt-4o", reply)
    run = await run_consultation(fake, f"context=[{context}]", "agents=openai_only", "rounds=1")
    assert run.result.status == "complete"
    sent = [r.json for r in fake.requests_for("gpt-4o")]
    reask = next(b for b in sent if len(b["messages"]) > 2)
    # the bad arguments go back as the assistant's turn; the tools and the forced choice are those of the round
    assert reask["messages"][-2] == {"role": "assistant", "content": '{"position": "cut'}
    assert reask["tools"] == sent[1]["tools"] and reask["tool_choice"] == sent[1]["tool_choice"]
    assert "reasked" in {e["status"] for e in run.of("consultation:round_artifact")}


async def test_an_empty_stream_in_the_tools_layout_is_a_truncated_answer(
        fake_provider_server: FakeProviderServer) -> None:
    from conclave.providers.base import ProviderError
    from conclave.testing.fake_server import Fault

    fake_provider_server.script("gpt-4o", Fault.empty_stream())
    with pytest.raises(ProviderError, match="truncated"):
        await _ask(fake_provider_server, _request("independent_opinion"), stream=True)


@pytest.mark.parametrize("base_url", [OFFICIAL, "http://127.0.0.1:9/v1"])
def test_schemas_prepared_while_round_1_waits_leave_a_later_request_nothing_to_derive(base_url: str) -> None:
    from plugins import openai as plugin

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 3},
                                               "why": {"type": "string", "pattern": f"^{base_url[-6:]}"}},
              "required": ["n", "why"], "additionalProperties": False}  # distinct per case: nothing cached yet
    provider = _provider(base_url, "off")
    provider.prepare_schemas("gpt-4o", [schema])
    strict, grammar = plugin._strict_schema.cache_info(), plugin._grammar_schema.cache_info()
    request = CompletionRequest(model="gpt-4o", messages=(Message("user", "Q?"),), system="s", json_schema=schema,
                                schema_name="numbers")
    for form in provider.forms(request):
        provider.body(request, stream=False, form=form)
    # every form the request may be asked in found its schema derived already: no new computation, only hits
    assert plugin._strict_schema.cache_info().misses == strict.misses
    assert plugin._grammar_schema.cache_info().misses == grammar.misses
    assert (plugin._strict_schema.cache_info().hits + plugin._grammar_schema.cache_info().hits
            > strict.hits + grammar.hits)
