"""Writing a result to stdout in the configured ``output.format``: markdown, json (JSON-LD) or both."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, TextIO

from conclave.render.jsonld import to_jsonld
from conclave.render.markdown import render_markdown

OutputFormat = Literal["markdown", "json", "both"]


def print_result(result: Mapping[str, Any], fmt: OutputFormat, stream: TextIO) -> None:
    """Write ``result`` to ``stream``: Markdown (styled by rich on a terminal, plain text otherwise), JSON-LD,
    or both separated by a ``---`` line."""
    if fmt not in ("markdown", "json", "both"):
        raise ValueError(f"output.format: {fmt!r} is not one of markdown, json, both")
    if fmt in ("markdown", "both"):
        _print_markdown(render_markdown(result), stream)
    if fmt == "both":
        stream.write("---\n")
    if fmt in ("json", "both"):
        stream.write(json.dumps(to_jsonld(result), indent=2, ensure_ascii=False) + "\n")
    stream.flush()


def _print_markdown(text: str, stream: TextIO) -> None:
    if not _is_tty(stream):
        stream.write(text)
        return
    from rich.console import Console  # imported only for a terminal: rich costs ~100 ms to import
    from rich.markdown import Markdown

    Console(file=stream, soft_wrap=False).print(Markdown(text))


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or file-like objects without isatty
        return False


__all__ = ["OutputFormat", "print_result"]
