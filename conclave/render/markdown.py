"""The Markdown report of one consultation result (``output.format=markdown``, ``conclave show``).

The layout is :func:`conclave.render.report.build_report`'s; this module only serialises it to Markdown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from conclave.render.nodes import to_markdown
from conclave.render.report import build_report, summary_line


def render_markdown(result: Mapping[str, Any], records: Sequence[Mapping[str, Any]] | None = None, *,
                    only_round: int | None = None, label: str = "") -> str:
    """The whole report as Markdown text, ending with a newline (``records``: the journal, when at hand)."""
    return to_markdown(build_report(result, records, only_round=only_round, label=label))


__all__ = ["render_markdown", "summary_line"]
