"""How the fake provider server models each API's prompt cache, so tests can assert cache hits and bills.

Tokens are counted the fake's way (4 characters of the request's JSON a token). Each API's documented rules:

- **OpenAI** (automatic): a prompt of at least ``min_tokens`` reuses the longest prefix an earlier request to the
  same model and ``prompt_cache_key`` sent, in 128-token steps above the minimum. The prefix is the list of
  tools, then the structured-output schema (it "serves as a prefix to the system message"), then the messages in
  order: another tool list or another schema is another prefix. ``tool_choice`` is not part of it (forcing one of
  the same tools changes no cached token). Usage: ``prompt_tokens_details.cached_tokens``.
- **Anthropic** (``cache_control``): the prompt is the blocks tools → system → (tool_choice) → messages; a
  breakpoint caches the prefix that ends with its block when that prefix is at least ``min_tokens``. A request
  reads the longest prefix ending at one of its blocks that an earlier request cached, and writes the rest up to its
  last breakpoint. More than 4 breakpoints is a 400. Usage: ``cache_read_input_tokens``,
  ``cache_creation_input_tokens``, and ``input_tokens`` for the rest.
- **Gemini**: explicit cached contents (``POST cachedContents``; a content under ``min_tokens`` is a 400) are read
  in full by every request naming them in ``cachedContent`` (a request that also sets ``systemInstruction``,
  ``tools`` or ``toolConfig`` is a 400, an unknown or expired one a 404); without one, implicit caching reuses the
  longest earlier prefix of ``systemInstruction`` + ``contents`` of at least ``min_tokens``. Usage:
  ``promptTokenCount`` includes ``cachedContentTokenCount``.

A prefix becomes readable when the request that wrote it is answered (after its latency): requests sent at the same
time all miss, as they do on the real APIs.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: chars a token, as the fake counts
CHARS_PER_TOKEN = 4
#: OpenAI serves cached prefixes in steps of this many tokens above the minimum
OPENAI_STEP = 128
MAX_BREAKPOINTS = 4
#: remembered prompts per (model, key) for prefix matching
_KEEP = 64


def tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=False, ensure_ascii=False)


def _common_prefix(a: str, b: str) -> int:
    """Length of the longest common prefix of two strings (binary search on slices: C-speed compares)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CacheUse:
    """What one request read from and wrote to the cache, in tokens (``extra``: tokens of a referenced cached
    content, which count as prompt tokens though the request did not carry them)."""

    read: int = 0
    write: int = 0
    extra: int = 0
    #: applied when the request is answered (makes what it wrote readable)
    commit: tuple[tuple[str, Any], ...] = ()
    #: the request is refused: (HTTP status, message)
    error: tuple[int, str] | None = None


@dataclass
class CachedContent:
    name: str
    model: str
    display_name: str
    tokens: int
    created: float
    expires: float

    def resource(self) -> dict[str, Any]:
        def stamp(t: float) -> str:
            return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"

        return {"name": self.name, "displayName": self.display_name, "model": self.model,
                "createTime": stamp(self.created), "updateTime": stamp(self.created),
                "expireTime": stamp(self.expires), "usageMetadata": {"totalTokenCount": self.tokens}}


