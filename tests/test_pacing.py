"""Pacing by the rate-limit headers the APIs send with every answer (conclave/providers/pacing.py): each API's
dialect read by its plugin, the rule on a fake clock, processes sharing one key's token bucket kept under it, and
the fake server sending the headers the way the real APIs (and their official SDKs) do."""

from __future__ import annotations

import heapq
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from conclave import events
from conclave.config.settings import ProviderSettings
from conclave.events import EventBus
from conclave.plugin_manager import load_plugins
from conclave.providers.base import CompletionRequest, Message
from conclave.providers.pacing import Allowance, Pacer, RateLimits, pacer_for
from conclave.providers.pool import ProviderPool
from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest, Reply
from conclave.testing.rate_limit import RateLimit, go_duration
from plugins.openai import duration_s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai,anthropic,gemini")
    return load_plugins()


def _provider(plugins: Any, api: str) -> Any:
    return plugins.providers.get(api)(api, ProviderSettings(api=api), None, environ={})


# ------------------------------------------------------------------------------------- the headers


@pytest.mark.parametrize(("text", "seconds"), [("1s", 1.0), ("6m0s", 360.0), ("20ms", 0.02), ("0s", 0.0),
                                               ("17.28s", 17.28), ("1h2m3.5s", 3723.5), ("250us", 0.00025)])
def test_openai_reset_durations_are_read_as_seconds(text: str, seconds: float) -> None:
    assert duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1", "soon", "1s2", "-1s", "1 s"])
def test_an_unreadable_duration_is_none(text: str) -> None:
    assert duration_s(text) is None


@pytest.mark.parametrize("seconds", [0.0, 0.12, 1.0, 4.875, 59.5, 61.25, 360.0, 3723.0])
def test_the_fake_writes_durations_the_reader_reads(seconds: float) -> None:
    assert duration_s(go_duration(seconds)) == pytest.approx(seconds, abs=0.001)


def test_openai_headers_give_requests_and_tokens_left(plugins: Any) -> None:
    headers = {"x-ratelimit-limit-requests": "5000", "x-ratelimit-remaining-requests": "4999",
               "x-ratelimit-reset-requests": "12ms", "x-ratelimit-limit-tokens": "160000",
               "x-ratelimit-remaining-tokens": "159976", "x-ratelimit-reset-tokens": "6m0s"}
    limits = _provider(plugins, "openai").rate_limits(headers)
    assert limits == RateLimits(Allowance(4999, 0.012), Allowance(159976, 360.0))


def test_openai_headers_without_a_usable_reset_say_nothing(plugins: Any) -> None:
    openai = _provider(plugins, "openai")
    assert openai.rate_limits({}) is None
    assert openai.rate_limits({"x-ratelimit-remaining-requests": "7"}) is None
    # Azure OpenAI sends -1 for a limit it does not report
    assert openai.rate_limits({"x-ratelimit-remaining-tokens": "-1", "x-ratelimit-reset-tokens": "0s"}) is None


