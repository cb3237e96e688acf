"""Prompt caching: the shared prefix, each API's hints, the fake's cache, cached pricing, the estimate, the switch."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_engine_support import QUESTION, Run, run_consultation

from conclave.config.settings import ProviderSettings
from conclave.engine.caching import WARMUP_AGENT
from conclave.providers.base import CompletionRequest, Message, PromptCache, Usage
from conclave.providers.pricing import ModelPrice, PriceTable
from conclave.store.paths import StoreLayout
from conclave.store.period_stats import compute_stats, period_from_args
from conclave.store.sqlite_index import connect
from conclave.testing.fake_server import FakeProviderServer, RecordedRequest
from conclave.testing.prompt_cache import PromptCacheModel
from plugins.anthropic import AnthropicProvider
from plugins.gemini import GeminiProvider
from plugins.openai import OpenAIProvider

CONTEXT_LINE = "The ledger service appends every invoice event to a partitioned stream; projections replay it.\n"


@pytest.fixture
def context_file(tmp_path: Path) -> Path:
    """About 16 KB: long enough to be cached (over 1,024 tokens however they are counted), quick to send."""
    path = tmp_path / "notes.md"
    path.write_text(CONTEXT_LINE * 180)
    return path


def _hint(system: str, stable: int) -> PromptCache:
    return PromptCache(key="conclave-k", stable_chars=stable,
                       schemas=(("independent", {"type": "object"}), ("synthesis", {"type": "object"})))


def _request(model: str, *, stable_text: str = "C" * 8000, own: str = "You are the security reviewer.",
             schema: str | None = "synthesis") -> CompletionRequest:
    system = stable_text + own
    return CompletionRequest(model=model, messages=(Message("user", "Q?"),), system=system,
                             json_schema={"type": "object"} if schema else None, schema_name=schema,
                             cache=_hint(system, len(stable_text)))


def _provider(cls: Any, name: str, mode: str, base_url: str = "http://127.0.0.1:9/x") -> Any:
    return cls(name, ProviderSettings(api=name, base_url=base_url, prompt_cache=mode), None, environ={})


# ------------------------------------------------------------------------------------------------ request bodies


def test_anthropic_marks_the_shared_prefix_and_the_seats_part_and_always_sends_every_schema() -> None:
    body = _provider(AnthropicProvider, "anthropic", "on").body(_request("claude-sonnet-4-5"), stream=False)
    assert [b["text"] for b in body["system"]] == ["C" * 8000, "You are the security reviewer."]
    assert all(b["cache_control"] == {"type": "ephemeral"} for b in body["system"])
    assert [t["name"] for t in body["tools"]] == ["independent", "synthesis"]
    assert body["tool_choice"] == {"type": "tool", "name": "synthesis"}


def test_anthropic_sends_no_breakpoint_on_a_prefix_shorter_than_the_model_caches() -> None:
    # claude-haiku-4-5 caches prefixes of 4,096 tokens or more; 8,000 bytes is about 2,000
    body = _provider(AnthropicProvider, "anthropic", "on").body(_request("claude-haiku-4-5"), stream=False)
    assert isinstance(body["system"], str) and [t["name"] for t in body["tools"]] == ["synthesis"]


def test_openai_passes_the_consultations_cache_key_only_where_it_is_known() -> None:
    request = _request("gpt-4o")
    assert _provider(OpenAIProvider, "openai", "on").body(request, stream=False)["prompt_cache_key"] == "conclave-k"
    official = _provider(OpenAIProvider, "openai", "auto", "https://api.openai.com/v1")
    assert official.body(request, stream=False)["prompt_cache_key"] == "conclave-k"
    assert "prompt_cache_key" not in _provider(OpenAIProvider, "grok", "auto", "https://api.x.ai/v1").body(
        request, stream=False)


def test_prompt_cache_off_sends_no_hint_to_any_api() -> None:
    request = _request("claude-sonnet-4-5")
    anthropic = _provider(AnthropicProvider, "anthropic", "off").body(request, stream=False)
    assert anthropic["system"] == request.system and "cache_control" not in json.dumps(anthropic)
    assert [t["name"] for t in anthropic["tools"]] == ["synthesis"]
    assert "prompt_cache_key" not in _provider(OpenAIProvider, "openai", "off").body(_request("gpt-4o"),
                                                                                     stream=False)
    gemini = _provider(GeminiProvider, "gemini", "off")
    assert not gemini._explicit(_request("gemini-2.5-flash")) and gemini.cache_rule("gemini-2.5-flash", 9999) is None


# ------------------------------------------------------------------------------------------------ the fake's caches


async def _post(fake: FakeProviderServer, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(fake.url + path, json=body) as resp:
        return resp.status, await resp.json()


async def test_fake_openai_reports_a_repeated_prefix_as_cached_but_not_under_another_schema(
        fake_provider_server: FakeProviderServer) -> None:
    fake = fake_provider_server
    messages = [{"role": "system", "content": "S" * 8000}, {"role": "user", "content": "first"}]
    body = {"model": "gpt-4o", "messages": messages, "prompt_cache_key": "k"}
    _, first = await _post(fake, "/openai/v1/chat/completions", body)
    _, again = await _post(fake, "/openai/v1/chat/completions", {**body, "messages": [messages[0], {
        "role": "user", "content": "second"}]})
    _, other = await _post(fake, "/openai/v1/chat/completions", {**body, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}})
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 1024 and (cached - 1024) % 128 == 0 and cached <= again["usage"]["prompt_tokens"]
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_fake_anthropic_writes_then_reads_a_breakpoint_and_refuses_a_fifth(
        fake_provider_server: FakeProviderServer) -> None:
    fake = fake_provider_server
    block = {"type": "text", "text": "S" * 8000, "cache_control": {"type": "ephemeral"}}
    body = {"model": "claude-sonnet-4-5", "max_tokens": 10, "system": [block],
            "messages": [{"role": "user", "content": "hi"}]}
    _, first = await _post(fake, "/anthropic/v1/messages", body)
    _, second = await _post(fake, "/anthropic/v1/messages", body)
    assert first["usage"]["cache_creation_input_tokens"] > 1024 and first["usage"]["cache_read_input_tokens"] == 0
    assert second["usage"]["cache_read_input_tokens"] == first["usage"]["cache_creation_input_tokens"]
    assert second["usage"]["cache_creation_input_tokens"] == 0
    status, error = await _post(fake, "/anthropic/v1/messages", {**body, "system": [block] * 5})
    assert status == 400 and "maximum of 4 blocks with cache_control" in error["error"]["message"]


async def test_fake_concurrent_requests_miss_what_the_other_is_writing() -> None:
    from conclave.testing.fake_server import Reply

    async with FakeProviderServer() as fake:
        fake.script("claude-sonnet-4-5", Reply(text="ok", latency=0.2))
        block = {"type": "text", "text": "S" * 8000, "cache_control": {"type": "ephemeral"}}
        body = {"model": "claude-sonnet-4-5", "max_tokens": 10, "system": [block],
                "messages": [{"role": "user", "content": "hi"}]}
        answers = await asyncio.gather(*(_post(fake, "/anthropic/v1/messages", body) for _ in range(2)))
    assert [a["usage"]["cache_read_input_tokens"] for _, a in answers] == [0, 0]


# ------------------------------------------------------------------------------------------------ consultations


def _systems(requests: list[RecordedRequest]) -> list[str]:
    """Each request's system prompt as text (Anthropic blocks joined)."""
    out = []
    for r in requests:
        system = r.json.get("system") if r.api == "anthropic" else None
        if r.api == "openai":
            system = next((m["content"] for m in r.json["messages"] if m["role"] == "system"), "")
        out.append("".join(b["text"] for b in system) if isinstance(system, list) else system or "")
    return out


