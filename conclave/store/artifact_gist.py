"""What the index keeps of an artifact: its gist, not its full text (issue 28: the full texts stay in the journal).

The ``artifacts.artifact`` column holds :func:`gist`:

- every top-level scalar field, texts clipped to :data:`TOP_CHARS` (positions, recommendations, confidence,
  votes: what a table cell's brief shows and what a query filters on), except :data:`ON_THE_ROW`, which the
  artifact's row holds in its own columns or no reader of the index asks for;
- every top-level list with all its items, so its length stays right (briefs count consensus points,
  challenges, options), but each item reduced: a text to the empty string except the first, which a brief may
  name (clipped to :data:`ITEM_CHARS`), a mapping to its number and boolean fields;
- in full (texts clipped), the lists queries and briefs read item by item: :data:`KEPT_LISTS` (a verdict's
  ``dissent``, which the ``dissent_log`` view reads; an exploratory verdict's options, which its brief names).

Table cells render their brief from it and link to the transcript, which reads the full artifact from the journal.
"""

from __future__ import annotations

from typing import Any

#: clip lengths, in characters: a top-level text, a text inside a list item
TOP_CHARS = 160
ITEM_CHARS = 60
#: lists kept item by item, and the clip length of their texts
KEPT_LISTS = {"dissent": 300, "recommendations": ITEM_CHARS}
MARK = "…"
#: top-level fields the gist leaves out: the row's artifact_type, round_number, agent and schema columns say them,
#: and a renderer skips them (about 140 bytes of each artifact's gist)
ON_THE_ROW = frozenset({"artifact_type", "round_number", "agent_id", "schema_version", "created_at"})
#: parsed JSON holds exactly these classes (no subclasses): containers, and what an item without texts drops
_CONTAINERS = frozenset({dict, list})
_DROPPED = frozenset({dict, list, str})


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + MARK


def _scalars(item: dict[str, Any], limit: int | None) -> dict[str, Any]:
    """``item``'s scalar fields; its texts clipped to ``limit``, or dropped when ``limit`` is None."""
    if limit is None:
        return {k: v for k, v in item.items() if v.__class__ not in _DROPPED}
    return {k: (v if len(v) <= limit else v[: limit - 1] + MARK) if v.__class__ is str else v
            for k, v in item.items() if v.__class__ not in _CONTAINERS}


def _items(values: list[Any], limit: int | None) -> list[Any]:
    out: list[Any] = []
    append = out.append
    for value in values:
        cls = value.__class__
        if cls is str:
            append(_clip(value, ITEM_CHARS) if limit is not None or not out else "")
        elif cls is dict:
            append(_scalars(value, limit))
        else:
            append(None if cls is list else value)
    return out


def gist(artifact: Any) -> Any:
    """The part of ``artifact`` (a parsed artifact) that the index keeps; anything not a dict is kept as is."""
    if artifact.__class__ is not dict:
        return artifact
    out: dict[str, Any] = {}
    for key, value in artifact.items():
        if key in ON_THE_ROW:
            continue
        cls = value.__class__
        if cls is str:
            out[key] = value if len(value) <= TOP_CHARS else value[: TOP_CHARS - 1] + MARK
        elif cls is list:
            out[key] = _items(value, KEPT_LISTS.get(key))
        elif cls is dict:
            out[key] = _scalars(value, TOP_CHARS)
        else:
            out[key] = value
    return out
