"""What the index keeps of an artifact: its gist, not its full text (issue 28: the full texts stay in the journal).

The ``artifacts.artifact`` column holds :func:`gist`: every top-level scalar field (long texts clipped), every
top-level list with all its items (so counts stay right) but each item reduced to its scalar fields with short
clipped texts, and a verdict's ``dissent`` with longer concerns (the ``dissent_log`` view reads it). Table cells
render their brief from it and link to the transcript, which reads the journal for the full artifact.
"""

from __future__ import annotations

from typing import Any

#: clip lengths, in characters: a top-level text, a text inside a list item, a dissent entry's text
TOP_CHARS = 160
ITEM_CHARS = 60
DISSENT_CHARS = 300
MARK = "…"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + MARK


def _scalars(item: dict[str, Any], limit: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in item.items():
        if isinstance(value, str):
            out[key] = _clip(value, limit)
        elif not isinstance(value, dict | list):
            out[key] = value
    return out


def _item(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return _clip(value, limit)
    if isinstance(value, dict):
        return _scalars(value, limit)
    return None if isinstance(value, list) else value


def gist(artifact: Any) -> Any:
    """The part of ``artifact`` (a parsed artifact) that the index keeps; anything not a dict is kept as is."""
    if not isinstance(artifact, dict):
        return artifact
    out: dict[str, Any] = {}
    for key, value in artifact.items():
        if isinstance(value, str):
            out[key] = _clip(value, TOP_CHARS)
        elif isinstance(value, list):
            limit = DISSENT_CHARS if key == "dissent" else ITEM_CHARS
            out[key] = [_item(v, limit) for v in value]
        elif isinstance(value, dict):
            out[key] = _scalars(value, TOP_CHARS)
        else:
            out[key] = value
    return out