async def test_every_call_of_a_consultation_opens_with_the_same_context_block(
        fake_provider_server: FakeProviderServer, conclave_env: Any, context_file: Path) -> None:
    fake = fake_provider_server
    run = await run_consultation(fake, f"context=[{context_file}]", "agents=mixed_anthropic_openai")
    assert run.result.status == "complete"
    calls = [r for r in fake.requests if r.api in ("openai", "anthropic") and r.method == "POST"]
    systems = _systems(calls)
    block = systems[0][: systems[0].index(CONTEXT_LINE * 180) + len(CONTEXT_LINE * 180)]
    assert len(calls) >= 9 and all(s.startswith(block) for s in systems)
    keys = {r.json.get("prompt_cache_key") for r in calls if r.api == "openai"}
    assert len(keys) == 1 and str(keys.pop()).startswith("conclave-")


async def _anthropic_panel(fake: FakeProviderServer, context_file: Path, *overrides: str) -> Run:
    run = await run_consultation(fake, f"context=[{context_file}]", "agents=anthropic_only",
                                 "judge.model=claude-sonnet-4-5", *overrides)
    assert run.result.status == "complete"
    return run


async def test_an_anthropic_panel_writes_the_prefix_once_and_every_call_reads_it(
        fake_provider_server: FakeProviderServer, conclave_env: Any, context_file: Path) -> None:
    fake = fake_provider_server
    run = await _anthropic_panel(fake, context_file)
    requests = [r for r in fake.requests if r.api == "anthropic"]
    warmups = [r for r in requests if r.json.get("tool_choice") == {"type": "none"}]
    assert len(warmups) == 1 and warmups[0].cache_write_tokens > 0 and warmups[0].json["max_tokens"] == 1
    answers = [r for r in requests if r not in warmups]
    assert len(answers) == 9 and all(r.cached_tokens >= warmups[0].cache_write_tokens for r in answers)
    first_block = {json.dumps(r.json["system"][0]) for r in requests}
    assert len(first_block) == 1 and len({json.dumps(r.json["tools"]) for r in requests}) == 1
    attempts = run.of("provider:attempt")
    assert [a["agent"] for a in attempts].count(WARMUP_AGENT) == 1
    assert run.result.tokens.cached_input == sum(a["cached_input_tokens"] for a in attempts) > 0


