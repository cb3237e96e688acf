"""Hedging across processes: the latency history and the hedge budget kept in ``$CONCLAVE_HOME/hedging.json``."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from conclave import events
from conclave.events import EventBus
from conclave.plugin_manager import load_plugins
from conclave.providers.base import CompletionRequest, Message
from conclave.providers.hedge_memory import MAX_MODELS, SAMPLES_PER_MODEL, HedgeMemory
from conclave.providers.hedging import HedgeBudget
from conclave.providers.pool import ProviderPool
from conclave.providers.retry import RetryPolicy
from conclave.testing.fake_server import RecordedRequest, Reply
from conclave.testing.schema_instances import instance_for

HEDGING = {"enabled": True, "floor_s": 0.05, "budget": 0.05, "burst": 2}


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai,anthropic,gemini")
    return load_plugins()


def _seed(home: Path, provider: str, model: str, latencies: list[float]) -> None:
    """What an earlier process leaves behind."""
    memory = HedgeMemory(home)
    for latency in latencies:
        memory.note(provider, model, latency)
    memory.flush(2.0)


async def test_history_from_an_earlier_process_sets_the_first_calls_hedge_delay(fake_provider_server, conclave_env,
                                                                                plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", [Reply(text="slow primary", latency=0.6), Reply(text="fast twin")])
    _seed(conclave_env, "openai", "gpt-4o", [0.04] * 20)  # p90 40 ms: hedge after max(0.05, 1.5 × 0.04) = 60 ms
    settings = fake.settings(hedging=HEDGING, strict_models=True, home=str(conclave_env))
    request = CompletionRequest(model="gpt-4o", messages=(Message("user", "q"),))
    async with ProviderPool(settings, plugins, retry_policy=RetryPolicy(),
                            hedge_memory=HedgeMemory(conclave_env)) as pool:
        completion = await pool.complete(agent="a", provider="openai", request=request, round_number=1)
    assert completion.text == "fast twin"  # without history the first call would wait 10 s before hedging
    remembered = HedgeMemory(conclave_env).load()[("openai", "gpt-4o")]
    assert len(remembered) == 21 and remembered[:20] == [0.04] * 20  # the twin's latency was added on close


async def test_one_slow_call_in_a_thin_history_does_not_stop_the_next_hedge(fake_provider_server, conclave_env,
                                                                            plugins):
    """A home's first consultations leave a few latencies; with one slow call among them their p90 is that call
    (nearest rank), so 1.5 × p90 would never hedge again. A thin history is read as 3 × its median instead."""
    fake = fake_provider_server
    fake.script("gpt-4o", [Reply(text="slow primary", latency=0.8), Reply(text="fast twin")])
    _seed(conclave_env, "openai", "gpt-4o", [0.02] * 8 + [0.8])  # 9 calls, one slow: hedge after 3 × 20 ms
    settings = fake.settings(hedging=HEDGING, strict_models=True, home=str(conclave_env))
    request = CompletionRequest(model="gpt-4o", messages=(Message("user", "q"),))
    async with ProviderPool(settings, plugins, retry_policy=RetryPolicy(),
                            hedge_memory=HedgeMemory(conclave_env)) as pool:
        completion = await pool.complete(agent="a", provider="openai", request=request, round_number=1)
    assert completion.text == "fast twin"  # 1.5 × the p90 (0.8 s) = 1.2 s would have let the primary win


async def test_a_prompt_cache_warm_up_sets_no_hedge_delay(fake_provider_server, conclave_env, plugins):
    """A warm-up (one output token before round 1) answers fast: counted as a peer or as history it would have the
    round's first real answer hedged after 3 × a prefill. It is neither, so that answer is not hedged at all."""
    from conclave.providers.base import WARMUP_AGENT

    fake = fake_provider_server
    fake.script("gpt-4o", [Reply(text="warm"), Reply(text="slow primary", latency=0.4), Reply(text="fast twin")])
    settings = fake.settings(hedging=HEDGING, strict_models=True, home=str(conclave_env))

    def request() -> CompletionRequest:
        return CompletionRequest(model="gpt-4o", messages=(Message("user", "q"),))

    async with ProviderPool(settings, plugins, retry_policy=RetryPolicy(),
                            hedge_memory=HedgeMemory(conclave_env)) as pool:
        await pool.complete(agent=WARMUP_AGENT, provider="openai", request=request(), round_number=1)
        completion = await pool.complete(agent="a", provider="openai", request=request(), round_number=1)
    assert completion.text == "slow primary"  # no peer, no history: the 10 s delay, never reached
    remembered = HedgeMemory(conclave_env).load()[("openai", "gpt-4o")]
    assert len(remembered) == 1 and remembered[0] >= 0.4  # the answer's latency only, not the warm-up's


