"""Secret scrubbing for everything we send to a provider (the question, context files, stdin).

Three kinds of rules run in order, specific before generic, so a secret is counted once under its most precise
type: an ``OPENAI_API_KEY=sk-...`` line is one ``openai_key``, not also an ``api_key`` assignment.

1. The provider keys conclave itself holds (their values, whatever their shape): ``known_secrets``.
2. Private key blocks (PEM, PGP, PuTTY), found without regex backtracking, terminated or not.
3. Token formats, kept as data in ``scrub_rules.toml`` (prefixes such as ``glrt-``, ``hf_``, ``SG.``, ``hvs.``).
4. Credentials by their syntax: URL user info, Go DSNs, ``Authorization`` headers, ``.netrc``, Docker
   ``config.json`` auths, ``.pgpass`` lines, passwords on ``curl -u``/``mysql -p``/``sshpass -p`` command lines,
   and ``NAME=value`` assignments whose name bears a secret.

Each secret becomes ``[REDACTED_<TYPE>]``; spans already redacted are left as they are, so scrubbing twice changes
nothing. The report carries counts only, never a value.

Every rule is linear in the length of the text: a regex starts at a literal (or at the start of a run of the
characters it repeats) and each repetition is bounded or cannot contain another start, so no attempt rescans what
an earlier one scanned; ``tests/test_scrub.py`` checks this by scaling and ``bench/scrub.py`` measures it.

How the work is kept small (see :func:`scrub`): one RE2 pass per 16 kB chunk finds which rule keywords each chunk
holds, and a rule scans only its chunks (a token rule only its keywords' lines; a name written in any case is
matched as a literal in the lower-cased text). The assignment and ``.pgpass`` rules run only on lines an RE2 guard
finds. Matches found a few at a time become edits applied once at the end; a window with many matches is
rewritten in one ``re.split``/``join`` pass with the checks run once per distinct value, so text dense with
secrets costs no Python call per match. There, each string the regex engine hands back costs about as much as
matching, so a rewrite takes out as few per match as it can: none for a rule whose regex refuses look-alikes
itself (token formats, URL and DSN passwords: ``re.subn`` with the placeholder), only the whole match when the
matches repeat (each distinct one is parsed and checked once), the value and what varies around it otherwise.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from conclave.scrub_public import PublicRule, public_rules
from conclave.yamlload import load_packaged_toml, parse_toml

try:  # RE2 finds which of the rules' keywords occur in one linear pass; without it, one search per keyword
    import re2
except ImportError:  # pragma: no cover - google-re2 is a dependency; this keeps scrubbing working without it
    re2 = None

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


#: a keyword's span runs from the start of its line to the end of the line this far after it (multi-line
#: forms such as .netrc entries and PuTTY keys follow their keyword); spans closer than this merge into one
_KEYWORD_REACH = 4096

#: what a rule's checks receive: the values of its ``check_groups`` in the original text (None: did not take part)
Values = tuple[str | None, ...]


@dataclass(frozen=True, eq=False)
class _Rule:
    """One secret pattern. The named group ``secret`` (or, for the assignment rule, ``plain``/``colon``; without
    any, the whole match) is what gets replaced.

    ``accept(values)`` can still refuse a match (a reference, prose, a setting about secrets); ``values`` holds the
    groups named in ``check_groups``, taken from the original text.
    """

    kind: str | Callable[[Values], str]
    #: the regex, compiled at its first use (:attr:`pattern`): most rules never run on a given text, and
    #: compiling all of them would cost every consultation ~30 ms before its first request
    source: str
    accept: Callable[[Values], bool] | None = None
    check_groups: tuple[str, ...] = ("secret",)
    #: lower-case strings one of which every match contains: without any of them in the text the rule is skipped
    keywords: tuple[str, ...] = ()
    #: the pattern is written for the lower-cased text (literals in lower case), where a case-insensitive
    #: name starts with a literal the regex engine finds by fast search; values still come from the original
    lowered: bool = False
    #: where the rule runs: "text" (where its keywords are: the pattern starts with a literal, found by fast
    #: search; everywhere without keywords), "keywords" (lines around its keywords and the next few kB), "lines"
    #: (only its keywords' lines: a single-line token), "guard" (lines where ``finder``, an RE2 pattern over the
    #: lower-cased ASCII text, matches), "command" (from each match of ``finder`` in the lower-cased text to its
    #: line's end)
    where: str = "text"
    finder: Any = None
    #: how far after its keyword a match can end (a multi-line form); single-line rules end on the keyword's line
    reach: int = _KEYWORD_REACH

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.source)

    @functools.cached_property
    def value_groups(self) -> tuple[str, ...]:
        """The groups that hold the value to redact, in the order tried; none = the whole match."""
        return tuple(name for name in _VALUE_GROUPS if name in self.pattern.groupindex)

    @functools.cached_property
    def literal_start(self) -> bool:
        """The pattern begins with a literal character, which the regex engine finds by fast search."""
        return _LITERAL_START.match(self.source) is not None

    @functools.cached_property
    def match_groups(self) -> tuple[str | int, ...]:
        """``check_groups`` as groups of :attr:`pattern` (0, the whole match, for a ``secret`` it does not name)."""
        return tuple(name if name in self.pattern.groupindex else 0 for name in self.check_groups)

    @functools.cached_property
    def pure(self) -> bool:
        """Every match is redacted alike, unless its value holds an earlier redaction: the regex itself refuses
        what is not a secret, so text without placeholders can be rewritten without looking at the values."""
        return self.accept is None and isinstance(self.kind, str)

    @functools.cached_property
    def unbroken(self) -> bool:
        """No match can hold a blank or read further than the character next to it (see :func:`_unbroken_runs`)."""
        return (_READS_BLANKS.search(self.source) is None
                and not any(blank in keyword for keyword in self.keywords for blank in _BLANKS))

    @functools.cached_property
    def split_form(self) -> _SplitForm:
        return _SplitForm.of(self.pattern)

    def verdict(self, values: Values) -> str | None:
        """The placeholder for a match whose checked groups are ``values``, or None to leave it."""
        value = next((v for v, name in zip(values, self.check_groups, strict=True)
                      if v is not None and name in _VALUE_GROUPS), None)
        if value is None or PLACEHOLDER_PREFIX in value:
            return None
        if self.accept is not None and not self.accept(values):
            return None
        return _placeholder(self.kind if isinstance(self.kind, str) else self.kind(values))


# Values that name a secret rather than contain one: code and config references (also inside a call, "self.x)"),
# booleans, empty defaults, ellipses ("sk-..."), a capitalised placeholder word ("PASSWORD").
# Each is one anchored attempt or a substring test, so checking a value is linear in its length (a single search
# for all of them would try every alternative at every position of a long value).
_REFERENCE_START = re.compile(
    r"""(?:\$|\{\{|<|%\(|\*{3,}$|x{4,}$|(?i:true|false|null|none|nil|undefined|yes|no|required|optional)$)"""
    r"""|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+[)\]}]*$|(?:PASSWORD|PASSWD|PASS|PWD|PW|SECRET|TOKEN|API_KEY)$"""
)


def _is_reference(value: str) -> bool:
    return ("(" in value or "[" in value or "..." in value or "…" in value
            or _REFERENCE_START.match(value) is not None)


def _plain_value(value: str) -> bool:
    """An unquoted assignment value that is plausibly a literal secret."""
    return len(value) >= 4 and not _is_reference(value)


_SECRET_CHAR = re.compile(r"[\d!@#$%^&*+=/_~-]")


def _colon_value(value: str) -> bool:
    """``key: value`` is also how prose introduces things ("Password: must be long"): ask for a secret's shape."""
    return _plain_value(value) and (_SECRET_CHAR.search(value) is not None or len(value) >= 16)


# A quoted literal is a secret unless it is a template slot or a mask ("${DB_PASSWORD}", "<token>", "****",
# "sk-xxxx": a vendor's prefix and a mask, as documentation writes a key).
_QUOTED_REFERENCE = re.compile(r"^(?:\$\{.*\}|\{\{.*\}\}|<[^>]*>|\*+|x{4,}|(?:[a-z0-9]{1,10}[_-]){1,3}x{4,})$",
                               re.IGNORECASE)


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


@functools.lru_cache(maxsize=4096)
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


def _assignment_kind(values: Values) -> str:
    return _kind_of_name(values[0] or "")


@functools.lru_cache(maxsize=4096)
def _kind_of_name(key: str) -> str:
    parts = _name_parts(key)
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
_SEPARATORS = re.compile(r"[:./_-]+")


def _identifier_path(value: str) -> bool:
    """Words and numbers joined by separators (``user:123:profile``, ``orders/2024/summary``): a cache or sort
    key, a path or a name. A generated secret mixes letters and digits inside its parts."""
    if len(value) > 256:  # keys and paths are short; checking a huge value part by part would cost a pass per part
        return False
    parts = [part for part in _SEPARATORS.split(value) if part]
    return len(parts) >= 2 and all(part.isalpha() or part.isdigit() for part in parts)


def _generated_value(value: str, min_length: int) -> bool:
    """A value shaped like a generated secret: long enough, no spaces, letters with digits (or long and mixed-case),
    and not a reference, template, number, plain URL or file path. Names, algorithms and prose have no such shape."""
    if len(value) < min_length or _SPACE.search(value):
        return False
    if _is_reference(value) or _QUOTED_REFERENCE.match(value):
        return False
    if "{" in value or _NUMBERISH.fullmatch(value) or _PLAIN_URL.fullmatch(value) or _FILE_PATH.fullmatch(value):
        return False
    if _identifier_path(value):
        return False
    has_digit = _ANY_DIGIT.search(value) is not None
    has_letter = _ANY_LETTER.search(value) is not None
    if has_digit and has_letter:
        return True
    return len(value) >= 20 and _ANY_LOWER.search(value) is not None and _ANY_UPPER.search(value) is not None


_SPACE, _ANY_DIGIT, _ANY_LETTER = re.compile(r"\s"), re.compile(r"\d"), re.compile(r"[^\W\d_]")
_ANY_LOWER, _ANY_UPPER = re.compile(r"[^\W\d_A-Z]"), re.compile(r"[A-Z]")


_MIN_GENERATED = {"suffix": 8, "inner": 16}


