"""A hedge is for a silent provider, not for a stalled caller: when this process's event loop was blocked past a
call's hedge delay (a busy machine, a blocking write), the time the stall took is given back to the call before it
counts as silent. The bench's rate-limited sweep paid requests twice so: hedges sent together at the end of a stall,
for answers that came in a moment later."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from conclave import events
from conclave.events import EventBus
from conclave.plugin_manager import load_plugins
from conclave.providers.base import CompletionRequest, Message
from conclave.providers.pool import ProviderPool
from conclave.testing.fake_server import FakeProviderServer, Reply, serving_in_a_thread


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai")
    return load_plugins()


@pytest.fixture
def fake_in_a_thread() -> Iterator[FakeProviderServer]:
    """The fake server on an event loop of its own thread, so it answers while the test's loop is blocked."""
    with serving_in_a_thread() as server:
        yield server


def _request(k: int) -> CompletionRequest:
    return CompletionRequest(model="gpt-4o", system="You are terse.", messages=(Message("user", f"Say yes ({k})."),))


async def _calls(fake: FakeProviderServer, plugins: Any, stall_s: float, calls: int) -> list[events.Event]:
    """``calls`` calls at once (as an evaluation's items and agents are); once all are sent, the process stalls."""
    bus = EventBus("c-test")
    seen: list[events.Event] = []
    bus.subscribe(seen.append)
    settings = fake.settings(hedging={"enabled": True, "hedge_after_s": 0.5, "floor_s": 0.01, "burst": 2 * calls})
    async with ProviderPool(settings, plugins, bus) as pool:
        running = [asyncio.create_task(pool.complete(
            agent=f"a{k}", provider="openai", request=_request(k), round_number=1, allow_substitution=False))
            for k in range(calls)]
        for _ in range(500):  # until every request is on its way
            if len(fake.requests_for("gpt-4o")) >= calls:
                break
            await asyncio.sleep(0.01)
        time.sleep(stall_s)  # noqa: ASYNC251 - the stall under test: this process blocks past the hedge delay
        completions = await asyncio.gather(*running)
    assert all(c.text == "yes" for c in completions)
    return seen


@pytest.mark.parametrize(("latency_s", "stall_s", "calls"), [
    # the bench's pattern: the hedge timers of a round's calls all fire late, together, at the end of a stall of
    # this process, and the answers come in a moment later (their hedges were then paid too)
    pytest.param(1.3, 1.0, 3, id="answers arriving as the caller comes out of a stall"),
    pytest.param(0.1, 1.2, 12, id="answers that arrived while the caller was stalled"),
])
async def test_answers_around_a_stall_of_the_caller_are_not_hedged(
        conclave_env: Any, plugins: Any, fake_in_a_thread: FakeProviderServer, latency_s: float, stall_s: float,
        calls: int) -> None:
    fake = fake_in_a_thread
    fake.script("gpt-4o", lambda request: Reply(text="yes", latency=latency_s))
    seen = await _calls(fake, plugins, stall_s=stall_s, calls=calls)
    assert len(fake.requests_for("gpt-4o")) == calls  # each asked once, paid once
    assert not [e for e in seen if e.type == events.PROVIDER_HEDGED]


async def test_a_provider_silent_past_the_delay_is_still_hedged_after_a_stall(
        conclave_env: Any, plugins: Any, fake_in_a_thread: FakeProviderServer) -> None:
    fake = fake_in_a_thread
    fake.script("gpt-4o", Reply(text="yes", latency=5.0), Reply(text="yes"))
    seen = await _calls(fake, plugins, stall_s=1.0, calls=1)
    assert len(fake.requests_for("gpt-4o")) == 2  # the stall is given back, then the silent primary is hedged
    hedged = [e for e in seen if e.type == events.PROVIDER_HEDGED]
    assert len(hedged) == 1 and hedged[0].data["winner"] == "backup"
