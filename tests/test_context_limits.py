"""Context limits: hosted models' windows from the price sheets, the pre-flight refusal of a prompt a seat's model
cannot take (CLI, MCP, engine), backups too small for a call's prompt, and the sheet loader's validation."""

from __future__ import annotations

import asyncio
import json
import random
import re
import string
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import clean_env
from test_engine_support import BASE_OVERRIDES, QUESTION

from conclave.api import compose_settings
from conclave.artifacts import schema_registry as artifacts
from conclave.engine.caching import cached_definitions
from conclave.engine.calls import CallSpec
from conclave.engine.cost.limits import DEFINITIONS_ALLOWANCE, check_context_windows
from conclave.engine.extraction import request_schema
from conclave.engine.judge import JudgeSeat
from conclave.engine.labels import JudgeLabels
from conclave.engine.session import Session
from conclave.engine.session_layers import with_layers
from conclave.errors import ConfigError
from conclave.events import EventBus
from conclave.plugin_manager import get_plugins, load_plugins
from conclave.providers.base import CompletionRequest, Message
from conclave.providers.pool import ProviderPool
from conclave.providers.pricing import ContextLimits, PriceTable, parse_sheet
from conclave.providers.retry import RetryPolicy
from conclave.providers.tiers import Tier, Tiers
from conclave.store.paths import StoreLayout
from conclave.testing.fake_server import FakeProviderServer, Fault, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.tokens import count_tokens

#: a panel where only the architect's gpt-4o (128,000 tokens) cannot take a 600k-token context
ONLY_GPT_4O_TOO_SMALL = ("agents.security.provider=gemini", "agents.security.model=gemini-2.5-flash")


def letters(tokens: int, seed: int = 0) -> str:
    """Text of exactly ``tokens`` tokens (a space and a letter is one token), two bytes each."""
    rng = random.Random(seed)
    return "".join(" " + rng.choice(string.ascii_lowercase) for _ in range(tokens))


@asynccontextmanager
async def session_for(fake: FakeProviderServer, context: str, *overrides: str) -> AsyncIterator[Session]:
    """A session composed and built as the runner builds it, before its pre-flight check."""
    settings = compose_settings(QUESTION, [*fake.overrides(), *BASE_OVERRIDES, *overrides])
    plugins = get_plugins()
    strategy = plugins.strategies.get(settings.mode.strategy)(settings.mode.options)
    bus = EventBus("c-test")
    async with ProviderPool(settings, plugins, bus) as pool:
        yield with_layers(Session(settings=settings, plugins=plugins, strategy=strategy, pool=pool, bus=bus,
                                  labels=JudgeLabels(settings.agents, 1, None), question=QUESTION,
                                  context_text=context))


def refusal(session: Session) -> str:
    with pytest.raises(ConfigError) as caught:
        check_context_windows(session)
    (line,) = caught.value.problems
    return line


def test_the_letters_text_has_the_tokens_it_says() -> None:
    assert count_tokens(letters(1000), "gpt-4o") == 1000


def test_every_hosted_model_in_the_sheets_declares_its_limits() -> None:
    table = PriceTable.load()
    for name, sheet in table.sheets.items():
        if name == "local":
            continue
        assert set(sheet.limits) == set(sheet.models), name
    assert table.context_limits("openai", "gpt-4o") == ContextLimits(window=128_000)
    assert table.context_limits("openai", "gpt-4o-2024-08-06") == ContextLimits(window=128_000)  # a snapshot
    assert table.context_limits("openai", "gpt-5") == ContextLimits(window=400_000, max_input=272_000)
    assert table.context_limits("gemini", "gemini-2.5-pro") == ContextLimits(max_input=1_048_576)
    assert table.context_limits("anthropic", "claude-sonnet-4-5") == ContextLimits(window=200_000)
    assert table.context_limits("openai", "no-such-model") is None


def test_the_room_for_a_prompt_leaves_the_answer_cap_where_the_window_holds_both() -> None:
    assert ContextLimits(window=128_000).prompt_room(4096) == 123_904
    assert ContextLimits(window=400_000, max_input=272_000).prompt_room(4096) == 272_000
    assert ContextLimits(window=400_000, max_input=272_000).prompt_room(200_000) == 200_000
    assert ContextLimits(max_input=1_048_576).prompt_room(65_536) == 1_048_576
    assert ContextLimits(window=16_384, answer_shrinks=True).prompt_room(4096) == 16_383  # llama.cpp
    assert ContextLimits().prompt_room(10) is None


@pytest.mark.parametrize(("entry", "fault"), [
    ({"context_window": "128k"}, "context_window must be a positive whole number"),
    ({"context_window": 0}, "context_window must be a positive whole number"),
    ({"context_window": 128000.5}, "context_window must be a positive whole number"),
    ({"max_input_tokens": -1}, "max_input_tokens must be a positive whole number"),
    ({"context_window": 1000, "max_input_tokens": 2000}, "max_input_tokens 2000 is over its context_window 1000"),
    ({"context_windw": 128000}, "unknown field 'context_windw'; allowed: cache_write_input, cached_input,"),
])
def test_the_sheet_loader_rejects_a_malformed_context_limit(entry: dict[str, Any], fault: str) -> None:
    data = {"provider": "openai", "models": {"gpt-4o": {"input": 2.5, "output": 10, **entry}}}
    with pytest.raises(ValueError, match=r"pricing/openai\.yaml: malformed price sheet") as caught:
        parse_sheet(data, "pricing/openai.yaml")
    assert fault in str(caught.value)


