"""The provider layer's parts on their own: health, hedge budget and delay, retry policy, pricing, tiers, SSE."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from conclave.config.settings import HedgingSettings
from conclave.providers.base import (
    AuthError,
    CompletionRequest,
    Message,
    RateLimitedError,
    ServerError,
    Usage,
)
from conclave.providers.health import HealthStatus, HealthThresholds, HealthTracker
from conclave.providers.hedging import NO_HISTORY_HEDGE_AFTER_S, HedgeBudget, hedge_after
from conclave.providers.http import parse_retry_after, provider_message, redact_secrets, schema_name
from conclave.providers.pricing import ModelPrice, PriceTable
from conclave.providers.probe import model_known
from conclave.providers.retry import RetryPolicy, call_with_retries
from conclave.providers.schema_hints import describe_constraints, described_constraints
from conclave.providers.sse import iter_sse
from conclave.providers.tiers import Tiers
from conclave.testing.schema_instances import instance_for

# ------------------------------------------------------------------------------------- health


def _tracker_with(*outcomes: tuple[bool, float]) -> HealthTracker:
    tracker = HealthTracker()
    for ok, latency in outcomes:
        tracker.record("p", "m", ok=ok, latency_s=latency)
    return tracker


@pytest.mark.parametrize(("outcomes", "status"), [
    ((), HealthStatus.UNKNOWN),
    (((True, 2.9),), HealthStatus.HEALTHY),
    (((True, 3.0),), HealthStatus.DEGRADED),
    (((True, 9.9),), HealthStatus.DEGRADED),
    (((True, 10.0),), HealthStatus.UNHEALTHY),
    (((True, 0.5), (False, 0.1)), HealthStatus.DEGRADED),
    (((True, 0.5), (False, 0.1), (False, 0.1), (False, 0.1)), HealthStatus.UNHEALTHY),
    (((False, 0.1), (False, 0.1), (True, 0.5)), HealthStatus.DEGRADED),  # error rate 2/3
])
def test_health_status_follows_the_seed_thresholds(outcomes, status):
    assert _tracker_with(*outcomes).status("p") is status


def test_health_window_forgets_old_outcomes():
    tracker = _tracker_with(*[(False, 0.1)] * 3, *[(True, 0.2)] * 10)
    snapshot = tracker.snapshot("p")
    assert (snapshot.status, snapshot.error_rate, snapshot.consecutive_failures) == (HealthStatus.HEALTHY, 0.0, 0)
    assert snapshot.latency_s == pytest.approx(0.2)


def test_p95_is_nearest_rank_over_successful_latencies():
    tracker = _tracker_with(*[(True, i / 100) for i in range(1, 101)], (False, 50.0))
    assert tracker.p95("p", "m") == pytest.approx(0.95)
    assert tracker.p95("p", "other") is None
    small = HealthTracker(HealthThresholds(latency_window=3))
    for latency in (9.0, 1.0, 2.0, 3.0):
        small.record("p", "m", ok=True, latency_s=latency)
    assert small.p95("p", "m") == 3.0


# ------------------------------------------------------------------------------------- hedging


@pytest.mark.parametrize(("fraction", "burst", "calls", "allowed"), [
    (0.05, 2.0, 1, 2), (0.05, 2.0, 20, 2), (0.05, 1.0, 19, 1), (0.5, 1.0, 3, 1), (1.0, 3.0, 3, 3), (0.0, 2.0, 100, 0),
])
def test_hedge_budget_starts_full_and_holds_at_most_burst(fraction, burst, calls, allowed):
    budget = HedgeBudget(fraction, burst)
    for _ in range(calls):
        budget.note_call()
    granted = sum(budget.try_acquire() for _ in range(allowed + 2))
    assert granted == allowed


def test_hedge_budget_refills_at_the_budget_fraction_per_call():
    budget = HedgeBudget(0.05, 2.0)
    assert budget.try_acquire() and budget.try_acquire() and not budget.try_acquire()
    for _ in range(19):
        budget.note_call()
    assert not budget.try_acquire()  # 0.95 tokens
    budget.note_call()
    assert budget.try_acquire() and not budget.try_acquire()


def test_hedge_delay_override_history_margin_floor_and_no_history():
    assert hedge_after(HedgingSettings(enabled=False), 1.0) is None
    assert hedge_after(HedgingSettings(hedge_after_s=0.7), 5.0) == 0.7
    assert hedge_after(HedgingSettings(floor_s=2.0), None) == NO_HISTORY_HEDGE_AFTER_S == 10.0
    assert hedge_after(HedgingSettings(floor_s=2.0), 0.4) == 2.0
    assert hedge_after(HedgingSettings(floor_s=0.5), 0.4) == pytest.approx(0.6)  # 1.5 × the p90
    assert hedge_after(HedgingSettings(floor_s=2.0), 6.5) == pytest.approx(9.75)
    # no history: 3 × the slowest peer that has answered, never below the floor; history wins over peers
    assert hedge_after(HedgingSettings(floor_s=0.5), None, [0.3, 0.2]) == pytest.approx(0.9)
    assert hedge_after(HedgingSettings(floor_s=0.5), None, [0.1]) == 0.5
    assert hedge_after(HedgingSettings(floor_s=0.5), 0.4, [3.0]) == pytest.approx(0.6)


# ------------------------------------------------------------------------------------- retries


def test_backoff_is_full_jitter_and_honours_retry_after():
    policy, rng = RetryPolicy(base_s=0.5, cap_s=4.0), random.Random(1)
    delays = [policy.delay(ServerError("x"), 3, rng) for _ in range(500)]
    assert 0 <= min(delays) < 0.2 and 1.8 < max(delays) <= 2.0  # uniform in [0, 0.5·2²]
    assert max(policy.delay(ServerError("x"), 10, rng) for _ in range(200)) <= 4.0
    assert policy.delay(RateLimitedError("x", retry_after_s=3.0), 1, rng) >= 3.0


async def test_call_with_retries_stops_on_a_non_retryable_error():
    calls: list[int] = []

    async def attempt(number: int, remaining: float) -> str:
        calls.append(number)
        raise AuthError("rejected") if number == 2 else ServerError("boom")

    with pytest.raises(AuthError):
        await call_with_retries(attempt, max_attempts=5, deadline=asyncio.get_running_loop().time() + 10,
                                policy=RetryPolicy(0.001, 0.001), rng=random.Random(0),
                                clock=asyncio.get_running_loop().time)
    assert calls == [1, 2]


async def test_call_with_retries_passes_the_time_left():
    seen: list[float] = []

    async def attempt(number: int, remaining: float) -> str:
        seen.append(remaining)
        if number < 3:
            raise ServerError("boom")
        return "ok"

    result = await call_with_retries(attempt, max_attempts=3, deadline=time.monotonic() + 5,
                                     policy=RetryPolicy(0.001, 0.001), rng=random.Random(0))
    assert result == "ok" and len(seen) == 3 and 4 < seen[0] <= 5 and seen[2] <= seen[0]


# ------------------------------------------------------------------------------------- pricing


def test_pricing_sheets_cover_every_provider_with_date_and_source():
    table = PriceTable.load()
    assert set(table.sheets) == {"openai", "anthropic", "gemini", "grok", "mistral", "local"}
    for sheet in table.sheets.values():
        assert sheet.taken is not None and sheet.taken.isoformat() == "2026-11-22"
        if sheet.provider == "local":  # runs on your own hardware: no price page, every model free
            continue
        assert sheet.source and sheet.source.startswith("https://")
        assert sheet.models
        for price in sheet.models.values():
            assert price.input > 0 and price.output > 0


def test_cost_bills_cached_input_at_its_own_price():
    price = ModelPrice(input=3.0, output=15.0, cached_input=0.3)
    assert price.cost(Usage(1_000_000, 0, 0)) == pytest.approx(3.0)
    assert price.cost(Usage(1_000_000, 1_000_000, 500_000)) == pytest.approx(1.5 + 0.15 + 15.0)
    assert ModelPrice(1.0, 2.0, None).cost(Usage(1_000_000, 0, 1_000_000)) == pytest.approx(1.0)


def test_a_sheet_default_prices_every_unlisted_model():
    table = PriceTable.load()
    assert table.cost("local", "any-gguf-you-point-at", Usage(1_000_000, 1_000_000)) == 0.0
    assert table.sheets["openai"].default is None  # paid APIs never fall back to a guess


def test_cost_of_unknown_models_is_none_and_snapshots_use_their_alias():
    table = PriceTable.load()
    assert table.cost("openai", "gpt-unknown", Usage(10, 10)) is None
    assert table.cost("nobody", "gpt-4o", Usage(10, 10)) is None
    dated = table.cost("anthropic", "claude-haiku-4-5-20251001", Usage(1_000_000, 0))
    assert dated == table.cost("anthropic", "claude-haiku-4-5", Usage(1_000_000, 0)) == pytest.approx(1.0)
    assert table.cost(("grok", "openai"), "grok-4", Usage(0, 1_000_000)) == pytest.approx(15.0)
    assert table.cost(("ollama", "openai"), "gpt-4o", Usage(0, 1_000_000)) == pytest.approx(10.0)


# ------------------------------------------------------------------------------------- tiers


def test_tiers_keep_the_predecessors_three_levels_with_current_names():
    tiers = Tiers.load()
    assert [t.name for t in tiers.tiers] == ["premium", "standard", "fast"]
    for model in ("claude-sonnet-4-5", "gpt-4o", "gemini-2.5-pro"):  # the default panel is premium
        assert tiers.tier_of(model) == 0
    assert tiers.tier_of("claude-sonnet-4-5-20250929") == 0
    assert tiers.tier_of("mistral-small-latest") == 2
    assert tiers.tier_of("llama3.2") is None
    prices = PriceTable.load()
    for tier in tiers.tiers:  # every tier model has a price, so a substitution's cost is known
        for provider, model in tier.models:
            assert prices.price(provider, model) is not None, (provider, model)


def test_candidates_search_own_tier_then_lower_tiers():
    tiers = Tiers.load()
    seen = [index for index, _ in tiers.candidates("gpt-4.1-mini")]
    assert seen[0] == 1 and 0 not in seen and seen == sorted(seen)
    assert all(pair[1] != "gpt-4.1-mini" for _, pair in tiers.candidates("gpt-4.1-mini"))


# ------------------------------------------------------------------------------------- wire helpers


async def _lines(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def test_sse_parser_handles_events_multiline_data_comments_and_crlf():
    stream = _lines(b": keep-alive\n", b"event: message_start\n", b'data: {"a":\n', b"data: 1}\n", b"\n",
                    b"data: two\r\n", b"\r\n", b"data: unterminated\n")
    assert [pair async for pair in iter_sse(stream)] == [
        ("message_start", '{"a":\n1}'), ("message", "two"), ("message", "unterminated")]


def test_retry_after_header_forms():
    assert parse_retry_after({"Retry-After": "7"}) == 7.0
    assert parse_retry_after({"retry-after-ms": "250", "Retry-After": "7"}) == 0.25
    assert parse_retry_after({}) is None
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert 25 < (parse_retry_after({"Retry-After": later}) or 0) <= 30


def test_provider_message_extracts_the_apis_error_text():
    assert provider_message(b'{"error": {"message": "bad schema", "type": "x"}}') == "bad schema"
    assert provider_message(b'{"type": "error", "error": {"type": "x", "message": "too long"}}') == "too long"
    assert provider_message(b'{"object": "error", "message": "vllm says no"}') == "vllm says no"
    assert provider_message(b"<html>Bad Gateway</html>") == "<html>Bad Gateway</html>"


@pytest.mark.parametrize("padding", range(250, 311))
def test_provider_message_redacts_before_it_cuts(padding):
    key = "sk-proj-Qm3v9XzT1pLr8sWk4YhN2bJc7DfGa5Ue6Ri0OtVb"
    other = "AIzaSyD4k9Lm2Qv7Xn1Rt8Bw5Hc3Js6Fp0Gz"
    for raw in (json.dumps({"error": {"message": "x" * padding + key}}).encode(),
                ("y" * padding + other + " " + key).encode()):
        text = provider_message(raw, secrets=[key, other])
        assert len(text) <= 301
        for secret in (key, other):
            assert all(secret[i:i + 8] not in text for i in range(len(secret) - 7))
    # without the secrets it is plain truncation, which is what used to leak a key's first characters
    assert key[:8] in provider_message(("x" * 290 + key).encode())


def test_redact_secrets_takes_whole_keys_and_their_leading_fragments():
    key = "sk-ant-api03-Zq8Lm2Xv7Nc4Bt1Rk9Hs6Wd3Fp0Gj5Ye"
    assert redact_secrets(f"a {key} b", [key]) == "a <redacted> b"
    assert redact_secrets(f"echoed {key[:16]}… and {key[:8]}", [key]) == "echoed <redacted>… and <redacted>"
    assert redact_secrets(f"{key[:7]} is every Anthropic key's prefix", [key]) == "sk-ant- is every Anthropic key's prefix"
    assert redact_secrets("nothing here", ["", key]) == "nothing here"
    assert redact_secrets("short abc key", ["abc"]) == "short <redacted> key"


def test_schema_names_are_safe_for_every_api():
    def request(name: str | None, title: str | None = None) -> CompletionRequest:
        schema = {"type": "object", **({"title": title} if title else {})}
        return CompletionRequest("m", (Message("user", "x"),), json_schema=schema, schema_name=name)

    assert schema_name(request("cross_exam")) == "cross_exam"
    assert schema_name(request(None, "Synthesis Artifact v1.0")) == "Synthesis_Artifact_v1_0"
    assert schema_name(request(None)) == "response"
    assert len(schema_name(request("x" * 100))) == 64


def test_model_known_accepts_dated_snapshots_and_latest_aliases():
    listed = ["claude-sonnet-4-5-20250929", "gpt-4o", "mistral-large-latest"]
    assert model_known("claude-sonnet-4-5", listed)
    assert model_known("gpt-4o", listed)
    assert model_known("mistral-large", listed)
    assert not model_known("gpt-4", listed)
    assert not model_known("claude-sonnet-4", listed)



def test_constraints_move_into_descriptions_and_back():
    schema: dict[str, Any] = {"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time", "description": "When it was said."},
        "points": {"type": "array", "items": {"type": "string", "minLength": 12}, "minItems": 3},
        "plain": {"type": "boolean"},
    }}
    described = describe_constraints(schema)
    when = described["properties"]["when"]
    assert when["description"] == 'When it was said. Constraints: {"format": "date-time"}'
    assert described_constraints(when) == {"format": "date-time"}
    assert described_constraints(described["properties"]["points"]["items"]) == {"minLength": 12}
    assert "description" not in described["properties"]["plain"]
    assert schema["properties"]["when"]["description"] == "When it was said."  # the input is not modified
    # a model (the fake) shown only the descriptions, as strict mode's variant keeps them, meets the constraints
    points = described["properties"]["points"]
    stripped = {"type": "object", "properties": {
        "when": {"type": "string", "description": when["description"]},
        "points": {"type": "array", "description": points["description"],
                   "items": {"type": "string", "description": points["items"]["description"]}},
    }}
    instance = instance_for(stripped)
    assert instance["when"] == "2026-01-01T00:00:00Z"
    assert len(instance["points"]) == 3 and all(len(p) >= 12 for p in instance["points"])
