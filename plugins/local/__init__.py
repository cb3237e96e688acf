"""Built-in ``local`` provider: a GGUF model run in-process with llama-cpp-python (the ``local`` extra).

No key, no network. The model (``providers.local.model_path``, else the packaged Gemma 3 270M) is loaded once per
process and shared by every agent; generation runs on one worker thread, one call at a time, so the event loop
stays responsive and a cancelled call stops at its next token. Artifact requests are decoded under a grammar built
from the artifact schema, so every answer parses and validates.

The package: this module (runtime, worker thread, provider), :mod:`.model` (which GGUF file, and assembling the
packaged one) and :mod:`.sampling` (the schema grammar and the sampler that enforces it).
"""

from __future__ import annotations

import asyncio
import atexit
import codecs
import concurrent.futures
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conclave.extras import install_hint
from conclave.hookspecs import hookimpl
from conclave.providers.base import (
    BadRequestError,
    Completion,
    CompletionRequest,
    ModelNotFoundError,
    Provider,
    ProviderError,
    ServerError,
    Usage,
)

if TYPE_CHECKING:
    from conclave.providers.pricing import ContextLimits

    from .sampling import SamplerStats

#: threads for llama.cpp; default half the cores: its spinning thread barrier collapses (10x slower) as soon as
#: another process wants the same cores, and one thread already decodes 40-60 tokens/s with the 270M model
ENV_THREADS = "CONCLAVE_LOCAL_THREADS"
#: context window cap: long enough for round 4's prompt (every earlier artifact), small enough for a laptop
MAX_CONTEXT = 16384
DEFAULT_TEMPERATURE = 0.7


class LocalRuntimeMissingError(ProviderError):
    """llama-cpp-python is not installed. Not retryable, and no other model would cure it."""

    outcome = "bad_request"


@dataclass
class GenerationJob:
    """One generation, handed to the worker thread: chat messages, the artifact schema to constrain to (if any),
    the token budget; ``cancel`` stops it between tokens and ``on_text`` receives each decoded piece."""

    messages: list[dict[str, str]]
    grammar_schema: dict[str, Any] | None
    max_tokens: int
    temperature: float
    cancel: threading.Event = field(default_factory=threading.Event)
    on_text: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Generation:
    """What one job produced: the text (forced prefix included), token counts, timings and sampler tiers."""

    text: str
    input_tokens: int
    cached_tokens: int
    output_tokens: int
    finish_reason: str
    prompt_s: float  # evaluating the prompt (what the KV cache did not already hold)
    decode_s: float  # sampling and decoding the answer
    sampler_stats: SamplerStats | None = None


class _Cancelled(Exception):
    """The job's caller went away; the worker stopped between tokens."""


# ============================================================================================ runtime


