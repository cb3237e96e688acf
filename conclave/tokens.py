"""Token counting with a real BPE tokenizer (never chars/4).

``tiktoken`` is used when the encoding is already in its local cache; otherwise the vocabulary that
``bpe-openai`` ships (the same ranks) is counted by :class:`_RankCounter`, tiktoken's byte-pair merge in Python
over one ``bytes -> rank`` dict (~26 MiB for o200k, where bpe-openai's compiled tokenizer holds ~66 MiB: its
embedded tables and automata), with the encoding's own pre-tokenizer pattern. The dict is built once from the
shipped file and kept in ``$XDG_CACHE_HOME/conclave/tokens/`` (``~/.cache/…``; ``marshal``: read in ~50 ms).
tiktoken downloads a missing encoding on first use, so we check its cache ourselves and never let it try.
Non-OpenAI models (Claude, Gemini, Grok, Mistral, local models) have no public tokenizer here: they are counted
with ``o200k_base`` as an approximation.
"""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import heapq
import importlib.util
import marshal
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import regex

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

# Each encoding's pre-tokenizer, as tiktoken_ext.openai_public defines it (a test checks they are the same).
_PATTERNS = {
    "o200k_base": "|".join([
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]),
    "cl100k_base": (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
                    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""),
}

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
    encoding = encoding_name_for(model)
    key = (encoding, text)
    known = _counted.get(key)
    if known is not None:
        return known
    count = _counter(encoding)
    total = sum(count(piece) for piece in _pieces(text))
    global _counted_chars
    if _counted_chars + len(text) > _REMEMBER_CHARS:
        _counted.clear()
        _counted_chars = 0
    if len(text) <= _REMEMBER_CHARS // 8:
        _counted[key] = total
        _counted_chars += len(text)
    return total


#: whole texts counted lately (a consultation counts the same artifact, block or prompt more than once), up to
#: this many characters in all (forgotten all at once beyond)
_REMEMBER_CHARS = 2_000_000
_counted: dict[tuple[str, str], int] = {}
_counted_chars = 0


def utf8_upper_bound(text: str, model: str | None = None) -> int:
    """An upper bound of :func:`count_tokens` that needs no tokenizer: every BPE token of ordinary text covers
    at least one UTF-8 byte. Cheap enough to run before anything else, exact enough to approve a small cost."""
    return len(text.encode("utf-8"))


def tokenizer_backend(encoding: str = DEFAULT_ENCODING) -> str:
    """What counts tokens for ``encoding`` on this machine: ``"tiktoken"`` (its local cache) or ``"bpe-openai"``
    (the vocabulary bpe-openai ships, counted by :class:`_RankCounter`)."""
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


def _counter(encoding: str) -> Callable[[str], int]:
    """Load ``encoding`` once per process, lazily, and return a function counting the tokens of ordinary text
    (one load even when a worker thread and the event loop ask for it at once)."""
    counter = _counters.get(encoding)
    if counter is None:
        with _loading:
            counter = _counters.get(encoding)
            if counter is None:
                counter = _counters[encoding] = _load_counter(encoding)
    return counter


_counters: dict[str, Callable[[str], int]] = {}
_loading = threading.Lock()


def _load_counter(encoding: str) -> Callable[[str], int]:
    if _tiktoken_cached(encoding):
        import tiktoken

        encode = tiktoken.get_encoding(encoding).encode_ordinary
        return lambda text: len(encode(text))
    return _RankCounter(_ranks(encoding), _PATTERNS[encoding]).count


class _RankCounter:
    """tiktoken's count for one encoding: split ``text`` with the encoding's pattern; a piece that is a token is
    one; any other piece is merged from its bytes, always joining the adjacent pair whose join has the lowest
    rank (the leftmost on a tie), until no adjacent join is a token. Counts of merged pieces are remembered."""

    def __init__(self, ranks: dict[bytes, int], pattern: str) -> None:
        self._ranks = ranks
        self._split = regex.compile(pattern).findall
        self._merged: dict[bytes, int] = {}
        self._lock = threading.Lock()

    def count(self, text: str) -> int:
        ranks, merged = self._ranks, self._merged
        total = 0
        for piece in self._split(text):
            data = piece.encode("utf-8")
            if data in ranks:
                total += 1
                continue
            n = merged.get(data)
            if n is None:
                n = _merge_count(data, ranks)
                with self._lock:
                    if len(merged) > 100_000:
                        merged.clear()
                    merged[data] = n
            total += n
        return total


