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
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

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


@dataclass(frozen=True)
class _Rule:
    """One secret pattern. The named group ``secret`` (or the whole match) is what gets replaced.

    ``accept(value, match)`` can still refuse a match (a reference, prose, a setting about secrets).
    """

    kind: str | Callable[[re.Match[str]], str]
    pattern: re.Pattern[str]
    accept: Callable[[str, re.Match[str]], bool] = lambda value, match: True
    #: cheap patterns, searched in the lower-cased text, one of which every line the rule can match contains
    guard: tuple[re.Pattern[str], ...] = ()
    #: lower-case strings one of which every match contains: without any of them in the text the rule is skipped
    keywords: tuple[str, ...] = ()
    #: the pattern begins with a literal, which the regex engine finds by fast search: it scans the whole text
    #: rather than the stretches around its keywords
    literal_start: bool = False

    @functools.cached_property
    def value_groups(self) -> tuple[str, ...]:
        """The groups that hold the value to redact, in the order tried; none = the whole match."""
        return tuple(name for name in _VALUE_GROUPS if name in self.pattern.groupindex)

    def kind_of(self, match: re.Match[str]) -> str:
        return self.kind if isinstance(self.kind, str) else self.kind(match)


# Values that name a secret rather than contain one: code and config references (also inside a call, "self.x)"),
# booleans, empty defaults, ellipses ("sk-..."), a capitalised placeholder word ("PASSWORD").
_REFERENCE = re.compile(
    r"""^(?:\$|\{\{|<|%\(|\*{3,}$|x{4,}$|(?i:true|false|null|none|nil|undefined|yes|no|required|optional)$)"""
    r"""|[(\[]|^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+[)\]}]*$|\.\.\.|…"""
    r"""|^(?:PASSWORD|PASSWD|PASS|PWD|PW|SECRET|TOKEN|API_KEY)$"""
)


def _plain_value(value: str) -> bool:
    """An unquoted assignment value that is plausibly a literal secret."""
    return len(value) >= 4 and not _REFERENCE.search(value)


_SECRET_CHAR = re.compile(r"[\d!@#$%^&*+=/_~-]")


def _colon_value(value: str) -> bool:
    """``key: value`` is also how prose introduces things ("Password: must be long"): ask for a secret's shape."""
    return _plain_value(value) and (_SECRET_CHAR.search(value) is not None or len(value) >= 16)


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


def _assignment_kind(match: re.Match[str]) -> str:
    return _kind_of_name(match.group("key"))


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
    if _REFERENCE.search(value) or _QUOTED_REFERENCE.match(value):
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


def _assignment_accepts(value: str, match: re.Match[str]) -> bool:
    """The value check for the assignment's form (quoted, ``=`` or ``:``) for strong names, a generated shape
    otherwise."""
    strength = _name_strength(match.group("key"))
    if strength is None:
        return False
    if strength != "strong":
        return _generated_value(value, _MIN_GENERATED[strength])
    if match.group("plain") is not None:
        return _plain_value(value)
    if match.group("colon") is not None:
        return _colon_value(value)
    return _quoted_value(value)


# A pattern that begins with a literal character (not a class, group, anchor or escape sequence such as \b).
_LITERAL_START = re.compile(r"""[A-Za-z0-9_"'@:/~-]|\\[.\[\]()"]""")


def _rule(kind: str | Callable[[re.Match[str]], str], pattern: str,
          accept: Callable[[str, re.Match[str]], bool] | None = None,
          guard: tuple[re.Pattern[str], ...] = (), keywords: Iterable[str] = ()) -> _Rule:
    compiled = re.compile(pattern)
    literal = bool(_LITERAL_START.match(pattern))
    if accept is None:
        return _Rule(kind, compiled, guard=guard, keywords=tuple(keywords), literal_start=literal)
    return _Rule(kind, compiled, accept, guard, tuple(keywords), literal)