def test_anthropic_headers_give_the_time_to_the_rfc3339_reset(plugins: Any) -> None:
    in_30s = (datetime.now(UTC) + timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    headers = {"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "12",
               "anthropic-ratelimit-requests-reset": in_30s, "anthropic-ratelimit-tokens-limit": "40000",
               "anthropic-ratelimit-tokens-remaining": "3000",
               "anthropic-ratelimit-tokens-reset": "2020-01-01T00:00:00Z"}  # past: whole again
    limits = _provider(plugins, "anthropic").rate_limits(headers)
    assert limits is not None and limits.requests is not None and limits.tokens == Allowance(3000, 0.0)
    assert limits.requests.remaining == 12 and 28.5 < limits.requests.reset_s <= 30.0
    assert _provider(plugins, "anthropic").rate_limits({"anthropic-ratelimit-requests-remaining": "3",
                                                        "anthropic-ratelimit-requests-reset": "tomorrow"}) is None


def test_gemini_sends_no_rate_limit_headers_and_reads_none(plugins: Any) -> None:
    assert _provider(plugins, "gemini").rate_limits({"x-ratelimit-remaining-requests": "1",
                                                     "x-ratelimit-reset-requests": "1s"}) is None


# ------------------------------------------------------------------------------------- the rule


def test_what_is_left_is_spread_over_the_time_to_reset() -> None:
    clock = Clock()
    pacer = Pacer(clock)
    pacer.heard(RateLimits(requests=Allowance(remaining=4, reset_s=2.0)))
    assert pacer.take() == 0.0
    assert pacer.take() == pytest.approx(0.5)  # 4 left over 2 s: one start every 0.5 s
    clock.now += 0.5
    assert pacer.take() == 0.0
    pacer.heard(RateLimits(requests=Allowance(remaining=40, reset_s=0.1)))  # a fresh reading: plenty left
    clock.now += 0.01
    assert pacer.take() == 0.0
    pacer.heard(RateLimits(requests=Allowance(remaining=0, reset_s=3.0)))  # none left: wait for the reset
    assert pacer.take() == pytest.approx(3.0)
    clock.now += 3.0  # the reset has passed: the limit is whole again and the reading no longer counts
    assert pacer.take() == 0.0
    assert pacer.take() == 0.0


def test_tokens_left_count_in_calls_of_this_process_s_average_size() -> None:
    clock = Clock()
    pacer = Pacer(clock)
    pacer.heard(RateLimits(tokens=Allowance(remaining=10_000, reset_s=10.0)))
    assert pacer.take() == 0.0 and pacer.take() == 0.0  # no call answered yet: its size is unknown
    pacer.answered(2_000)
    pacer.answered(2_000)
    assert pacer.take() == pytest.approx(2.0)  # 5 calls' worth left over 10 s: one every 2 s
    clock.now += 2.0
    assert pacer.take() == 0.0


def test_the_slower_of_the_headers_and_the_429_pace_holds() -> None:
    clock = Clock()
    pacer = Pacer(clock)
    pacer.heard(RateLimits(requests=Allowance(remaining=100, reset_s=1.0)))
    assert pacer.take() == 0.0
    pacer.refused(pacer.cuts, retry_after_s=0.3)  # a 429 though the headers left room: twice its Retry-After
    assert pacer.take() == pytest.approx(0.6)
    clock.now += 0.6
    assert pacer.take() == 0.0
    pacer.heard(RateLimits(requests=Allowance(remaining=1, reset_s=5.0)))  # now the headers are the slower
    assert pacer.take() == pytest.approx(5.0)


def _shared_bucket(processes: int, *, use_headers: bool, seconds: float = 120.0, per_process: int = 6,
                   latency: float = 0.05) -> tuple[int, int]:
    """``processes`` processes (a pacer each) keep ``per_process`` calls going against one key's token bucket
    (8/s, burst 40) for ``seconds`` on a simulated clock; a refused call waits for its Retry-After and is sent
    again. Returns (calls answered, 429s)."""
    clock = Clock()
    limit = RateLimit(8.0, 40, clock=clock)
    pacers = [Pacer(clock) for _ in range(processes)]
    end = clock.now + seconds
    # (when, sequence, process, the answer: None while the call is still to be sent)
    events: list[tuple[float, int, int, Any]] = []
    sequence = 0

    def at(when: float, process: int, answer: Any = None) -> None:
        nonlocal sequence
        sequence += 1
        heapq.heappush(events, (when, sequence, process, answer))

    for p in range(processes):
        for _ in range(per_process):
            at(clock.now, p)
    answered = 0
    while events:
        when, _, p, answer = heapq.heappop(events)
        clock.now = when
        pacer = pacers[p]
        if answer is not None:  # the answer arrives
            pace, fault, headers = answer
            if use_headers:
                pacer.heard(RateLimits(Allowance(float(headers["x-ratelimit-remaining-requests"]),
                                                 duration_s(headers["x-ratelimit-reset-requests"]) or 0.0)))
            if fault is not None:
                pacer.refused(pace, fault.retry_after)
                at(when + (fault.retry_after or 0.0), p)
            else:
                pacer.answered()
                answered += 1
                at(when, p)
            continue
        if when >= end:
            continue
        if (wait := pacer.take()) > 0:
            at(when + wait, p)
            continue
        request = RecordedRequest("openai", "gpt-4o", "/", "POST", {}, {}, {"n": sequence}, 0.0)
        fault = limit(request)
        at(when + latency, p, (pacer.cuts, fault, request.response_headers))
    return answered, limit.limited


def test_processes_sharing_a_key_stay_under_its_limit_by_the_headers() -> None:
    answered, refused = _shared_bucket(3, use_headers=True)
    # the bucket's refill (8/s for 120 s) plus its burst, nearly all of it used, and almost nothing refused
    assert answered >= 0.95 * (8 * 120 + 40)
    assert refused <= 0.01 * answered
    # without the headers (the 429 pace alone) the same processes keep overshooting the shared bucket
    answered_429, refused_429 = _shared_bucket(3, use_headers=False)
    assert refused_429 > 10 * max(refused, 1)
    assert answered >= 0.97 * answered_429  # and the headers cost next to no throughput


# ------------------------------------------------------------------------------------- end to end


def _request(model: str) -> CompletionRequest:
    return CompletionRequest(model=model, system="You are terse.", messages=(Message("user", "Say yes."),))


@pytest.mark.parametrize(("api", "model"), [("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4-5")])
async def test_a_call_through_the_pool_paces_its_endpoint_by_the_fake_s_headers(conclave_env, plugins, api, model):
    limit = RateLimit(0.2, 3)  # three at once, then one every 5 s
    async with FakeProviderServer() as fake:
        fake.script(model, lambda request: limit(request) or Reply(text="yes"))
        async with ProviderPool(fake.settings(hedging={"enabled": False}), plugins) as pool:
            for _ in range(2):
                await pool.complete(agent="a", provider=api, request=_request(model), round_number=1,
                                    allow_substitution=False)
            pacer = pacer_for(pool.provider(api).endpoint())
    assert pacer.limits.requests is not None
    assert pacer.limits.requests.remaining == 1  # 3, less the two calls
    assert 2.0 < pacer.limits.requests.reset_s <= 11.0  # the bucket is whole again in (10 s less the time between)
    assert pacer.take() > 1.0  # the one left is spread over the time to reset: the next call waits


async def test_a_call_waiting_for_its_pace_is_not_hedged(conclave_env, plugins):
    # the wait is the key's limit, not a slow server: a backup to the same endpoint would wait for the same limit
    # and, when both get sent, be paid twice (a default-size bench sweep paid 135 requests twice so)
    limit = RateLimit(1.0, 2)
    bus = EventBus("c-test")
    seen: list[events.Event] = []
    bus.subscribe(seen.append)
    settings = {"hedging": {"enabled": True, "hedge_after_s": 0.1, "floor_s": 0.01, "burst": 5}}
    async with FakeProviderServer() as fake:
        fake.script("gpt-4o", lambda request: limit(request) or Reply(text="yes"))
        async with ProviderPool(fake.settings(**settings), plugins, bus) as pool:
            for _ in range(2):  # the second waits ~1 s: one left, whole again in a second
                await pool.complete(agent="a", provider="openai", request=_request("gpt-4o"), round_number=1,
                                    allow_substitution=False)
            requests = fake.requests_for("gpt-4o")
    assert len(requests) == 2 and requests[1].ts - requests[0].ts > 0.5
    assert not [e for e in seen if e.type == events.PROVIDER_HEDGED]


async def test_a_call_waiting_out_a_429_is_not_hedged_on_the_same_endpoint(conclave_env, plugins):
    # no other provider to back it up: a backup on the same key waits for the same Retry-After, and when both are
    # then sent the request is paid twice
    bus = EventBus("c-test")
    seen: list[events.Event] = []
    bus.subscribe(seen.append)
    settings = {"hedging": {"enabled": True, "hedge_after_s": 0.1, "floor_s": 0.01, "burst": 5}}
    async with FakeProviderServer() as fake:
        fake.script("gpt-4o", Fault.rate_limited(retry_after=0.6), Reply(text="yes"), Reply(text="yes"))
        async with ProviderPool(fake.settings(**settings), plugins, bus) as pool:
            await pool.complete(agent="a", provider="openai", request=_request("gpt-4o"), round_number=1,
                                allow_substitution=False)
            requests = fake.requests_for("gpt-4o")
    assert len(requests) == 2  # the refused one and its retry
    assert not [e for e in seen if e.type == events.PROVIDER_HEDGED]


async def test_the_official_sdks_see_the_fake_s_rate_limit_headers(conclave_env) -> None:
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    limit = RateLimit(0.2, 3)
    async with FakeProviderServer() as fake:
        for model in ("gpt-4o", "claude-sonnet-4-5"):
            fake.script(model, lambda request: limit(request) or Reply(text="yes"))
        client = openai.AsyncOpenAI(api_key="sk-fake", base_url=fake.base_url("openai"), max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": "q"}])
        assert raw.headers["x-ratelimit-limit-requests"] == "3"
        assert raw.headers["x-ratelimit-remaining-requests"] == "2"
        assert duration_s(raw.headers["x-ratelimit-reset-requests"]) == pytest.approx(5.0, abs=0.1)
        assert raw.parse().choices[0].message.content == "yes"
        async with client.chat.completions.with_streaming_response.create(  # a stream carries them too
                model="gpt-4o", messages=[{"role": "user", "content": "q"}], stream=True) as streamed:
            assert streamed.headers["x-ratelimit-remaining-requests"] == "1"
        claude = anthropic.AsyncAnthropic(api_key="sk-ant-fake", base_url=fake.base_url("anthropic"), max_retries=0)
        raw = await claude.messages.with_raw_response.create(
            model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "q"}])
        assert raw.headers["anthropic-ratelimit-requests-remaining"] == "0"  # one per 5 s: none back yet
        reset = datetime.fromisoformat(raw.headers["anthropic-ratelimit-requests-reset"])
        assert 0 < (reset - datetime.now(UTC)).total_seconds() <= 16  # the bucket is whole in ~15 s
        with pytest.raises(anthropic.RateLimitError) as refused:  # the bucket is empty: 429, headers and all
            await claude.messages.create(model="claude-sonnet-4-5", max_tokens=10,
                                         messages=[{"role": "user", "content": "q"}])
        assert refused.value.response.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert "retry-after" in refused.value.response.headers