def _assignment_accepts(values: Values) -> bool:
    """The value check for the assignment's form (quoted, ``=`` or ``:``) for strong names, a generated shape
    otherwise. ``values``: key, quoted value, ``=`` value, ``:`` value (one of the three is set)."""
    key, quoted, plain, colon = values
    strength = _name_strength(key or "")
    value = quoted if quoted is not None else plain if plain is not None else colon or ""
    if strength is None:
        return False
    if strength != "strong":
        return _generated_value(value, _MIN_GENERATED[strength])
    if plain is not None:
        return _plain_value(value)
    if colon is not None:
        return _colon_value(value)
    return _quoted_value(value)


# A pattern that begins with a literal character (not a class, group, anchor or escape sequence such as \b).
_LITERAL_START = re.compile(r"""[A-Za-z0-9_"'@:/~-]|\\[.\[\]()"]""")


def _rule(kind: str | Callable[[Values], str], pattern: str, accept: Callable[[Values], bool] | None = None, *,
          keywords: Iterable[str] = (), check_groups: tuple[str, ...] = ("secret",), lowered: bool = False,
          where: str | None = None, finder: Any = None, reach: int = _KEYWORD_REACH) -> _Rule:
    """A rule; where it runs defaults to everywhere for a pattern that starts with a literal, else around its
    keywords."""
    if where is None:
        where = "text" if _LITERAL_START.match(pattern) else "keywords"
    return _Rule(kind, pattern, accept, check_groups, tuple(keywords), lowered, where, finder, reach)


# --------------------------------------------------------------------------------------- token formats (data)

_DIGIT, _UPPER, _LOWER = re.compile(r"\d"), re.compile(r"[A-Z]"), re.compile(r"[a-z]")
_REQUIRE: dict[str, Callable[[str], bool]] = {
    "digit": lambda v: _DIGIT.search(v) is not None,
    "mixed": lambda v: all(p.search(v) is not None for p in (_DIGIT, _UPPER, _LOWER)),
}


def _requiring(checks: list[str]) -> Callable[[Values], bool] | None:
    if not checks:
        return None
    tests = [_REQUIRE[name] for name in checks]
    return lambda values: all(test(values[0] or "") for test in tests)


def load_token_rules(text: str | None = None) -> tuple[_Rule, ...]:
    """The token-format rules of ``scrub_rules.toml`` (or of ``text`` in that format), in file order."""
    if text is None:  # the packaged file, parsed once per version of it
        specs = load_packaged_toml(resources.files("conclave").joinpath("scrub_rules.toml"))["rules"]
    else:
        specs = parse_toml(text)["rules"]
    rules = []
    for spec in specs:
        unknown = set(spec.get("require", ())) - set(_REQUIRE)
        if unknown:
            raise ValueError(f"scrub rule {spec['id']}: unknown require {sorted(unknown)}")
        # a token never spans lines (no rule pattern matches a line break): each runs on its keywords' lines,
        # or on the lines its guard finds
        guard = spec.get("guard")
        rules.append(_rule(spec["kind"], spec["regex"], _requiring(list(spec.get("require", ()))),
                           keywords=spec.get("keywords", ()), lowered=bool(spec.get("lowered", False)),
                           where="lines" if guard is None else "guard",
                           finder=None if guard is None else guard.encode()))
    return tuple(rules)


# ------------------------------------------------------------------------------------ credentials by syntax

# A password in a URL or DSN, not a template slot (``${DB_PASSWORD}``, ``%s``, ``{{ pw }}``, ``<pw>``), a mask
# (``****``, ``xxxx``) or a word in capitals standing for it in documentation (``user:PASSWORD@host``). Written
# as a lookahead at the value's start (the value always runs up to the "@" that ends it), so the regex engine
# refuses these itself: a line dense with DSNs is rewritten without a Python call per match.
_URL_PASSWORD_CHECK = r"(?![$%{<]|(?=[*xXPSTA])(?:\*+|[xX]{4,}|PASSWORD|PASSWD|PASS|PWD|PW|SECRET|TOKEN|API_KEY)@)"


def _docker_auth(values: Values) -> bool:
    """base64 of ``user:password`` (at least 8 characters), not a word such as ``"auth": "required"``."""
    value = values[0] or ""
    return len(value) >= 8 and not value.isalpha()


# What each check refuses, as parts of one regex on an ASCII value after a line break (values never hold one),
# each with the text that must occur in the joined values for the part to be able to match (None: always
# tried): a part whose text occurs nowhere is left out of the pass. Together they say what _VALUE_CHECKS say.
_Part = tuple[str | None, str]
_PLACEHOLDER_PART: _Part = ("[", r"(?:[^\n\[]++|\[(?!REDACTED_))*+\[REDACTED_")
_REFERENCE_PARTS: tuple[_Part, ...] = (  # _is_reference
    ("(", r"[^\n(]*+\("), ("[", r"[^\n\[]*+\["), ("…", r"[^\n…]*+…"), (".", r"(?:[^\n.]++|\.(?!\.\.))*+\.\.\."),
    ("$", r"\$"), ("{", r"\{\{"), ("<", "<"), ("%", r"%\("), ("*", r"\*{3,}+$"), ("xxxx", r"x{4,}+$"),
    (".", r"[A-Za-z_]\w*+(?:\.[A-Za-z_]\w*+)++[)\]}]*+$"),
    # the words, after one test of the first character that fails for most values
    (None, r"(?=[tfnuyroTFNUYROPSA])(?:(?i:true|false|null|none|nil|undefined|yes|no|required|optional)"
           r"|PASSWORD|PASSWD|PASS|PWD|PW|SECRET|TOKEN|API_KEY)$"),
)
_QUOTED_REFERENCE_PARTS: tuple[_Part, ...] = (  # _QUOTED_REFERENCE
    ("$", r"\$\{[^\n]*\}$"), ("{", r"\{\{[^\n]*\}\}$"), ("<", r"<[^>\n]*+>$"), ("*", r"\*++$"),
    (None, r"(?=[xX])(?i:x{4,}+)$"), (None, r"(?:[A-Za-z0-9]{1,10}+[_-]){1,3}+(?i:x{4,}+)$"),
)


@dataclass(frozen=True)
class _Refuses:
    """A check written as one regex: a value is refused where ``pattern`` (multi-line) matches at its start.

    The same regex, run once over many distinct values joined by line breaks, checks them all in one pass of the
    regex engine (:func:`_verdicts`): text dense with secrets that all differ (a dump of credentials) then costs
    no Python call per value."""

    source: str
    #: the same check as parts with the text each needs (see _REFUSAL_PARTS): for checking many values at once
    parts: tuple[_Part, ...] = ()

    def refused(self, lines: str) -> list[str]:
        """The refused values in ``lines`` (values, each after a line break): by the parts whose text occurs."""
        if not self.parts:
            return self.lines.findall(lines)
        included = tuple(needle is None or needle in lines for needle, _ in self.parts)
        return _refusal_of(self.parts, included).findall(lines)

    @functools.cached_property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(self.source, re.MULTILINE)

    def __call__(self, values: Values) -> bool:
        return self.pattern.match(values[0] or "") is None

    @functools.cached_property
    def lines(self) -> re.Pattern[str]:
        """Each refused line whole (group 1), in text of values each after a line break. The line break, a literal,
        is what the regex engine searches for: a pattern starting with "^" would be tried at every position."""
        return re.compile(rf"\n((?:{self.source})[^\n]*)", re.MULTILINE)


# What _plain_value refuses, as a regex on one value (which never holds a line break): shorter than 4, a call, an
# index or an ellipsis anywhere, or a reference at its start (_REFERENCE_START, whose "$" ends the value).
_NOT_PLAIN = rf"[^\n]{{0,3}}$|[^\n]*?[(\[…]|[^\n]*?\.\.\.|{_REFERENCE_START.pattern}"
_NOT_PLAIN_PARTS: tuple[_Part, ...] = ((None, r"(?![^\n]{4})"), *_REFERENCE_PARTS)
# A password given to a command-line flag: a literal, not the next flag.
_flag_password = _Refuses(rf"-|{_NOT_PLAIN}", (("-", "-"), *_NOT_PLAIN_PARTS))
# curl -u user:PW (or wget, httpie): a literal, not a number (docker run -u 1000:1000).
_user_password = _Refuses(rf"\d+$|{_NOT_PLAIN}", ((None, r"\d++$"), *_NOT_PLAIN_PARTS))


def _command(*words: tuple[str, str]) -> tuple[re.Pattern[str], ...]:
    """Command words as whole words in the lower-cased text (a flag after one on its line belongs to it), each
    given as (literal start, rest of the name as a regex): the regex engine finds the literal by fast search."""
    return tuple(re.compile(rf"{start}(?<=\b{start}){rest}\b") for start, rest in words)


