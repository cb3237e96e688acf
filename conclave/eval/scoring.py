r"""Scorers per item kind, and the canonical form that lets answers vote together ("42" and "42.0" are one vote).

- ``numeric``: the last number in the answer (thousands separators allowed) equals the expected one within a
  relative tolerance of 1e-6; "the answer is 42." scores as 42. GSM8K's ``#### 42`` and MATH's ``\boxed{42}`` are
  read first when present; units and currency are ignored ("12 m/s^2", "$1,200", "45%"), and ``3 × 10^8`` is 3e8.
- ``math``: MATH's answers — the content of the last ``\boxed{}`` (or the whole answer), compared as LaTeX with
  spacing, ``\left``/``\right``, ``\dfrac``/``\tfrac``, ``\text{}``, degree signs and surrounding ``$`` ignored;
  two plain numbers compare as numbers.
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
_GSM8K = re.compile(r"####\s*(.+?)\s*$", re.S)
_SCIENTIFIC = re.compile(r"(\d+(?:\.\d+)?)\s*(?:×|x|\*|\\times|\\cdot)\s*10\s*\^\s*\{?\s*([-−+]?\d+)\s*\}?")
#: an exponent written on a unit ("m/s^2", "cm²", "km^{3}"): not the answer's number
_UNIT_POWER = re.compile(r"(?<=[A-Za-z)])\s*\^\s*\{?[-−]?\d+\}?|[²³]")


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{…}`` (or ``\\fbox{…}``) in ``text``, braces balanced; None if none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    depth, begin = 0, text.index("{", start)
    for index in range(begin, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[begin + 1:index].strip()
    return None


def final_part(text: str) -> str:
    """What a worked answer concludes with: after GSM8K's last ``####``, else inside the last ``\\boxed{}``."""
    marked = _GSM8K.search(text)
    if marked and "####" not in marked.group(1):
        return marked.group(1)
    inner = boxed(text)
    return text if inner is None else inner


def parse_number(text: str) -> float | None:
    """The number ``text`` ends with (see the module's ``numeric``); None when there is none."""
    text = final_part(text).replace("−", "-")
    text = _SCIENTIFIC.sub(lambda m: f"{m.group(1)}e{m.group(2)}", text)
    text = _UNIT_POWER.sub("", text)
    found = _NUMBER.findall(text)
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


def math_form(text: str) -> str | None:
    """MATH's comparable form of an answer (see the module's ``math``); None when nothing is left."""
    form = final_part(text).strip().strip("$").strip()
    form = re.sub(r"\\text\{\s*([^{}]*?)\s*\}|\\mathrm\{\s*([^{}]*?)\s*\}", lambda m: m.group(1) or m.group(2) or "",
                  form)
    form = re.sub(r"\\left|\\right|\\[,;:! ]|\\displaystyle", "", form)
    form = re.sub(r"\\[dt]frac", r"\\frac", form)
    form = re.sub(r"\^\s*\{?\\circ\}?|°", "", form)
    form = "".join(form.split()).rstrip(".")
    if re.fullmatch(r"[-+]?\d[\d,]*(?:\.\d+)?", form):
        value = float(form.replace(",", ""))
        return str(int(value)) if value == int(value) else repr(value)
    return form or None


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
    if kind == "math":
        return math_form(answer)
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