# The assignment rule tries a name at every identifier start, which costs ~0.2 s per MB; it only runs on the
# lines these guards find (a secret word in a name right before ":" or "=") in the lower-cased text. One guard
# per word, each starting with its literal, so the regex engine finds candidates by fast search. The possessive
# "{0,128}+" never gives characters back: a name cannot end inside a run of name characters, and backtracking
# through each run made long runs of "pass_pass_…" ten times slower.
_STEMS = ("pass", "secret", "token", "key", "cred", "private")
_ASSIGNMENT_GUARD = tuple(re.compile(rf"""{stem}[a-z0-9_.-]{{0,128}}+["']?[ \t]*[:=]""") for stem in _STEMS)


# --------------------------------------------------------------------------------------- token formats (data)

_DIGIT, _UPPER, _LOWER = re.compile(r"\d"), re.compile(r"[A-Z]"), re.compile(r"[a-z]")
_REQUIRE: dict[str, Callable[[str], bool]] = {
    "digit": lambda v: _DIGIT.search(v) is not None,
    "mixed": lambda v: all(p.search(v) is not None for p in (_DIGIT, _UPPER, _LOWER)),
}


def _requiring(checks: list[str]) -> Callable[[str, re.Match[str]], bool] | None:
    if not checks:
        return None
    tests = [_REQUIRE[name] for name in checks]
    return lambda value, match: all(test(value) for test in tests)


def load_token_rules(text: str | None = None) -> tuple[_Rule, ...]:
    """The token-format rules of ``scrub_rules.toml`` (or of ``text`` in that format), in file order."""
    if text is None:
        text = resources.files("conclave").joinpath("scrub_rules.toml").read_text(encoding="utf-8")
    rules = []
    for spec in tomllib.loads(text)["rules"]:
        unknown = set(spec.get("require", ())) - set(_REQUIRE)
        if unknown:
            raise ValueError(f"scrub rule {spec['id']}: unknown require {sorted(unknown)}")
        rules.append(_rule(spec["kind"], spec["regex"], _requiring(list(spec.get("require", ()))),
                           keywords=spec.get("keywords", ())))
    return tuple(rules)


# ------------------------------------------------------------------------------------ credentials by syntax

def _command_before(match: re.Match[str], command: re.Pattern[str], limit: int = 512) -> bool:
    """Whether ``command`` occurs in the match's line before it (up to ``limit`` characters back): the command a
    flag belongs to. Searched in place, without copying the line."""
    text, start = match.string, match.start()
    low = max(0, start - limit)
    return command.search(text, text.rfind("\n", low, start) + 1 or low, start) is not None


_MYSQL = re.compile(r"(?i)\b(?:mysql|mysqldump|mysqladmin|mysqlimport|mysqlsh|mariadb|mariadb-dump)\b")
_SSHPASS = re.compile(r"(?i)\bsshpass\b")
_REDIS_CLI = re.compile(r"(?i)\bredis-cli\b")
_HTTP_CLIENT = re.compile(r"(?i)\b(?:curl|wget|https?)\b")


def _url_password(value: str, match: re.Match[str]) -> bool:
    """A password in a URL or DSN, not a template slot (``${DB_PASSWORD}``, ``%s``, ``{{ pw }}``, ``<pw>``)."""
    return (not value.startswith(("$", "%", "{", "<")) and not _QUOTED_REFERENCE.match(value)
            and not _PLACEHOLDER_WORD.fullmatch(value))


# a word in capitals standing for the secret in documentation: user:PASSWORD@host, -p PW
_PLACEHOLDER_WORD = re.compile(r"PASSWORD|PASSWD|PASS|PWD|PW|SECRET|TOKEN|API_KEY")


def _docker_auth(value: str, match: re.Match[str]) -> bool:
    """base64 of ``user:password`` (at least 8 characters), not a word such as ``"auth": "required"``."""
    return len(value) >= 8 and not value.isalpha()


