"""Token counting: a real BPE tokenizer, tiktoken only from its local cache, never a download attempt."""

from __future__ import annotations

import gzip
import hashlib
import importlib.machinery
import importlib.resources
import importlib.util
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conclave import tokens


@pytest.fixture(autouse=True)
def _fresh_tokenizer_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Point tiktoken at an empty private cache and make any network fetch by tiktoken fail loudly."""
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    monkeypatch.delenv("DATA_GYM_CACHE_DIR", raising=False)
    import tiktoken.load

    def no_network(blobpath: str) -> bytes:
        raise AssertionError(f"tiktoken tried to fetch {blobpath}")

    monkeypatch.setattr(tiktoken.load, "read_file", no_network)
    tokens.reset_cache()
    yield
    tokens.reset_cache()


def _seed_tiktoken_cache(cache_dir: Path, encoding: str, data: bytes | None = None) -> Path:
    """Place ``encoding`` where tiktoken looks for it, using the vocabulary bpe-openai ships."""
    if data is None:
        blob = importlib.resources.files("bpe_openai") / "data" / f"{encoding}.tiktoken.gz"
        data = gzip.decompress(blob.read_bytes())
    url, _ = tokens._TIKTOKEN_BLOBS[encoding]
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / hashlib.sha1(url.encode()).hexdigest()
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini", "o200k_base"),
        ("gpt-4.1", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-4-turbo", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("openai/gpt-4-0613", "cl100k_base"),
        ("claude-sonnet-4-5", "o200k_base"),
        ("gemini-2.5-flash", "o200k_base"),
        (None, "o200k_base"),
    ],
)
def test_model_maps_to_encoding(model: str | None, encoding: str) -> None:
    assert tokens.encoding_name_for(model) == encoding


def test_counts_known_bpe_values_not_a_character_estimate() -> None:
    # Reference counts from OpenAI's tokenizers; chars/4 would give 4 and 5.
    assert tokens.count_tokens("tiktoken is great!", "gpt-4") == 6
    assert tokens.count_tokens("hello world", "gpt-4o") == 2
    assert tokens.count_tokens("antidisestablishmentarianism", "gpt-4o") != len("antidisestablishmentarianism") // 4


def test_empty_text_is_zero_tokens() -> None:
    assert tokens.count_tokens("") == 0


def test_special_token_text_is_counted_as_ordinary_text() -> None:
    # A prompt quoting "<|endoftext|>" must be counted, not rejected as a special token.
    assert tokens.count_tokens("before <|endoftext|> after") > 3


def test_text_over_the_tokenizer_input_limit_is_counted_in_pieces() -> None:
    block = " ".join(["The billing service emits events that downstream consumers replay."] * 10) + "\n"
    one = tokens.count_tokens(block)
    many = tokens.count_tokens(block * 2_000)  # ~1.4 M characters, over bpe-openai's 1 M limit
    assert abs(many - one * 2_000) <= one * 2_000 * 0.001


def test_without_a_tiktoken_cache_bpe_openai_counts_and_nothing_is_fetched() -> None:
    assert tokens.tokenizer_backend("o200k_base") == "bpe-openai"
    assert tokens.count_tokens("hello world", "gpt-4o") == 2  # the autouse fixture fails any fetch


def test_cached_tiktoken_encoding_is_used_and_agrees_with_bpe_openai(tmp_path: Path) -> None:
    text = "Should we move billing to event sourcing? Consider auditability, replay cost and team skills."
    expected = tokens.count_tokens(text, "gpt-4o")  # bpe-openai: the cache is still empty
    tokens.reset_cache()
    _seed_tiktoken_cache(tmp_path / "tiktoken-cache", "o200k_base")
    assert tokens.tokenizer_backend("o200k_base") == "tiktoken"
    assert tokens.count_tokens(text, "gpt-4o") == expected
    assert tokens.tokenizer_backend("cl100k_base") == "bpe-openai"  # only o200k was cached


def test_corrupt_tiktoken_cache_is_ignored_and_left_in_place(tmp_path: Path) -> None:
    # tiktoken would delete a file with the wrong hash and re-download it; we must do neither.
    path = _seed_tiktoken_cache(tmp_path / "tiktoken-cache", "o200k_base", data=b"not a vocabulary")
    assert tokens.tokenizer_backend("o200k_base") == "bpe-openai"
    assert tokens.count_tokens("hello world", "gpt-4o") == 2
    assert path.read_bytes() == b"not a vocabulary"


def test_empty_cache_dir_setting_means_no_tiktoken(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", "")  # tiktoken: caching disabled, i.e. always download
    assert tokens.tokenizer_backend("o200k_base") == "bpe-openai"


def test_importing_the_module_loads_no_tokenizer() -> None:
    code = "import sys, conclave.tokens; print('tiktoken' in sys.modules, 'bpe_openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_counting_loads_neither_bpe_openai_nor_its_compiled_backend(tmp_path: Path) -> None:
    """Counting reads the one vocabulary file it needs — not the bpe_openai package (whose import decodes every
    vocabulary it ships) nor its compiled tokenizer (~66 MiB for o200k) — and counts what the package would."""
    code = (
        "import sys, conclave.tokens as t\n"
        "n = t.count_tokens('naïve café 東京 🙂 <|endoftext|> def f(): return 1', 'gpt-4o')\n"
        "print(n, 'bpe_openai' in sys.modules, 'bpe_openai._bindings' in sys.modules)\n"
        "import warnings; warnings.simplefilter('ignore')\n"
        "import bpe_openai\n"
        "print(len(bpe_openai.get_encoding('o200k_base').encode_ordinary("
        "'naïve café 東京 🙂 <|endoftext|> def f(): return 1')))\n"
    )
    env = {"PATH": "/usr/bin:/bin", "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty"), "HOME": os.path.expanduser("~")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    first, second = out.splitlines()
    count, package_loaded, backend_loaded = first.split()
    assert (package_loaded, backend_loaded) == ("False", "False")
    assert int(count) == int(second) > 0


def _compiled(encoding: str) -> Any:
    """bpe-openai's compiled tokenizer for ``encoding`` (the reference the Python count must equal)."""
    spec = importlib.util.find_spec("bpe_openai")
    assert spec is not None and spec.origin is not None
    path = sorted(Path(spec.origin).parent.glob("_bindings*.so"))[0]
    loader = importlib.machinery.ExtensionFileLoader("bpe_openai._bindings", str(path))
    module_spec = importlib.util.spec_from_file_location("bpe_openai._bindings", path, loader=loader)
    assert module_spec is not None
    module = importlib.util.module_from_spec(module_spec)
    loader.exec_module(module)
    return module.tokenizer_for_encoding(encoding)


