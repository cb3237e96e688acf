"""A tiny document model shared by every view: renderers build nodes once; Markdown, HTML, the terminal and the
Datasette pages serialise the same nodes. A view never formats an artifact itself.

Nodes are plain dataclasses; text is never pre-escaped (each serialiser escapes for its own format): the Markdown
serialiser turns ``<`` and ``&`` into character references, because Markdown viewers render raw HTML, and points
``javascript:``/``vbscript:``/``data:`` link targets nowhere; other Markdown (emphasis, lists, https links) stays.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Union

Tone = Literal["info", "warn", "danger", "ok"]


@dataclass(frozen=True)
class Section:
    """A titled part of a document; ``level`` 2 is a top-level section of the report (``##``)."""

    title: str
    children: Sequence[Node] = ()
    level: int = 2
    anchor: str = ""


@dataclass(frozen=True)
class Card:
    """One participant's contribution (an agent's answer, the judge's artifact): a box in HTML, a sub-heading in
    Markdown."""

    title: str
    children: Sequence[Node] = ()
    subtitle: str = ""
    level: int = 3
    tone: Tone | None = None


@dataclass(frozen=True)
class Para:
    text: str
    label: str = ""  # shown bold before the text ("Position:")
    muted: bool = False  # an aside ("None: the cross-examination left nothing unresolved.")


@dataclass(frozen=True)
class Bullets:
    items: Sequence[str]
    label: str = ""
    ordered: bool = False


@dataclass(frozen=True)
class Facts:
    """Label/value pairs, one per line (``- **Pros:** …``)."""

    pairs: Sequence[tuple[str, str]]


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[str]]
    numeric: frozenset[int] = field(default_factory=frozenset)  # right-aligned columns


@dataclass(frozen=True)
class Note:
    """A call-out: a status banner, a notice about early termination."""

    text: str
    tone: Tone = "info"
    label: str = ""
    icon: str = ""


@dataclass(frozen=True)
class Raw:
    """Pre-built content per format (an SVG chart for HTML, its text fallback for Markdown)."""

    html: str
    markdown: str = ""


Node = Union[Section, Card, Para, Bullets, Facts, Table, Note, Raw]  # noqa: UP007 - a runtime alias


def one_line(text: object) -> str:
    return " ".join(str(text).split())


# ------------------------------------------------------------------------------------------------ Markdown


def to_markdown(nodes: Iterable[Node]) -> str:
    """The nodes as Markdown, blocks separated by blank lines, ending with a newline."""
    blocks = [b for b in (_md(n) for n in nodes) if b]
    return "\n\n".join(blocks) + "\n"


def _md(node: Node) -> str:
    if isinstance(node, Section | Card):
        title = _m(node.title + (f" ({node.subtitle})" if isinstance(node, Card) and node.subtitle else ""))
        inner = [b for b in (_md(c) for c in node.children) if b]
        return "\n\n".join([f"{'#' * node.level} {title}", *inner])
    if isinstance(node, Para):
        text = _m(node.text.strip())
        if node.muted and text:
            text = f"_{text}_"
        if node.label:
            return f"**{_m(node.label)}** {text}" if text else f"**{_m(node.label)}**"
        return text
    if isinstance(node, Bullets):
        body = "\n".join(f"{f'{n}.' if node.ordered else '-'} {_m(one_line(i))}" for n, i in enumerate(node.items, 1))
        return f"**{_m(node.label)}**\n\n{body}" if node.label else body
    if isinstance(node, Facts):
        return "\n".join(f"- **{_m(k)}:** {_m(one_line(v))}" for k, v in node.pairs)
    if isinstance(node, Table):
        head = "| " + " | ".join(_md_cell(h) for h in node.headers) + " |"
        rule = "| " + " | ".join("---:" if i in node.numeric else "---" for i in range(len(node.headers))) + " |"
        rows = ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in node.rows]
        return "\n".join([head, rule, *rows])
    if isinstance(node, Note):
        text = (f"{node.icon} " if node.icon else "") + (f"**{_m(node.label)}** " if node.label else "") + _m(node.text)
        return "\n".join(f"> {line}" if line else ">" for line in text.splitlines() or [""])
    if isinstance(node, Raw):
        return node.markdown
    raise TypeError(f"not a document node: {node!r}")


def _md_cell(text: str) -> str:
    return _m(one_line(text)).replace("|", "\\|")