def _cli_password(value: str, match: re.Match[str]) -> bool:
    """``-p``/``-a``/``--password`` on a command line: ``sshpass -p PW`` or ``sshpass -pPW``, ``mysql -pPW`` (for
    mysql a space makes the next word the database, not a password), ``redis-cli -a PW``, ``--password PW``."""
    if not _plain_value(value) or value.startswith("-"):
        return False
    flag = match.group("flag")
    if flag == "-password":
        return match.group("sp") is not None  # "--password=PW" is an assignment, found by the assignment rules
    if flag == "a":
        return _command_before(match, _REDIS_CLI)
    if _command_before(match, _SSHPASS):
        return True
    return match.group("sp") is None and _command_before(match, _MYSQL)


def _user_password(value: str, match: re.Match[str]) -> bool:
    """``curl -u user:PW`` (or wget, httpie); not ``docker run -u 1000:1000``."""
    return _plain_value(value) and not value.isdigit() and _command_before(match, _HTTP_CLIENT)


_STRUCTURAL: tuple[_Rule, ...] = (
    # PuTTY .ppk: the lines after "Private-Lines: N" are the private key (encrypted or not).
    _rule("private_key",
          r"Private-Lines:[ \t]*\d{1,3}[ \t]*\r?\n"
          r"(?P<secret>[A-Za-z0-9+/=]{1,128}+(?=[ \t]*(?:\r?\n|$))"
          r"(?:[ \t]*\r?\n[A-Za-z0-9+/=]{1,128}+(?=[ \t]*(?:\r?\n|$))){0,255})",
          keywords=("private-lines:",)),
    # Mistral keys have no prefix: only the variable they are assigned to gives them away.
    _rule("mistral_key",
          r"""MISTRAL_API_KEY(?<=\bMISTRAL_API_KEY)["']?[ \t]*[:=][ \t]*["']?(?P<secret>[A-Za-z0-9]{20,})""",
          keywords=("mistral_api_key",)),
    # scheme://user:PASSWORD@host keeps the user (useful context) and drops the password; the user may be empty
    # (redis://:PASSWORD@host).
    _rule("url_password", r"://[^\s:/@]{0,256}:(?P<secret>[^\s@/]{1,512})@",
          _url_password, keywords=("://",)),
    # Go's database/sql DSN: user:PASSWORD@tcp(host:3306)/db (also unix(...)).
    _rule("url_password",
          r"(?<![A-Za-z0-9_.-])[A-Za-z0-9_.-]{1,64}:(?P<secret>[^\s:@/()'\"]{1,256})@(?:tcp|tcp6|unix|udp)\(",
          _url_password, keywords=("@tcp(", "@tcp6(", "@unix(", "@udp(")),
    _rule("basic_auth",
          r"(?i:\b(?:proxy-)?authorization[\"']?[ \t]*[:=][ \t]*[\"']?basic[ \t]+)"
          r"(?P<secret>[A-Za-z0-9+/_-]{4,}+={0,2})(?!:)",
          keywords=("authorization",)),
    _rule("bearer_token", r"\b[Bb]earer\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)", keywords=("bearer",)),
    _rule("token", r"(?i:\bauthorization[\"']?[ \t]*[:=][ \t]*[\"']?token[ \t]+)(?P<secret>[A-Za-z0-9._~+/-]{8,}=*)",
          keywords=("authorization",)),
    # .netrc: machine HOST [login USER] [account A] password PW (on one line or several); "default" too.
    _rule("password",
          r"(?:machine(?<=\bmachine)[ \t]+[^\s]{1,256}|default(?<=\bdefault))"
          r"(?:\s{1,64}(?:login|account)[ \t]+[^\s]{1,256}){0,2}\s{1,64}password[ \t]+(?P<secret>[^\s]{1,256})",
          lambda value, match: _plain_value(value), keywords=("machine", "default")),
    # Docker config.json: {"auths": {"registry": {"auth": "base64(user:password)"}}}
    _rule("docker_auth", r"\"auth\"[ \t]*:[ \t]*\"(?P<secret>[A-Za-z0-9+/]{4,}={0,2})\"", _docker_auth,
          keywords=('"auth"',)),
    # .pgpass: host:port:database:user:PASSWORD
    _rule("password",
          r"(?m:^[A-Za-z0-9.*_-]{1,253}:(?:\d{1,5}|\*):[^:\s]{1,64}:[^:\s]{1,64}:(?P<secret>[^\s]{1,256})$)",
          guard=(re.compile(r":(?:\d{1,5}|\*):[^:\s]{1,64}:[^:\s]{1,64}:[^\s]"),)),
    # Command lines: curl -u user:PASSWORD, sshpass -p PASSWORD, mysql -pPASSWORD, redis-cli -a PW, --password PW
    _rule("password",
          r"""-(?<=\s-)(?:u|-user)(?:[ \t]+|=)?["']?[^\s:"'`]{1,256}:(?P<secret>[^\s"'`]{1,256})""",
          _user_password, keywords=("-u", "--user")),
    _rule("password",
          r"""-(?<=\s-)(?P<flag>p|a|-password)(?P<sp>[ \t]+)?["']?(?P<secret>[^\s"'`]{1,256})""",
          _cli_password, keywords=("-p", "-a", "--password")),
)