_STRUCTURAL: tuple[_Rule, ...] = (
    # PuTTY .ppk: the lines after "Private-Lines: N" are the private key (encrypted or not).
    _rule("private_key",
          r"Private-Lines:[ \t]*\d{1,3}[ \t]*\r?\n"
          r"(?P<secret>[A-Za-z0-9+/=]{1,128}+(?=[ \t]*(?:\r?\n|$))"
          r"(?:[ \t]*\r?\n[A-Za-z0-9+/=]{1,128}+(?=[ \t]*(?:\r?\n|$))){0,255})",
          keywords=("private-lines:",), reach=256 * 132),
    # Mistral keys have no prefix: only the variable they are assigned to gives them away.
    _rule("mistral_key",
          r"""MISTRAL_API_KEY(?<=\bMISTRAL_API_KEY)["']?[ \t]*[:=][ \t]*["']?(?P<secret>[A-Za-z0-9]{20,})""",
          keywords=("mistral_api_key",)),
    # scheme://user:PASSWORD@host keeps the user (useful context) and drops the password; the user may be empty
    # (redis://:PASSWORD@host).
    _rule("url_password", rf"://[^\s:/@]{{0,256}}+:(?P<secret>{_URL_PASSWORD_CHECK}[^\s@/]{{1,512}}+)@",
          keywords=("://",)),
    # Go's database/sql DSN: user:PASSWORD@tcp(host:3306)/db (also unix(...)).
    # The match is ":" and the password (user and address are lookarounds), so a line dense with DSNs is
    # rewritten by the regex engine in one pass.
    _rule("url_password",
          rf":(?<=[A-Za-z0-9_.-]:)(?P<secret>{_URL_PASSWORD_CHECK}[^\s:@/()'\"]{{1,256}}+)(?=@(?:tcp|tcp6|unix|udp)\()",
          keywords=("@tcp(", "@tcp6(", "@unix(", "@udp(")),
    # Authorization headers, matched in the lower-cased text where the header name is a literal.
    _rule("basic_auth",
          r"authorization(?<=\bauthorization)[\"']?[ \t]*[:=][ \t]*[\"']?basic[ \t]+"
          r"(?P<secret>[A-Za-z0-9+/_-]{4,}+={0,2})(?!:)",
          keywords=("authorization",), lowered=True),
    _rule("bearer_token", r"earer(?<=\b[Bb]earer)\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)", keywords=("bearer",)),
    _rule("token", r"authorization(?<=\bauthorization)[\"']?[ \t]*[:=][ \t]*[\"']?token[ \t]+"
                   r"(?P<secret>[A-Za-z0-9._~+/-]{8,}=*)",
          keywords=("authorization",), lowered=True),
    # .netrc: machine HOST [login USER] [account A] password PW (on one line or several); "default" too.
    _rule("password",
          r"(?:machine(?<=\bmachine)[ \t]+[^\s]{1,256}|default(?<=\bdefault))"
          r"(?:\s{1,64}(?:login|account)[ \t]+[^\s]{1,256}){0,2}\s{1,64}password[ \t]+(?P<secret>[^\s]{1,256})",
          _Refuses(_NOT_PLAIN), keywords=("machine", "default")),
    # Docker config.json: {"auths": {"registry": {"auth": "base64(user:password)"}}}
    _rule("docker_auth", r"\"auth\"[ \t]*:[ \t]*\"(?P<secret>[A-Za-z0-9+/]{4,}={0,2})\"", _docker_auth,
          keywords=('"auth"',)),
    # .pgpass: host:port:database:user:PASSWORD
    _rule("password",
          r"(?m)^[A-Za-z0-9.*_-]{1,253}:(?:\d{1,5}|\*):[^:\s]{1,64}:[^:\s]{1,64}:(?P<secret>[^\s]{1,256})$",
          where="guard", finder=rb":(?:\d{1,5}|\*):[^:\s]{1,64}:[^:\s]{1,64}:[^\s]"),
    # Command lines. A flag's password counts only after its command on the same line: curl -u user:PASSWORD
    # (wget, httpie), sshpass -p PASSWORD (or -pPASSWORD), mysql -pPASSWORD (for mysql a space makes the next
    # word the database), redis-cli -a PASSWORD; --password PASSWORD after any command.
    _rule("password", r"""-(?<=\s-)(?:u|-user)(?:[ \t]++|=)?+["']?+[^\s:"'`]{1,256}+:"""
          r"""(?P<secret>[^\s"'`]{1,256}+)""", _user_password, keywords=("curl", "wget", "http"), where="command",
          finder=_command(("curl", ""), ("wget", ""), ("http", "s?"))),
    _rule("password", r"""-(?<=\s-)p[ \t]*+["']?+(?P<secret>[^\s"'`]{1,256}+)""", _flag_password,
          keywords=("sshpass",), where="command", finder=_command(("sshpass", ""))),
    _rule("password", r"""-(?<=\s-)p["']?+(?P<secret>[^\s"'`]{1,256}+)""", _flag_password,
          keywords=("mysql", "mariadb"), where="command",
          finder=_command(("m", "(?:ysql(?:dump|admin|import|sh)?|ariadb(?:-dump)?)"))),
    _rule("password", r"""-(?<=\s-)a[ \t]*+["']?+(?P<secret>[^\s"'`]{1,256}+)""", _flag_password,
          keywords=("redis-cli",), where="command", finder=_command(("redis-cli", ""))),
    _rule("password", r"""--password(?<=\s--password)[ \t]++["']?+(?P<secret>[^\s"'`]{1,256}+)""",
          _flag_password, keywords=("--password",)),
    # --token VALUE / --auth-token=VALUE after any command (kubeadm join, sentry-cli, CLI logins)
    _rule("token", r"""--(?<=\s--)(?:auth-)?token(?:[ \t]++|=)["']?+(?P<secret>[^\s"'`]{1,256}+)""",
          _flag_password, keywords=("--token", "--auth-token")),
)

# ------------------------------------------------------------------------------------- named assignments

# One regex, matched in the lower-cased text, for the three forms, tried in this order at each name: a quoted
# value after ":" or "=" (group "secret"), an unquoted value after "=" ("plain"), an unquoted value after ":"
# ("colon"). The lookaheads refuse, inside the regex engine, values that _plain_value and _colon_value would
# refuse for their length or shape: on text dense with names and no values that saves a Python call per name.
# It runs only on the lines where its finder (RE2, linear, never rescanning a long name) finds a secret word
# in a name followed by a separator and the start of a value this regex could accept.
_SECRET_VALUE_CHAR = r"[\d!@#$%^&*+=/_~-]"
_ASSIGNMENTS: tuple[_Rule, ...] = (
    _rule(
        _assignment_kind,
        rf"""{_KEY}[ \t]*(?:[:=][ \t]*(?P<oq>["'])(?P<secret>(?:(?!(?P=oq))[^\\\n]|\\.)*)(?P=oq)"""
        rf"""|=(?!=)[ \t]*(?=[^\s"'`,;&]{{4}})(?P<plain>[^\s"'`,;&]+)"""
        rf"""|:[ \t]*(?=[^\s"'`,;&]{{4}})(?=[^\s"'`,;&]{{16}}|[^\s"'`,;&]{{0,15}}?{_SECRET_VALUE_CHAR})"""
        r"""(?P<colon>[^\s"'`,;&]+))""",
        _assignment_accepts,
        keywords=("pass", "secret", "token", "key", "cred", "private"),
        check_groups=("key", "secret", "plain", "colon"),
        lowered=True,
        where="guard",
        # V: a value character; S: a secret-shaped one ("?" stands for any non-ASCII character in the ASCII text
        # the guard reads, so a digit from another script still counts)
        finder=(rb"""(?:pass|secret|token|key|cred|private)[a-z0-9_.\-]*["']?[ \t]*"""
                rb"""(?:[:=][ \t]*["']|=[ \t]*[^\s"'`,;&]{4}"""
                rb"""|:[ \t]*(?:[^\s"'`,;&]{16}|[^\s"'`,;&]{3,15}[0-9!@#$%^&*+=/_~?\-]"""
                rb"""|[^\s"'`,;&]{0,2}[0-9!@#$%^&*+=/_~?\-][^\s"'`,;&]))"""),
    ),
)

_TOKEN_RULES = load_token_rules()
_RULES: tuple[_Rule, ...] = (*_TOKEN_RULES, *_STRUCTURAL, *_ASSIGNMENTS)


#: public rules for what conclave finds itself: private key blocks (with or without their END line; a run of
#: BEGIN lines quoted in documentation is not a key); JWTs, Vault and Twilio tokens, whose public keywords of two
#: characters ("ey", "s.", "sk") are on most lines of prose; and credentials by their syntax (curl's -u and -H
#: and the generic rule's names: conclave's own rules know the same, refuse more look-alikes and rewrite a dump
#: of them in one pass)
_OWN_PUBLIC = frozenset({"private-key", "jwt", "vault-service-token", "twilio-api-key", "curl-auth-user",
                         "curl-auth-header", "generic-api-key"})


@functools.cache
def _pipeline() -> tuple[_Rule | PublicRule, ...]:
    """Every rule in the order it runs, specific before generic: conclave's token formats, credentials by
    syntax, the public set's formats (gitleaks' default rules, when installed: see :mod:`conclave.scrub_public`),
    named assignments, and last the public set's generic rules. A secret is counted once, under the first
    rule that finds it."""
    public = public_rules()
    rules = tuple(rule for rule in public.rules if rule.id not in _OWN_PUBLIC) if public is not None else ()
    return (*_TOKEN_RULES, *_STRUCTURAL, *(rule for rule in rules if not rule.generic), *_ASSIGNMENTS,
            *(rule for rule in rules if rule.generic))


# ------------------------------------------------------------------------------------------ private keys

# A BEGIN line followed by key material (after blank lines and "Proc-Type: ..." headers, with real or
# JSON-escaped line breaks): a BEGIN line alone, as in prose or in a run of such lines, is passed over inside the
# regex engine.
_PEM_BEGIN = re.compile(r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----"
                        r"(?=(?:[ \t\r\n]|\\[rn]|[A-Za-z-]{1,40}:[^\n\\]{0,256})*+[A-Za-z0-9+/=]{24})")
_PEM_END = re.compile(r"-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----")
#: a real key block is a few kB; an END further away than this does not close the block it follows
_PEM_MAX = 64 * 1024
#: an unterminated BEGIN line followed by less than this much key-like text is a mention, not a key
_PEM_MIN_BODY = 24
# An unterminated block: the lines after BEGIN that look like a key (base64, "Proc-Type: ..." headers, blank),
# separated by real or JSON-escaped newlines. Each repetition ends at a separator its characters cannot contain,
# and possessive quantifiers never give back, so this is one pass.
_PEM_BODY = re.compile(
    r"(?:[ \t]*+(?:[A-Za-z0-9+/=]{1,4096}+|[A-Za-z-]{1,40}+:[^\n\\]{0,256}+)?[ \t]*+(?:\r?\n|\\r\\n|\\n))*+"
    r"(?:[ \t]*+[A-Za-z0-9+/=]{1,4096}+(?=[\"']|$))?"
)


def _scrub_private_keys(text: str, counts: dict[str, int]) -> str:
    """Every ``-----BEGIN … PRIVATE KEY-----`` block, up to its END line or, without one, to the end of the lines
    that look like key material. Each BEGIN looks for its END only up to the next BEGIN, so the text is scanned
    a bounded number of times however many unterminated blocks it holds."""
    if "-----BEGIN " not in text:
        return text
    begins = [m.span() for m in _PEM_BEGIN.finditer(text)]
    if not begins:
        return text
    pieces, last = [], 0
    for i, (start, header_end) in enumerate(begins):
        if start < last:
            continue  # inside the block before
        limit = min(begins[i + 1][0] if i + 1 < len(begins) else len(text), start + _PEM_MAX)
        end_match = _PEM_END.search(text, header_end, limit)
        if end_match is not None:
            end = end_match.end()
        else:
            body = _PEM_BODY.match(text, header_end, limit)
            end = body.end() if body else header_end
            if end - header_end < _PEM_MIN_BODY:
                continue  # a BEGIN line quoted in prose or docs, with no key material after it
            end -= 1 if text[header_end:end].endswith("\n") else 0  # keep the line break after the block
        pieces += [text[last:start], f"{PLACEHOLDER_PREFIX}PRIVATE_KEY]"]
        counts["private_key"] = counts.get("private_key", 0) + 1
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