async def test_recorded_cost_bills_cached_reads_and_writes_at_their_own_prices(
        fake_provider_server: FakeProviderServer, conclave_env: Any, context_file: Path) -> None:
    run = await _anthropic_panel(fake_provider_server, context_file)
    price = PriceTable.load().price("anthropic", "claude-sonnet-4-5")
    assert price is not None and price.cached_input is not None and price.cache_write_input is not None
    attempts = run.of("provider:attempt")
    usages = [Usage(a["input_tokens"], a["output_tokens"], a["cached_input_tokens"], a["cache_write_tokens"])
              for a in attempts]
    assert all(a["cost"] == pytest.approx(price.cost(u)) for a, u in zip(attempts, usages, strict=True))
    assert run.result.cost.actual == pytest.approx(sum(price.cost(u) for u in usages), abs=1e-6)
    uncached = sum(price.cost(Usage(u.input_tokens, u.output_tokens)) for u in usages)
    assert run.result.cost.actual < 0.6 * uncached


def test_model_price_bills_reads_writes_and_the_rest_apart() -> None:
    price = ModelPrice(input=3.0, output=15.0, cached_input=0.3, cache_write_input=3.75)
    usage = Usage(input_tokens=1_000_000, output_tokens=0, cached_input_tokens=600_000, cache_write_tokens=300_000)
    assert price.cost(usage) == pytest.approx(0.1 * 3.0 + 0.6 * 0.3 + 0.3 * 3.75)


