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
    """One secret pattern. The named group ``secret`` (or the whole match) is what gets replaced.

    ``accept(value, match)`` can still refuse a match (a reference, prose, a setting about secrets).
    """

    kind: str | Callable[[re.Match[str]], str]
    pattern: re.Pattern[str]
    accept: Callable[[str, re.Match[str]], bool] = lambda value, match: True
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


# Assignments (``NAME=value``, ``name: value``, ``"name": "value"``). A name bears a secret when one of its word
# parts (split at "_", ".", "-" and camelCase) names one; how sure the name is decides how secret-like the value
# must look:
#   strong - the last part is password/passwd/passphrase/pass, secret, token, or api/access/private/secret key
#            (DB_PASSWORD, DB_PASS, client_secret, refreshToken, API_KEY, SECRET_KEY): any literal value.
#   suffix - the last part is another "key" (not the first part: SIGNING_KEY, signingKey, but not KEY_COUNT,
#            keyboard or monkey), credential(s)/creds or private: cache, sort and primary keys and credential file
#            paths share these names, so the value must look generated (see _generated_value), >= 8 characters.
#   inner  - a secret word elsewhere in the name (SECRET_KEY_BASE, PRIVATE_KEY_ID, password_policy, TOKEN_LIMIT,
#            max_tokens): settings *about* secrets look like this, so a generated value of >= 16 characters.
# The name is bounded, must start where an identifier starts and is taken whole ("{1,128}+" never backtracks):
# an unbounded one rescans a long run of word characters from every position in it (minutes on a minified file).
_SECRET_STEM = r"(?:pass|secret|token|key|cred|private)"
_NAME = "A-Za-z0-9_.-"
_KEY = (rf"""(?P<q>["']?)(?P<key>(?<![{_NAME}])(?=[{_NAME}]{{0,120}}?{_SECRET_STEM})[{_NAME}]{{1,128}}+)"""
        r"(?P=q)")

_STRONG_LAST = re.compile(r"\w*(?:password|passwd|passphrase|secret|token|apikey|accesskey|privatekey|secretkey)|pass")
_STRONG_BEFORE_KEY = frozenset({"api", "access", "private", "secret"})
_SUFFIX_LAST = re.compile(r"\w*credentials?|creds|private")
_SECRET_PART = re.compile(r"\w*(?:password|passwd|passphrase|secret|token|apikey|credential)s?|pass|creds|private")
_PASS_PART = re.compile(r"\w*(?:password|passwd|passphrase)s?|pass")


def _name_parts(key: str) -> list[str]:
    """``"signingKey"`` -> ``["signing", "key"]``; ``"DB_PASS"`` -> ``["db", "pass"]``."""
    split = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key)
    return [part for part in re.split(r"[_.-]+", split.lower()) if part]


def _is_secret_part(parts: list[str], index: int) -> bool:
    part = parts[index]
    return bool(_SECRET_PART.fullmatch(part) or _STRONG_LAST.fullmatch(part)) or (index > 0 and part in ("key", "keys"))


def _name_strength(key: str) -> str | None:
    """``"strong"``, ``"suffix"``, ``"inner"`` (see above) or None when the name does not bear a secret."""
    parts = _name_parts(key)
    if not parts:
        return None
    last = parts[-1]
    if _STRONG_LAST.fullmatch(last) or (last == "key" and len(parts) > 1 and parts[-2] in _STRONG_BEFORE_KEY):
        return "strong"
    if _SUFFIX_LAST.fullmatch(last) or (last == "key" and len(parts) > 1):
        return "suffix"
    return "inner" if any(_is_secret_part(parts, i) for i in range(len(parts))) else None


def _assignment_kind(match: re.Match[str]) -> str:
    parts = _name_parts(match.group("key"))
    if any(_PASS_PART.fullmatch(part) for part in parts):
        return "password"
    index = max(i for i in range(len(parts)) if _is_secret_part(parts, i))
    part = parts[index]
    if part.endswith("apikey") or (part == "key" and parts[index - 1] == "api"):
        return "api_key"
    return "token" if part.endswith(("token", "tokens")) else "secret"