def test_a_hosted_provider_reads_its_window_from_the_sheet_and_a_free_endpoint_declares_none(
        fake_provider_server: FakeProviderServer, conclave_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = fake_provider_server.settings()
    pool = ProviderPool(settings, load_plugins())
    assert pool.provider("openai").context_window("gpt-4o") == 128_000
    assert pool.provider("gemini").context_window("gemini-2.5-pro") == 1_048_576
    assert pool.provider("openai").context_window("my-finetune") is None  # no figure: not checked
    monkeypatch.delenv("OPENAI_API_KEY")  # a keyless server on this machine has a window of its own
    assert ProviderPool(settings, load_plugins()).provider("openai").context_limits("gpt-4o") is None


# ------------------------------------------------------------------------------------------- the pre-flight check


async def test_a_600k_token_context_is_refused_for_gpt_4o_and_accepted_for_gemini(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    context = letters(600_000)
    async with session_for(fake_provider_server, context, *ONLY_GPT_4O_TOO_SMALL) as session:
        line = refusal(session)
    assert line.startswith("prompt too long for agents.architect (openai/gpt-4o): its largest prompt (round ")
    needed = int(re.search(r"is about ([\d,]+) tokens", line).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert 600_000 < needed < 610_000
    assert re.search(r"tokens plus up to [\d,]+ for its answer, and the model has a context window of 128,000 tokens;",
                     line)
    assert "send less context (the files of context=[...], project=, stdin)" in line
    assert line.endswith("or choose a model with a larger window (openai/gpt-5.4: a context window of "
                         "1,050,000 tokens)")  # the openai model closest in price that takes it
    async with session_for(fake_provider_server, context, *ONLY_GPT_4O_TOO_SMALL,
                           "agents.architect.provider=gemini", "agents.architect.model=gemini-2.5-pro") as session:
        check_context_windows(session)  # 1,048,576 input tokens: it fits


async def test_the_judge_is_named_when_its_model_is_the_one_too_small(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    overrides = ("agents.architect.provider=gemini", "agents.architect.model=gemini-2.5-flash",
                 "agents.security.provider=gemini", "agents.security.model=gemini-2.5-flash", "judge.model=gpt-4o")
    async with session_for(fake_provider_server, letters(200_000), *overrides) as session:
        line = refusal(session)
    assert line.startswith("prompt too long for judge (openai/gpt-4o): its largest prompt (round 2, ")


async def test_a_prompt_exactly_at_the_room_passes_and_one_token_more_is_refused(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    async with session_for(fake_provider_server, letters(130_000), *ONLY_GPT_4O_TOO_SMALL) as session:
        line = refusal(session)
    found = re.search(r"is about ([\d,]+) tokens plus up to ([\d,]+) for its answer", line)
    assert found is not None
    needed, cap = (int(group.replace(",", "")) for group in found.groups())
    over = needed - (128_000 - cap)  # tokens beyond the largest prompt the window leaves room for
    assert over > 0
    async with session_for(fake_provider_server, letters(130_000 - over), *ONLY_GPT_4O_TOO_SMALL) as session:
        check_context_windows(session)  # exactly 128,000 with the answer cap
    async with session_for(fake_provider_server, letters(130_000 - over + 1), *ONLY_GPT_4O_TOO_SMALL) as session:
        assert f"is about {128_000 - cap + 1:,} tokens" in refusal(session)


async def test_the_schema_allowance_bounds_every_schema_and_tool_list(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    # the cheap pass approves a prompt without loading its schema when it fits with DEFINITIONS_ALLOWANCE bytes
    for name in artifacts.schema_names():
        if name != "common":
            assert len(json.dumps(request_schema(name)).encode()) < DEFINITIONS_ALLOWANCE, name
    async with session_for(fake_provider_server, letters(5000), "judge.model=gpt-4o") as session:
        cache = session.prompt_cache
        assert cache is not None
        for provider, model in {(a.provider, a.model) for a in session.settings.agents.values()}:
            tools = cached_definitions(session.pool, provider, model, cache, 10**6)
            assert len(tools.encode()) < DEFINITIONS_ALLOWANCE / 2, provider  # OpenAI's: every schema, strict


async def test_over_the_window_the_cli_prints_one_line_exits_2_and_sends_nothing(
        fake_provider_server: FakeProviderServer, tmp_path: Path) -> None:
    context = tmp_path / "dump.txt"
    context.write_text(letters(600_000))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", QUESTION, *fake_provider_server.overrides(), *BASE_OVERRIDES,
        *ONLY_GPT_4O_TOO_SMALL, f"context=[{context}]", cwd=tmp_path, env=clean_env(tmp_path, FAKE_KEYS),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode == 2 and out == b""
    lines = err.decode().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("conclave: prompt too long for agents.architect (openai/gpt-4o): its largest ")
    assert "context window of 128,000 tokens" in lines[0] and "openai/gpt-5.4" in lines[0]
    assert fake_provider_server.requests == []
    assert not list(StoreLayout(tmp_path).journal_dir.glob("*.jsonl"))


# ------------------------------------------------------------------------------------------------------ backups


def _pool_with(fake: FakeProviderServer, plugins: Any, *candidates: tuple[str, str]) -> ProviderPool:
    tiers = Tiers([Tier("premium", (("openai", "gpt-4o"), *candidates))])
    return ProviderPool(fake.settings(hedging={"enabled": False}), plugins, EventBus("c-test"),
                        retry_policy=RetryPolicy(base_s=0.01, cap_s=0.02), tiers=tiers)


def _request(tokens: int) -> CompletionRequest:
    return CompletionRequest(model="gpt-4o", system="You answer.", messages=(Message("user", letters(tokens)),),
                             max_tokens=2048)


async def test_a_backup_whose_window_is_too_small_for_the_prompt_is_skipped(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    plugins = load_plugins()
    candidates = (("anthropic", "claude-sonnet-4-5"), ("gemini", "gemini-2.5-pro"))
    async with _pool_with(fake_provider_server, plugins, *candidates) as pool:
        assert pool.backup_for("openai", "gpt-4o") == candidates[0]
        assert pool.backup_for("openai", "gpt-4o", _request(1000)) == candidates[0]
        assert pool.backup_for("openai", "gpt-4o", _request(250_000)) == candidates[1]  # Claude holds 200,000
    async with _pool_with(fake_provider_server, plugins, candidates[0]) as pool:
        assert pool.backup_for("openai", "gpt-4o", _request(250_000)) is None


async def test_a_failed_call_is_not_substituted_by_a_model_too_small_for_it(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake_provider_server.script("gpt-4o", Fault.server_error(500))
    fake_provider_server.script("gemini-2.5-pro", Reply(text="from gemini"))
    candidates = (("anthropic", "claude-sonnet-4-5"), ("gemini", "gemini-2.5-pro"))
    async with _pool_with(fake_provider_server, load_plugins(), *candidates) as pool:
        completion = await pool.complete(agent="architect", provider="openai", request=_request(250_000),
                                         round_number=1)
        assert completion.text == "from gemini"
        assert [s["substitute_model"] for s in pool.substitutions] == ["gemini-2.5-pro"]
    assert "claude-sonnet-4-5" not in {r.model for r in fake_provider_server.requests}


# ------------------------------------------------------------------------------------------------ the papercut


async def test_a_substitution_is_printed_once_on_stderr(fake_provider_server: FakeProviderServer,
                                                        tmp_path: Path) -> None:
    fake_provider_server.script("gpt-4o", Fault.unknown_model())  # not retried: the architect fails over at once
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", QUESTION, *fake_provider_server.overrides(), *BASE_OVERRIDES, "rounds=1",
        "hedging.enabled=false", cwd=tmp_path, env={**clean_env(tmp_path, FAKE_KEYS), "CONCLAVE_PROGRESS": "1"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await process.communicate()
    assert process.returncode == 0, err
    mentions = [line for line in err.decode().splitlines() if "claude-sonnet-4-6" in line]
    assert len(mentions) == 1, err  # the INFO log line said it a second time
    assert "↻ architect: openai/gpt-4o → anthropic/claude-sonnet-4-6 (failure)" in mentions[0]


async def test_a_failed_judge_is_not_replaced_by_a_model_too_small_for_its_prompt(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    pool = _pool_with(fake_provider_server, load_plugins(), ("anthropic", "claude-sonnet-4-5"))
    seat = JudgeSeat(pool.settings, native=lambda provider: True)
    spec = CallSpec(agent="judge", provider="openai", model="gpt-4o", system="You judge.", user=letters(250_000),
                    schema_name="synthesis", round_number=2, max_tokens=4096)
    async with pool:
        assert seat.replacement(pool) == ("anthropic", "claude-sonnet-4-5")  # the tier backup
        # Claude holds 200,000 tokens: neither the tier backup nor the panel's Claude seat, but its Gemini
        assert seat.replacement(pool, spec) == ("gemini", "gemini-2.5-pro")


async def test_a_large_context_whose_bytes_do_not_fit_but_whose_tokens_do_passes(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    # ~116 KB of context: its bytes plus the schema's bytes exceed gpt-4o's room, its bytes plus the schema's
    # tokens do not: the schema is counted exactly and the consultation is not refused.
    import conclave.tokens as tokens

    tokens.reset_cache()  # no tokenizer loaded and nothing counted yet (another test may have counted this schema)
    context = letters(58_000)  # 116,000 bytes
    async with session_for(fake_provider_server, context) as session:
        check_context_windows(session)
    assert tokens._counters  # the schemas' bytes did not fit: they were counted
