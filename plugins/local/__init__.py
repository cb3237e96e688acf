"""Built-in ``local`` provider: a GGUF model run in-process by llama.cpp's engine, from the prebuilt ``xllamacpp``
wheel (``pip install '.[local]'``: nothing is compiled at install).

No key, no network. The model (``providers.local.model_path``, else the packaged Gemma 3 270M) is loaded once per
process and shared by every agent; generation runs on one worker thread, one call at a time, so the event loop
stays responsive and a cancelled call stops at its next token. Artifact requests are decoded under a grammar built
from the artifact schema, so every answer parses and validates.

The package: this module (runtime, worker thread, provider), :mod:`.model` (which GGUF file, and assembling the
packaged one) and :mod:`.sampling` (the schema grammar).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import json
import mmap
import os
import struct
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
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

#: threads for llama.cpp; default half the cores: its spinning thread barrier collapses (10x slower) as soon as
#: another process wants the same cores, and one thread already decodes 40-60 tokens/s with the 270M model
ENV_THREADS = "CONCLAVE_LOCAL_THREADS"
#: context window cap: long enough for round 4's prompt (every earlier artifact), small enough for a laptop
MAX_CONTEXT = 16384
DEFAULT_TEMPERATURE = 0.7


class LocalRuntimeMissingError(ProviderError):
    """The llama.cpp runtime (xllamacpp) is not installed. Not retryable, and no other model would cure it."""

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


class _Cancelled(Exception):
    """The job's caller went away; the worker stopped between tokens."""


# ============================================================================================ runtime


