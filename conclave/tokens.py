"""Token counting with a real BPE tokenizer (never chars/4).

``tiktoken`` is used when the encoding is already in its local cache; otherwise ``bpe-openai``, which embeds
the same vocabularies and works offline. tiktoken downloads a missing encoding on first use, so we check its
cache ourselves and never let it try. Non-OpenAI models (Claude, Gemini, Grok, Mistral, local models) have no
public tokenizer here: they are counted with ``o200k_base`` as an approximation.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

DEFAULT_ENCODING = "o200k_base"

# Where tiktoken fetches each encoding and the sha256 it insists on (from tiktoken_ext.openai_public).
# tiktoken's cache key is sha1(url); a cached file whose hash differs is deleted and re-downloaded.
_TIKTOKEN_BLOBS = {
    "o200k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    ),
    "cl100k_base": (
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
        "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    ),
}

# gpt-4 / gpt-3.5 era models use cl100k; gpt-4o, gpt-4.1, gpt-4.5, gpt-5 and the o-series use o200k.
_CL100K_MODELS = re.compile(r"^(gpt-4(?![o.])|gpt-3\.5|gpt-35|text-embedding-(3|ada))")

# bpe-openai refuses inputs of 1M characters or 200k tokens; long texts are counted in pieces cut at
# whitespace, which changes the count by at most a token or two per cut.
_CHUNK_CHARS = 100_000


def encoding_name_for(model: str | None) -> str:
    """The BPE encoding used to count tokens for ``model`` (``o200k_base`` unless it is a cl100k-era model)."""
    if not model:
        return DEFAULT_ENCODING
    name = model.rsplit("/", 1)[-1].lower()  # "openai/gpt-4" and "gpt-4" count the same
    return "cl100k_base" if _CL100K_MODELS.match(name) else DEFAULT_ENCODING


def count_tokens(text: str, model: str | None = None) -> int:
    """Number of BPE tokens in ``text`` for ``model``; special-token strings count as ordinary text."""
    if not text:
        return 0
    count = _counter(encoding_name_for(model))
    return sum(count(piece) for piece in _pieces(text))


def utf8_upper_bound(text: str, model: str | None = None) -> int:
    """An upper bound of :func:`count_tokens` that needs no tokenizer: every BPE token of ordinary text covers
    at least one UTF-8 byte. Cheap enough to run before anything else, exact enough to approve a small cost."""
    return len(text.encode("utf-8"))


def tokenizer_backend(encoding: str = DEFAULT_ENCODING) -> str:
    """Which library counts tokens for ``encoding`` on this machine: ``"tiktoken"`` or ``"bpe-openai"``."""
    return "tiktoken" if _tiktoken_cached(encoding) else "bpe-openai"


def _pieces(text: str) -> list[str]:
    pieces = []
    while len(text) > _CHUNK_CHARS:
        cut = max(text.rfind(" ", 0, _CHUNK_CHARS), text.rfind("\n", 0, _CHUNK_CHARS))
        cut = cut if cut > 0 else _CHUNK_CHARS
        pieces.append(text[:cut])
        text = text[cut:]
    pieces.append(text)
    return pieces


@functools.cache
def _counter(encoding: str) -> Callable[[str], int]:
    """Load ``encoding`` once per process, lazily, and return a function counting the tokens of ordinary text."""
    if _tiktoken_cached(encoding):
        import tiktoken

        encode = tiktoken.get_encoding(encoding).encode_ordinary
        return lambda text: len(encode(text))
    backend = _bpe_backend()
    if backend is not None:
        return backend.tokenizer_for_encoding(encoding).count
    with warnings.catch_warnings():  # bpe-openai 0.1.x loads its data with a deprecated importlib API
        warnings.simplefilter("ignore", DeprecationWarning)
        import bpe_openai

        encode = bpe_openai.get_encoding(encoding).encode_ordinary
        return lambda text: len(encode(text))


def _bpe_backend() -> ModuleType | None:
    """bpe-openai's compiled tokenizer, loaded without its Python wrapper.

    Importing the ``bpe_openai`` package decodes every vocabulary it ships into Python dicts (~0.5 s and
    ~140 MiB) although the compiled backend embeds its own tables and builds only the encoding asked for
    (~70 MiB for o200k). Counting needs nothing else, so load the extension module by itself; None when it
    cannot be found (then the wrapper is used)."""
    try:
        spec = importlib.util.find_spec("bpe_openai")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    for path in sorted(Path(spec.origin).parent.glob("_bindings*.so")) + sorted(
            Path(spec.origin).parent.glob("_bindings*.pyd")):
        loader = importlib.machinery.ExtensionFileLoader("bpe_openai._bindings", str(path))
        module_spec = importlib.util.spec_from_file_location("bpe_openai._bindings", path, loader=loader)
        if module_spec is None:
            continue
        module = importlib.util.module_from_spec(module_spec)
        try:
            loader.exec_module(module)
        except ImportError:
            continue
        if hasattr(module, "tokenizer_for_encoding"):
            return module
    return None


def _tiktoken_cache_file(encoding: str) -> Path | None:
    """The file tiktoken would read ``encoding`` from, following its own cache-dir rules; None = no cache."""
    if encoding not in _TIKTOKEN_BLOBS:
        return None
    if "TIKTOKEN_CACHE_DIR" in os.environ:
        cache_dir = os.environ["TIKTOKEN_CACHE_DIR"]
    elif "DATA_GYM_CACHE_DIR" in os.environ:
        cache_dir = os.environ["DATA_GYM_CACHE_DIR"]
    else:
        cache_dir = os.path.join(tempfile.gettempdir(), "data-gym-cache")
    if cache_dir == "":  # tiktoken reads "" as "caching disabled": it would always download
        return None
    url, _ = _TIKTOKEN_BLOBS[encoding]
    return Path(cache_dir) / hashlib.sha1(url.encode()).hexdigest()


@functools.cache
def _tiktoken_cached(encoding: str) -> bool:
    """True when tiktoken is installed and can load ``encoding`` from its cache without any network access."""
    path = _tiktoken_cache_file(encoding)
    if path is None or not path.is_file():
        return False
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        return False
    try:
        data = path.read_bytes()
    except OSError:
        return False
    return hashlib.sha256(data).hexdigest() == _TIKTOKEN_BLOBS[encoding][1]


def reset_cache() -> None:
    """Forget loaded encoders and cache checks (tests that change ``TIKTOKEN_CACHE_DIR`` call this)."""
    _counter.cache_clear()
    _tiktoken_cached.cache_clear()


__all__ = ["DEFAULT_ENCODING", "count_tokens", "encoding_name_for", "reset_cache", "tokenizer_backend",
           "utf8_upper_bound"]