def _merge_count(data: bytes, ranks: dict[bytes, int]) -> int:
    if len(data) > 32:
        return _merge_count_long(data, ranks)
    parts = [data[i:i + 1] for i in range(len(data))]
    get = ranks.get
    while len(parts) > 1:
        best, at = None, -1
        for i in range(len(parts) - 1):
            rank = get(parts[i] + parts[i + 1])
            if rank is not None and (best is None or rank < best):
                best, at = rank, i
        if best is None:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return len(parts)

def _merge_count_long(data: bytes, ranks: dict[bytes, int]) -> int:
    """:func:`_merge_count` in O(n log n) for long pieces (a minified line, a base64 blob): the same merges in the
    same order — the lowest-ranked adjacent pair, the leftmost on a tie — kept in a heap of (rank, start)."""
    n = len(data)
    nxt = list(range(1, n + 1))  # start of the part after the part starting at i (n: none)
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap = []
    for i in range(n - 1):
        rank = ranks.get(data[i:i + 2])
        if rank is not None:
            heap.append((rank, i, i + 2))
    heapq.heapify(heap)
    count = n
    while heap:
        rank, i, end = heapq.heappop(heap)
        j = nxt[i] if alive[i] else -1
        if j < 0 or j >= n or not alive[j] or nxt[j] != end:
            continue  # stale: a part of this pair was merged since
        alive[j] = False
        nxt[i] = end
        if end < n:
            prv[end] = i
        count -= 1
        left = prv[i]
        if left >= 0:
            joined = ranks.get(data[left:end])
            if joined is not None:
                heapq.heappush(heap, (joined, left, end))
        if end < n:
            after = nxt[end]
            joined = ranks.get(data[i:after])
            if joined is not None:
                heapq.heappush(heap, (joined, i, after))
    return count


def _vocabulary_file(encoding: str) -> Path:
    """The ``.tiktoken.gz`` vocabulary bpe-openai ships for ``encoding`` (found without importing the package,
    whose import decodes every vocabulary it ships)."""
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("bpe-openai is not installed: no vocabulary to count tokens with")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / f"{encoding}.tiktoken.gz"


def _ranks(encoding: str) -> dict[bytes, int]:
    """``encoding``'s ``bytes -> rank`` table: from the marshal copy in the user's cache dir when it was made from
    this very file by this Python, else decoded from the shipped file (and the copy written). The copy derives
    from package data only, so every conclave home shares it."""
    source = _vocabulary_file(encoding)
    st = source.stat()
    stamp = f"{source}:{st.st_size}:{st.st_mtime_ns}:{sys.version_info[:2]}:{marshal.version}"
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    cache_root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    cached = Path(cache_root) / "conclave" / "tokens" / f"{encoding}-{digest}.marshal"
    try:
        ranks = marshal.loads(cached.read_bytes())
        if isinstance(ranks, dict) and ranks:
            return ranks
    except (OSError, EOFError, ValueError, TypeError):
        pass
    ranks = {}
    with gzip.open(source, "rb") as lines:
        for line in lines:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        tmp.write_bytes(marshal.dumps(ranks))
        os.replace(tmp, cached)
    except OSError:
        pass  # a read-only home decodes the file again next time
    return ranks


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
    _counters.clear()
    _tiktoken_cached.cache_clear()
    global _counted_chars
    _counted.clear()
    _counted_chars = 0


__all__ = ["DEFAULT_ENCODING", "count_tokens", "encoding_name_for", "reset_cache", "tokenizer_backend",
           "utf8_upper_bound"]
