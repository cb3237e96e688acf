"""Versioned prompt templates: a text file with a ``version:`` header, rendered with ``$name`` placeholders.

A template's id (``converge/round2@v1#sha256:…``) names the strategy, the template, its declared version and a
digest of its text, so the record shows exactly which words were sent even if someone edits a file without
bumping its version.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.resources
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from conclave.errors import ConclaveError

if TYPE_CHECKING:
    from conclave.engine.rounds import RoundType
    from conclave.engine.strategy import Strategy

_HEADER = re.compile(r"\A---\n(?P<meta>.*?)\n---\n", re.DOTALL)


class TemplateError(ConclaveError, LookupError):
    """A template is missing, has no version, or uses a placeholder its round does not provide."""


@dataclass(frozen=True)
class PromptTemplate:
    strategy: str
    name: str  # e.g. "round2"
    version: str  # from the file's header, e.g. "v1"
    text: str  # the body, header removed

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @property
    def id(self) -> str:
        return f"{self.strategy}/{self.name}@{self.version}#sha256:{self.sha256[:16]}"

    def render(self, **fields: str) -> str:
        """Substitute ``$field`` placeholders. Values are inserted verbatim (a ``$`` inside a question stays)."""
        try:
            return string.Template(self.text).substitute(fields)
        except KeyError as exc:
            raise TemplateError(
                f"template {self.strategy}/{self.name} uses ${exc.args[0]}, which this round does not provide; "
                f"available: {', '.join(sorted(fields))}"
            ) from None

    @classmethod
    def parse(cls, strategy: str, name: str, raw: str) -> PromptTemplate:
        match = _HEADER.match(raw)
        meta = dict(_meta_lines(match.group("meta"))) if match else {}
        if "version" not in meta:
            raise TemplateError(f"template {strategy}/{name} has no 'version:' header")
        body = raw[match.end() :] if match else raw
        return cls(strategy=strategy, name=name, version=meta["version"], text=body.strip() + "\n")


def _meta_lines(meta: str) -> list[tuple[str, str]]:
    pairs = []
    for line in meta.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs.append((key.strip(), value.strip()))
    return pairs



#: the placeholder of the earlier rounds' block (:mod:`conclave.quality.summarize`); a template without it gets
#: the block appended after its text
EARLIER_ROUNDS = "earlier_rounds"


def user_message(strategy: Strategy, round_type: RoundType, values: Mapping[str, str]) -> str:
    """The user message of one call: the strategy renders the round's template with ``values`` (the context
    window's: :meth:`conclave.quality.summarize.ContextWindow.prepare`), then the earlier rounds' block follows
    when the template has no ``$earlier_rounds`` of its own."""
    message = strategy.user_message(round_type, values)
    block = values.get(EARLIER_ROUNDS, "")
    if block and f"${EARLIER_ROUNDS}" not in strategy.template(round_type.template).text:
        message = f"{message.rstrip()}\n\n{block}"
    return message


@functools.cache
def load_template(package: str, directory: str, strategy: str, name: str) -> PromptTemplate:
    """Read ``<package>/<directory>/<name>.md`` (shipped as package data) as a template of ``strategy``."""
    resource = importlib.resources.files(package).joinpath(directory, f"{name}.md")
    try:
        raw = resource.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TemplateError(f"strategy {strategy!r}: no template {directory}/{name}.md in package {package}") from None
    return PromptTemplate.parse(strategy, name, raw)