# ------------------------------------------------------------------------------------- named assignments

# One regex for the three forms, tried in this order at each name: a quoted value after ":" or "=" (group
# "secret"), an unquoted value after "=" ("plain"), an unquoted value after ":" ("colon"). The lookaheads refuse,
# inside the regex engine, values that _plain_value and _colon_value would refuse for their length or shape: on
# text dense with names and no values that saves a Python call per name.
_ASSIGNMENTS: tuple[_Rule, ...] = (
    _rule(
        _assignment_kind,
        rf"""(?i:{_KEY})[ \t]*(?:[:=][ \t]*(?P<oq>["'])(?P<secret>(?:(?!(?P=oq))[^\\\n]|\\.)*)(?P=oq)"""
        rf"""|=(?!=)[ \t]*(?=[^\s"'`,;&]{{4}})(?P<plain>[^\s"'`,;&]+)"""
        rf"""|:[ \t]*(?=[^\s"'`,;&]{{16}}|[^\s"'`,;&]{{0,15}}?[\d!@#$%^&*+=/_~-])(?P<colon>[^\s"'`,;&]+))""",
        _assignment_accepts,
        _ASSIGNMENT_GUARD,
        keywords=_STEMS,
    ),
)

_RULES: tuple[_Rule, ...] = (*load_token_rules(), *_STRUCTURAL, *_ASSIGNMENTS)


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
    # keyword); where it runs is decided on the current text, lower-cased again only after a redaction.
    lowered = _Lowered(text)
    present = _keywords().present(lowered.text)
    for rule in _RULES:
        if rule.keywords and present.isdisjoint(rule.keywords):
            continue
        before = sum(counts.values())
        text = _apply(rule, text, lowered, counts)
        if sum(counts.values()) != before:
            lowered = _Lowered(text)
    return text, ScrubReport(counts)


class _KeywordIndex:
    """Which of a fixed set of lower-case keywords occur in a text."""

    def __init__(self, keywords: Iterable[str]) -> None:
        self.keywords = sorted(set(keywords))
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
    return _KeywordIndex(keyword for rule in _RULES for keyword in rule.keywords)


class _Lowered:
    """The lower-cased text, and the spans found in it, shared by the rules until a redaction changes the text."""

    def __init__(self, text: str) -> None:
        self.text = text.lower()
        #: positions line up with the original (a few characters lower-case to two and would shift them)
        self.aligned = len(self.text) == len(text)
        self.spans: dict[Any, list[tuple[int, int]]] = {}


#: a keyword's span runs from the start of its line to the end of the line this far after it (multi-line
#: forms such as .netrc entries and PuTTY keys follow their keyword); spans closer than this merge into one
_KEYWORD_REACH = 4096


