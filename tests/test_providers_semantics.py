"""Provider semantics the official SDKs encode (quota, x-should-retry, RetryInfo, refusals, 408/409, Gemini's schema
keywords, Anthropic's temperature), and the pool's own bookkeeping (abandoned attempts priced, substitution labels,
follow-ups to the stand-in, closing), against the fake server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from conclave_plugins.gemini import GEMINI_KEYWORDS

from conclave.config.settings import ProviderSettings
from conclave.events import EventBus
from conclave.plugin_manager import load_plugins
from conclave.providers.base import (
    CompletionRequest,
    Message,
    ProviderError,
    QuotaExhaustedError,
    RateLimitedError,
    RefusalError,
)
from conclave.providers.pool import ProviderPool
from conclave.providers.pricing import PriceTable, same_model
from conclave.providers.retry import RetryPolicy
from conclave.providers.schema_hints import restrict_keywords
from conclave.testing.fake_server import FakeProviderServer, Fault, Reply

FAST_RETRIES = RetryPolicy(base_s=0.01, cap_s=0.02)
ANSWER = {"position": "yes", "confidence": 0.7}
MODELS = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-5", "gemini": "gemini-2.5-pro"}


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai,anthropic,gemini")
    return load_plugins()


def _request(model: str, **kw: Any) -> CompletionRequest:
    return CompletionRequest(model=model, messages=(Message("user", "Should we?"),), **kw)


def _pool(fake: FakeProviderServer, plugins: Any, **settings: Any) -> ProviderPool:
    settings.setdefault("hedging", {"enabled": False})
    return ProviderPool(fake.settings(**settings), plugins, retry_policy=FAST_RETRIES)


async def _ask(pool: ProviderPool, provider: str, substitute: bool = False, **kw: Any) -> Any:
    request = kw.pop("request", None) or _request(MODELS[provider], json_schema={"type": "object"})
    return await pool.complete(agent="architect", provider=provider, request=request, round_number=1,
                               allow_substitution=substitute, **kw)


# ------------------------------------------------------------------------------------- error semantics


async def test_openai_insufficient_quota_is_a_distinct_error_never_retried(fake_provider_server, conclave_env,
                                                                          plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Fault.insufficient_quota())
    async with _pool(fake, plugins) as pool:
        with pytest.raises(QuotaExhaustedError, match="quota exhausted for this key — check billing"):
            await _ask(pool, "openai")
        attempts = pool.attempts
    assert len(fake.requests_for("gpt-4o")) == 1
    assert [a.outcome for a in attempts] == ["quota"]


async def test_a_plain_openai_429_is_still_a_retried_rate_limit(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Fault.rate_limited(retry_after=0.01), Reply(json=ANSWER))
    async with _pool(fake, plugins) as pool:
        completion = await _ask(pool, "openai")
    assert [a.outcome for a in completion.attempts] == ["rate_limited", "ok"]


@pytest.mark.parametrize(("fault", "requests"), [
    (Fault.server_error(500, should_retry=False), 1),  # x-should-retry: false wins over "5xx is retried"
    (Fault.http(400, "try again", ), 1),
])
async def test_x_should_retry_false_stops_retries(fake_provider_server, conclave_env, plugins, fault, requests):
    fake = fake_provider_server
    fake.script("gpt-4o", fault, Reply(json=ANSWER))
    async with _pool(fake, plugins) as pool:
        with pytest.raises(ProviderError):
            await _ask(pool, "openai")
    assert len(fake.requests_for("gpt-4o")) == requests


async def test_x_should_retry_true_retries_what_would_not_be(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("claude-sonnet-4-5", Fault("http", 400, "overloaded, try again", should_retry=True),
                Reply(json=ANSWER))
    async with _pool(fake, plugins) as pool:
        completion = await _ask(pool, "anthropic")
    assert [a.outcome for a in completion.attempts] == ["bad_request", "ok"]


@pytest.mark.parametrize("fault", [Fault.conflict(), Fault.request_timeout()], ids=["409", "408"])
async def test_409_and_408_are_retried_like_the_sdks_do(fake_provider_server, conclave_env, plugins, fault):
    fake = fake_provider_server
    fake.script("gpt-4o", fault, Reply(json=ANSWER))
    async with _pool(fake, plugins) as pool:
        completion = await _ask(pool, "openai")
    assert completion.parsed == ANSWER and len(completion.attempts) == 2


async def test_gemini_retry_delay_comes_from_the_body(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gemini-2.5-pro", Fault.resource_exhausted("0.2s"), Reply(json=ANSWER))
    async with _pool(fake, plugins) as pool:
        completion = await _ask(pool, "gemini")
    first, second = fake.requests_for("gemini-2.5-pro")
    assert second.ts - first.ts >= 0.19  # the body's RetryInfo, not our 10-20 ms backoff
    assert "retry after 0.2s" in (completion.attempts[0].error or "")


async def test_gemini_retry_delay_beyond_the_deadline_is_not_waited_for(fake_provider_server, conclave_env,
                                                                       plugins):
    fake = fake_provider_server
    fake.script("gemini-2.5-pro", Fault.resource_exhausted("33s"))
    providers = fake.providers_config()
    providers["gemini"]["timeout_s"] = 5
    async with _pool(fake, plugins, providers=providers) as pool:
        with pytest.raises(RateLimitedError) as caught:
            await _ask(pool, "gemini")
    assert caught.value.retry_after_s == 33 and len(fake.requests_for("gemini-2.5-pro")) == 1


async def test_gemini_per_day_quota_is_not_retried(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gemini-2.5-pro", Fault.resource_exhausted("0.01s", per_day=True))
    async with _pool(fake, plugins) as pool:
        with pytest.raises(QuotaExhaustedError, match=r"per-day quota .* midnight Pacific"):
            await _ask(pool, "gemini")
    assert len(fake.requests_for("gemini-2.5-pro")) == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_an_openai_refusal_is_a_typed_refusal_streamed_or_not(fake_provider_server, conclave_env, plugins,
                                                                  stream):
    fake = fake_provider_server
    fake.script("gpt-4o", Reply(refusal="I can't help with that request."))
    chunks: list[str] = []
    async with _pool(fake, plugins) as pool:
        with pytest.raises(RefusalError, match=r"refused to answer: I can't help with that request\."):
            await _ask(pool, "openai", on_chunk=chunks.append if stream else None)
    assert chunks == [] and len(fake.requests_for("gpt-4o")) == 1  # not retried


# ------------------------------------------------------------------------------------- request bodies


def test_the_gemini_schema_uses_only_its_documented_keywords():
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "type": "object",
        "properties": {
            "kind": {"const": "verdict"},
            "summary": {"type": "string", "minLength": 1, "pattern": "^\\S", "description": "short"},
            "items": {"type": "array", "minItems": 1, "items": {"type": "string", "maxLength": 5}},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["kind"], "additionalProperties": False,
    }
    variant = restrict_keywords(schema, GEMINI_KEYWORDS)

    def keywords(node: Any) -> set[str]:
        if not isinstance(node, dict):
            return set()
        found = set(node) - {"properties"}
        for key, value in node.items():
            if key == "properties":
                for sub in value.values():
                    found |= keywords(sub)
            elif isinstance(value, dict):
                found |= keywords(value)
        return found

    assert keywords(variant) <= GEMINI_KEYWORDS
    assert variant["properties"]["kind"] == {"enum": ["verdict"]}
    assert variant["properties"]["summary"]["description"] == 'short Constraints: {"pattern": "^\\\\S", "minLength": 1}'
    assert variant["properties"]["items"]["minItems"] == 1  # documented keywords are kept as they are
    assert variant["properties"]["score"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert schema["properties"]["kind"] == {"const": "verdict"}  # the input is left alone


async def test_gemini_receives_the_restricted_schema(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
              "properties": {"a": {"type": "string", "minLength": 2}}}
    fake.script("gemini-2.5-pro", Reply(json={"a": "ok"}))
    async with _pool(fake, plugins) as pool:
        await _ask(pool, "gemini", request=_request("gemini-2.5-pro", json_schema=schema))
    sent = fake.requests_for("gemini-2.5-pro")[0].schema
    assert "$schema" not in sent and "minLength" not in sent["properties"]["a"]


def test_anthropic_temperature_is_gated_on_the_api_version(plugins):
    import conclave_plugins.anthropic as anthropic

    provider = plugins.providers.get("anthropic")("anthropic", ProviderSettings(api="anthropic"), None, environ={})
    request = _request("claude-sonnet-4-5", temperature=0.2)
    assert anthropic.API_VERSION == "2023-06-01" and provider.body(request, stream=False)["temperature"] == 0.2
    assert anthropic.accepts_temperature("2023-06-01") and not anthropic.accepts_temperature("2026-10-21")


async def test_the_fake_accepts_an_anthropic_key_as_bearer_like_the_real_api(conclave_env):
    import aiohttp

    async with FakeProviderServer(keys={"anthropic": "sk-ant-right"}) as fake, aiohttp.ClientSession() as http:
        url = fake.base_url("anthropic") + "/v1/messages"
        body = {"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(url, json=body, headers={"Authorization": "Bearer sk-ant-right"}) as ok:
            assert ok.status == 200
        async with http.post(url, json=body, headers={"Authorization": "Bearer sk-ant-wrong"}) as wrong:
            assert wrong.status == 401


# ------------------------------------------------------------------------------------- the pool's bookkeeping


async def test_a_hedge_loser_is_priced_not_free(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Reply(json={"from": "primary"}, latency=0.5))
    fake.script("claude-sonnet-4-6", Reply(json=ANSWER))
    hedging = {"enabled": True, "hedge_after_s": 0.05, "floor_s": 0.01, "budget": 1.0}
    async with _pool(fake, plugins, hedging=hedging) as pool:
        completion = await _ask(pool, "openai", substitute=True)
        loser = next(a for a in pool.attempts if a.outcome == "cancelled")
        loser_cost = pool.cost(loser.provider, loser.model, loser.usage)
    assert completion.provider == "anthropic"
    assert loser.estimated and loser.usage.input_tokens > 0
    assert loser_cost is not None and loser_cost > 0


async def test_a_cut_off_stream_is_priced_with_what_arrived(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Fault.truncated_stream())
    async with _pool(fake, plugins, providers={
            **fake.providers_config(), "openai": {**fake.providers_config()["openai"], "max_attempts": 1}}) as pool:
        with pytest.raises(ProviderError):
            await _ask(pool, "openai", on_chunk=lambda _t: None)
        [attempt] = pool.attempts
    assert attempt.estimated and attempt.usage.input_tokens > 0 and attempt.usage.output_tokens > 0


async def test_an_http_error_is_not_billed(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Fault.http(400, "bad"))
    async with _pool(fake, plugins) as pool:
        with pytest.raises(ProviderError):
            await _ask(pool, "openai")
        [attempt] = pool.attempts
    assert not attempt.estimated and attempt.usage.total_tokens == 0


async def test_a_hedge_won_after_the_primary_failed_is_labelled_failure(fake_provider_server, conclave_env,
                                                                         plugins):
    fake = fake_provider_server
    # the primary is slow (so the hedge starts), then fails outright; the backup answers after that
    fake.script("gpt-4o", Fault.server_error(500, latency=0.15))
    fake.script("claude-sonnet-4-6", Reply(json=ANSWER, latency=0.3))
    hedging = {"enabled": True, "hedge_after_s": 0.05, "floor_s": 0.01, "budget": 1.0}
    providers = fake.providers_config()
    providers["openai"]["max_attempts"] = 1
    async with _pool(fake, plugins, hedging=hedging, providers=providers) as pool:
        await _ask(pool, "openai", substitute=True)
        assert [s["reason"] for s in pool.substitutions] == ["failure"]


async def test_a_re_ask_after_a_substitution_goes_to_the_stand_in(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Fault.server_error(500))
    fake.script("claude-sonnet-4-6", Reply(json={"wrong": True}), Reply(json=ANSWER))
    async with _pool(fake, plugins) as pool:
        first = await _ask(pool, "openai", substitute=True)
        failed_calls = len(fake.requests_for("gpt-4o"))
        follow_up = await _ask(pool, "openai", substitute=True)  # the engine's re-ask names the original again
        after_follow_up = len(fake.requests_for("gpt-4o"))
        other_round = await pool.complete(agent="architect", provider="openai", round_number=3,
                                          request=_request("gpt-4o"), allow_substitution=True)
    assert (first.provider, follow_up.provider, follow_up.parsed) == ("anthropic", "anthropic", ANSWER)
    assert (failed_calls, after_follow_up) == (3, 3)  # the follow-up never went back to the failed provider
    # it failed for good in round 1: round 3 goes straight to the substitute, saying why
    assert len(fake.requests_for("gpt-4o")) == 3 and other_round.provider == "anthropic"
    assert [(s["round_number"], s["reason"]) for s in pool.substitutions] == [(1, "failure"), (3, "unavailable")]
    assert pool.unavailable_reason("openai", "gpt-4o").startswith("openai/gpt-4o failed in round 1 (server_error")


async def test_closing_the_pool_closes_the_session_even_when_a_provider_close_raises(fake_provider_server,
                                                                                     conclave_env, plugins):
    pool = await _pool(fake_provider_server, plugins).__aenter__()
    openai, anthropic = pool.provider("openai"), pool.provider("anthropic")
    session = pool._session

    async def broken_close() -> None:
        raise RuntimeError("close failed")

    openai.close = broken_close  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="close failed"):
        await pool.__aexit__(None, None, None)
    assert session is not None and session.closed
    assert openai.session is None and anthropic.session is None


def test_pricing_never_matches_a_model_by_substring():
    prices = PriceTable.load()
    mini, full = prices.price("openai", "gpt-4o-mini"), prices.price("openai", "gpt-4o")
    assert mini is not None and full is not None and mini != full
    assert prices.price("openai", "gpt-4o-mini-2024-07-18") == mini
    assert prices.price("openai", "gpt-4o-imaginary") is None
    assert same_model("gpt-4o", "gpt-4o-2024-08-06") and same_model("gemini-2.5-pro", "models/gemini-2.5-pro")
    assert not same_model("gpt-4o", "gpt-4o-mini") and not same_model("gpt-4o", "gpt-4o-mini-2024-07-18")


async def test_queued_calls_do_not_start_the_hedge_clock(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Reply(json=ANSWER, latency=0.3))
    hedging = {"enabled": True, "hedge_after_s": 0.4, "floor_s": 0.01, "budget": 1.0}
    providers = fake.providers_config()
    providers["openai"]["max_concurrency"] = 1
    async with _pool(fake, plugins, hedging=hedging, providers=providers) as pool:
        results = await asyncio.gather(*(pool.complete(agent=a, provider="openai", request=_request("gpt-4o"),
                                                       round_number=1) for a in ("a", "b", "c")))
    # the third call waited ~0.6 s in the queue, longer than the hedge delay, yet none was hedged
    assert all(r.provider == "openai" for r in results) and not any(a.hedge for r in results for a in r.attempts)
    assert json.loads(results[2].text) == ANSWER


async def test_a_hedge_fired_while_the_primary_waits_out_a_429_is_labelled_rate_limited(
        fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    # the primary is rate limited and waits 0.5 s before its retry; the hedge starts meanwhile and wins
    fake.script("gpt-4o", Fault.rate_limited(retry_after=0.5), Reply(json=ANSWER))
    fake.script("claude-sonnet-4-6", Reply(json=ANSWER))
    hedging = {"enabled": True, "hedge_after_s": 0.05, "floor_s": 0.01, "budget": 1.0}
    received: list[Any] = []
    bus = EventBus("c-test")
    bus.subscribe(received.append)
    async with ProviderPool(fake.settings(hedging=hedging), plugins, bus, retry_policy=FAST_RETRIES) as pool:
        completion = await _ask(pool, "openai", substitute=True)
        assert [s["reason"] for s in pool.substitutions] == ["rate_limited"]
    assert completion.provider == "anthropic"
    (hedged,) = [e.data for e in received if e.type == "provider:hedged"]
    assert (hedged["winner"], hedged["reason"]) == ("backup", "rate_limited")


@pytest.mark.parametrize(("primary", "asked_again"), [
    ([Fault.server_error(500), Fault.server_error(500), Fault.hang()], False),  # failed, retried, failed again
    ([Fault.server_error(500), Fault.hang()], True),  # failed once: may be a blip
    ([Fault.hang()], True),  # only slow
], ids=["failed-twice", "failed-once", "slow"])
async def test_a_primary_beaten_by_its_hedge_while_failing_is_not_asked_again(fake_provider_server, conclave_env,
                                                                               plugins, primary, asked_again):
    fake = fake_provider_server
    fake.script("gpt-4o", primary)
    fake.script("claude-sonnet-4-6", Reply(json=ANSWER, latency=0.3))  # wins while the primary hangs
    hedging = {"enabled": True, "hedge_after_s": 0.05, "floor_s": 0.01, "budget": 1.0, "burst": 8}
    async with ProviderPool(fake.settings(hedging=hedging), plugins, retry_policy=FAST_RETRIES) as pool:
        first = await _ask(pool, "openai", substitute=True)
        sent = len(fake.requests_for("gpt-4o"))
        later = await pool.complete(agent="architect", provider="openai", round_number=3,
                                    request=_request("gpt-4o", json_schema={"type": "object"}),
                                    allow_substitution=True)
        reasons = [s["reason"] for s in pool.substitutions]
    assert first.provider == later.provider == "anthropic"
    assert (len(fake.requests_for("gpt-4o")) > sent) is asked_again
    # round 1: it was failing (or only slow) when the backup won; round 3: it hangs, or is not asked at all
    assert reasons == ["failure" if primary[0].kind == "http" else "timeout",
                       "timeout" if asked_again else "unavailable"]


async def test_anthropic_credit_exhausted_is_a_quota_error_that_fails_over(fake_provider_server, conclave_env,
                                                                           plugins):
    fake = fake_provider_server
    fake.script("claude-sonnet-4-5", Fault.http(400, "Your credit balance is too low to access the Anthropic API. "
                                                     "Please go to Plans & Billing to upgrade or purchase credits."))
    async with _pool(fake, plugins) as pool:
        with pytest.raises(QuotaExhaustedError, match="credit exhausted for this key"):
            await _ask(pool, "anthropic")
        substituted = await _ask(pool, "anthropic", substitute=True)  # not a bad request: another model may answer
    assert substituted.provider != "anthropic" and len(fake.requests_for("claude-sonnet-4-5")) == 1


async def test_a_primary_whose_same_model_hedge_answers_is_asked_again(fake_provider_server, conclave_env, plugins):
    """strict_models: the hedge is the same model; when it answers while the first request was failing, the model
    is alive and later calls ask it again."""
    fake = fake_provider_server
    # two quick 500s, then a hanging retry; the hedge, sent after them, is the fourth request and answers
    fake.script("gpt-4o", Fault.server_error(500), Fault.server_error(500), Fault.hang(), Reply(json=ANSWER))
    hedging = {"enabled": True, "hedge_after_s": 0.3, "floor_s": 0.01, "budget": 1.0, "burst": 8}
    async with ProviderPool(fake.settings(hedging=hedging, strict_models=True), plugins,
                            retry_policy=FAST_RETRIES) as pool:
        await _ask(pool, "openai", substitute=True)
        sent = len(fake.requests_for("gpt-4o"))
        later = await pool.complete(agent="architect", provider="openai", round_number=3,
                                    request=_request("gpt-4o", json_schema={"type": "object"}))
        assert pool.unavailable == {} and pool.substitutions == []
    assert later.provider == "openai" and len(fake.requests_for("gpt-4o")) == sent + 1