# --------------------------------------------------------------------------------------------- scrubbing

PROVIDER_KEY = "provider_key"


def scrub(text: str, known_secrets: Iterable[str] = ()) -> tuple[str, ScrubReport]:
    """``text`` with every recognised secret replaced by ``[REDACTED_<TYPE>]``, and the counts per type.

    ``known_secrets`` are values to redact wherever they appear, whatever their shape: the provider keys
    conclave holds (see :func:`conclave.store.redact.key_values`), reported as ``provider_key``.
    """
    counts: dict[str, int] = {}
    for secret in sorted(set(known_secrets), key=len, reverse=True):
        if secret and (n := text.count(secret)):
            text = text.replace(secret, f"{PLACEHOLDER_PREFIX}{PROVIDER_KEY.upper()}]")
            counts[PROVIDER_KEY] = counts.get(PROVIDER_KEY, 0) + n
    text = _scrub_private_keys(text, counts)
    # Whether a rule runs at all is decided on the text before any redaction (redacting can only remove a
    # keyword); where it runs is decided on the current text (the chunks holding its keywords, and its lines).
    view = _View(text)
    present = set().union(*(keywords for _, keywords in view.chunks()))
    for rule in _pipeline():
        if rule.keywords and present.isdisjoint(rule.keywords):
            continue
        if isinstance(rule, PublicRule):
            _apply_public(rule, view, counts)
        else:
            _apply(rule, view, counts)
    return view.materialized(), ScrubReport(counts)


class _KeywordIndex:
    """Which of a fixed set of lower-case keywords occur in a text."""

    def __init__(self, keywords: Iterable[str]) -> None:
        self.keywords = sorted(set(keywords))
        self.longest = max(map(len, self.keywords), default=1)
        self._set: Any = None
        if re2 is not None:
            self._set = re2.Set.SearchSet(re2.Options())
            for keyword in self.keywords:
                self._set.Add(re.escape(keyword))
            self._set.Compile()

    def present(self, lowered: str) -> set[str]:
        if self._set is None:
            return {keyword for keyword in self.keywords if keyword in lowered}
        return {self.keywords[i] for i in self._set.Match(lowered) or ()}


@functools.cache
def _keywords() -> _KeywordIndex:
    return _KeywordIndex(keyword for rule in _pipeline() for keyword in rule.keywords)


