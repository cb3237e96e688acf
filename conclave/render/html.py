"""The report as one self-contained HTML file (``output.format=html``, ``conclave show --format html``): the same
nodes as the Markdown report, with the stylesheet inlined, so the file opens anywhere without a network."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from conclave.render.nodes import to_html
from conclave.render.report import build_report


@cache
def stylesheet() -> str:
    """The stylesheet every conclave page uses (also served by the Datasette plugin)."""
    return (resources.files("conclave.render") / "assets" / "conclave.css").read_text(encoding="utf-8")


def report_fragment(result: Mapping[str, Any], records: Sequence[Mapping[str, Any]] | None = None, *,
                    only_round: int | None = None, label: str = "") -> str:
    """The report as an HTML fragment (``<div class="cv-report">``), for embedding in another page."""
    body = to_html(build_report(result, records, only_round=only_round, label=label))
    return f'<div class="cv-report">\n{body}\n</div>'


def render_html(result: Mapping[str, Any], records: Sequence[Mapping[str, Any]] | None = None, *,
                only_round: int | None = None, label: str = "") -> str:
    """A complete HTML document: no external stylesheet, script, font or image."""
    question = " ".join(str(result.get("question") or "consultation").split())
    title = f"conclave · {question[:80]}"
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{html.escape(title)}</title>\n<style>\nbody {{ margin: 2em auto; padding: 0 1.5em; "
        f"max-width: 1100px; }}\n{stylesheet()}</style>\n</head>\n<body>\n"
        f"{report_fragment(result, records, only_round=only_round, label=label)}\n</body>\n</html>\n"
    )


__all__ = ["render_html", "report_fragment", "stylesheet"]
