"""The safety evaluator's rules and the two tiers that need no model: patterns (tier 1) and triggers (tier 2).

Three tiers, each only as expensive as it must be:

1. **lightweight** — precise patterns for clearly harmful requests or content (weapons synthesis, malware
   creation, self-harm and violence instructions, sexual content involving minors), run on the question, the
   supplied context and every agent and judge artifact. A few substring searches per response decide which
   regexes run at all, so this tier costs microseconds. A hit blocks (``quality.safety.tier1_action: block``) or
   asks tier 3 first (``evaluate``).
2. **triggered** — reasons to look closer, never a block on their own: the debate mode (``adversarial``,
   ``devils_advocate``, …), the question's topic (security, medical, legal), the asker's intent ("how to exploit",
   "evade detection", step-by-step attack instructions) and patterns in the material (shellcode, reverse shells,
   credential dumpers). Topic triggers read the question and context only (panels discuss security all the time);
   intent and context triggers also read every response.
3. **full-evaluation** — the judge seat reads the text and answers the ``safety_evaluation`` schema (verdict, risk,
   categories, concerns); it runs only when tier 2 (or a tier-1 hit under ``evaluate``) asks for it.

The rules are data (``safety_rules.toml``); ``quality.safety.patterns.*`` adds more from the config. This module
only matches text; :mod:`conclave.engine.safety_gate` decides what runs when and what a hit does to a consultation.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from conclave.yamlload import load_packaged_toml

TIER_NAMES = {1: "lightweight", 2: "triggered", 3: "full-evaluation"}
#: the kinds of tier-2 trigger; ``mode`` comes from the config, the others from patterns
TRIGGER_KINDS = ("mode", "topic", "intent", "context")
#: trigger kinds that read responses as well as the question (a topic is the question's alone)
RESPONSE_TRIGGER_KINDS = ("intent", "context")
#: the most of a match a record keeps (enough to say what was matched, not to carry the content)
MATCH_CHARS = 80
#: characters on each side of a keyword occurrence that a rule's regex reads; every built-in rule's match is
#: shorter than this (its gaps are bounded), so no match that contains the keyword is missed
WINDOW = 256


@dataclass(frozen=True)
class Rule:
    """One pattern: ``kind`` is ``block`` (tier 1) or a trigger kind (tier 2)."""

    id: str
    kind: str
    category: str
    description: str
    pattern: str  # compiled on first use (:attr:`regex`): most texts contain no keyword of most rules
    keywords: tuple[str, ...] = ()  # one of these occurs in every match; none: the regex always runs
    unless: str | None = None  # ``not_followed_by``: matching right after a match, it discards the match

    @functools.cached_property
    def regex(self) -> Any:
        """The compiled pattern: RE2, or Python's for a pattern RE2 rejects (see :func:`compile_pattern`)."""
        return compile_pattern(self.pattern)

    @functools.cached_property
    def not_followed_by(self) -> re.Pattern[str] | None:
        return re.compile(self.unless, re.IGNORECASE) if self.unless else None

    def find(self, folded: str, lowered: str, present: set[str] | None = None) -> str | None:
        """The first match in ``folded`` (whitespace folded), or None; ``lowered`` is it in lower case and
        ``present`` the keywords that occur in it (None: look for them here).

        A rule with keywords runs its regex only in windows of :data:`WINDOW` characters around each keyword
        occurrence (every match contains a keyword and is shorter than a window), so a long answer that mentions
        a keyword once costs one short scan, not a scan of the whole answer."""
        if not self.keywords:
            return self._search(folded, 0, len(folded))
        keywords = [k for k in self.keywords if k in lowered] if present is None else [
            k for k in self.keywords if k in present]
        if not keywords:
            return None
        if len(lowered) != len(folded):  # lower-casing changed the length: positions would not line up
            return self._search(folded, 0, len(folded))
        spans: list[tuple[int, int]] = []
        most = len(folded) // (2 * WINDOW)  # past this many windows, one scan of the whole text is cheaper
        for keyword in keywords:
            at = lowered.find(keyword)
            while at != -1 and len(spans) <= most:
                spans.append((max(0, at - WINDOW), at + len(keyword) + WINDOW))
                at = lowered.find(keyword, at + 1)
        if not spans:
            return None
        if len(spans) > most:
            return self._search(folded, 0, len(folded))
        spans.sort()
        merged = [spans[0]]
        for start, end in spans[1:]:
            if start <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            else:
                merged.append((start, end))
        for start, end in merged:
            found = self._search(folded, start, min(end, len(folded)))
            if found is not None:
                return found
        return None

    def _search(self, text: str, start: int, end: int) -> str | None:
        # pos/endpos, not a slice: \b still sees the characters just outside the window
        while start <= end:
            match = self.regex.search(text, start, end)
            if match is None:
                return None
            if self.not_followed_by is None or not self.not_followed_by.match(text, match.end()):
                return str(match.group(0))[:MATCH_CHARS]
            start = match.start() + 1
        return None


@dataclass(frozen=True)
class Hit:
    """A rule that matched a piece of text (``target``: ``question``, ``context``, an agent name or ``judge``)."""

    rule: str
    kind: str
    category: str
    description: str
    target: str
    matched: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "kind": self.kind, "category": self.category, "description": self.description,
                "target": self.target, "matched": self.matched}