class _View:
    """The text being scrubbed, the redactions found so far, and its lower-cased forms.

    Redactions found by a few matches at a time are kept as edits (start, end, placeholder) against ``text``
    and applied once at the end (:meth:`materialized`), so a rule that finds a handful of secrets in a large text
    does not copy the text; a later match overlapping an edit is not a new secret (the span is redacted already).
    A rule with many matches rewrites the text in one pass instead (:meth:`replace`, after applying the edits).

    ``lowered`` lines up with ``text`` position by position ("İ", the one character whose lower case is two
    characters long, is lowered to "i"); ``ascii`` is ``lowered`` with every other non-ASCII character replaced
    by "?", one byte per character, for the RE2 guards. Both are computed when first needed after a change."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._lowered: str | None = None
        self._ascii: bytes | None = None
        self._raw_ascii: bytes | None = None
        self._chunks: list[tuple[int, set[str]]] | None = None
        self._keyword_chunks: dict[str, list[int]] | None = None
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.placeholders: list[str] = []

    def replace(self, text: str) -> None:
        if text is not self.text:
            self.text, self._lowered, self._ascii, self._raw_ascii, self._chunks = text, None, None, None, None
            self._keyword_chunks = None

    def chunks(self) -> list[tuple[int, set[str]]]:
        """(start, the keywords found from there to the chunk's end, or running past it) for each
        :data:`_CHUNK` characters of the text: where each rule's keywords are, to a chunk, from one pass of RE2."""
        if self._chunks is None:
            lowered, overlap = self.lowered, _keywords().longest - 1
            index = _keywords()
            self._chunks = [(lo, index.present(lowered[lo:lo + _CHUNK + overlap]))
                            for lo in range(0, len(lowered), _CHUNK)]
        return self._chunks

    def keyword_chunks(self) -> dict[str, list[int]]:
        """Each keyword found, with the starts of the chunks that hold it (see :meth:`chunks`), in order."""
        if self._keyword_chunks is None:
            index: dict[str, list[int]] = {}
            for lo, present in self.chunks():
                for keyword in present:
                    index.setdefault(keyword, []).append(lo)
            self._keyword_chunks = index
        return self._keyword_chunks

    def ranges(self, keywords: tuple[str, ...], reach: int) -> list[tuple[int, int]]:
        """The stretches of text where a match containing one of ``keywords`` can lie: the chunks holding one,
        widened to whole lines and ``reach`` characters further, overlapping ones merged."""
        text, wanted = self.text, set(keywords)
        spans: list[tuple[int, int]] = []
        # Every search starts where the one before stopped (a span ends at a line break or at the end): on a
        # text that is one long line, each chunk must not scan back to its start or on to its end again.
        newline = -2  # the first line break at or after the last position searched from (-1: none)
        for lo, present in self.chunks():
            if present.isdisjoint(wanted):
                continue
            hi = min(lo + _CHUNK, len(text))
            if spans and lo <= spans[-1][1]:
                start = spans.pop()[0]
            else:
                start = text.rfind("\n", spans[-1][1] if spans else 0, lo) + 1
            after = min(hi + reach, len(text))
            if newline != -1 and newline < after:
                newline = text.find("\n", after)
            spans.append((start, len(text) if newline == -1 else newline))
        return spans

    def claimed(self, start: int, end: int) -> bool:
        """``text[start:end]`` overlaps a redaction already recorded."""
        i = bisect.bisect_right(self.starts, start)
        return bool((i and self.ends[i - 1] > start) or (i < len(self.starts) and self.starts[i] < end))

    def claim(self, start: int, end: int, placeholder: str) -> bool:
        """Record a redaction of ``text[start:end]`` unless it overlaps one already recorded."""
        i = bisect.bisect_right(self.starts, start)
        if (i and self.ends[i - 1] > start) or (i < len(self.starts) and self.starts[i] < end):
            return False
        self.starts.insert(i, start)
        self.ends.insert(i, end)
        self.placeholders.insert(i, placeholder)
        return True

    def materialized(self) -> str:
        """The text with every recorded redaction applied (the view then holds that text and no edits)."""
        if self.starts:
            pieces, last = [], 0
            for start, end, placeholder in zip(self.starts, self.ends, self.placeholders, strict=True):
                pieces += [self.text[last:start], placeholder]
                last = end
            pieces.append(self.text[last:])
            self.replace("".join(pieces))
            self.starts, self.ends, self.placeholders = [], [], []
        return self.text

    @property
    def lowered(self) -> str:
        if self._lowered is None:
            lowered = self.text.replace("\u0130", "i").lower()
            if len(lowered) != len(self.text):  # another such character (a later Unicode): lower ASCII only
                lowered = self.text.translate(_ASCII_LOWER)
            self._lowered = lowered
        return self._lowered

    @property
    def ascii(self) -> bytes:
        if self._ascii is None:
            self._ascii = self.lowered.encode("ascii", "replace")
        return self._ascii

    @property
    def raw_ascii(self) -> bytes:
        """``text`` as ``ascii`` is ``lowered``: one byte per character, "?" for every non-ASCII one."""
        if self._raw_ascii is None:
            self._raw_ascii = self.text.encode("ascii", "replace")
        return self._raw_ascii


_ASCII_LOWER = {code: code + 32 for code in range(ord("A"), ord("Z") + 1)}

#: the text is indexed by chunks of this many characters: a rule runs only on the chunks holding its keywords
_CHUNK = 16 * 1024


def _windows(rule: _Rule, view: _View) -> list[tuple[int, int]]:
    """The (start, end) stretches of the current text the rule runs on, in order, disjoint."""
    text = view.text
    reach = 0 if rule.where == "lines" else rule.reach
    if rule.where in ("text", "lines") and rule.keywords and rule.literal_start:
        spans = view.ranges(rule.keywords, reach)  # the regex engine finds the literal by itself
        return _unbroken_runs(rule, view, spans) if rule.where == "lines" else spans
    if rule.where == "text" and not rule.keywords:
        return [(0, len(text))]
    if rule.where in ("text", "lines", "keywords"):  # a regex tried at every position: only near keywords
        spans = [span for lo, hi in view.ranges(rule.keywords, reach)
                 for span in _keyword_spans(text, view.lowered, rule.keywords, lo, hi, reach)]
        return _unbroken_runs(rule, view, spans) if rule.where == "lines" else spans
    if rule.where == "guard":  # a guard without letters reads the text as it is: no need to lower-case it first
        return _guarded_lines(_re2_finder(rule.finder), text,
                              view.ascii if _LETTER.search(_ESCAPE.sub(b"", rule.finder)) else view.raw_ascii,
                              _re2_runs(rule.finder))
    return _command_lines(rule.finder, text, view.lowered)


_LETTER, _ESCAPE = re.compile(rb"[A-Za-z]"), re.compile(rb"\\.")

#: a stretch longer than this (one long line: a minified file, a dump on one line) is searched by a token rule
#: only in the runs without blanks around its keywords (:func:`_unbroken_runs`)
_LONG_LINE = 4096
#: at most this many runs per stretch; beyond, the whole stretch
_MAX_RUNS = 256
_LOOK_BACK = 256
_BLANKS = " \t\r\f\v\n"
# what lets a regex match a blank or read the text's end (\s, \W, \D, escapes of blanks and code points,
# anchors, back references, negated sets, any character, a space, verbose mode): such a rule runs on whole lines
_READS_BLANKS = re.compile(r"\\[sSWDtrfvnxuUNZA0-9\\]|\[\^|\$| |(?<!\\)\.|\(\?[a-z]*x")


def _unbroken_runs(rule: _Rule, view: _View, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` with each long one narrowed to the runs of text without blanks around its keywords, for a rule
    whose matches hold no blank and look at most at the character next to them (a token): a match holds one of
    its keywords, so it lies in such a run, and the blank that ends the run reads to its lookarounds as the end
    of the window does. Each run is searched for once, forwards and back, so this is one pass over the stretch."""
    if not rule.unbroken:
        return spans
    narrowed: list[tuple[int, int]] = []
    chunks: dict[str, list[int]] = {}
    for lo, hi in spans:
        if hi - lo <= _LONG_LINE or view.text.find("\n", lo, hi) != -1:  # short, or lines the regex skips fast
            narrowed.append((lo, hi))
            continue
        if not chunks:  # where each keyword is, to a chunk: the search for it skips the other chunks
            chunks = {keyword: [start for start, present in view.chunks() if keyword in present]
                      for keyword in rule.keywords}
        runs = _runs_around(view.text, view.lowered, chunks, lo, hi)
        narrowed.extend([(lo, hi)] if runs is None else runs)
    return narrowed


def _next_blank(text: str, at: int, hi: int) -> int:
    """The first blank in ``text[at:hi]`` (``hi`` if none), looked for in windows growing fourfold: a blank that
    does not occur is not looked for to the end of a long line each time."""
    step = _LOOK_BACK
    while at < hi:
        stop = min(hi, at + step)
        found = [i for blank in _BLANKS if (i := text.find(blank, at, stop)) != -1]
        if found:
            return min(found)
        at, step = stop, step * 4
    return hi


def _find_in_chunks(lowered: str, keyword: str, chunks: list[int], pos: int, hi: int) -> int:
    """``lowered.find(keyword, pos, hi)``, searching only the chunks (their starts) that hold ``keyword``."""
    i = max(0, bisect.bisect_right(chunks, pos) - 1)
    while i < len(chunks) and chunks[i] < hi:
        start, end = max(pos, chunks[i]), min(hi, chunks[i] + _CHUNK + len(keyword) - 1)
        if start < end and (at := lowered.find(keyword, start, end)) != -1:
            return at
        i += 1
    return -1


def _runs_around(text: str, lowered: str, chunks: dict[str, list[int]], lo: int,
                 hi: int) -> list[tuple[int, int]] | None:
    """The runs without blanks in ``text[lo:hi]`` (which starts a line) that hold one of the keywords (``chunks``:
    where each one is); None when there are more than :data:`_MAX_RUNS`."""
    runs: list[tuple[int, int]] = []
    upcoming = {keyword: _find_in_chunks(lowered, keyword, starts, lo, hi) for keyword, starts in chunks.items()}
    pos = lo
    while True:
        for keyword, at in upcoming.items():
            if 0 <= at < pos:
                upcoming[keyword] = _find_in_chunks(lowered, keyword, chunks[keyword], pos, hi)
        found = [at for at in upcoming.values() if at >= 0]
        if not found:
            return runs
        at = min(found)
        # the last blank before the keyword: looked for close by first, so blanks that do not occur are not
        # each looked for all the way back
        near = max(pos, at - _LOOK_BACK)
        start = max(text.rfind(blank, near, at) for blank in _BLANKS) + 1
        if not start and near > pos:
            start = max(text.rfind(blank, pos, near) for blank in _BLANKS) + 1
        start = max(pos, start)
        end = _next_blank(text, at, hi)
        if runs and start <= runs[-1][1]:
            runs[-1] = (runs[-1][0], end)
        else:
            runs.append((start, end))
            if len(runs) > _MAX_RUNS:
                return None
        pos = end


@functools.cache
def _re2_finder(pattern: bytes) -> Any:
    if re2 is None:  # pragma: no cover - google-re2 is a dependency
        return re.compile(pattern)
    return re2.compile(pattern)


@functools.cache
def _re2_runs(pattern: bytes) -> Any:
    """A run of adjacent lines each holding a match of ``pattern`` (which never spans lines), from the first
    line's start to the last line's end (its line break excluded); None without RE2, whose automaton keeps
    this linear (a backtracking engine would retry each line's prefix)."""
    if re2 is None:  # pragma: no cover - google-re2 is a dependency
        return None
    line = rb"[^\n]*(?:" + pattern + rb")[^\n]*"
    return re2.compile(rb"(?m)^" + line + rb"(?:\n" + line + rb")*")


def _keyword_spans(text: str, lowered: str, keywords: tuple[str, ...], lo: int = 0, hi: int | None = None,
                   reach: int = _KEYWORD_REACH) -> list[tuple[int, int]]:
    """The (start, end) of the stretches of ``text[lo:hi]`` where one of ``keywords`` occurs in ``lowered``:
    from the start of a keyword's line to the end of the line ``reach`` characters after it.

    Each keyword is searched for once per position it can next occur at, and the search resumes past the span
    just taken, so this is one pass over the stretch per keyword, however many times the keywords occur."""
    hi = len(text) if hi is None else hi
    upcoming = {keyword: lowered.find(keyword, lo, hi) for keyword in keywords}
    spans: list[tuple[int, int]] = []
    pos = lo
    while True:
        for keyword, at in upcoming.items():
            if 0 <= at < pos:
                upcoming[keyword] = lowered.find(keyword, pos, hi)
        found = [at for at in upcoming.values() if at >= 0]
        if not found:
            return spans
        at = min(found)
        start = max(lo, text.rfind("\n", spans[-1][1] if spans else lo, at) + 1)  # never back past the last span
        end = text.find("\n", min(at + reach, hi), hi)
        end = hi if end == -1 else end
        if spans and start <= spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
        pos = end


def _guarded_lines(guard: Any, text: str, subject: bytes, runs: Any = None) -> list[tuple[int, int]]:
    """The (start, end) of the lines ``guard`` finds in ``subject`` (aligned with ``text``), adjacent lines
    merged. The next search starts after the line just taken: every scan (and the rfind back to the line start)
    covers new text only, so a long line with many hits costs one pass, not one pass back per hit.

    ``runs`` (RE2: :func:`_re2_runs`) finds a whole run of adjacent guarded lines in one search, so text where
    every line is guarded (a dump of credentials) costs one call, not one per line."""
    spans: list[tuple[int, int]] = []
    pos, adjacent = 0, 0
    # line by line (a guard with a literal is found fastest alone); a run at a time once the last few guarded
    # lines each followed the one before
    while (match := (runs if runs is not None and adjacent >= _ADJACENT else guard).search(subject, pos)) is not None:
        start = text.rfind("\n", pos, match.start()) + 1
        end = text.find("\n", match.end())
        end = len(text) if end == -1 else end
        if spans and start <= spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], end)
            adjacent = 0 if adjacent >= _ADJACENT else adjacent + 1
        else:
            spans.append((start, end))
            adjacent = 0
        pos = end
    return spans


#: after this many guarded lines each right after another, the rest are found a run at a time
_ADJACENT = 16


def _command_lines(commands: tuple[re.Pattern[str], ...], text: str, lowered: str) -> list[tuple[int, int]]:
    """From the first occurrence of one of ``commands`` on a line to the line's end. A line whose command starts
    it continues the span before (a script of such lines is one span, not one per line)."""
    spans: list[tuple[int, int]] = []
    for command in commands:
        pos = 0
        while (match := command.search(lowered, pos)) is not None:
            end = text.find("\n", match.end())
            end = len(text) if end == -1 else end
            spans.append((match.start(), end))
            pos = end
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _keyword_lines(view: _View, keywords: tuple[str, ...]) -> list[tuple[int, int]]:
    """The (start, end) of the lines holding one of ``keywords``, lines closer than :data:`_NEAR` merged with
    what lies between (the regex engine reads a few hundred characters faster than Python makes another call;
    gitleaks itself runs a rule over the whole file its keywords are in). Each keyword is looked for only in
    the chunks that hold it, and from the end of the last line found for it: one pass per keyword."""
    text, lowered, n = view.text, view.lowered, len(view.text)
    lines: list[tuple[int, int]] = []
    chunks = view.keyword_chunks()
    for keyword in keywords:
        resume = 0
        for lo in chunks.get(keyword, ()):
            pos = max(lo, resume)
            stop = min(lo + _CHUNK + len(keyword) - 1, n)
            while pos < stop and (at := lowered.find(keyword, pos, stop)) != -1:
                end = text.find("\n", at)
                end = n if end == -1 else end
                lines.append((max(text.rfind("\n", resume, at) + 1, resume), end))  # its line's start
                pos = resume = end + 1
    lines.sort()
    merged: list[tuple[int, int]] = []
    for start, end in lines:
        if merged and start <= merged[-1][1] + _NEAR:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


#: keyword lines this close (in characters) are searched as one stretch
_NEAR = 1024


def _apply_public(rule: PublicRule, view: _View, counts: dict[str, int]) -> None:
    """Record the public rule's accepted secrets on the lines holding its keywords as edits. Its regex runs with
    RE2 over the ASCII bytes of each stretch of such lines (one pass each, linear whatever the regex)."""
    public = public_rules()
    pattern = rule.compiled
    if public is None or pattern is None:
        return
    text, subject = view.text, view.raw_ascii
    spans = _keyword_lines(view, rule.keywords) if rule.keywords else [(0, len(text))]
    placeholder = _placeholder(rule.kind)
    for lo, hi in spans:
        bounds = _LineBounds(text, lo, hi)
        for match in pattern.finditer(subject[lo:hi]):
            found = rule.secret_span(match)
            if found is None:
                continue
            start, end = lo + found[0], lo + found[1]
            # a span an earlier rule redacted is not a new secret: looked at first, it costs no checks
            if view.claimed(start, end) or _in_placeholder(text, start, end):
                continue
            if not rule.accepts(text[start:end], text[lo + match.start():lo + match.end()],
                                functools.partial(bounds.line, start), public.allowlists):
                continue
            view.claim(start, end, placeholder)
            counts[rule.kind] = counts.get(rule.kind, 0) + 1


def _in_placeholder(text: str, start: int, end: int) -> bool:
    """``text[start:end]`` overlaps a ``[REDACTED_…]`` placeholder already in the text."""
    at = text.rfind(PLACEHOLDER_PREFIX, max(0, start - _LONGEST_PLACEHOLDER), end)
    return at != -1 and text.find("]", at) >= start


#: longer than any placeholder (a rule id of the public set is at most ~50 characters)
_LONGEST_PLACEHOLDER = 96


class _LineBounds:
    """The line around a position of ``text[lo:hi]`` (a stretch of whole lines), the last one remembered: the
    matches on one long line look it up once."""

    def __init__(self, text: str, lo: int, hi: int) -> None:
        self.text, self.lo, self.hi = text, lo, hi
        self.start, self.end = -1, -1

    def line(self, at: int) -> str:
        if not self.start <= at <= self.end:
            self.start = self.text.rfind("\n", self.lo, at) + 1 or self.lo
            end = self.text.find("\n", at, self.hi)
            self.end = self.hi if end == -1 else end
        return self.text[self.start:self.end]


#: a window with more matches than this is rewritten in one pass (:func:`_rewrite`) rather than edited match by match
_DENSE = 256


def _apply(rule: _Rule, view: _View, counts: dict[str, int]) -> None:
    """Find the rule's secrets where it runs: as edits while matches are few, by rewriting the text when a
    window holds many."""
    if rule is _ASSIGNMENTS[0]:
        _apply_assignments(rule, view, counts)
        return
    verdicts: dict[Values, str | None] = {}  # lines repeat (config blocks, logs): each distinct match checked once
    for start, end in _windows(rule, view):
        sample = _edit(rule, view, start, end, counts, verdicts)
        if sample is not None:
            view.materialized()  # dense: apply the edits so far, then rewrite the text in one pass per window
            pieces, last, text = [], 0, view.text
            # the first matches repeat (a line or command copied many times): take whole matches out, not values
            repeating = len(set(sample)) <= _FEW
            for start_, end_ in _windows(rule, view):
                new = _rewrite(rule, text, start_, end_, counts, repeating)
                if new is not None:
                    pieces += [text[last:start_], new]
                    last = end_
            if pieces:
                pieces.append(text[last:])
                view.replace(pieces[1] if len(pieces) == 3 and not pieces[0] and not pieces[2] else "".join(pieces))
            return


def _edit(rule: _Rule, view: _View, start: int, end: int, counts: dict[str, int],
          verdicts: dict[Values, str | None], found_already: Iterable[re.Match[str]] | None = None) -> list[str] | None:
    """Record the rule's accepted matches in ``text[start:end]`` as edits; when the window holds more than
    :data:`_DENSE` matches of a rule that can be rewritten in one pass instead, record nothing and return the
    first matches' texts.

    A rule written for the lower-cased text is matched there; its checks and redactions use the original text at
    the same positions. ``found_already``: the window's matches, when the caller has them."""
    text = view.text
    subject = view.lowered if rule.lowered else text
    matches = rule.pattern.finditer(subject, start, end) if found_already is None else iter(found_already)
    if not rule.lowered:
        first = list(itertools.islice(matches, _DENSE + 1))
        if len(first) > _DENSE:
            return [match.group() for match in first]
        matches = iter(first)
    groups, value_groups = rule.match_groups, rule.value_groups
    found: dict[str, int] = {}
    for match in matches:
        values = tuple(text[a:b] if a >= 0 else None for a, b in map(match.span, groups))
        if values in verdicts:
            placeholder = verdicts[values]
        else:
            placeholder = verdicts[values] = rule.verdict(values)
        if placeholder is None:
            continue
        a, b = next((match.span(g) for g in value_groups if match.start(g) >= 0), match.span())
        if view.claim(a, b, placeholder):
            found[placeholder] = found.get(placeholder, 0) + 1
    for placeholder, n in found.items():
        _count([placeholder], counts, n)
    return None


def _rewrite(rule: _Rule, text: str, start: int, end: int, counts: dict[str, int],
             repeating: bool = False) -> str | None:
    """The window ``text[start:end]`` with the rule's accepted matches redacted (None: nothing to redact).

    ``re.split`` with the rule's groups hands back, in one call into the regex engine, every stretch between
    matches and every group of every match; the checks run once per distinct value, and the window is put back
    together with the accepted values replaced: no Python call per match, so text dense with matches (a line of
    DSNs, a minified file) costs little more than the regex engine's own pass. Values redacted before hold a
    placeholder and are left as they are. ``repeating``: the window's first matches are few distinct texts.

    Each string ``split`` makes costs about as much as the regex engine's work on a short match, so the forms
    below take as few strings per match out of the text as the rule allows."""
    form = rule.split_form
    window = text if start == 0 and end == len(text) else text[start:end]
    if rule.pure and form.bare is not None and PLACEHOLDER_PREFIX not in window:
        return _rewrite_bare(rule, window, counts)
    if form.lead is not None:  # a match is a fixed text and the value: split keeps the values only
        return _rewrite_values(rule, form.lead, window, counts)
    if repeating and form.whole is not None:
        try:
            return _rewrite_wholes(rule, window, counts)
        except _TooMany:
            pass
    parts = form.pattern.split(window)
    if len(parts) == 1:
        return None
    stride = form.stride
    columns = form.check_columns(rule.check_groups)
    if len(columns) == 1 and isinstance(rule.accept, _Refuses) and isinstance(rule.kind, str):
        return _rewrite_refusing(rule, parts, parts[columns[0]::stride], counts)
    if len(columns) == 1:  # the usual case: plain strings, no tuple per match
        checked: list[Any] = parts[columns[0]::stride]
        verdicts = _verdicts(rule, set(checked))
    else:
        checked = list(zip(*(parts[column::stride] for column in columns), strict=True))
        verdicts = {values: rule.verdict(values) for values in set(checked)}
    # every match the same way (in dense text: all accepted, one kind): no lookup per match
    distinct = set(verdicts.values())
    placeholders = ([distinct.pop()] * len(checked) if len(distinct) == 1
                    else list(map(verdicts.__getitem__, checked)))
    accepted = len(placeholders) - placeholders.count(None)
    if not accepted:
        return None
    if accepted == len(placeholders):
        parts[form.secret::stride] = placeholders
    else:
        secrets = parts[form.secret::stride]
        parts[form.secret::stride] = [s if p is None else p for s, p in zip(secrets, placeholders, strict=True)]
    for column in form.blank:
        parts[column::stride] = [""] * len(placeholders)
    if len(verdicts) == 1 or isinstance(rule.kind, str):  # one kind: count without a pass over the matches
        _count([next(p for p in verdicts.values() if p is not None)], counts, accepted)
    else:
        _count(placeholders, counts)
    return "".join(parts)


def _rewrite_refusing(rule: _Rule, parts: list[Any], checked: list[str], counts: dict[str, int]) -> str | None:
    """:func:`_rewrite` for a rule whose check is a regex (:class:`_Refuses`) on its value alone: the values
    are checked in one pass over them all, and when none is refused every match gets the one placeholder
    without a lookup per match."""
    assert isinstance(rule.accept, _Refuses) and isinstance(rule.kind, str)
    form, stride = rule.split_form, rule.split_form.stride
    lines = "\n" + "\n".join(checked)
    if lines.count("\n") != len(checked):  # pragma: no cover - no value pattern takes a line break
        return None
    refused = set(rule.accept.refused(lines))
    if PLACEHOLDER_PREFIX in lines:
        refused.update(value for value in checked if PLACEHOLDER_PREFIX in value)
    placeholder = _placeholder(rule.kind)
    new_values, accepted = _placed(checked, refused, placeholder)
    if new_values is None:
        return None
    parts[form.secret::stride] = new_values
    for column in form.blank:
        parts[column::stride] = [""] * len(checked)
    _count([placeholder], counts, accepted)
    return "".join(parts)


def _placed(values: list[str], refused: set[str], placeholder: str) -> tuple[list[str] | None, int]:
    """``values`` with each one not ``refused`` replaced by ``placeholder`` (None: all refused), and how many
    were replaced. A few refused values are found by the list's own search, so the usual dense case makes no
    Python step per value."""
    if not refused:
        return [placeholder] * len(values), len(values)
    if len(refused) > _FEW:
        kept = sum(map(refused.__contains__, values))
        if kept == len(values):
            return None, 0
        return [value if value in refused else placeholder for value in values], len(values) - kept
    placed = [placeholder] * len(values)
    kept = 0
    for value in refused:
        at = -1
        while True:
            try:
                at = values.index(value, at + 1)
            except ValueError:
                break
            placed[at] = value
            kept += 1
    return (None, 0) if kept == len(values) else (placed, len(values) - kept)


def _verdicts(rule: _Rule, values: set[str]) -> dict[str, str | None]:
    """The placeholder for each distinct value of a single-value rule (None: left as it is). Many values with a
    check written as a regex (:class:`_Refuses`) are checked in one pass over them, one per line."""
    if len(values) <= _FEW or not isinstance(rule.accept, _Refuses) or not isinstance(rule.kind, str):
        return {value: rule.verdict((value,)) for value in values}
    lines = "\n" + "\n".join(values)
    if lines.count("\n") != len(values):  # pragma: no cover - no value pattern takes a line break
        return {value: rule.verdict((value,)) for value in values}
    verdicts: dict[str, str | None] = dict.fromkeys(values, _placeholder(rule.kind))
    for value in rule.accept.refused(lines):
        verdicts[value] = None
    if PLACEHOLDER_PREFIX in lines:
        for value in values:
            if PLACEHOLDER_PREFIX in value:
                verdicts[value] = None
    return verdicts


#: at most this many distinct matches make a window "repeating" (see :func:`_rewrite_wholes`)
_FEW = 32


class _TooMany(Exception):
    """The window's matches do not repeat after all: rewrite it value by value."""


def _rewrite_wholes(rule: _Rule, window: str, counts: dict[str, int]) -> str | None:
    """:func:`_rewrite` for a window whose matches repeat: ``split`` takes each whole match out (one string per
    match instead of one per part), each distinct match is parsed again on its own to find and check its value,
    and the window is joined with each match replaced by its redacted form. Raises :class:`_TooMany` (nothing
    done) when the window holds more than :data:`_FEW` distinct matches after all."""
    form = rule.split_form
    assert form.whole is not None and form.reparse is not None
    parts = form.whole.split(window)
    if len(parts) == 1:
        return None
    wholes = parts[1::2]
    distinct = set(wholes)
    if len(distinct) > _FEW:
        raise _TooMany
    redacted: dict[str, str] = {}
    tally: dict[str, int] = {}
    for whole in distinct:
        match = form.reparse.fullmatch(whole)
        if match is None:  # pragma: no cover - a whole match always parses again (see _SplitForm.of)
            raise _TooMany
        placeholder = rule.verdict(tuple(match.group(g) for g in rule.match_groups))
        if placeholder is None:
            redacted[whole] = whole
            continue
        a, b = next((match.span(g) for g in rule.value_groups if match.start(g) >= 0), match.span())
        redacted[whole] = whole[:a] + placeholder + whole[b:]
        tally[placeholder] = tally.get(placeholder, 0) + (len(wholes) if len(distinct) == 1 else wholes.count(whole))
    if not tally:
        return None
    for placeholder, n in tally.items():
        _count([placeholder], counts, n)
    if len(distinct) == 1:
        return redacted[wholes[0]].join(parts[0::2])
    parts[1::2] = list(map(redacted.__getitem__, wholes))
    return "".join(parts)


def _rewrite_bare(rule: _Rule, window: str, counts: dict[str, int]) -> str | None:
    """:func:`_rewrite` for a rule whose regex refuses what is not a secret, on text holding no placeholder:
    every match is redacted alike, so the values are never taken out of the text. A match that is fixed text
    around the value is replaced by the regex engine itself; otherwise ``split`` hands back the text between
    matches and the varying parts around each value, and the placeholder goes in between, all without a
    Python call or a string per match beyond those parts."""
    form = rule.split_form
    assert form.bare is not None and isinstance(rule.kind, str)
    placeholder = _placeholder(rule.kind)
    fixed = form.bare_pre + placeholder + form.bare_post
    groups = form.bare.groups
    if not groups:
        new, n = form.bare.subn(fixed.replace("\\", "\\\\"), window)
    else:
        parts = form.bare.split(window)
        n = (len(parts) - 1) // (groups + 1)
        if n:
            stride = groups + 2  # the text before a match, its captured parts, the placeholder between them
            pieces = [fixed] * (stride * n + 1)
            pieces[0::stride] = parts[0::groups + 1]
            column = 1
            if "_pre" in form.bare.groupindex:
                pieces[1::stride] = parts[1::groups + 1]
                column = 2
            if "_post" in form.bare.groupindex:
                pieces[column + 1::stride] = parts[groups::groups + 1]
            new = "".join(pieces)
    if not n:
        return None
    _count([placeholder], counts, n)
    return new


def _rewrite_values(rule: _Rule, lead: str, window: str, counts: dict[str, int]) -> str | None:
    """:func:`_rewrite` for a rule whose every match is ``lead`` followed by the value: ``split`` returns the text
    between matches and the values, and when every match is redacted alike the window is one ``join``."""
    pattern = rule.pattern if rule.pattern.groups == 1 else rule.split_form.pattern
    parts = pattern.split(window)
    if len(parts) == 1:
        return None
    values = parts[1::2]
    verdicts = _verdicts(rule, set(values))
    distinct = set(verdicts.values())
    if distinct == {None}:
        return None
    if len(distinct) == 1:  # every match redacted with one placeholder
        placeholder = distinct.pop()
        assert placeholder is not None
        _count([placeholder], counts, len(values))
        return (lead + placeholder).join(parts[0::2])
    placeholders = list(map(verdicts.__getitem__, values))
    parts[1::2] = [lead + (v if p is None else p) for v, p in zip(values, placeholders, strict=True)]
    _count(placeholders, counts)
    return "".join(parts)


# ------------------------------------------------------------------------- assignments dense with matches
# A dump of credentials (thousands of NAME=value lines) would cost a Python check per value. There, each window
# without earlier redactions is rewritten in one pass instead: one ``re.split`` of the original text hands back
# per match what precedes the value (name, separator, opening quote: the "head"), the value and the closing
# quote; each distinct head is parsed once (which check its values get, and their placeholder), and each check
# runs over all values at once as one regex pass over them joined by line breaks (``_refusal``). The result is
# the one the match-by-match path gives (tests/test_scrub.py compares them on generated text).

_V = r"""[^\s"'`,;&]"""


def _either_case(word: str) -> str:
    """``word`` as a regex matching its ASCII letters in either case ("key" -> "[kK][eE][yY]")."""
    return "".join(f"[{c}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


# The assignment rule's regex for the original text, the name's letters in either case: what the rule's regex
# finds in the lower-cased text, as long as the text holds neither of the two characters whose lower case is an
# ASCII letter ("\u0130" and the Kelvin sign, _CASE_FOLDED), whose lines are matched one at a time.
_ASSIGNMENT_SPLIT = re.compile(
    rf"""(?P<head>(?P<q>["']?)(?<![{_NAME}])(?=[{_NAME}]{{0,120}}?"""
    rf"""(?:{"|".join(map(_either_case, ("pass", "secret", "token", "key", "cred", "private")))}))"""
    rf"""[{_NAME}]{{1,128}}+(?P=q)[ \t]*(?:[:=][ \t]*(?P<oq>["'])|=(?!=)[ \t]*"""
    rf"""|:[ \t]*(?={_V}{{16}}|{_V}{{0,15}}?{_SECRET_VALUE_CHAR})))"""
    rf"""(?P<value>(?(oq)(?:(?!(?P=oq))[^\\\n]|\\.)*|{_V}{{4,}}))(?P<tail>(?(oq)(?P=oq)))"""
)
_SPLIT_STRIDE = _ASSIGNMENT_SPLIT.groups + 1
_HEAD = re.compile(rf"""(?P<q>["']?)(?P<key>[{_NAME}]+)(?P=q)[ \t]*(?P<sep>[:=])[ \t]*(?P<oq>["'])?""")
_CASE_FOLDED = ("\u0130", "\u212a")

#: the value check each form of assignment gets (see _assignment_accepts): a strong name's by its form, a
#: weaker name's whatever the form
_VALUE_CHECKS: dict[str, Callable[[str], bool]] = {
    "plain": _plain_value, "colon": _colon_value, "quoted": _quoted_value,
    "suffix": lambda value: _generated_value(value, _MIN_GENERATED["suffix"]),
    "inner": lambda value: _generated_value(value, _MIN_GENERATED["inner"]),
}


@functools.lru_cache(maxsize=4096)
def _head_class(head: str) -> tuple[str, str] | None:
    """The check a head's values get and the placeholder of those accepted; None when its name bears no secret."""
    match = _HEAD.fullmatch(head)
    assert match is not None, head  # a head always parses: _HEAD is _ASSIGNMENT_SPLIT's head, less its guards
    key = match["key"]
    strength = _name_strength(key)
    if strength is None:
        return None
    form = "quoted" if match["oq"] else "plain" if match["sep"] == "=" else "colon"
    return (form if strength == "strong" else strength), _placeholder(_kind_of_name(key))


def _generated_parts(min_length: int) -> tuple[_Part, ...]:  # _generated_value
    return (
        (None, rf"[^\n]{{0,{min_length - 1}}}$"), (None, r"[^\s]*+[^\S\n]"), *_REFERENCE_PARTS,
        *_QUOTED_REFERENCE_PARTS, ("{", r"[^\n{]*+\{"), (None, r"[\d.,:_+-]++$"),
        ("://", r"[A-Za-z][A-Za-z0-9+.-]*+://[^\s@?#]*+$"), ("/", r"[\w.~-]*/[\w./-]*\.[A-Za-z][A-Za-z0-9]{0,4}$"),
        (None, r"(?=[^\n]{0,256}$)[:./_-]*+(?:[A-Za-z]++|[0-9]++)(?:[:./_-]++(?:[A-Za-z]++|[0-9]++))++[:./_-]*+$"),
        (None, r"(?!(?=[^\n0-9]*+[0-9])(?=[^\nA-Za-z]*+[A-Za-z]))"
               r"(?!(?=[^\n]{20})(?=[^\na-z]*+[a-z])(?=[^\nA-Z]*+[A-Z]))"),
    )


# (an unquoted value has four characters or more: _ASSIGNMENT_SPLIT takes no shorter one, so its check needs no
# test of length)
_REFUSAL_PARTS: dict[str, tuple[_Part, ...]] = {
    "plain": _REFERENCE_PARTS,
    "colon": (*_REFERENCE_PARTS, (None, r"(?![^\n]{16})[^\n\d!@#$%^&*+=/_~-]*+$")),
    "quoted": ((None, "$"), *_QUOTED_REFERENCE_PARTS),
    "suffix": _generated_parts(_MIN_GENERATED["suffix"]),
    "inner": _generated_parts(_MIN_GENERATED["inner"]),
}


@functools.lru_cache(maxsize=256)
def _refusal_of(parts: tuple[_Part, ...], included: tuple[bool, ...]) -> re.Pattern[str]:
    """Each refused value whole (group 1) in values joined after line breaks, by the parts ``included``."""
    sources = [source for (_, source), keep in zip(parts, included, strict=True) if keep] or ["(?!)"]
    return re.compile(rf"\n((?:{'|'.join(sources)})[^\n]*)", re.MULTILINE)


def _refusal(check: str, included: tuple[bool, ...]) -> re.Pattern[str]:
    """:func:`_refusal_of` the parts of an assignment's value check (and values holding an earlier redaction)."""
    return _refusal_of((_PLACEHOLDER_PART, *_REFUSAL_PARTS[check]), included)


def _refused(check: str, values: list[str]) -> set[str]:
    """The ``values`` that ``check`` refuses, or that hold an earlier redaction: the ASCII ones in one regex
    pass over them all, the others one by one."""
    joined = "\n" + "\n".join(values)
    if not joined.isascii():
        accept = _VALUE_CHECKS[check]
        wide = {value for value in values if not value.isascii()}
        return ({value for value in wide if PLACEHOLDER_PREFIX in value or not accept(value)}
                | _refused(check, [value for value in values if value not in wide]))
    included = tuple(needle is None or needle in joined for needle, _ in (_PLACEHOLDER_PART, *_REFUSAL_PARTS[check]))
    return set(_refusal(check, included).findall(joined))


def _rewrite_assignments(window: str, counts: dict[str, int]) -> str | None:
    """The window with the assignment rule's accepted values redacted (None: nothing to redact). The window
    holds no earlier redaction pending and neither character of _CASE_FOLDED."""
    parts = _ASSIGNMENT_SPLIT.split(window)
    n = len(parts) // _SPLIT_STRIDE
    if not n:
        return None
    heads, values = parts[1::_SPLIT_STRIDE], parts[4::_SPLIT_STRIDE]
    # the heads of a dump are mostly one text: comparing them is cheaper than hashing each
    classes = {head: _head_class(head) for head in ((heads[0],) if heads.count(heads[0]) == n else set(heads))}
    kinds = set(classes.values())
    if len(kinds) == 1:  # the usual dense case: one name (or names alike), so one check and one placeholder
        only = kinds.pop()
        if only is None:
            return None
        check, placeholder = only
        refused = _refused(check, values)
        placed, accepted = _placed(values, refused, placeholder)
        if placed is None:
            return None
        new_values = placed
        kind = _KIND_OF[placeholder]
        counts[kind] = counts.get(kind, 0) + accepted
    else:
        by_check: dict[str, list[str]] = {}
        for head, value in zip(heads, values, strict=True):
            kind_ = classes[head]
            if kind_ is not None:
                by_check.setdefault(kind_[0], []).append(value)
        refusals = {check: _refused(check, checked) for check, checked in by_check.items()}
        placeholders = [None if (kind_ := classes[head]) is None or value in refusals[kind_[0]] else kind_[1]
                        for head, value in zip(heads, values, strict=True)]
        if placeholders.count(None) == n:
            return None
        _count(placeholders, counts)
        new_values = [value if placeholder is None else placeholder
                      for value, placeholder in zip(values, placeholders, strict=True)]
    parts[4::_SPLIT_STRIDE] = new_values
    parts[2::_SPLIT_STRIDE] = parts[3::_SPLIT_STRIDE] = [""] * n  # quotes inside the head: already in it
    return "".join(parts)


def _dense_segments(view: _View, start: int, end: int) -> list[tuple[int, int, bool]]:
    """``text[start:end]`` (whole lines) cut into (start, end, dense) stretches: the lines holding an earlier
    redaction still pending, or a character of _CASE_FOLDED, are matched one at a time (dense False); the rest
    can be rewritten in one pass. An assignment never spans lines, so each stretch is matched on its own."""
    text, holes = view.text, []
    i = bisect.bisect_right(view.ends, start)
    while i < len(view.starts) and view.starts[i] < end:
        holes.append((view.starts[i], view.ends[i]))
        i += 1
    for char in _CASE_FOLDED:
        at = text.find(char, start, end)
        while at != -1:
            holes.append((at, at + 1))
            line_end = text.find("\n", at, end)
            at = -1 if line_end == -1 else text.find(char, line_end, end)
    segments: list[tuple[int, int, bool]] = []
    pos = start
    for lo, hi in sorted(holes):
        lo = max(start, text.rfind("\n", start, lo) + 1)
        hi = text.find("\n", max(lo, hi - 1), end)
        hi = end if hi == -1 else hi
        if segments and not segments[-1][2] and lo <= segments[-1][1] + 1:
            segments[-1] = (segments[-1][0], max(hi, segments[-1][1]), False)
        else:
            if lo > pos:
                segments.append((pos, lo, True))
            segments.append((lo, hi, False))
        pos = max(pos, hi)
    if pos < end:
        segments.append((pos, end, True))
    return segments


def _apply_assignments(rule: _Rule, view: _View, counts: dict[str, int]) -> None:
    """:func:`_apply` for the assignment rule: a window with many matches is rewritten in one pass where it
    can be (:func:`_rewrite_assignments`), the rest match by match."""
    verdicts: dict[Values, str | None] = {}
    for start, end in _windows(rule, view):
        first = list(itertools.islice(rule.pattern.finditer(view.lowered, start, end), _DENSE + 1))
        if len(first) <= _DENSE:
            _edit(rule, view, start, end, counts, verdicts, first)
            continue
        for lo, hi, dense in _dense_segments(view, start, end):
            if not dense:
                _edit(rule, view, lo, hi, counts, verdicts)
            elif (new := _rewrite_assignments(view.text[lo:hi], counts)) is not None:
                view.claim(lo, hi, new)  # the stretch's text, redacted: applied with the other edits


def _count(placeholders: list[str | None], counts: dict[str, int], times: int = 1) -> None:
    """Count each placeholder (``times`` each) under its kind."""
    for placeholder, n in Counter(placeholders).items():
        if placeholder is not None:
            kind = _KIND_OF[placeholder]
            counts[kind] = counts.get(kind, 0) + n * times


@dataclass(frozen=True)
class _SplitForm:
    """A rule's pattern with groups around what comes before and after its value, so ``split`` returns every
    piece of the text: per match, ``stride`` columns (the text before the match, then each group by number)."""

    pattern: re.Pattern[str]
    stride: int
    secret: int  # the value's column
    blank: tuple[int, ...]  # columns of groups nested in the others: emptied before joining, or text would repeat
    #: when every match is this text (lookarounds aside) followed by the value and nothing else: the text
    lead: str | None = None
    #: the pattern with the value not captured, and the parts around it captured only when they vary (a part that
    #: is always the same text is put back with the placeholder): for rewriting without looking at the values;
    #: None when other groups would be captured too
    bare: re.Pattern[str] | None = None
    #: the fixed text before and after the value in a match of :attr:`bare` ("" where that part is captured)
    bare_pre: str = ""
    bare_post: str = ""
    #: the pattern capturing each whole match and nothing else, and the rule's pattern for parsing a whole match
    #: on its own (its leading word-boundary lookbehind dropped); None where a match could parse differently out
    #: of its text (any other lookaround or anchor)
    whole: re.Pattern[str] | None = None
    reparse: re.Pattern[str] | None = None

    @classmethod
    def of(cls, pattern: re.Pattern[str]) -> _SplitForm:
        source = pattern.pattern
        flags = _GLOBAL_FLAGS.match(source)
        head, body = (flags.group(), source[flags.end():]) if flags else ("", source)
        if "secret" in pattern.groupindex:
            open_at = body.index("(?P<secret>")
            close_at = _closing_paren(body, open_at)
            if not _top_level_group(body, "secret"):
                raise ValueError(f"scrub rule {source!r}: the secret group must not be inside a group or alternative")
            pre = f"(?P<_pre>{body[:open_at]})" if open_at else ""
            post = f"(?P<_post>{body[close_at + 1:]})" if body[close_at + 1:] else ""
            split = f"{head}{pre}{body[open_at:close_at + 1]}{post}"
            bare_pre, bare_post = _fixed_text(body[:open_at]), _fixed_text(body[close_at + 1:])
            bare = (f"{head}{pre if bare_pre is None else body[:open_at]}"
                    f"(?:{body[open_at + len('(?P<secret>'):close_at]})"
                    f"{post if bare_post is None else body[close_at + 1:]}")
        else:
            split = f"{head}(?P<secret>{body})"
            bare, bare_pre, bare_post = source, "", ""
        bare_compiled: re.Pattern[str] | None = re.compile(bare)
        if bare_compiled is not None and bare_compiled.groups != (bare_pre is None) + (bare_post is None):
            bare_compiled = None
        compiled = re.compile(split)
        keep = {compiled.groupindex[name] for name in ("_pre", "secret", "_post") if name in compiled.groupindex}
        blank = tuple(column for column in range(1, compiled.groups + 1) if column not in keep)
        lead = None
        if pattern.groups <= 1:
            if "secret" not in pattern.groupindex:
                lead = ""
            else:
                before, after = _LEAD.fullmatch(body[:open_at]), _LOOKAROUNDS.fullmatch(body[close_at + 1:])
                lead = before.group(1) if before and after else None
        whole = reparse = None
        unbounded = _LEADING_LOOKBEHIND.sub(r"\1", body, count=1)
        if pattern.groups == 1 and "secret" in pattern.groupindex and not _reads_context(unbounded):
            whole = re.compile(f"{head}({body.replace('(?P<secret>', '(?:', 1)})")
            reparse = re.compile(f"{head}{unbounded}")
        return cls(compiled, compiled.groups + 1, compiled.groupindex["secret"], blank, lead, bare_compiled,
                   bare_pre or "", bare_post or "", whole, reparse)

    def check_columns(self, groups: tuple[str, ...]) -> list[int]:
        return [self.pattern.groupindex[name] for name in groups]


_GLOBAL_FLAGS = re.compile(r"\(\?[aiLmsux]+\)")


def _fixed_text(source: str) -> str | None:
    """The text a pattern part always matches (plain characters, then lookarounds), or None if it varies."""
    lead = _LEAD.fullmatch(source)
    if lead is not None:
        return lead.group(1)
    literal = _LITERAL_TEXT.match(source)
    end = literal.end() if literal is not None else 0
    return source[:end] if _LOOKAROUNDS.fullmatch(source, end) else None


_LITERAL_TEXT = re.compile(r"[A-Za-z0-9:@_ -]*")
# "literal(?<=\bliteral)" at a pattern's start: the word boundary the rule files write after the literal
_LEADING_LOOKBEHIND = re.compile(r"^([A-Za-z0-9_-]+)\(\?<=[^()]*\)")


def _reads_context(source: str) -> bool:
    """Whether a pattern looks at text around what it consumes: a lookaround, an anchor or word boundary (or a
    backreference, which this conservatively counts too)."""
    from re import _constants as sre_constants  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]

    def reads(items: Any) -> bool:
        for op, arg in items:
            if op in (sre_constants.AT, sre_constants.ASSERT, sre_constants.ASSERT_NOT, sre_constants.GROUPREF,
                      sre_constants.GROUPREF_EXISTS):
                return True
            if op == sre_constants.BRANCH and any(reads(branch) for branch in arg[1]):
                return True
            if op == sre_constants.SUBPATTERN and reads(arg[-1]):
                return True
            if op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT,
                      sre_constants.ATOMIC_GROUP) and reads(arg[-1] if op != sre_constants.ATOMIC_GROUP else arg):
                return True
        return False

    return reads(sre_parse.parse(source).data)
# a pattern part that is plain characters (group 1) then lookbehinds, or only lookarounds (simple ones: no nested
# groups), so the text it matches is known without matching
_LEAD = re.compile(r"([A-Za-z0-9:@_ -]*)((?:\(\?<[=!][^()]*\))*)")
_LOOKAROUNDS = re.compile(r"(?:\(\?<?[=!](?:\\.|[^()\\]|\((?:\?:)?(?:\\.|[^()\\])*\))*\))*")


def _closing_paren(source: str, open_at: int) -> int:
    """The index of the ``)`` closing the group opened at ``open_at`` (escapes and classes skipped)."""
    depth, i, in_class = 0, open_at, False
    while i < len(source):
        char = source[i]
        if char == "\\":
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            if source[i + 1:i + 2] == "]":
                i += 1
            elif source[i + 1:i + 3] == "^]":
                i += 2
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError(f"unbalanced group in {source!r}")


def _top_level_group(source: str, name: str) -> bool:
    """Whether the named group is an item of the pattern's top-level sequence (no alternative around it)."""
    try:
        from re import _parser as sre_parse  # type: ignore[attr-defined]
    except ImportError:  # pragma: no cover - Python < 3.11
        import sre_parse
    parsed = sre_parse.parse(source)
    index = parsed.state.groupdict[name]
    return any(op == sre_parse.SUBPATTERN and arg[0] == index for op, arg in parsed.data)


_VALUE_GROUPS = ("secret", "plain", "colon")


#: placeholder -> the kind it stands for
_KIND_OF: dict[str, str] = {}


def _placeholder(kind: str) -> str:
    placeholder = f"{PLACEHOLDER_PREFIX}{kind.upper()}]"
    _KIND_OF.setdefault(placeholder, kind)
    return placeholder


__all__ = ["PROVIDER_KEY", "ScrubReport", "load_token_rules", "scrub"]