# a link or image target (``](target``) or a link reference definition (``[label]: target``)
_LINK_TARGET = re.compile(r"(\]\(\s*|\]:[ \t]*\n?[ \t]*)([^\s)]+)")
_UNSAFE_SCHEMES = ("javascript:", "vbscript:", "data:")
_IGNORED_IN_SCHEME = re.compile(r"[\x00-\x20\\]")  # browsers drop controls and blanks; ``\:`` is an escaped colon


def _m(text: str) -> str:
    """Model text made inert for Markdown viewers: no raw HTML, no autolink, no script or data link target."""
    text = text.replace("&", "&amp;").replace("<", "&lt;")
    return _LINK_TARGET.sub(_safe_target, text)


def _safe_target(match: re.Match[str]) -> str:
    target = _IGNORED_IN_SCHEME.sub("", html.unescape(match.group(2))).lower()
    return match.group(1) + ("#unsafe-link-removed" if target.startswith(_UNSAFE_SCHEMES) else match.group(2))


# ------------------------------------------------------------------------------------------------ HTML


def to_html(nodes: Iterable[Node]) -> str:
    """The nodes as an HTML fragment (classes ``cv-*``, styled by ``conclave.css``)."""
    return "\n".join(_html(n) for n in nodes)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _slug(text: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in text.lower()).split())


def _html(node: Node) -> str:
    if isinstance(node, Section):
        level = min(max(node.level, 1), 6)
        anchor = node.anchor or _slug(node.title)
        inner = "\n".join(_html(c) for c in node.children)
        return (f'<section class="cv-section" id="{_e(anchor)}"><h{level}>{_e(node.title)}</h{level}>\n'
                f"{inner}</section>")
    if isinstance(node, Card):
        tone = f" cv-{node.tone}" if node.tone else ""
        sub = f' <span class="cv-sub">{_e(node.subtitle)}</span>' if node.subtitle else ""
        inner = "\n".join(_html(c) for c in node.children)
        return (f'<article class="cv-card{tone}"><h4 class="cv-card-title">{_e(node.title)}{sub}</h4>\n'
                f"{inner}</article>")
    if isinstance(node, Para):
        label = f"<strong>{_e(node.label)}</strong> " if node.label else ""
        cls = ' class="cv-muted"' if node.muted else ""
        return f"<p{cls}>{label}{_text(node.text)}</p>"
    if isinstance(node, Bullets):
        label = f'<p class="cv-label"><strong>{_e(node.label)}</strong></p>' if node.label else ""
        items = "".join(f"<li>{_e(one_line(i))}</li>" for i in node.items)
        tag = "ol" if node.ordered else "ul"
        return f"{label}<{tag}>{items}</{tag}>"
    if isinstance(node, Facts):
        rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(one_line(v))}</dd>" for k, v in node.pairs)
        return f'<dl class="cv-facts">{rows}</dl>'
    if isinstance(node, Table):
        head = "".join(f"<th{_num(i, node)}>{_e(h)}</th>" for i, h in enumerate(node.headers))
        body = "".join("<tr>" + "".join(f"<td{_num(i, node)}>{_e(c)}</td>" for i, c in enumerate(row)) + "</tr>"
                       for row in node.rows)
        return f'<div class="cv-table-wrap"><table class="cv-table"><thead><tr>{head}</tr></thead>' \
               f"<tbody>{body}</tbody></table></div>"
    if isinstance(node, Note):
        icon = f'<span class="cv-icon">{_e(node.icon)}</span> ' if node.icon else ""
        label = f"<strong>{_e(node.label)}</strong> " if node.label else ""
        return f'<div class="cv-note cv-{node.tone}">{icon}{label}{_text(node.text)}</div>'
    if isinstance(node, Raw):
        return node.html
    raise TypeError(f"not a document node: {node!r}")


def _num(index: int, table: Table) -> str:
    return ' class="cv-num"' if index in table.numeric else ""


def _text(text: str) -> str:
    """Escaped text whose blank-line-separated paragraphs become ``<br>`` breaks."""
    parts = [_e(p.strip()) for p in text.strip().split("\n\n")]
    return "<br><br>".join(p.replace("\n", "<br>") for p in parts)


__all__ = ["Bullets", "Card", "Facts", "Node", "Note", "Para", "Raw", "Section", "Table", "one_line", "to_html",
           "to_markdown"]