@dataclass
class Scan:
    """Tier 1 and tier 2 over one piece of text."""

    target: str
    blocks: list[Hit] = field(default_factory=list)
    triggers: list[Hit] = field(default_factory=list)


class Rules:
    """The compiled rules, grouped by kind."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = list(rules)
        seen: set[str] = set()
        for rule in self.rules:
            if rule.id in seen:
                raise ValueError(f"safety rule id {rule.id!r} is used twice")
            seen.add(rule.id)
        self.by_kind: dict[str, list[Rule]] = {}
        for rule in self.rules:
            self.by_kind.setdefault(rule.kind, []).append(rule)
        self.keywords = sorted({k for rule in self.rules for k in rule.keywords})
        self._keyword_set: Any = None  # one RE2 pass says which keywords occur (far cheaper than a find each)
        try:
            import re2
        except ImportError:  # pragma: no cover - google-re2 is a dependency
            return
        if self.keywords:
            self._keyword_set = re2.Set.SearchSet(re2.Options())
            for keyword in self.keywords:
                self._keyword_set.Add(re.escape(keyword))
            self._keyword_set.Compile()

    def present(self, lowered: str) -> set[str]:
        """The rules' keywords that occur in ``lowered``."""
        if self._keyword_set is None:
            return {k for k in self.keywords if k in lowered}
        return {self.keywords[i] for i in self._keyword_set.Match(lowered) or ()}

    @classmethod
    def load(cls, extra: Mapping[str, Any] | None = None) -> Rules:
        """The built-in rules plus ``extra`` (``quality.safety.patterns``: ``block`` {category: [regex]},
        ``topic``/``intent``/``context`` [regex])."""
        return cls([*builtin_rules(), *config_rules(extra or {})])

    def scan(self, target: str, text: str, kinds: Sequence[str]) -> Scan:
        """Run the rules of ``kinds`` (``block`` and/or trigger kinds) over ``text``."""
        scan = Scan(target)
        if not text:
            return scan
        folded = " ".join(text.split())
        lowered = folded.lower()
        present = self.present(lowered)
        for kind in kinds:
            for rule in self.by_kind.get(kind, ()):
                matched = rule.find(folded, lowered, present)
                if matched is not None:
                    hit = Hit(rule.id, rule.kind, rule.category, rule.description, target, matched)
                    (scan.blocks if kind == "block" else scan.triggers).append(hit)
        return scan


def compile_pattern(pattern: str) -> Any:
    """``pattern``, case-insensitive, on RE2 (linear time, and far faster than Python's re on alternations of
    words); Python's re when RE2 rejects it (lookarounds, backreferences in a pattern added by the config)."""
    try:
        import re2
    except ImportError:  # pragma: no cover - google-re2 is a dependency
        return re.compile(pattern, re.IGNORECASE)
    options = re2.Options()
    options.case_sensitive = False
    options.log_errors = False  # a pattern RE2 rejects falls back to Python's re, silently
    try:
        return re2.compile(pattern, options)
    except re2.error:
        return re.compile(pattern, re.IGNORECASE)


@functools.cache
def builtin_rules() -> tuple[Rule, ...]:
    """The rules of ``safety_rules.toml``, in file order (block rules first)."""
    data = load_packaged_toml(resources.files("conclave.quality").joinpath("safety_rules.toml"))
    out = []
    for spec in data.get("block", []):
        out.append(_rule(spec, "block"))
    for spec in data.get("trigger", []):
        out.append(_rule(spec, spec["kind"]))
    return tuple(out)


def _rule(spec: Mapping[str, Any], kind: str) -> Rule:
    return Rule(id=spec["id"], kind=kind, category=spec["category"], description=spec["description"],
                pattern=spec["regex"], keywords=tuple(k.lower() for k in spec.get("keywords", ())),
                unless=spec.get("not_followed_by"))


def config_rules(extra: Mapping[str, Any]) -> list[Rule]:
    """Rules added by ``quality.safety.patterns`` (validated by the config model, so every regex compiles)."""
    out = []
    for category, patterns in sorted((extra.get("block") or {}).items()):
        for i, pattern in enumerate(patterns, 1):
            out.append(Rule(f"config-block-{category}-{i}", "block", category,
                            f"matches a {category} pattern added in quality.safety.patterns.block", pattern))
    for kind in ("topic", "intent", "context"):
        for i, pattern in enumerate(extra.get(kind) or [], 1):
            out.append(Rule(f"config-{kind}-{i}", kind, kind, f"matches a {kind} pattern added in "
                            f"quality.safety.patterns.{kind}", pattern))
    return out


def artifact_text(artifact: Any) -> str:
    """Every string value of an artifact, one per line (keys and header fields are the schema's, not content)."""
    out: list[str] = []
    _strings(artifact, out)
    return "\n".join(out)


_HEADER_KEYS = frozenset({"artifact_type", "schema_version", "created_at", "agent_id"})


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if key not in _HEADER_KEYS:
                _strings(item, out)
    elif isinstance(value, list | tuple):
        for item in value:
            _strings(item, out)