async def test_the_estimate_counts_the_cached_share_and_prompt_cache_off_turns_it_off(
        fake_provider_server: FakeProviderServer, conclave_env: Any, context_file: Path) -> None:
    fake = fake_provider_server
    cached = await _anthropic_panel(fake, context_file, "rounds=1")
    fake.reset()
    plain = await _anthropic_panel(fake, context_file, "rounds=1", "providers.anthropic.prompt_cache=off")
    (with_cache,) = cached.of("consultation:cost_estimated")[-1:]  # the exact estimate (after the bound)
    (without,) = plain.of("consultation:cost_estimated")[-1:]
    # one warm-up writes the context block, then each of the 3 agents reads it
    assert with_cache["cached_input_tokens"] > 0 and with_cache["cached_input_tokens"] % 3 == 0
    assert without["cached_input_tokens"] == 0 and with_cache["estimated_cost"] < without["estimated_cost"]
    # the estimate is an honest bound of what was then billed, with and without caching
    assert cached.result.cost.actual <= with_cache["estimated_cost"]
    assert plain.result.cost.actual <= without["estimated_cost"]
    sent = [r for r in fake.requests if r.api == "anthropic"]
    assert sent and not any("cache_control" in json.dumps(r.json) for r in sent)
    assert all(r.cached_tokens == 0 for r in sent)


async def test_a_gemini_panel_creates_one_cached_content_uses_it_everywhere_and_deletes_it(
        fake_provider_server: FakeProviderServer, conclave_env: Any, context_file: Path) -> None:
    fake = fake_provider_server
    run = await run_consultation(fake, f"context=[{context_file}]", "agents=gemini_only",
                                 "judge.model=gemini-2.5-flash", "agents.security.model=gemini-2.5-flash",
                                 "agents.architect.model=gemini-2.5-flash", "agents.pragmatist.model=gemini-2.5-flash")
    assert run.result.status == "complete"
    created = [r for r in fake.requests if r.path.endswith("/cachedContents")]
    generated = [r for r in fake.requests if ":generateContent" in r.path or ":streamGenerateContent" in r.path]
    assert len(created) == 1 and len(generated) == 9
    assert all(r.json["cachedContent"].startswith("cachedContents/") and "systemInstruction" not in r.json
               for r in generated)
    assert len({r.json["cachedContent"] for r in generated}) == 1 and all(r.cached_tokens > 0 for r in generated)
    deleted = [r for r in fake.requests if r.method == "DELETE"]
    assert [r.path.rsplit("/", 1)[-1] for r in deleted] == [generated[0].json["cachedContent"].rsplit("/", 1)[-1]]
    assert not fake.cache.contents
    # the creation is billed once, as a write carried by the first answered call
    (write,) = [a for a in run.of("provider:attempt") if a["cache_write_tokens"]]
    assert write["cache_write_tokens"] == generated[0].cached_tokens


async def test_gemini_falls_back_to_the_whole_prompt_when_the_cache_cannot_be_created(
        conclave_env: Any, context_file: Path) -> None:
    async with FakeProviderServer(prompt_cache=PromptCacheModel(min_tokens=10**9)) as fake:
        run = await run_consultation(fake, f"context=[{context_file}]", "agents=gemini_only", "rounds=1",
                                     "agents.security.model=gemini-2.5-flash",
                                     "agents.architect.model=gemini-2.5-flash",
                                     "agents.pragmatist.model=gemini-2.5-flash")
        assert run.result.status == "complete"
        generated = [r for r in fake.requests if ":generateContent" in r.path or ":streamGenerateContent" in r.path]
        assert generated and all("cachedContent" not in r.json and "systemInstruction" in r.json for r in generated)
        assert len([r for r in fake.requests if r.path.endswith("/cachedContents")]) == 1  # tried once, not per call


