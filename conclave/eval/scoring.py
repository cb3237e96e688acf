"""Scorers per item kind, and the canonical form that lets answers vote together ("42" and "42.0" are one vote).

- ``numeric``: the last number in the answer (thousands separators allowed) equals the expected one within a
  relative tolerance of 1e-6; "the answer is 42." scores as 42.
- ``choice``: a choice letter (``B``, ``(b)``, ``B.``) or the text of a choice; scored by index.
- ``yes_no``: the first word, yes/true or no/false.
- ``exact``: case, surrounding whitespace and punctuation, and inner runs of whitespace are ignored.
An answer that cannot be read as its kind (no number, no known choice) is wrong and has no canonical form.
"""

from __future__ import annotations

import math
import re
import string
from typing import Any

_NUMBER = re.compile(r"[-+−]?\d[\d,]*(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+−]?\.\d+")
_LETTER = re.compile(r"^\(?([A-Za-z])[).:]?$")
_STRIP = string.whitespace + string.punctuation.replace("-", "").replace("+", "")


def parse_number(text: str) -> float | None:
    """The last number in ``text``; None when there is none."""
    found = _NUMBER.findall(text.replace("−", "-"))
    if not found:
        return None
    try:
        value = float(found[-1].replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def choice_index(text: str, choices: list[str]) -> int | None:
    """Index of the choice ``text`` names, by letter (A = 0) or by its text; None when it names none."""
    text = text.strip()
    letter = _LETTER.match(text)
    if letter:
        index = ord(letter.group(1).upper()) - ord("A")
        return index if 0 <= index < len(choices) else None
    wanted = normalise(text)
    for index, choice in enumerate(choices):
        if normalise(choice) == wanted:
            return index
    # "B) Paris" or "B. Paris": a letter followed by that choice's text
    head = re.match(r"^\(?([A-Za-z])[).:]\s+(.*)$", text)
    if head:
        index = ord(head.group(1).upper()) - ord("A")
        if 0 <= index < len(choices) and normalise(head.group(2)) == normalise(choices[index]):
            return index
    return None


def yes_no(text: str) -> str | None:
    word = re.match(r"[a-z]+", normalise(text))
    if not word:
        return None
    first = word.group(0)
    if first in ("yes", "true", "y"):
        return "yes"
    if first in ("no", "false", "n"):
        return "no"
    return None


def normalise(text: str) -> str:
    return " ".join(text.strip().strip(_STRIP).casefold().split())


def canonical(answer: str | None, kind: str, choices: list[str] | None = None) -> str | None:
    """The form answers are compared and counted in; None when ``answer`` cannot be read as ``kind``."""
    if answer is None or not str(answer).strip():
        return None
    answer = str(answer)
    if kind == "numeric":
        value = parse_number(answer)
        if value is None:
            return None
        return str(int(value)) if value == int(value) and abs(value) < 1e15 else repr(value)
    if kind == "choice":
        index = choice_index(answer, list(choices or []))
        return None if index is None else chr(ord("A") + index)
    if kind == "yes_no":
        return yes_no(answer)
    return normalise(answer) or None


def is_correct(answer: str | None, item: Any) -> bool:
    """Whether ``answer`` is right for ``item`` (an :class:`~conclave.eval.items.Item` or its dict)."""
    get = item.get if isinstance(item, dict) else lambda k, d=None: getattr(item, k, d)
    kind, expected, choices = get("kind", "exact"), str(get("answer")), list(get("choices") or [])
    if answer is None:
        return False
    if kind == "numeric":
        got, want = parse_number(str(answer)), parse_number(expected)
        return got is not None and want is not None and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
    ours = canonical(answer, kind, choices)
    return ours is not None and ours == canonical(expected, kind, choices)