async def test_a_model_without_history_is_hedged_once_its_round_peers_have_answered(fake_provider_server,
                                                                                   conclave_env, plugins):
    fake = fake_provider_server
    fake.script("gpt-4o", [Reply(text="slow primary", latency=3.0), Reply(text="fast twin")])
    fake.script("claude-sonnet-4-5", Reply(text="peer", latency=0.05))
    fake.script("gemini-2.5-pro", Reply(text="peer", latency=0.05))
    settings = fake.settings(hedging=HEDGING, strict_models=True, home=str(conclave_env))
    hedged: list[dict[str, Any]] = []
    bus = EventBus("c-test")
    bus.subscribe(lambda event: hedged.append(event.data) if event.type == events.PROVIDER_HEDGED else None)

    async def ask(pool: ProviderPool, provider: str, model: str) -> str:
        request = CompletionRequest(model=model, messages=(Message("user", "q"),))
        completion = await pool.complete(agent=model, provider=provider, request=request, round_number=1)
        return completion.text

    # a new home: no model has history; round 1's three agents start together
    async with ProviderPool(settings, plugins, bus, retry_policy=RetryPolicy(),
                            hedge_memory=HedgeMemory(conclave_env)) as pool:
        texts = await asyncio.wait_for(asyncio.gather(
            ask(pool, "openai", "gpt-4o"), ask(pool, "anthropic", "claude-sonnet-4-5"),
            ask(pool, "gemini", "gemini-2.5-pro")), timeout=2.5)
    # gpt-4o was hedged 3 × the slowest answered peer (~50 ms) after it was sent, not 10 s: its twin answered
    assert texts[0] == "fast twin"
    assert [(h["model"], h["winner"], h["same_model"]) for h in hedged] == [("gpt-4o", "backup", True)]
    assert 0.15 <= hedged[0]["after_s"] < 1.0