# Values that are plainly not generated secrets: numbers, versions, sizes and times ("4096", "1.2.0", "15:30").
_NUMBERISH = re.compile(r"[\d.,:_+-]+")
# A URL without user info or query: credentials in URLs have their own rule, and a query may hold a token=.
_PLAIN_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s@?#]*")
# A file path with an extension (GOOGLE_APPLICATION_CREDENTIALS=/etc/gcp/sa.json): base64 and hex have no ".".
_FILE_PATH = re.compile(r"[\w.~-]*/[\w./-]*\.[A-Za-z][A-Za-z0-9]{0,4}")


def _generated_value(value: str, min_length: int) -> bool:
    """A value shaped like a generated secret: long enough, no spaces, letters with digits (or long and mixed-case),
    and not a reference, template, number, plain URL or file path. Names, algorithms and prose have no such shape."""
    if len(value) < min_length or any(c.isspace() for c in value):
        return False
    if _REFERENCE.search(value) or _QUOTED_REFERENCE.match(value):
        return False
    if "{" in value or _NUMBERISH.fullmatch(value) or _PLAIN_URL.fullmatch(value) or _FILE_PATH.fullmatch(value):
        return False
    has_digit = any(c.isdigit() for c in value)
    has_letter = any(c.isalpha() for c in value)
    mixed_case = any(c.islower() for c in value) and any(c.isupper() for c in value)
    return (has_digit and has_letter) or (len(value) >= 20 and mixed_case)


_MIN_GENERATED = {"suffix": 8, "inner": 16}


def _assignment_accepts(strong: Callable[[str], bool]) -> Callable[[str, re.Match[str]], bool]:
    """The value check for one assignment form: ``strong`` for strong names, a generated shape otherwise."""

    def accept(value: str, match: re.Match[str]) -> bool:
        strength = _name_strength(match.group("key"))
        if strength is None:
            return False
        return strong(value) if strength == "strong" else _generated_value(value, _MIN_GENERATED[strength])

    return accept


def _rule(kind: str | Callable[[re.Match[str]], str], pattern: str,
          accept: Callable[[str, re.Match[str]], bool] | None = None,
          guard: re.Pattern[str] | None = None) -> _Rule:
    compiled = re.compile(pattern)
    return _Rule(kind, compiled, accept, guard) if accept else _Rule(kind, compiled, guard=guard)


# The assignment rules try a name at every identifier start, which costs ~0.2 s per MB each; they only run on
# the lines this guard finds (a secret word in a name right before ":" or "=") in the lower-cased text. The
# possessive "{0,128}+" never gives characters back: a name cannot end inside a run of name characters, and
# backtracking through each run made long runs of "pass_pass_…" ten times slower.
_ASSIGNMENT_GUARD = re.compile(rf"""{_SECRET_STEM}[a-z0-9_.-]{{0,128}}+["']?[ \t]*[:=]""")


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
        _assignment_accepts(_quoted_value),
        _ASSIGNMENT_GUARD,
    ),
    _rule(_assignment_kind, rf"""(?i:{_KEY})[ \t]*=(?!=)[ \t]*(?P<secret>[^\s"',;&]+)""",
          _assignment_accepts(_plain_value), _ASSIGNMENT_GUARD),
    _rule(_assignment_kind, rf"""(?i:{_KEY})[ \t]*:[ \t]*(?P<secret>[^\s"',;&]+)""",
          _assignment_accepts(_colon_value), _ASSIGNMENT_GUARD),
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
    pos = 0
    # The next search starts after the line just taken: every scan (and the rfind back to the line start) covers
    # new text only, so a long line with many hits costs one pass, not one pass back per hit.
    while (match := rule.guard.search(lowered, pos)) is not None:
        start = text.rfind("\n", pos, match.start()) + 1
        end = text.find("\n", match.end())
        end = len(text) if end == -1 else end
        spans.append((start, end))
        pos = end
    return spans


def _redact(match: re.Match[str], rule: _Rule, counts: dict[str, int]) -> str:
    group = "secret" if "secret" in match.re.groupindex else 0
    value = match.group(group)
    if value.startswith(PLACEHOLDER_PREFIX) or not rule.accept(value, match):
        return match.group(0)
    kind = rule.kind_of(match)
    counts[kind] = counts.get(kind, 0) + 1
    start, end = match.span(group)
    whole = match.group(0)
    offset = match.start()
    return whole[: start - offset] + f"{PLACEHOLDER_PREFIX}{kind.upper()}]" + whole[end - offset :]


__all__ = ["ScrubReport", "scrub"]