TRICKY = [
    "Should we move billing to event sourcing? Consider auditability, replay cost and team skills.",
    "naïve café 東京 🙂 <|endoftext|> def f(): return 1",
    "I'm sure they'll say we've 'd it; DON'T SHOUT, it's FINE's",
    "  leading spaces\n\n\ttabs\r\n  trailing   \n",
    "12345678901234567890 3.14159 1,000,000 0x1F",
    "한국어 텍스트와 中文文本 и русский текст, ελληνικά, עברית, العربية",
    "e\u0301 a\u0308 \u200b zero-width, ﬁ ligature, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    '{"json": [1, 2, {"k": "v"}], "path": "/usr/local/bin", "url": "https://example.com/a?b=c&d=e"}',
    "````python\nfor i in range(10):\n    print(i ** 2)  # squares\n```",
    "🚀🚀🚀 !!! ??? ... --- ___ *** /// \\\\",
]


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_the_python_count_equals_the_compiled_tokenizer(encoding: str) -> None:
    reference = _compiled(encoding)
    model = "gpt-4o" if encoding == "o200k_base" else "gpt-4"
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    rng = random.Random(11)
    alphabet = "ab XY 12 \n\r\t.,:'\"!?-_/\\()[]{}<>|@#$%&*~`éüßñ日本語한국Ωπ🙂\u200b\u0301'sllve"
    noise = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(300)]
    long_pieces = ["x" * 20_000, "ab" * 5_000, "é" * 3_000,  # one pre-tokenizer piece each: merged in O(n log n)
                   "".join(rng.choice("ABCabc0189+/=") for _ in range(20_000))]
    for text in [*TRICKY, readme, *noise, *long_pieces]:
        assert tokens.count_tokens(text, model) == sum(reference.count(p) for p in tokens._pieces(text)), text


def test_the_pre_tokenizer_patterns_are_tiktoken_s(monkeypatch: pytest.MonkeyPatch) -> None:
    import tiktoken_ext.openai_public as public

    monkeypatch.setattr(public, "load_tiktoken_bpe", lambda *args, **kwargs: {})
    assert tokens._PATTERNS == {"o200k_base": public.o200k_base()["pat_str"],
                                "cl100k_base": public.cl100k_base()["pat_str"]}


def test_the_rank_table_is_kept_and_a_damaged_copy_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    expected = tokens.count_tokens("hello world, again", "gpt-4o")
    kept = list((tmp_path / "cache" / "conclave" / "tokens").glob("o200k_base-*.marshal"))
    assert len(kept) == 1
    kept[0].write_bytes(b"damaged")
    tokens.reset_cache()
    assert tokens.count_tokens("hello world, again", "gpt-4o") == expected
    assert kept[0].stat().st_size > 1_000_000  # written again whole
