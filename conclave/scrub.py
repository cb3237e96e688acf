"""Secret scrubbing for everything we send to a provider (the question, context files, stdin).

Rules run in order, specific before generic, so a key is counted once under its most precise type: an
``OPENAI_API_KEY=sk-...`` line is one ``openai_key``, not also an ``api_key`` assignment. Each secret becomes
``[REDACTED_<TYPE>]``; spans already redacted are left as they are, so scrubbing twice changes nothing. The
report carries counts only, never a value.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

PLACEHOLDER_PREFIX = "[REDACTED_"


@dataclass(frozen=True)
class ScrubReport:
    """How many secrets of each type were redacted."""

    by_type: Mapping[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.by_type.values())

    def merge(self, other: ScrubReport) -> ScrubReport:
        """A report counting both this report's and ``other``'s redactions."""
        merged = dict(self.by_type)
        for kind, n in other.by_type.items():
            merged[kind] = merged.get(kind, 0) + n
        return ScrubReport(merged)

    def as_dict(self) -> dict[str, Any]:
        return {"total": self.total, "by_type": dict(sorted(self.by_type.items()))}


@dataclass(frozen=True)
class _Rule:
    """One secret pattern. The named group ``secret`` (or the whole match) is what gets replaced."""

    kind: str | Callable[[re.Match[str]], str]
    pattern: re.Pattern[str]
    accept: Callable[[str], bool] = lambda value: True
    #: a cheap pattern, searched in the lower-cased text, that every line the rule can match contains
    guard: re.Pattern[str] | None = None

    def kind_of(self, match: re.Match[str]) -> str:
        return self.kind if isinstance(self.kind, str) else self.kind(match)


# Values that name a secret rather than contain one: code and config references, booleans, empty defaults.
_REFERENCE = re.compile(
    r"""^(?:\$|\{\{|<|%\(|\*{3,}$|x{4,}$|(?i:true|false|null|none|nil|undefined|yes|no|required|optional)$)"""
    r"""|[(\[]|^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$"""
)


def _plain_value(value: str) -> bool:
    """An unquoted assignment value that is plausibly a literal secret."""
    return len(value) >= 4 and not _REFERENCE.search(value)


def _colon_value(value: str) -> bool:
    """``key: value`` is also how prose introduces things ("Password: must be long"): ask for a secret's shape."""
    return _plain_value(value) and (bool(re.search(r"[\d!@#$%^&*+=/_~-]", value)) or len(value) >= 16)


# A quoted literal is a secret unless it is a template slot or a mask ("${DB_PASSWORD}", "<token>", "****").
_QUOTED_REFERENCE = re.compile(r"^(?:\$\{.*\}|\{\{.*\}\}|<[^>]*>|\*+|x{4,})$", re.IGNORECASE)


def _quoted_value(value: str) -> bool:
    return bool(value) and not _QUOTED_REFERENCE.match(value)


_SECRET_WORD = r"(?:pass(?:word|wd|phrase)|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key)"
# A key that *ends* in a secret word (DB_PASSWORD, accessToken, "client_secret"), so that max_tokens,
# token_count or password_policy never match. The prefix is bounded: an unbounded one rescans a long run of
# word characters from every word boundary in it (minutes on a minified file).
_KEY = rf"""(?P<q>["']?)(?P<key>\b[A-Za-z0-9_.-]{{0,48}}?{_SECRET_WORD})(?P=q)"""


def _assignment_kind(match: re.Match[str]) -> str:
    key = match.group("key").lower()
    if "pass" in key:
        return "password"
    if re.search(r"api[_-]?key$|apikey$", key):
        return "api_key"
    if key.endswith("token"):
        return "token"
    return "secret"


def _rule(kind: str | Callable[[re.Match[str]], str], pattern: str, accept: Callable[[str], bool] | None = None,
          guard: re.Pattern[str] | None = None) -> _Rule:
    compiled = re.compile(pattern)
    return _Rule(kind, compiled, accept, guard) if accept else _Rule(kind, compiled, guard=guard)


# The assignment rules scan for a key at every word boundary, which costs ~0.2 s per MB each; they only run on
# the lines this guard finds (a secret word's ending right before ":" or "="), a ~10 ms scan.
_ASSIGNMENT_GUARD = re.compile(r"""(?:word|wd|phrase|secret|token|key)["']?[ \t]*[:=]""")


_RULES: tuple[_Rule, ...] = (
    _rule(
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----",
    ),
    _rule("anthropic_key", r"\bsk-ant-[A-Za-z0-9_-]{20,}"),
    # Real keys are random, so they contain a digit; hyphenated prose after "sk-" does not.
    _rule("openai_key", r"\bsk-(?:proj-|svcacct-|admin-)?(?=[A-Za-z0-9_-]{0,250}?\d)[A-Za-z0-9_-]{20,}"),
    _rule("xai_key", r"\bxai-[A-Za-z0-9]{20,}"),
    _rule("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"),
    _rule("github_token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b"),
    _rule("slack_token", r"\bxox[abprs]-[A-Za-z0-9-]{10,}"),
    _rule("stripe_key", r"\b(?:(?:sk|rk)_(?:live|test)|pk_live)_[0-9A-Za-z]{16,}"),
    _rule("aws_access_key_id", r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    _rule(
        "aws_secret_key",
        r"""(?i:\b(?:aws_)?secret_(?:access_)?key["']?\s*[:=]\s*["']?)(?P<secret>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])""",
    ),
    # Mistral keys have no prefix: only the variable they are assigned to gives them away.
    _rule("mistral_key", r"""\bMISTRAL_API_KEY["']?\s*[:=]\s*["']?(?P<secret>[A-Za-z0-9]{20,})"""),
    _rule("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    # scheme://user:PASSWORD@host keeps the user (useful context) and drops the password.
    _rule("url_password", r"\b[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s:/@]{1,256}:(?P<secret>[^\s@/]{1,512})@"),
    _rule("bearer_token", r"\b[Bb]earer\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)"),
    _rule(
        _assignment_kind,
        rf"""(?i:{_KEY})[ \t]*[:=][ \t]*(?P<oq>["'])(?P<secret>(?:(?!(?P=oq))[^\\\n]|\\.)*)(?P=oq)""",
        _quoted_value,
        _ASSIGNMENT_GUARD,
    ),
    _rule(_assignment_kind, rf"""(?i:{_KEY})[ \t]*=(?!=)[ \t]*(?P<secret>[^\s"',;&]+)""", _plain_value,
          _ASSIGNMENT_GUARD),
    _rule(_assignment_kind, rf"""(?i:{_KEY})[ \t]*:[ \t]*(?P<secret>[^\s"',;&]+)""", _colon_value,
          _ASSIGNMENT_GUARD),
)


def scrub(text: str) -> tuple[str, ScrubReport]:
    """``text`` with every recognised secret replaced by ``[REDACTED_<TYPE>]``, and the counts per type."""
    counts: dict[str, int] = {}
    for rule in _RULES:
        text = _apply(rule, text, counts)
    return text, ScrubReport(counts)


def _apply(rule: _Rule, text: str, counts: dict[str, int]) -> str:
    redact = functools.partial(_redact, rule=rule, counts=counts)
    spans = _guarded_lines(rule, text)
    if spans is None:
        return rule.pattern.sub(redact, text)
    pieces, last = [], 0
    for start, end in spans:
        pieces += [text[last:start], rule.pattern.sub(redact, text[start:end])]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def _guarded_lines(rule: _Rule, text: str) -> list[tuple[int, int]] | None:
    """The (start, end) of each line the rule's guard finds, in order; None = scan the whole text."""
    if rule.guard is None:
        return None
    lowered = text.lower()
    if len(lowered) != len(text):  # a few characters lower-case to two; positions would not line up
        return None
    spans: list[tuple[int, int]] = []
    for match in rule.guard.finditer(lowered):
        start = text.rfind("\n", 0, match.start()) + 1
        if spans and start < spans[-1][1]:
            continue  # another hit on a line already taken
        end = text.find("\n", match.end())
        spans.append((start, len(text) if end == -1 else end))
    return spans


def _redact(match: re.Match[str], rule: _Rule, counts: dict[str, int]) -> str:
    group = "secret" if "secret" in match.re.groupindex else 0
    value = match.group(group)
    if value.startswith(PLACEHOLDER_PREFIX) or not rule.accept(value):
        return match.group(0)
    kind = rule.kind_of(match)
    counts[kind] = counts.get(kind, 0) + 1
    start, end = match.span(group)
    whole = match.group(0)
    offset = match.start()
    return whole[: start - offset] + f"{PLACEHOLDER_PREFIX}{kind.upper()}]" + whole[end - offset :]


__all__ = ["ScrubReport", "scrub"]