@dataclass
class PromptCacheModel:
    """The fake's caches. ``enabled=False`` turns every cache off (explicit cached contents still work)."""

    enabled: bool = True
    min_tokens: int = 1024
    ttl_s: float = 300.0
    #: (api, model, key) -> prompts seen (for prefix matching): (expires, text)
    prompts: dict[tuple[str, str, str], list[tuple[float, str]]] = field(default_factory=dict)
    #: (model, prefix digest) -> expires, for Anthropic breakpoints
    prefixes: dict[tuple[str, str], float] = field(default_factory=dict)
    contents: dict[str, CachedContent] = field(default_factory=dict)

    def forget(self) -> None:
        """Drop every cached prefix and cached content."""
        self.prompts.clear()
        self.prefixes.clear()
        self.contents.clear()

    # ------------------------------------------------------------------------------------- lookups

    def use(self, api: str, model: str, body: Mapping[str, Any]) -> CacheUse:
        if api == "openai":
            return self._openai(model, body)
        if api == "anthropic":
            return self._anthropic(model, body)
        return self._gemini(model, body)

    def apply(self, use: CacheUse) -> None:
        """Make what ``use`` wrote readable (called when its request is answered)."""
        now = time.time()
        for kind, item in use.commit:
            if kind == "prompt":
                bucket, text = item
                seen = [(t, p) for t, p in self.prompts.get(bucket, []) if t > now and p != text]
                self.prompts[bucket] = [*seen[-(_KEEP - 1):], (now + self.ttl_s, text)]
            elif kind == "prefix":
                self.prefixes[item] = now + self.ttl_s

    def _longest(self, bucket: tuple[str, str, str], text: str) -> int:
        """Characters of ``text`` shared with the longest matching prompt remembered in ``bucket``."""
        now = time.time()
        best = 0
        for expires, seen in self.prompts.get(bucket, []):
            if expires > now:
                best = max(best, _common_prefix(seen, text))
        return best

    def _openai(self, model: str, body: Mapping[str, Any]) -> CacheUse:
        if not self.enabled:
            return CacheUse()
        head = _dump(body.get("tools")) + _dump(body.get("response_format"))
        text = head + "".join(_dump(m) for m in body.get("messages") or [])
        bucket = ("openai", model, str(body.get("prompt_cache_key") or ""))
        commit = (("prompt", (bucket, text)),)
        if tokens(text) < self.min_tokens:
            return CacheUse()
        shared = tokens(text[: self._longest(bucket, text)])
        if shared < self.min_tokens:
            return CacheUse(commit=commit)
        return CacheUse(read=self.min_tokens + (shared - self.min_tokens) // OPENAI_STEP * OPENAI_STEP,
                        commit=commit)

    def _anthropic(self, model: str, body: Mapping[str, Any]) -> CacheUse:
        blocks: list[tuple[str, bool]] = []  # (serialized block, has a breakpoint)

        def add(block: Any) -> None:
            marked = isinstance(block, Mapping) and block.get("cache_control") is not None
            blocks.append((_dump(block), marked))

        for tool in body.get("tools") or []:
            add(tool)
        system = body.get("system")
        for block in (system if isinstance(system, list) else [system] if system else []):
            add(block)
        blocks.append((_dump(body.get("tool_choice")), False))
        for message in body.get("messages") or []:
            content = message.get("content") if isinstance(message, Mapping) else None
            for block in (content if isinstance(content, list) else [content]):
                add(block)
        marks = sum(marked for _, marked in blocks)
        if marks > MAX_BREAKPOINTS:
            return CacheUse(error=(400, f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be "
                                        f"provided. Found {marks}."))
        if not self.enabled or not marks:
            return CacheUse()
        now = time.time()
        prefix, read, last, commit = "", 0, 0, []
        for text, marked in blocks:
            prefix += text
            size = tokens(prefix)
            key = (model, _digest(prefix))
            if self.prefixes.get(key, 0) > now:
                read = size
            if marked and size >= self.min_tokens:
                last = size
                commit.append(("prefix", key))
        return CacheUse(read=read, write=max(0, last - read), commit=tuple(commit))

    def _gemini(self, model: str, body: Mapping[str, Any]) -> CacheUse:
        name = body.get("cachedContent")
        if name:
            content = self.contents.get(str(name))
            if content is None or content.expires <= time.time():
                return CacheUse(error=(404, "CachedContent not found (or permission denied)"))
            if any(body.get(k) for k in ("systemInstruction", "system_instruction", "tools", "toolConfig")):
                return CacheUse(error=(400, "CachedContent can not be used with GenerateContent request setting "
                                            "system_instruction, tools or tool_config.\n\nProposed fix: move "
                                            "those values to CachedContent from GenerateContent request."))
            if content.model.removeprefix("models/") != model.removeprefix("models/"):
                return CacheUse(error=(400, f"Model used by GenerateContent request ({model}) and CachedContent "
                                            f"({content.model}) has to be the same."))
            return CacheUse(read=content.tokens, extra=content.tokens)
        if not self.enabled:
            return CacheUse()
        text = _dump(body.get("systemInstruction")) + "".join(_dump(c) for c in body.get("contents") or [])
        bucket = ("gemini", model.removeprefix("models/"), "")
        commit = (("prompt", (bucket, text)),)
        shared = tokens(text[: self._longest(bucket, text)])
        return CacheUse(read=shared if shared >= self.min_tokens else 0, commit=commit)

    # ------------------------------------------------------------------------------------- cached contents

    def create(self, body: Mapping[str, Any], number: int) -> tuple[int, dict[str, Any]]:
        """``POST cachedContents``: (status, the resource or an error message)."""
        model = str(body.get("model") or "")
        if not model:
            return 400, {"message": "CachedContent must name a model"}
        size = tokens(_dump(body.get("systemInstruction")) + _dump(body.get("contents")))
        if size < self.min_tokens:
            return 400, {"message": f"Cached content is too small. total_token_count={size}, "
                                    f"min_total_token_count={self.min_tokens}"}
        ttl = str(body.get("ttl") or "3600s")
        try:
            seconds = float(ttl.removesuffix("s"))
        except ValueError:
            return 400, {"message": f"Invalid ttl: {ttl}"}
        now = time.time()
        content = CachedContent(f"cachedContents/fake{number}", model if model.startswith("models/")
                                else f"models/{model}", str(body.get("displayName") or ""), size, now, now + seconds)
        self.contents[content.name] = content
        return 200, content.resource()

    def delete(self, name: str) -> bool:
        return self.contents.pop(name, None) is not None