class LocalRuntime:
    """One loaded GGUF and its KV cache. Not thread-safe: only the worker thread calls :meth:`generate`."""

    def __init__(self, path: Path, *, threads: int | None = None, n_ctx: int | None = None) -> None:
        import llama_cpp
        import numpy as np

        self._lib = llama_cpp
        _route_llama_logs(llama_cpp)
        self.path = path
        self.threads = threads or _default_threads()
        self.llm = llama_cpp.Llama(
            str(path), n_ctx=n_ctx or MAX_CONTEXT, n_threads=self.threads, n_threads_batch=self.threads,
            verbose=False,
        )
        self.n_vocab = self.llm.n_vocab()
        import ctypes  # here, not at import: a consultation of hosted models loads this plugin without using it

        self._buffer = ctypes.create_string_buffer(64)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        self.eos = self.piece(self.llm.token_eos(), special=True).decode("utf-8", "replace")
        self.bos = self.piece(self.llm.token_bos(), special=True).decode("utf-8", "replace")
        self.template = self.llm.metadata.get("tokenizer.chat_template") or None
        # Word-like tokens get the repetition penalty; punctuation and JSON structure repeat by design.
        pieces = (self.piece(i) for i in range(self.n_vocab))
        self.penalised = np.fromiter((_wordlike(p) for p in pieces), dtype=bool, count=self.n_vocab)

    def piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token (llama-cpp-python's own helper pads to 32 bytes and cuts longer pieces)."""
        size = len(self._buffer)
        n = self._lib.llama_token_to_piece(self.vocab, token, self._buffer, size, 0, special)
        if n < 0:  # the buffer was too small: -n bytes are needed
            import ctypes

            self._buffer = ctypes.create_string_buffer(-n)
            n = self._lib.llama_token_to_piece(self.vocab, token, self._buffer, -n, 0, special)
        return self._buffer.raw[:n]

    @property
    def n_ctx(self) -> int:
        return int(self.llm.n_ctx())

    def prompt_text(self, messages: Sequence[dict[str, str]], prefix: str) -> str:
        """The prompt in the model's own chat template, or plain text for a base model without one."""
        if self.template:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            formatter = Jinja2ChatFormatter(template=self.template, eos_token=self.eos, bos_token=self.bos)
            chat: Any = list(messages)  # llama-cpp-python types these as its own TypedDicts
            try:
                return formatter(messages=chat).prompt + prefix
            except ValueError:  # the template refused a system turn (raise_exception): fold it into the user's
                folded: Any = _fold_system(chat)
                return formatter(messages=folded).prompt + prefix
        lines = []
        for message in messages:
            label = {"system": "", "user": "User:\n", "assistant": "Assistant:\n"}[message["role"]]
            lines.append(f"{label}{message['content'].strip()}\n\n")
        opening = "```json\n" if prefix else ""  # a base model continues a fenced block as JSON
        return "".join(lines) + "Assistant:\n" + opening + prefix

    def generate(self, job: GenerationJob) -> Generation:
        """Run ``job`` to completion, the token budget or cancellation (raises :class:`_Cancelled`)."""
        from conclave import artifacts

        from .sampling import SamplingParams, SurvivorsFirstSampler, build_grammar

        now = artifacts.now_iso()
        grammar = build_grammar(job.grammar_schema, max_tokens=job.max_tokens, now=now) \
            if job.grammar_schema is not None else None
        prefix = grammar.prefix if grammar else ""
        prompt = self.prompt_text(job.messages, prefix)
        bos_in_text = bool(self.bos) and prompt.startswith(self.bos)
        tokens = self.llm.tokenize(prompt.encode("utf-8"), add_bos=not bos_in_text, special=True)
        budget = min(job.max_tokens, self.n_ctx - len(tokens))
        if budget < 1:
            raise BadRequestError(f"the prompt has {len(tokens)} tokens; the local model's context holds {self.n_ctx}")
        if grammar is not None and budget < job.max_tokens:  # a long prompt leaves less room: tighten the caps
            grammar = build_grammar(job.grammar_schema or {}, max_tokens=budget, now=now)
        started = time.perf_counter()
        cached = self._evaluate_prompt(tokens, job.cancel)
        prompt_s = time.perf_counter() - started
        with SurvivorsFirstSampler(self._lib, self.vocab, self.n_vocab, grammar.gbnf if grammar else None,
                                   SamplingParams(temperature=job.temperature), penalised=self.penalised) as sampler:
            if job.on_text is not None and prefix:
                job.on_text(prefix)
            text, count, finish = self._decode(sampler, job, budget, prefix if grammar else None)
            stats = sampler.stats
        return Generation(prefix + text, len(tokens), cached, count, finish, prompt_s,
                          time.perf_counter() - started - prompt_s, stats)

    def _decode(self, sampler: Any, job: GenerationJob, budget: int, json_prefix: str | None) -> tuple[str, int, str]:
        """Sample up to ``budget`` tokens; returns the text, the token count and the finish reason."""
        import numpy as np

        text = b""
        # pieces may split a UTF-8 character; the incremental decoder holds the partial bytes back
        stream = codecs.getincrementaldecoder("utf-8")(errors="replace")
        for count in range(budget):
            if job.cancel.is_set():
                raise _Cancelled
            logits = np.ctypeslib.as_array(self.llm._ctx.get_logits_ith(-1), shape=(self.n_vocab,)).copy()
            token = sampler.sample(logits)
            if self._lib.llama_vocab_is_eog(self.vocab, token):
                return text.decode("utf-8", "replace"), count, "stop"
            sampler.accept(token)
            piece = self.piece(token)
            text += piece
            if job.on_text is not None:
                job.on_text(stream.decode(piece))
            # A closed root object ends the answer: no decode step is spent on the end-of-turn marker.
            if json_prefix is not None and b"}" in piece and _complete_json(json_prefix, text):
                return text.decode("utf-8", "replace"), count + 1, "stop"
            self.llm.eval([token])
        return text.decode("utf-8", "replace"), budget, "length"

    def _evaluate_prompt(self, tokens: list[int], cancel: threading.Event) -> int:
        """Feed ``tokens``, reusing the longest prefix already in the KV cache; returns how many were reused.

        Fed one batch at a time so that a cancelled call stops within a batch even on a long prompt.
        """
        held = self.llm.input_ids[: self.llm.n_tokens].tolist()
        common = 0
        for a, b in zip(held, tokens, strict=False):
            if a != b:
                break
            common += 1
        common = min(common, len(tokens) - 1)  # at least one token must run to produce fresh logits
        if not self.llm._ctx.kv_cache_seq_rm(-1, common, -1):
            common = 0
            self.llm._ctx.kv_cache_clear()
        self.llm.n_tokens = common
        step = self.llm.n_batch
        for start in range(common, len(tokens), step):
            if cancel.is_set():
                raise _Cancelled
            self.llm.eval(tokens[start : start + step])
        return common

    def close(self) -> None:
        self.llm.close()


_log_callback: Any = None
_GGML_LOG_ERROR = 4  # ggml_log_level: NONE, DEBUG, INFO, WARN, ERROR, CONT


def _route_llama_logs(llama_cpp: Any) -> None:
    """Send llama.cpp's log lines to the ``conclave.local`` logger, errors as errors and the rest as debug.

    llama-cpp-python's own callback maps ggml's levels with an outdated table (WARN=3 read as ERROR), so it
    prints warnings to stderr, the user's progress view, even with ``verbose=False``.
    """
    global _log_callback
    if _log_callback is not None:
        return
    log = logging.getLogger("conclave.local")

    @llama_cpp.llama_log_callback
    def forward(level: int, text: bytes, user_data: Any) -> None:
        severity = logging.ERROR if level == _GGML_LOG_ERROR else logging.DEBUG
        log.log(severity, "%s", text.decode("utf-8", "replace").rstrip())

    _log_callback = forward  # ctypes callbacks must stay referenced for as long as C may call them
    import ctypes

    llama_cpp.llama_log_set(forward, ctypes.c_void_p(0))


def _default_threads() -> int:
    raw = os.environ.get(ENV_THREADS, "")
    if raw.strip().isdigit() and int(raw) > 0:
        return int(raw)
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core counts
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return max(1, cores // 2)


def _wordlike(piece: bytes) -> bool:
    return any(ch.isalnum() for ch in piece.decode("utf-8", "ignore"))


def _fold_system(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The chat without a system turn: its text opens the first user message."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if system and rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    return rest


def _complete_json(prefix: str, text: bytes) -> bool:
    try:
        json.loads(prefix + text.decode("utf-8"))
    except ValueError:
        return False
    return True


# ============================================================================================ scheduling

_lock = threading.Lock()
_executor: concurrent.futures.ThreadPoolExecutor | None = None
_runtimes: dict[Path, LocalRuntime] = {}


def _worker() -> concurrent.futures.ThreadPoolExecutor:
    """The one thread every local generation in this process runs on, in submission order."""
    global _executor
    with _lock:
        if _executor is None:
            _executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="conclave-local")
        return _executor


def runtime_for(path: Path) -> LocalRuntime:
    """The process-wide runtime for ``path`` (loaded on first use, on the worker thread)."""
    key = path.resolve()
    runtime = _runtimes.get(key)
    if runtime is None:
        if not _runtimes:
            atexit.register(_close_all)
        runtime = _runtimes[key] = LocalRuntime(key)
    return runtime


def _close_all() -> None:
    # Free the models while the interpreter is intact: left to garbage collection at shutdown, llama-cpp-python's
    # finalizers run after its own module globals are gone and print a TypeError traceback to stderr.
    for runtime in _runtimes.values():
        runtime.close()
    _runtimes.clear()


def loaded_models() -> list[Path]:
    """The GGUF files loaded in this process (one runtime each, shared by every agent)."""
    return list(_runtimes)


async def run_on_worker(fn: Callable[[], Any], cancel: threading.Event | None = None) -> Any:
    """Await ``fn()`` on the worker thread; on cancellation, tell the job to stop at its next token."""
    future = _worker().submit(fn)
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        if cancel is not None:
            cancel.set()
        raise


# ============================================================================================ provider


class LocalProvider(Provider):
    """In-process llama.cpp model; ``providers.local.model_path`` picks a GGUF (default: the packaged Gemma)."""

    def endpoint(self) -> str | None:
        return f"file:{self.settings.model_path}" if self.settings.model_path else "local:packaged-gemma-3-270m"

    def default_max_concurrency(self) -> int | None:
        # one worker thread runs the model: calls wait their turn in the pool (shown as queued, each call's timeout
        # starting when it is sent), and a slow call is never hedged with a copy that could only run after it
        return 1

    def models_dir(self) -> Path:
        """Where the packaged model is assembled: one shared, read-only copy for every ``CONCLAVE_HOME``."""
        from .model import shared_models_dir

        return shared_models_dir(self._environ)  # the injected environment, as for keys

    def context_window(self, model: str) -> int | None:
        """The runtime's context size: every GGUF is loaded with ``MAX_CONTEXT`` tokens, whatever its name."""
        return MAX_CONTEXT

    def context_limits(self, model: str) -> ContextLimits | None:
        """``MAX_CONTEXT`` for the prompt: the runtime shortens the answer to the room the prompt leaves."""
        from conclave.providers.pricing import ContextLimits

        return ContextLimits(window=MAX_CONTEXT, answer_shrinks=True)

    def _load(self, model: str) -> LocalRuntime:
        """The shared runtime for the configured GGUF; runs on the worker, so first-use assembly happens once."""
        from .model import LocalModelError, resolve_model_path

        try:
            path = resolve_model_path(self.settings.model_path, self.models_dir())
            return runtime_for(path)
        except LocalModelError as exc:
            raise ModelNotFoundError(str(exc), provider=self.name, model=model) from None
        except ValueError as exc:  # llama.cpp could not load the file
            raise ModelNotFoundError(f"llama.cpp cannot load the local model: {exc}", provider=self.name,
                                     model=model) from None

    def _check_runtime(self, model: str) -> None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            raise LocalRuntimeMissingError(
                f"the local provider needs llama-cpp-python, which is not installed: {install_hint('local')}",
                provider=self.name, model=model,
            ) from None

    async def list_models(self) -> list[str] | None:
        """No models list: a local GGUF answers to any name. Checks, for ``conclave doctor``, that the runtime is
        installed and the model file can be found, without loading or assembling it."""
        from .model import LocalModelError, PackagedModel

        self._check_runtime("")
        try:
            if self.settings.model_path:
                await asyncio.to_thread(self._check_model_path)
            else:
                PackagedModel.from_package()
        except LocalModelError as exc:
            raise ModelNotFoundError(str(exc), provider=self.name) from None
        return None

    def _check_model_path(self) -> None:
        from .model import resolve_model_path

        resolve_model_path(self.settings.model_path, self.models_dir())

    async def attempt(self, request: CompletionRequest) -> Completion:
        return await self._complete(request, None)

    async def attempt_stream(self, request: CompletionRequest) -> AsyncIterator[str | Completion]:
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[str] = asyncio.Queue()

        def on_text(piece: str) -> None:
            if piece:
                with contextlib.suppress(RuntimeError):  # the consumer's loop closed after a cancellation
                    loop.call_soon_threadsafe(chunks.put_nowait, piece)

        task = asyncio.ensure_future(self._complete(request, on_text))
        try:
            while not task.done():
                getter = asyncio.ensure_future(chunks.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    yield getter.result()
                else:
                    getter.cancel()
            while not chunks.empty():  # pieces scheduled before the result landed
                yield chunks.get_nowait()
            yield task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ProviderError):
                    await task

    async def _complete(self, request: CompletionRequest, on_text: Callable[[str], None] | None) -> Completion:
        self._check_runtime(request.model)
        started = time.perf_counter()
        messages = ([{"role": "system", "content": request.system}] if request.system else []) + [
            {"role": m.role, "content": m.content} for m in request.messages
        ]
        job = GenerationJob(
            messages=messages,
            grammar_schema=dict(request.json_schema) if request.json_schema is not None else None,
            max_tokens=request.max_tokens,
            temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            on_text=on_text,
        )

        def run() -> Generation:
            from .sampling import GrammarError

            runtime = self._load(request.model)
            try:
                return runtime.generate(job)
            except GrammarError as exc:
                raise BadRequestError(f"the local provider cannot constrain this schema: {exc}",
                                      provider=self.name, model=request.model) from None
            except RuntimeError as exc:  # a llama_decode failure: transient as far as we can tell
                raise ServerError(f"the local model failed while generating: {exc}", provider=self.name,
                                  model=request.model) from None

        try:
            output: Generation = await run_on_worker(run, job.cancel)
        except _Cancelled:
            raise asyncio.CancelledError from None
        parsed = None
        if request.json_schema is not None and output.finish_reason == "stop":
            with contextlib.suppress(ValueError):
                parsed = json.loads(output.text)
        return Completion(
            text=output.text,
            parsed=parsed if isinstance(parsed, dict) else None,
            usage=Usage(output.input_tokens, output.output_tokens, output.cached_tokens),
            model=request.model,
            provider=self.name,
            finish_reason=output.finish_reason,
            latency_s=time.perf_counter() - started,
        )


@hookimpl
def register_providers(register: Any) -> None:
    register("local", LocalProvider)