class LocalRuntime:
    """One loaded GGUF in llama.cpp's own server engine (xllamacpp: a prebuilt wheel, nothing compiled at install).

    The engine applies the model's chat template, keeps the KV cache between calls (``cache_prompt``) and samples
    the way llama.cpp's server does: top-k and min-p first, the grammar checked on the token drawn and, only when it
    fails, on the whole vocabulary. Only the worker thread calls :meth:`generate`.
    """

    def __init__(self, path: Path, *, threads: int | None = None, n_ctx: int | None = None) -> None:
        import xllamacpp

        self.path = path
        self.threads = threads or _default_threads()
        self.n_ctx = n_ctx or MAX_CONTEXT
        params = xllamacpp.CommonParams()
        params.model.path = str(path)
        params.n_ctx = self.n_ctx
        params.n_parallel = 1  # one slot: the worker thread sends one call at a time
        params.cpuparams.n_threads = params.cpuparams_batch.n_threads = self.threads
        params.verbosity = -1  # llama.cpp's log lines would land in the user's progress view
        params.warmup = False
        self.template, self.bos, self.eos = _chat_format(path)
        try:
            self.server = xllamacpp.Server(params)
        except Exception as exc:  # the engine reports an unloadable file with a generic exception
            raise ValueError(f"{path.name}: {exc}") from None

    def prompt_text(self, messages: Sequence[dict[str, str]], prefix: str) -> str:
        return prompt_text(messages, prefix, template=self.template, bos=self.bos, eos=self.eos)

    def generate(self, job: GenerationJob) -> Generation:
        """Run ``job`` to completion, the token budget or cancellation (raises :class:`_Cancelled`)."""
        from conclave.artifacts import schema_registry as artifacts

        from .sampling import build_grammar

        now = artifacts.now_iso()
        grammar = build_grammar(job.grammar_schema, max_tokens=job.max_tokens, now=now) \
            if job.grammar_schema is not None else None
        prefix = grammar.prefix if grammar else ""

        def full_prompt(prefix: str) -> str:
            text = self.prompt_text(job.messages, prefix)
            return text[len(self.bos):] if self.bos and text.startswith(self.bos) else text  # the engine adds BOS

        prompt = full_prompt(prefix)
        budget = self._room(prompt, job.max_tokens)
        if grammar is not None and budget < job.max_tokens:  # a long prompt leaves less room: tighten the caps
            grammar = build_grammar(job.grammar_schema or {}, max_tokens=budget, now=now)
            grown = len(grammar.prefix.encode()) - len(prefix.encode())
            if grown > 0:  # tighter caps forced more fields into the prefix, which the prompt carries
                budget -= grown
                grammar = build_grammar(job.grammar_schema or {}, max_tokens=max(budget, 1), now=now)
            prefix = grammar.prefix
            prompt = full_prompt(prefix)
        if budget < 1:
            raise BadRequestError(f"the prompt leaves no room for an answer in the local model's {self.n_ctx:,} "
                                  "tokens of context")
        request: dict[str, Any] = {
            "prompt": prompt, "n_predict": budget, "temperature": job.temperature, "stream": True,
            "cache_prompt": True, "top_k": 40, "min_p": 0.05,
            # DRY instead of a flat repetition penalty: it stops loops of words without penalising the quotes,
            # colons and newlines every JSON answer repeats by design
            "repeat_penalty": 1.0, "dry_multiplier": 0.8,
        }
        if grammar is not None:
            request["grammar"] = grammar.gbnf
        pieces: list[str] = []
        final: dict[str, Any] = {}
        if job.on_text is not None and prefix:
            job.on_text(prefix)

        def receive(chunk: Any) -> bool:
            if not isinstance(chunk, dict):
                return job.cancel.is_set()
            if "error" in chunk:
                final["error"] = chunk["error"]
                return True
            for choice in chunk.get("choices") or ():
                text = choice.get("text") or ""
                if text:
                    pieces.append(text)
                    if job.on_text is not None:
                        job.on_text(text)
                if choice.get("finish_reason"):
                    final["finish_reason"] = choice["finish_reason"]
            if chunk.get("usage"):
                final["usage"] = chunk["usage"]
            if chunk.get("timings"):
                final["timings"] = chunk["timings"]
            return job.cancel.is_set()  # True stops the generation at this token

        started = time.perf_counter()
        if job.cancel.is_set():
            raise _Cancelled
        answer = self.server.handle_completions(request, receive)
        if job.cancel.is_set():
            raise _Cancelled
        error = final.get("error") or (answer.get("error") if isinstance(answer, dict) else None)
        if error:
            message = error.get("message", error) if isinstance(error, dict) else error
            if "context" in str(message) or "exceeds" in str(message):
                raise BadRequestError(f"the local model cannot take this prompt: {message}")
            raise RuntimeError(str(message))
        usage = final.get("usage") or {}
        timings = final.get("timings") or {}
        elapsed = time.perf_counter() - started
        prompt_s = float(timings.get("prompt_ms", 0.0)) / 1000
        return Generation(
            text=prefix + "".join(pieces),
            input_tokens=int(usage.get("prompt_tokens", 0)),
            cached_tokens=int((usage.get("prompt_tokens_details") or {}).get("cached_tokens",
                                                                              timings.get("cache_n", 0))),
            output_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=str(final.get("finish_reason") or "stop"),
            prompt_s=prompt_s,
            decode_s=max(elapsed - prompt_s, 0.0),
        )

    def _room(self, prompt: str, max_tokens: int) -> int:
        """The answer's token budget: ``max_tokens``, or less when the prompt leaves less of the context.

        A prompt has at most one token per byte (plus BOS), so only a prompt that might not leave ``max_tokens``
        is counted, by evaluating it alone (the engine keeps it cached for the answer that follows).
        """
        if len(prompt.encode("utf-8")) + 1 + max_tokens <= self.n_ctx:
            return max_tokens
        counted = self.server.handle_completions({"prompt": prompt, "n_predict": 0, "cache_prompt": True})
        error = counted.get("error") if isinstance(counted, dict) else "no answer"
        tokens = int(((counted.get("usage") or {}).get("prompt_tokens", 0)) if not error else self.n_ctx)
        if tokens >= self.n_ctx:
            shown = f"{tokens:,} tokens" if not error else "more tokens than that"
            raise BadRequestError(f"the prompt has {shown}; the local model's context holds {self.n_ctx:,}")
        return min(max_tokens, self.n_ctx - tokens)

    def close(self) -> None:
        self.server = None


#: GGUF value types: fixed-size ones by struct format; 8 is a string, 9 an array
_GGUF_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _chat_format(path: Path) -> tuple[str | None, str, str]:
    """The GGUF's chat template (None without one) and the text of its BOS and EOS tokens, read from the header's
    key/value section (GGUF v2/v3, little-endian) without reading the tensors."""
    try:
        return _read_chat_format(path)
    except (struct.error, KeyError, IndexError, OverflowError, MemoryError):
        raise ValueError(f"{path.name}: its GGUF header is damaged or truncated") from None


