"""Evaluation items: a JSONL set ``{id, question, answer, choices?, kind}``, a benchmark file read through a column
map (CSV, Parquet, a ``datasets`` dataset saved to disk: :mod:`conclave.eval.sources`), or a built-in generator.

Generators are seeded and offline: ``arithmetic`` (Du et al. 2023: ``a+b*c+d-e*f`` with integers below 30) and
``gym:<task>`` (a procedural task of the ``reasoning-gym`` package, installed with the ``eval`` extra).
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from conclave.errors import UsageError
from conclave.eval.scoring import choice_index
from conclave.extras import install_hint

Kind = Literal["exact", "numeric", "choice", "yes_no", "math"]
KINDS: tuple[str, ...] = ("exact", "numeric", "choice", "yes_no", "math")
#: the letters that name choices, A for the first; a multiple-choice item has at most this many
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
GENERATORS = ("arithmetic", "gym:<task>")
#: reasoning-gym tasks known to give short, exactly scorable answers (any other gym task may be named too)
GYM_TASKS = ("basic_arithmetic", "chain_sum", "leg_counting", "gcd", "word_sorting")


@dataclass(frozen=True)
class Item:
    """One question with its known answer; ``kind`` says how an answer is scored (:mod:`conclave.eval.scoring`)."""

    id: str
    question: str
    answer: str
    kind: Kind = "exact"
    choices: list[str] = field(default_factory=list)

    @property
    def letters(self) -> list[str]:
        """The letters naming this item's choices (A, B, …); empty for an item without choices."""
        return list(LETTERS[:len(self.choices)])

    @property
    def prompt(self) -> str:
        """What the panel is asked: the question, and for a multiple-choice item its lettered options."""
        if not self.choices:
            return self.question
        options = "\n".join(f"{letter}. {choice}" for letter, choice in zip(self.letters, self.choices, strict=True))
        return (f"{self.question}\n\nOptions:\n{options}\n\n"
                f"Answer with the letter of one option ({self.letters[0]}–{self.letters[-1]}).")

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if not self.choices:
            data.pop("choices")
        return data


def load_set(spec: str, *, n: int, seed: int) -> list[Item]:
    """The items of ``spec``: a ``.jsonl`` file (its first ``n`` items; ``n=0`` = all) or a generator (``n`` items
    from ``seed``). Raises :class:`UsageError` naming what is wrong."""
    if spec == "arithmetic":
        return arithmetic(n or 20, seed)
    if spec.startswith("gym:"):
        return reasoning_gym(spec[4:], n or 20, seed)
    path = Path(spec).expanduser()
    if path.suffix == ".jsonl" or path.exists():
        items = read_jsonl(path)
        return items[:n] if n else items
    raise UsageError(f"eval set {spec!r}: not a file nor a generator; allowed: a path to a .jsonl, .csv, .parquet "
                     "or .arrow file or a saved dataset directory, "
                     f"{', '.join(GENERATORS)} (gym tasks such as {', '.join(GYM_TASKS)})")


def read_jsonl(path: Path) -> list[Item]:
    """Parse and check a JSONL set; the first bad line is reported with its number and the key at fault."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"eval set {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"eval set {str(path)!r}: not UTF-8 text (byte 0x{exc.object[exc.start:exc.start + 1].hex()} "
                         f"at offset {exc.start}); save it as UTF-8") from None
    items: list[Item] = []
    seen: set[str] = set()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not JSON ({exc.msg})") from None
        item = item_from_dict(data, where)
        if item.id in seen:
            raise UsageError(f"{where}: id: {item.id!r} is used twice; every item needs its own id")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise UsageError(f"eval set {str(path)!r}: no items")
    return items


def item_from_dict(data: Any, where: str) -> Item:
    if not isinstance(data, dict):
        raise UsageError(f"{where}: an item is a JSON object with keys id, question, answer, kind, choices")
    unknown = sorted(set(data) - {"id", "question", "answer", "kind", "choices"})
    if unknown:
        raise UsageError(f"{where}: {unknown[0]}: unknown key; allowed: id, question, answer, kind, choices")
    for key in ("id", "question", "answer"):
        value = data.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and key != "question":
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            raise UsageError(f"{where}: {key}: required, a non-empty string")
    kind = data.get("kind", "exact")
    if kind not in KINDS:
        raise UsageError(f"{where}: kind: {kind!r} is not one of: {', '.join(KINDS)}")
    choices = data.get("choices") or []
    if not isinstance(choices, list) or not all(isinstance(c, str) and c.strip() for c in choices):
        raise UsageError(f"{where}: choices: a list of non-empty strings")
    if kind == "choice" and not 2 <= len(choices) <= len(LETTERS):
        raise UsageError(f"{where}: choices: kind 'choice' needs 2 to {len(LETTERS)} choices, got {len(choices)}")
    answer = str(data["answer"]).strip()
    if kind == "choice":
        index = choice_index(answer, choices)
        if index is None:
            raise UsageError(f"{where}: answer: {answer!r} is neither a choice letter nor one of the choices")
        answer = LETTERS[index]  # the gold letter: what the constrained answer schema allows
    if kind == "yes_no" and answer.lower() not in ("yes", "no"):
        raise UsageError(f"{where}: answer: kind 'yes_no' needs 'yes' or 'no', got {answer!r}")
    if kind == "numeric":
        try:
            float(answer.replace(",", ""))
        except ValueError:
            raise UsageError(f"{where}: answer: kind 'numeric' needs a number, got {answer!r}") from None
    return Item(id=str(data["id"]).strip(), question=data["question"], answer=answer, kind=kind, choices=choices)


def arithmetic(n: int, seed: int) -> list[Item]:
    """Du et al.'s arithmetic items ``a+b*c+d-e*f``, six integers drawn uniformly from 0..29 (seeded)."""
    rng = random.Random(f"arithmetic:{seed}")
    items = []
    for i in range(n):
        a, b, c, d, e, f = (rng.randrange(30) for _ in range(6))
        question = (f"What is the result of {a}+{b}*{c}+{d}-{e}*{f}? "
                    "Give the final answer as a single integer.")
        items.append(Item(id=f"arith-{seed}-{i}", question=question, answer=str(a + b * c + d - e * f),
                          kind="numeric"))
    return items


def reasoning_gym(task: str, n: int, seed: int) -> list[Item]:
    """``n`` items of reasoning-gym's ``task`` (procedural, offline). Answers that parse as numbers are scored as
    numbers, others exactly."""
    try:
        import reasoning_gym as gym
    except ImportError:
        raise UsageError(f"eval set 'gym:…' needs reasoning-gym: {install_hint('eval')}") from None
    try:
        dataset = gym.create_dataset(task, size=n, seed=seed)
    except Exception as exc:
        raise UsageError(f"eval set 'gym:{task}': {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} "
                         f"(tasks that score well: {', '.join(GYM_TASKS)})") from None
    items = []
    for i, entry in enumerate(dataset):
        answer = str(entry["answer"]).strip()
        try:
            float(answer.replace(",", ""))
            kind: Kind = "numeric"
        except ValueError:
            kind = "exact"
        items.append(Item(id=f"gym-{task}-{seed}-{i}", question=str(entry["question"]), answer=answer, kind=kind))
    return items