@pytest.mark.slow
async def test_cli_consultation_records_cached_tokens_that_stats_report(
        fake_provider_server: FakeProviderServer, conclave_env: Path, context_file: Path) -> None:
    fake = fake_provider_server
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(conclave_env), CONCLAVE_PROGRESS="0")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", QUESTION, f"context=[{context_file}]", "agents=anthropic_only", "rounds=1",
        "judge.model=claude-sonnet-4-5", "cost.auto_approve=true", "output.format=json", *fake.overrides(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(conclave_env), env=env)
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, err.decode()
    result = json.loads(out)
    sent = sum(r.cached_tokens for r in fake.requests)
    assert result["tokens"]["cached_input"] == sent > 0
    db = connect(StoreLayout(conclave_env).index_path)
    try:
        stats = compute_stats(db, period_from_args(all_time=True))
    finally:
        db.close()
    assert stats["tokens"]["cached_input"] == sent
    assert stats["tokens"]["cache_write"] == sum(r.cache_write_tokens for r in fake.requests) > 0


async def test_gemini_sends_the_whole_prompt_again_when_its_cached_content_has_gone(
        fake_provider_server: FakeProviderServer, conclave_env: Any, context_file: Path) -> None:
    from conclave.testing.fake_server import Reply
    from conclave.testing.schema_instances import instance_for

    fake = fake_provider_server

    def expire_then_answer(request: RecordedRequest) -> Reply:
        fake.cache.contents.clear()  # the cache expires while round 1 is being answered
        return Reply(json=instance_for(request.schema))

    fake.script("gemini-2.5-flash", expire_then_answer)
    run = await run_consultation(fake, f"context=[{context_file}]", "agents=gemini_only", "rounds=2",
                                 "judge.model=gemini-2.5-flash", "agents.security.model=gemini-2.5-flash",
                                 "agents.architect.model=gemini-2.5-flash", "agents.pragmatist.model=gemini-2.5-flash")
    assert run.result.status == "complete"
    calls = [r for r in fake.requests_for("gemini-2.5-flash") if "generationConfig" in (r.json or {})]
    referenced = [i for i, r in enumerate(calls) if "cachedContent" in r.json]
    # after the refusal every call (the round-2 judge's included) carries the whole prompt; nothing is re-created
    assert referenced and all("systemInstruction" in r.json for r in calls[referenced[-1] + 1:])
    assert "cachedContent" not in calls[-1].json and len(calls) > 4
    assert len([r for r in fake.requests if r.path.endswith("/cachedContents")]) == 1


async def test_a_gemini_model_with_one_seat_is_left_to_the_implicit_cache(
        fake_provider_server: FakeProviderServer, conclave_env: Any, context_file: Path) -> None:
    fake = fake_provider_server
    # the default panel: one Gemini seat, whose calls come one after another
    run = await run_consultation(fake, f"context=[{context_file}]", "agents=default", "rounds=3",
                                 "agents.pragmatist.model=gemini-2.5-flash")
    assert run.result.status == "complete"
    assert not [r for r in fake.requests if r.path.endswith("/cachedContents")]  # no storage paid for
    generated = [r for r in fake.requests if ":generateContent" in r.path or ":streamGenerateContent" in r.path]
    assert len(generated) >= 2 and all("systemInstruction" in r.json for r in generated)
    # the whole prompt opens with the context every time, so the implicit cache serves every call after the first
    assert generated[0].cached_tokens == 0 and all(r.cached_tokens >= 1024 for r in generated[1:])


async def test_a_warm_up_is_sent_only_where_one_write_and_the_reads_cost_less_than_a_write_per_seat(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    from conclave.engine.caching import warm_up_pays
    from conclave.plugin_manager import load_plugins
    from conclave.providers.pool import ProviderPool

    async with ProviderPool(fake_provider_server.settings(), load_plugins()) as pool:
        assert not warm_up_pays(pool, "openai", "gpt-4o", 2)  # 1 + 2 × 0.5 = 2 prefills: nothing saved
        assert warm_up_pays(pool, "openai", "gpt-4o", 3)  # 2.5 instead of 3
        assert warm_up_pays(pool, "openai", "gpt-5", 2)  # 1 + 2 × 0.1
        assert warm_up_pays(pool, "anthropic", "claude-sonnet-4-5", 2)  # 1.25 + 2 × 0.1 instead of 2 × 1.25
