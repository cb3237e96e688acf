"""Writing a result to stdout in the configured ``output.format``: markdown, json (JSON-LD), both, or html (one
self-contained HTML document)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

from conclave.errors import ConclaveError
from conclave.render.html import render_html
from conclave.render.jsonld import to_jsonld
from conclave.render.markdown import render_markdown
from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout

OutputFormat = Literal["markdown", "json", "both", "html"]
FORMATS = ("markdown", "json", "both", "html")

#: set once per Hydra job by the CLI (not the engine): where the journal lives, and the label of a sweep job
_report_home: Path | None = None
_sweep_label: dict[str, str] = {}


def set_report_context(home: Path | None, sweep_overrides: Mapping[str, str] | None = None) -> None:
    """Where ``print_result`` finds the journal (for cost by round and retries), and the override values that label
    this result in a ``-m`` sweep (empty outside a sweep)."""
    global _report_home, _sweep_label
    _report_home = home
    _sweep_label = dict(sweep_overrides or {})


def sweep_label(overrides: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items())


def _journal_records(result: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    cid = result.get("consultation_id")
    if _report_home is None or not isinstance(cid, str):
        return None

    try:
        path = StoreLayout(_report_home).journal_path(cid)
        return read_records(path) if path.exists() else None
    except (OSError, ConclaveError):
        return None  # the report still prints from the result alone


def print_result(result: Mapping[str, Any], fmt: OutputFormat, stream: TextIO,
                 records: Sequence[Mapping[str, Any]] | None = None) -> None:
    """Write ``result`` to ``stream``: Markdown (styled by rich on a terminal, plain text otherwise), JSON-LD,
    both separated by a ``---`` line, or a self-contained HTML document. In a sweep each result is labelled with
    its override values (a ``sweep`` key in JSON)."""
    if fmt not in FORMATS:
        raise ValueError(f"output.format: {fmt!r} is not one of {', '.join(FORMATS)}")
    if records is None and fmt != "json":  # the journal's records add detail to the report; JSON-LD has none
        records = _journal_records(result)
    label = sweep_label(_sweep_label)
    if fmt == "html":
        stream.write(render_html(result, records, label=label))
    if fmt in ("markdown", "both"):
        _print_markdown(render_markdown(result, records, label=label), stream)
    if fmt == "both":
        stream.write("---\n")
    if fmt in ("json", "both"):
        document = to_jsonld(result)
        if _sweep_label:
            document["sweep"] = dict(_sweep_label)
        stream.write(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
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


__all__ = ["FORMATS", "OutputFormat", "print_result", "set_report_context", "sweep_label"]