def _keyword_spans(text: str, lowered: str, keywords: tuple[str, ...]) -> list[tuple[int, int]]:
    """The (start, end) of the stretches of ``text`` where one of ``keywords`` occurs in ``lowered``.

    Each keyword is searched for once per position it can next occur at, and the search resumes past the span
    just taken, so this is one pass over the text per keyword, however many times the keywords occur."""
    upcoming = {keyword: lowered.find(keyword) for keyword in keywords}
    spans: list[tuple[int, int]] = []
    pos = 0
    while True:
        for keyword, at in upcoming.items():
            if 0 <= at < pos:
                upcoming[keyword] = lowered.find(keyword, pos)
        found = [at for at in upcoming.values() if at >= 0]
        if not found:
            return spans
        at = min(found)
        start = text.rfind("\n", pos, at) + 1 if spans else text.rfind("\n", 0, at) + 1
        end = text.find("\n", min(at + _KEYWORD_REACH, len(text)))
        end = len(text) if end == -1 else end
        if spans and start <= spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
        pos = end


def _apply(rule: _Rule, text: str, lowered: _Lowered, counts: dict[str, int]) -> str:
    redact = functools.partial(_redact, rule=rule, counts=counts)
    spans: list[tuple[int, int]] | None = None
    if lowered.aligned and rule.guard:
        spans = lowered.spans.get(rule.guard)
        if spans is None:
            spans = lowered.spans[rule.guard] = _merged(
                [span for guard in rule.guard for span in _guarded_lines(guard, text, lowered.text)]
            )
    elif lowered.aligned and rule.keywords and not rule.literal_start:
        spans = lowered.spans.get(rule.keywords)
        if spans is None:
            spans = lowered.spans[rule.keywords] = _keyword_spans(text, lowered.text, rule.keywords)
    if spans is None:
        return rule.pattern.sub(redact, text)
    pieces, last = [], 0
    for start, end in spans:
        pieces += [text[last:start], rule.pattern.sub(redact, text[start:end])]
        last = end
    pieces.append(text[last:])
    return "".join(pieces)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` in order, overlapping or adjacent ones joined."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(end, out[-1][1]))
        else:
            out.append((start, end))
    return out


def _guarded_lines(guard: re.Pattern[str], text: str, lowered: str) -> list[tuple[int, int]]:
    """The (start, end) of the lines ``guard`` finds in ``lowered``, in order, adjacent lines merged."""
    spans: list[tuple[int, int]] = []
    pos = 0
    # The next search starts after the line just taken: every scan (and the rfind back to the line start) covers
    # new text only, so a long line with many hits costs one pass, not one pass back per hit.
    while (match := guard.search(lowered, pos)) is not None:
        start = text.rfind("\n", pos, match.start()) + 1
        end = text.find("\n", match.end())
        end = len(text) if end == -1 else end
        if spans and start <= spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], end)
        else:
            spans.append((start, end))
        pos = end
    return spans


_VALUE_GROUPS = ("secret", "plain", "colon")


def _redact(match: re.Match[str], rule: _Rule, counts: dict[str, int]) -> str:
    group: str | int = 0
    for name in rule.value_groups:
        if match.group(name) is not None:
            group = name
            break
    value = match.group(group)
    if value.startswith(PLACEHOLDER_PREFIX) or PLACEHOLDER_PREFIX in value or not rule.accept(value, match):
        return match.group(0)
    kind = rule.kind_of(match)
    counts[kind] = counts.get(kind, 0) + 1
    if group == 0:
        return _placeholder(kind)
    text, (start, end) = match.string, match.span(group)
    return text[match.start():start] + _placeholder(kind) + text[end:match.end()]


@functools.lru_cache(maxsize=256)
def _placeholder(kind: str) -> str:
    return f"{PLACEHOLDER_PREFIX}{kind.upper()}]"


__all__ = ["PROVIDER_KEY", "ScrubReport", "load_token_rules", "scrub"]
