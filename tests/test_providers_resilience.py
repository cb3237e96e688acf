"""Retries, hedging, failover, strict_models, backup choice and the call log, against the fake server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conclave import events
from conclave.events import EventBus
from conclave.plugin_manager import load_plugins
from conclave.providers.base import (
    AuthError,
    BadRequestError,
    CompletionRequest,
    Message,
    ModelNotFoundError,
    ProviderTimeoutError,
    RateLimitedError,
    ServerError,
    SubstitutionRefusedError,
)
from conclave.providers.health import HealthStatus
from conclave.providers.pool import ProviderPool
from conclave.providers.retry import RetryPolicy
from conclave.testing.fake_server import FakeProviderServer, Fault, Reply

FAST_RETRIES = RetryPolicy(base_s=0.01, cap_s=0.02)
HEDGE_QUICKLY = {"enabled": True, "hedge_after_s": 0.05, "floor_s": 0.01, "budget": 1.0}
NO_HEDGING = {"enabled": False}
BACKUP = ("anthropic", "claude-sonnet-4-6")  # the first tier-1 entry on another provider than openai
ANSWER = {"position": "yes", "confidence": 0.7}


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai,anthropic,gemini")
    return load_plugins()


@pytest.fixture
def bus() -> tuple[EventBus, list[events.Event]]:
    bus = EventBus("c-test")
    seen: list[events.Event] = []
    bus.subscribe(seen.append)
    return bus, seen


def _request(model: str = "gpt-4o", **kw: Any) -> CompletionRequest:
    return CompletionRequest(model=model, messages=(Message("user", "Should we?"),), **kw)


def _pool(fake: FakeProviderServer, plugins: Any, bus: EventBus | None = None, **settings: Any) -> ProviderPool:
    settings.setdefault("hedging", NO_HEDGING)
    return ProviderPool(fake.settings(**settings), plugins, bus, retry_policy=FAST_RETRIES)


async def _ask(pool: ProviderPool, **kw: Any) -> Any:
    kw.setdefault("request", _request())
    return await pool.complete(agent="architect", provider=kw.pop("provider", "openai"), round_number=1, **kw)


async def _eventually(predicate: Any) -> bool:
    """Poll ``predicate`` for up to five seconds (the server notices a closed connection a moment after the client
    closes it; on a loaded machine that moment passed a second once)."""
    for _ in range(500):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return bool(predicate())


# ------------------------------------------------------------------------------------- retries


async def test_retry_waits_for_retry_after_then_succeeds(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", [Fault.rate_limited(retry_after=0.3), Reply(text="after the wait")])
    async with _pool(fake, plugins) as pool:
        completion = await _ask(pool)
    assert completion.text == "after the wait"
    assert [(a.number, a.outcome, a.status) for a in completion.attempts] == [(1, "rate_limited", 429),
                                                                              (2, "ok", 200)]
    first, second = fake.requests_for("gpt-4o")
    assert second.ts - first.ts >= 0.3


async def test_retries_are_bounded_by_max_attempts(fake_provider_server, conclave_env, plugins):
    fake_provider_server.script("gpt-4o", Fault.server_error(502))
    async with _pool(fake_provider_server, plugins) as pool:
        with pytest.raises(ServerError, match="HTTP 502"):
            await _ask(pool, allow_substitution=False)
        assert [a.number for a in pool.attempts] == [1, 2, 3]  # providers.openai.max_attempts defaults to 3
    assert len(fake_provider_server.requests_for("gpt-4o")) == 3


@pytest.mark.parametrize(("fault", "error"), [(Fault.auth_rejected(), AuthError),
                                              (Fault.unknown_model(), ModelNotFoundError),
                                              (Fault.bad_request(), BadRequestError)],
                         ids=["401", "404", "400"])
async def test_auth_unknown_model_and_bad_request_are_never_retried(fake_provider_server, conclave_env, plugins,
                                                                    fault, error):
    fake_provider_server.script("gpt-4o", fault)
    async with _pool(fake_provider_server, plugins) as pool:
        with pytest.raises(error):
            await _ask(pool, allow_substitution=False)
    assert len(fake_provider_server.requests_for("gpt-4o")) == 1


async def test_retry_after_beyond_the_deadline_gives_up_at_once(fake_provider_server, conclave_env, plugins):
    fake_provider_server.script("gpt-4o", Fault.rate_limited(retry_after=30))
    async with _pool(fake_provider_server, plugins) as pool:
        with pytest.raises(RateLimitedError, match="retry after 30s"):
            await _ask(pool, request=_request(timeout_s=2.0), allow_substitution=False)
    assert len(fake_provider_server.requests_for("gpt-4o")) == 1


async def test_the_deadline_bounds_the_whole_call_including_retries(fake_provider_server, conclave_env, plugins):
    fake_provider_server.script("gpt-4o", [Fault.server_error(500), Fault.hang()])
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with _pool(fake_provider_server, plugins) as pool:
        with pytest.raises(ProviderTimeoutError):
            await _ask(pool, request=_request(timeout_s=0.3), allow_substitution=False)
    assert 0.25 <= loop.time() - started < 1.0


# ------------------------------------------------------------------------------------- hedging


async def test_hedge_won_by_the_backup_cancels_the_primary(fake_provider_server, conclave_env, plugins, bus):
    fake = fake_provider_server
    fake.script("gpt-4o", Reply(json={"from": "primary"}, latency=0.3))
    fake.script(BACKUP[1], Reply(json=ANSWER))
    async with _pool(fake, plugins, bus[0], hedging=HEDGE_QUICKLY) as pool:
        completion = await _ask(pool, request=_request(json_schema={"type": "object"}))
        substitutions = pool.substitutions
    assert (completion.provider, completion.parsed) == ("anthropic", ANSWER)
    assert [(a.provider, a.outcome, a.hedge) for a in completion.attempts] == [
        ("anthropic", "ok", True), ("openai", "cancelled", False)]
    assert await _eventually(lambda: fake.requests_for("gpt-4o")[0].disconnected)
    assert substitutions == [{
        "round_number": 1, "agent": "architect", "original_provider": "openai", "original_model": "gpt-4o",
        "substitute_provider": "anthropic", "substitute_model": BACKUP[1], "reason": "timeout",
    }]
    assert [e.data for e in bus[1] if e.type == events.PROVIDER_SUBSTITUTED] == substitutions


async def test_hedge_lost_by_the_backup_keeps_the_primary_answer(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Reply(text="primary", latency=0.12))
    fake.script(BACKUP[1], Reply(text="backup", latency=0.3))
    async with _pool(fake, plugins, hedging=HEDGE_QUICKLY) as pool:
        completion = await _ask(pool)
        assert pool.substitutions == []
    assert (completion.provider, completion.text) == ("openai", "primary")
    assert [(a.provider, a.outcome, a.hedge) for a in completion.attempts] == [
        ("openai", "ok", False), ("anthropic", "cancelled", True)]
    assert await _eventually(lambda: fake.requests_for(BACKUP[1])[0].disconnected)


async def test_no_hedge_when_the_budget_is_spent(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", [Reply(text="slow", latency=0.15), Reply(text="twin"),
                           Reply(text="slow primary", latency=0.15)])
    # the bucket holds 1 token: the first slow call hedges, the second (0.05 tokens earned since) waits
    async with _pool(fake, plugins, hedging={**HEDGE_QUICKLY, "budget": 0.05, "burst": 1},
                     strict_models=True) as pool:
        await _ask(pool)
        completion = await _ask(pool)
        assert (pool.budget.calls, pool.budget.used) == (2, 1)
    assert completion.text == "slow primary"
    assert [a.hedge for a in completion.attempts] == [False]


async def test_a_single_call_may_hedge_at_the_default_budget(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", [Reply(text="slow primary", latency=0.4), Reply(text="fast twin")])
    # the default budget (5%) on a consultation's first call: the full bucket pays for a hedge at once
    async with _pool(fake, plugins, hedging={**HEDGE_QUICKLY, "budget": 0.05}, strict_models=True) as pool:
        completion = await _ask(pool)
        assert pool.budget.used == 1
    assert completion.text == "fast twin"


async def test_strict_models_hedges_with_the_same_model_only(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", [Reply(text="slow", latency=0.3), Reply(text="fast twin")])
    async with _pool(fake, plugins, hedging=HEDGE_QUICKLY, strict_models=True) as pool:
        completion = await _ask(pool)
        assert pool.substitutions == []
    assert (completion.provider, completion.text) == ("openai", "fast twin")
    assert {r.model for r in fake.requests} == {"gpt-4o"}


async def test_streamed_chunks_come_from_the_attempt_that_answers(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Reply(text="primary text", latency=0.3))
    fake.script(BACKUP[1], Reply(text="the backup's streamed answer"))
    chunks: list[str] = []
    async with _pool(fake, plugins, hedging=HEDGE_QUICKLY) as pool:
        completion = await _ask(pool, on_chunk=chunks.append)
    assert "".join(chunks) == completion.text == "the backup's streamed answer"


# ------------------------------------------------------------------------------------- failover


@pytest.mark.parametrize("fault", [Fault.server_error(500), Fault.unknown_model()], ids=["5xx", "404"])
async def test_primary_failure_fails_over_to_the_backup(fake_provider_server, conclave_env, plugins, bus, fault):
    fake = fake_provider_server
    fake.script("gpt-4o", fault)
    fake.script(BACKUP[1], Reply(text="backup answer"))
    async with _pool(fake, plugins, bus[0]) as pool:
        completion = await _ask(pool)
    assert (completion.provider, completion.text) == ("anthropic", "backup answer")
    assert completion.attempts[-1].provider == "anthropic"
    assert [e.data["reason"] for e in bus[1] if e.type == events.PROVIDER_SUBSTITUTED] == ["failure"]


async def test_rejected_key_does_not_fail_over(fake_provider_server, conclave_env, plugins):
    fake_provider_server.script("gpt-4o", Fault.auth_rejected())
    async with _pool(fake_provider_server, plugins) as pool:
        with pytest.raises(AuthError):
            await _ask(pool)
        assert pool.substitutions == []
    assert [r.model for r in fake_provider_server.requests] == ["gpt-4o"]


async def test_strict_models_turns_failover_into_an_error_naming_agent_and_models(fake_provider_server, conclave_env,
                                                                                  plugins):
    fake_provider_server.script("gpt-4o", Fault.server_error(500))
    async with _pool(fake_provider_server, plugins, strict_models=True) as pool:
        with pytest.raises(SubstitutionRefusedError) as caught:
            await _ask(pool)
    message = str(caught.value)
    assert "agent 'architect'" in message
    assert "openai/gpt-4o" in message and f"{BACKUP[0]}/{BACKUP[1]}" in message
    assert {r.model for r in fake_provider_server.requests} == {"gpt-4o"}


async def test_when_the_backup_fails_too_the_primary_error_is_raised(fake_provider_server, conclave_env, plugins):
    fake_provider_server.script("gpt-4o", Fault.server_error(500))
    fake_provider_server.script(BACKUP[1], Fault.overloaded())
    async with _pool(fake_provider_server, plugins) as pool:
        with pytest.raises(ServerError) as caught:
            await _ask(pool)
    assert any("backup anthropic/claude-sonnet-4-6 failed too" in note for note in caught.value.__notes__)


# ------------------------------------------------------------------------------------- backups and health


async def test_backup_prefers_healthy_and_skips_unhealthy_providers(fake_provider_server, conclave_env, plugins):
    async with _pool(fake_provider_server, plugins) as pool:
        assert pool.backup_for("openai", "gpt-4o") == BACKUP  # all UNKNOWN: tier order decides
        pool.health.record("gemini", "gemini-2.5-pro", ok=True, latency_s=0.5)
        assert pool.health.status("gemini") is HealthStatus.HEALTHY
        assert pool.backup_for("openai", "gpt-4o") == ("gemini", "gemini-2.5-pro")
        for _ in range(3):
            pool.health.record("gemini", "gemini-2.5-pro", ok=False, latency_s=0.1)
        assert pool.health.status("gemini") is HealthStatus.UNHEALTHY
        assert pool.backup_for("openai", "gpt-4o") == BACKUP
        assert pool.backup_for("anthropic", "claude-sonnet-4-5") == ("openai", "gpt-4.1")  # not anthropic, not gemini
        cheap = pool.backup_for("openai", "gpt-4o-mini")  # a cheap model's backup comes from the lowest tier
        assert cheap is not None and cheap[0] != "openai" and cheap in pool.tiers.tiers[2].models


async def test_backup_requires_a_key_on_keyed_endpoints(conclave_env, plugins, monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    async with FakeProviderServer() as fake:
        providers = fake.providers_config()
        providers["anthropic"]["base_url"] = "https://api.anthropic.com"  # needs a key; none is set
        async with _pool(fake, plugins, providers=providers) as pool:
            assert pool.backup_for("openai", "gpt-4o") == ("gemini", "gemini-2.5-pro")


async def test_attempts_feed_health_and_the_hedge_delay(fake_provider_server, conclave_env, plugins):
    fake_provider_server.script("gpt-4o", Reply(text="ok", latency=0.05))
    async with _pool(fake_provider_server, plugins) as pool:
        assert pool.health.status("openai") is HealthStatus.UNKNOWN
        await _ask(pool)
        assert pool.health.status("openai") is HealthStatus.HEALTHY
        p90 = pool.health.latency_quantile("openai", "gpt-4o", 0.9)
        assert p90 is not None and 0.05 <= p90 < 0.5


# ------------------------------------------------------------------------------------- the call log


async def test_every_attempt_is_emitted_with_cost(fake_provider_server, conclave_env, plugins, bus):
    fake = fake_provider_server
    fake.script("gpt-4o", [Fault.server_error(503), Reply(text="ok", usage=(1_000_000, 100_000, 0))])
    async with _pool(fake, plugins, bus[0]) as pool:
        await _ask(pool)
        attempts = pool.attempts
    emitted = [e.data for e in bus[1] if e.type == events.PROVIDER_ATTEMPT]
    assert [(d["number"], d["outcome"], d["status"]) for d in emitted] == [(1, "overloaded", 503), (2, "ok", 200)]
    assert emitted[1]["cost"] == pytest.approx(2.50 + 1.00)  # gpt-4o: $2.50/M in, $10/M out
    assert emitted[0]["cost"] == 0.0
    assert emitted[1]["agent"] == "architect" and emitted[1]["round_number"] == 1 and not emitted[1]["hedge"]
    assert len(attempts) == 2


async def test_unknown_model_cost_is_unknown_not_zero(fake_provider_server, conclave_env, plugins, bus):
    async with _pool(fake_provider_server, plugins, bus[0]) as pool:
        completion = await _ask(pool, request=_request("my-finetune-7"))
        assert pool.cost("openai", "my-finetune-7", completion.usage) is None
        assert pool.estimate_cost("openai", "my-finetune-7", 10, 10) is None
    assert [e.data["cost"] for e in bus[1] if e.type == events.PROVIDER_ATTEMPT] == [None]


async def test_cancelling_the_call_cancels_the_request(fake_provider_server, conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", Fault.hang())
    async with _pool(fake, plugins, hedging=HEDGE_QUICKLY) as pool:
        task = asyncio.create_task(_ask(pool, allow_substitution=False))
        assert await _eventually(lambda: len(fake.requests) == 2)  # the primary and its same-model hedge
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [a.outcome for a in pool.attempts] == ["cancelled", "cancelled"]
    assert await _eventually(lambda: all(r.disconnected for r in fake.requests))


async def test_every_attempt_waits_for_the_journal_first_retries_included(fake_provider_server, conclave_env, plugins):
    # a retry spends again: what the journal holds must still be durable (a disk refused in between stops it)
    fake = fake_provider_server
    fake.script("gpt-4o", [Fault.server_error(503), Reply(text="second")])
    waits: list[int] = []

    async def before_spending() -> None:
        waits.append(len(fake.requests))

    async with _pool(fake, plugins) as pool:
        pool.before_spending = before_spending
        completion = await _ask(pool)
    assert completion.text == "second"
    assert waits == [0, 1]  # before the first request, and before the retry (after the first was answered)