def _read_chat_format(path: Path) -> tuple[str | None, str, str]:
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF" or struct.unpack_from("<I", data, 4)[0] not in (2, 3):
            raise ValueError(f"{path.name} is not a GGUF file (version 2 or 3)")
        offset = 24  # magic, version, tensor count, key/value count
        pending: dict[str, Any] = {}
        tokens_at: int | None = None

        def read_string(at: int) -> tuple[str, int]:
            size = struct.unpack_from("<Q", data, at)[0]
            return bytes(data[at + 8 : at + 8 + size]).decode("utf-8", "replace"), at + 8 + size

        def skip(kind: int, at: int) -> int:
            if kind == _GGUF_STRING:
                return at + 8 + struct.unpack_from("<Q", data, at)[0]
            if kind == _GGUF_ARRAY:
                item, count = struct.unpack_from("<IQ", data, at)
                at += 12
                if item in _GGUF_SCALARS:
                    return at + count * struct.calcsize(_GGUF_SCALARS[item])
                for _ in range(count):
                    at = skip(item, at)
                return at
            return at + struct.calcsize(_GGUF_SCALARS[kind])

        for _ in range(struct.unpack_from("<Q", data, 16)[0]):
            key, offset = read_string(offset)
            kind = struct.unpack_from("<I", data, offset)[0]
            offset += 4
            if key == "tokenizer.chat_template" and kind == _GGUF_STRING:
                pending["template"] = read_string(offset)[0]
            elif key in ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id") and kind in _GGUF_SCALARS:
                pending[key] = struct.unpack_from("<" + _GGUF_SCALARS[kind], data, offset)[0]
            elif key == "tokenizer.ggml.tokens" and kind == _GGUF_ARRAY:
                tokens_at = offset
            offset = skip(kind, offset)

        def token_text(key: str) -> str:
            index = pending.get(key)
            if tokens_at is None or not isinstance(index, int) or index < 0:
                return ""
            at = tokens_at + 12
            for _ in range(index):
                at = skip(_GGUF_STRING, at)
            return read_string(at)[0]

        return (pending.get("template") or None, token_text("tokenizer.ggml.bos_token_id"),
                token_text("tokenizer.ggml.eos_token_id"))


def prompt_text(messages: Sequence[dict[str, str]], prefix: str, *, template: str | None, bos: str, eos: str) -> str:
    """The prompt in the model's own chat template, or plain text for a model without one (the packaged Gemma
    has none); ``prefix`` is the forced start of the answer."""
    if template:
        try:
            text = _render_template(template, messages, bos, eos)
        except ValueError:  # the template refused a system turn (raise_exception): fold it into the user's
            text = _render_template(template, _fold_system(list(messages)), bos, eos)
        return text + prefix
    lines = []
    for message in messages:
        label = {"system": "", "user": "User:\n", "assistant": "Assistant:\n"}[message["role"]]
        lines.append(f"{label}{message['content'].strip()}\n\n")
    opening = "```json\n" if prefix else ""  # a base model continues a fenced block as JSON
    return "".join(lines) + "Assistant:\n" + opening + prefix


def _render_template(template: str, messages: Sequence[dict[str, str]], bos: str, eos: str) -> str:
    """The chat template rendered as Hugging Face renders it, in Jinja's sandbox."""
    import jinja2.sandbox

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals.update(raise_exception=raise_exception, strftime_now=time.strftime)
    return env.from_string(template).render(messages=list(messages), bos_token=bos, eos_token=eos,
                                            add_generation_prompt=True)


def _fold_system(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The chat without a system turn: its text opens the first user message."""
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    rest = [dict(m) for m in messages if m["role"] != "system"]
    if system and rest and rest[0]["role"] == "user":
        rest[0]["content"] = f"{system}\n\n{rest[0]['content']}"
    return rest


def _default_threads() -> int:
    raw = os.environ.get(ENV_THREADS, "")
    if raw.strip().isdigit() and int(raw) > 0:
        return int(raw)
    affinity = getattr(os, "sched_getaffinity", None)  # Linux; elsewhere every core counts
    cores = len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
    return max(1, cores // 2)


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
    # Stop the engines while the interpreter is intact, not in whatever order garbage collection at shutdown picks.
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
        except ValueError as exc:  # not a GGUF, or llama.cpp could not load it
            raise ModelNotFoundError(f"llama.cpp cannot load the local model: {exc}", provider=self.name,
                                     model=model) from None

    def _check_runtime(self, model: str) -> None:
        try:
            import xllamacpp  # noqa: F401
        except ImportError:
            raise LocalRuntimeMissingError(
                f"the local provider needs xllamacpp, which is not installed: {install_hint('local')}",
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


@hookimpl
def register_price_sheets(register: Any) -> None:
    register("local", resources.files("conclave_plugins").joinpath("pricing", "local.yaml"))