async def test_a_cli_consultation_hedges_from_remembered_history_and_stays_complete(fake_provider_server,
                                                                                    conclave_env):
    fake = fake_provider_server
    calls = {"gpt-4o": 0}

    def gpt4o(request: RecordedRequest) -> Reply:
        calls["gpt-4o"] += 1
        return Reply(json=instance_for(request.schema), latency=2.0 if calls["gpt-4o"] == 1 else 0.0)

    fake.script("gpt-4o", gpt4o)
    _seed(conclave_env, "openai", "gpt-4o", [0.05] * 20)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(conclave_env), CONCLAVE_PROGRESS="0")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "Hedge, or not?", "rounds=1", "strict_models=true",
        "cost.auto_approve=true", "output.format=json", *fake.overrides(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(conclave_env), env=env,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, err.decode()
    result = json.loads(out)
    # the slow first gpt-4o call was hedged after max(0.5 s floor, 1.5 × 50 ms) with the same model, which won:
    # not a substitution, so the consultation is complete, and the journal says what happened
    assert result["status"] == "complete" and result["substitutions"] == []
    assert len(fake.requests_for("gpt-4o")) == 2
    journal = (conclave_env / "journal" / f"{result['consultation_id']}.jsonl").read_text().splitlines()
    hedged = [r["data"] for r in map(json.loads, journal) if r["type"] == "provider:hedged"]
    assert [(h["model"], h["backup_model"], h["winner"], h["same_model"]) for h in hedged] == [
        ("gpt-4o", "gpt-4o", "backup", True)]
    assert hedged[0]["after_s"] == 0.5
    # and the process wrote its own latencies back for the next one
    remembered = HedgeMemory(conclave_env).load()
    assert len(remembered[("openai", "gpt-4o")]) == 21 and ("anthropic", "claude-sonnet-4-5") in remembered


def test_the_shared_budget_allows_a_short_run_to_hedge_and_caps_many_runs(tmp_path):
    first = HedgeBudget(0.05, 2.0, HedgeMemory(tmp_path))
    first.note_call()
    assert first.try_acquire()  # a new home starts with a full bucket: a 1-call consultation may hedge
    granted, calls = 1, 1
    for _ in range(40):  # 40 more "processes" of 10 calls each, every one of them wanting to hedge every call
        budget = HedgeBudget(0.05, 2.0, HedgeMemory(tmp_path))
        for _ in range(10):
            budget.note_call()
            calls += 1
            granted += budget.try_acquire()
        HedgeMemory(tmp_path).flush(2.0)
    assert calls == 401
    assert granted <= 2 + 0.05 * calls  # burst + budget × calls, whatever the number of processes
    assert granted >= 0.05 * calls - 1  # and the earned tokens are not lost between processes


def _hammer(home: str, worker: int, rounds: int, out: Any) -> None:
    granted = 0
    for i in range(rounds):
        memory = HedgeMemory(Path(home))
        memory.note(f"p{worker}", "m", float(i))
        memory.note("shared", "m", float(worker))
        memory.accrue(0.5)
        granted += memory.take_token(2.0)
        memory.flush(2.0)
    out.put(granted)


def test_concurrent_processes_lose_no_sample_and_spend_no_token_twice(tmp_path):
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    workers, rounds = 4, 25
    processes = [context.Process(target=_hammer, args=(str(tmp_path), w, rounds, out)) for w in range(workers)]
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=30)
    granted = sum(out.get(timeout=5) for _ in processes)
    assert all(p.exitcode == 0 for p in processes)
    remembered = HedgeMemory(tmp_path).load()  # the file is whole JSON
    for w in range(workers):
        assert remembered[(f"p{w}", "m")] == [float(i) for i in range(rounds)]  # every write kept, in order
    assert len(remembered[("shared", "m")]) == workers * rounds
    assert granted <= 2 + 0.5 * workers * rounds  # the bucket's whole supply, never more


def test_the_file_is_bounded_and_a_broken_one_is_ignored(tmp_path):
    (tmp_path / "hedging.json").write_text("{not json")
    assert HedgeMemory(tmp_path).load() == {}
    memory = HedgeMemory(tmp_path)
    for i in range(SAMPLES_PER_MODEL + 50):
        memory.note("openai", "m0", i / 1000)
    for n in range(1, MAX_MODELS + 5):
        memory.note("openai", f"m{n}", 0.1)
    memory.flush(2.0)
    remembered = HedgeMemory(tmp_path).load()
    assert len(remembered) == MAX_MODELS
    assert ("openai", "m0") not in remembered  # the least recently updated models go first
    memory = HedgeMemory(tmp_path)
    for i in range(SAMPLES_PER_MODEL + 50):
        memory.note("openai", "m9", i / 1000)
    memory.flush(2.0)
    kept = HedgeMemory(tmp_path).load()[("openai", "m9")]
    assert len(kept) == SAMPLES_PER_MODEL and kept[-1] == (SAMPLES_PER_MODEL + 49) / 1000
