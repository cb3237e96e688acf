"""Benchmark files the user already has, read through a column map: JSONL, CSV, Parquet, and a Hugging Face
``datasets`` dataset saved to disk (``Dataset.save_to_disk``: Arrow files in a directory). Nothing is downloaded.

``eval.columns`` names the file's column for each field (``question``, ``answer``, ``choices``, ``id``); a dotted
name reads inside a nested column (``mc1_targets.choices``); ``choices`` may also be a list of columns (GPQA's
``Correct Answer``, ``Incorrect Answer 1``, …). ``eval.answer_format`` says how the gold answer is written
(:data:`ANSWER_FORMATS`) and so how items are scored. Every row is checked before anything is spent: a missing
column, a gold answer not in its format, or choices without a gold letter is one line naming the file, the line (CSV,
JSONL) or row (Parquet, Arrow) and the field.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conclave.errors import ConfigError, UsageError
from conclave.eval.items import LETTERS, Item, Kind, load_set
from conclave.eval.scoring import boxed, math_form, parse_number
from conclave.extras import install_hint

#: how a gold answer is written, and the kind of scoring it implies
ANSWER_FORMATS: dict[str, str] = {
    "auto": "per row: choices → a letter, index or choice text; true/false → yes_no; '#### n' → gsm8k; "
            "'\\boxed{}' → boxed; a number → number; else plain",
    "plain": "text compared exactly (case, spacing, surrounding punctuation ignored)",
    "number": "a number, units and currency ignored ('12 cm', '$1,200', '45%')",
    "gsm8k": "GSM8K's worked solution ending '#### <number>'",
    "boxed": "a MATH solution; the content of its last \\boxed{} is the answer",
    "math": "a bare MATH answer in LaTeX ('\\frac{1}{2}', '(3, \\pi)')",
    "letter": "the letter of the right choice (A, B, …)",
    "index": "the 0-based index of the right choice",
    "labels": "a 0/1 label per choice with exactly one 1 (TruthfulQA's mc1_targets.labels)",
    "text": "the text of the right choice (GPQA's 'Correct Answer')",
    "yes_no": "yes/no or true/false (StrategyQA's boolean answer)",
}
FIELDS = ("question", "answer", "choices", "id")
TABLE_SUFFIXES = (".parquet", ".arrow")
KIND_OF: dict[str, Kind] = {"plain": "exact", "number": "numeric", "gsm8k": "numeric", "boxed": "math",
                            "math": "math", "letter": "choice", "index": "choice", "labels": "choice",
                            "text": "choice", "yes_no": "yes_no"}


@dataclass(frozen=True)
class SourceOptions:
    """How to read a benchmark file: its column map, the gold answers' format, a split, shuffled choices."""

    columns: Mapping[str, str | list[str] | None] = field(default_factory=dict)
    answer_format: str = "auto"
    split: str | None = None
    shuffle_choices: bool = False

    @property
    def mapped(self) -> bool:
        """Whether the user described the file (a native conclave JSONL set is read strictly otherwise)."""
        return any(v for v in self.columns.values()) or self.answer_format != "auto" or self.shuffle_choices

    def column(self, name: str) -> str | list[str]:
        given = self.columns.get(name)
        return given if given else name


def load(spec: str, *, n: int, seed: int, options: SourceOptions) -> list[Item]:
    """The items of ``spec`` (its first ``n``; 0 = all): a CSV, Parquet or Arrow file or a saved dataset, a JSONL
    file read through ``options`` when they describe it, else a native JSONL set or a generator
    (:func:`conclave.eval.items.load_set`)."""
    check_options(options)
    path = Path(spec).expanduser()
    if spec in ("arithmetic",) or spec.startswith("gym:"):
        if options.mapped:
            raise ConfigError(["eval.columns: a column map reads a file; the generator "
                               f"{spec!r} has no columns (leave eval.columns and eval.answer_format unset)"])
        return load_set(spec, n=n, seed=seed)
    if is_table(path) or path.suffix in (".csv", *TABLE_SUFFIXES) or (options.mapped and path.suffix == ".jsonl"):
        items = load_file(path, options, seed=seed)
        return items[:n] if n else items
    return load_set(spec, n=n, seed=seed)


def check_options(options: SourceOptions) -> None:
    """Configuration errors (exit 2) before any file is read."""
    unknown = sorted(set(options.columns) - set(FIELDS))
    if unknown:
        raise ConfigError([f"eval.columns.{unknown[0]}: unknown field; allowed: {', '.join(FIELDS)}"])
    for name, value in options.columns.items():
        if value is None or isinstance(value, str) or (
                name == "choices" and isinstance(value, list) and all(isinstance(v, str) for v in value)):
            continue
        allowed = "a column name or a list of column names" if name == "choices" else "a column name"
        raise ConfigError([f"eval.columns.{name}: {allowed}, got {value!r}"])
    if options.answer_format not in ANSWER_FORMATS:
        raise ConfigError([f"eval.answer_format: {options.answer_format!r} is not one of: "
                           f"{', '.join(ANSWER_FORMATS)}"])


def is_table(path: Path) -> bool:
    """A Parquet or Arrow file, or a directory written by ``datasets``' ``save_to_disk``."""
    return path.suffix in TABLE_SUFFIXES or (path.is_dir() and (
        (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()))


def load_file(path: Path, options: SourceOptions, *, seed: int) -> list[Item]:
    """Every item of the file at ``path``, checked row by row (the first bad one raises :class:`UsageError`)."""
    items: list[Item] = []
    seen: set[str] = set()
    for number, (where, row) in enumerate(rows(path, options), 1):
        item = item_from_row(row, where, options, number=number, stem=path.stem, seed=seed)
        if item.id in seen:
            raise UsageError(f"{where}: id: {item.id!r} is used twice; every item needs its own id")
        seen.add(item.id)
        items.append(item)
    if not items:
        raise UsageError(f"eval set {str(path)!r}: no items")
    return items


def rows(path: Path, options: SourceOptions) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, row)`` for each row: ``where`` is ``file:line`` for text files, ``file row n`` for tables."""
    if is_table(path):
        yield from _table_rows(path, options.split)
    elif path.suffix == ".csv":
        yield from _csv_rows(path)
    else:
        yield from _jsonl_rows(path)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise UsageError(f"eval set {str(path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"eval set {str(path)!r}: not UTF-8 text (byte 0x{exc.object[exc.start:exc.start + 1].hex()} "
                         f"at offset {exc.start}); save it as UTF-8") from None


def _jsonl_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    for number, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path.name}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(data, dict):
            raise UsageError(f"{where}: a row is a JSON object, got {type(data).__name__}")
        yield where, data


def _csv_rows(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    reader = csv.DictReader(_read_text(path).splitlines(keepends=True))
    try:
        if reader.fieldnames is None:  # reads the header: the first record starts on the next line
            return
        line = reader.line_num + 1
        for row in reader:
            yield f"{path.name}:{line}", {k: v for k, v in row.items() if k is not None}
            line = reader.line_num + 1
    except csv.Error as exc:
        raise UsageError(f"{path.name}:{reader.line_num}: not CSV ({exc})") from None


def _table_rows(path: Path, split: str | None) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        import pyarrow as pa
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise UsageError(f"eval set {str(path)!r}: Parquet and saved datasets need pyarrow: "
                         f"{install_hint('data')}") from None
    files = _table_files(path, split)
    number = 0
    for file in files:
        try:
            table = pyarrow.parquet.read_table(file) if file.suffix == ".parquet" else _read_arrow(file, pa)
        except (OSError, pa.ArrowException) as exc:
            raise UsageError(f"eval set {str(file)!r}: not a readable {file.suffix[1:]} file "
                             f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None
        for row in table.to_pylist():
            number += 1
            yield f"{path.name} row {number}", row


def _read_arrow(file: Path, pa: Any) -> Any:
    """An Arrow file: the IPC stream ``datasets`` writes, or the IPC file format."""
    with pa.memory_map(str(file)) as source:
        try:
            return pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_file(source).read_all()


def _table_files(path: Path, split: str | None) -> list[Path]:
    """The data files of a table: the file itself, or a saved dataset's Arrow files (a split of a saved
    ``DatasetDict`` chosen by ``eval.split``)."""
    if not path.is_dir():
        if not path.is_file():
            raise UsageError(f"eval set {str(path)!r}: no such file")
        return [path]
    if (path / "dataset_dict.json").is_file():
        try:
            splits = [str(s) for s in json.loads((path / "dataset_dict.json").read_text())["splits"]]
        except (OSError, ValueError, KeyError, TypeError):
            raise UsageError(f"eval set {str(path)!r}: dataset_dict.json does not list its splits") from None
        chosen = split or ("test" if "test" in splits else splits[0] if len(splits) == 1 else None)
        if chosen not in splits:
            raise ConfigError([f"eval.split: {split!r} is not a split of {path.name}; allowed: {', '.join(splits)}"
                               if split else f"eval.split: {path.name} has several splits; allowed: "
                               f"{', '.join(splits)}"])
        path = path / str(chosen)
    elif split is not None:
        raise ConfigError([f"eval.split: {path.name} is a single dataset with no splits; leave eval.split unset"])
    try:
        state = json.loads((path / "state.json").read_text())
        names = [str(entry["filename"]) for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        names = sorted(p.name for p in path.glob("*.arrow"))
    if not names:
        raise UsageError(f"eval set {str(path)!r}: no Arrow data files (not a dataset saved with save_to_disk)")
    return [path / name for name in names]


# ------------------------------------------------------------------------------------------------ rows → items


def _value(row: Mapping[str, Any], column: str) -> tuple[bool, Any]:
    """``(found, value)`` of ``column`` in ``row``; a dotted name reads inside nested columns."""
    if column in row:
        return True, row[column]
    node: Any = row
    for part in column.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _required(row: Mapping[str, Any], where: str, name: str, column: str) -> Any:
    found, value = _value(row, column)
    if not found:
        shown = ", ".join(map(str, list(row)[:12])) + (", …" if len(row) > 12 else "")
        raise UsageError(f"{where}: {name}: no column {column!r} (set eval.columns.{name}; columns: {shown})")
    if value is None or (isinstance(value, str) and not value.strip()):
        raise UsageError(f"{where}: {name}: column {column!r} is empty")
    return value


def item_from_row(row: Mapping[str, Any], where: str, options: SourceOptions, *, number: int, stem: str,
                  seed: int) -> Item:
    """One item from one row, read through the column map and the answer format."""
    question = _required(row, where, "question", str(options.column("question")))
    if not isinstance(question, str):
        raise UsageError(f"{where}: question: a string, got {type(question).__name__}")
    id_column = options.columns.get("id")
    found, raw_id = _value(row, str(id_column or "id"))
    if id_column and not found:
        _required(row, where, "id", str(id_column))
    item_id = str(raw_id).strip() if found and raw_id is not None and str(raw_id).strip() else f"{stem}-{number}"
    choices = _choices(row, where, options)
    gold = _required(row, where, "answer", str(options.column("answer")))
    fmt = options.answer_format
    if fmt == "auto":
        fmt = _guess(gold, choices)
    kind = KIND_OF[fmt]
    if kind == "choice":
        if not choices:
            raise UsageError(f"{where}: choices: answer_format={fmt} needs choices (set eval.columns.choices)")
        index = _gold_index(gold, fmt, choices, where)
        if options.shuffle_choices:
            order = list(range(len(choices)))
            random.Random(f"{seed}\x00{item_id}").shuffle(order)
            choices, index = [choices[i] for i in order], order.index(index)
        return Item(item_id, question, LETTERS[index], "choice", choices)
    return Item(item_id, question, _gold(gold, fmt, where), kind, [])


def _choices(row: Mapping[str, Any], where: str, options: SourceOptions) -> list[str]:
    given = options.columns.get("choices")
    if isinstance(given, list):
        values: Any = [_required(row, where, "choices", column) for column in given]
    else:
        found, values = _value(row, str(given or "choices"))
        if given and not found:
            _required(row, where, "choices", str(given))
        if not found or values is None or values == "":
            return []
        if isinstance(values, str):  # a CSV cell holding a JSON list
            try:
                values = json.loads(values)
            except ValueError:
                raise UsageError(f"{where}: choices: the cell is not a JSON list of strings") from None
    if not isinstance(values, list | tuple) or not all(isinstance(v, str | int | float) for v in values):
        raise UsageError(f"{where}: choices: a list of strings, got {type(values).__name__}")
    choices = [str(v).strip() for v in values]
    if not 2 <= len(choices) <= len(LETTERS) or not all(choices):
        raise UsageError(f"{where}: choices: 2 to {len(LETTERS)} non-empty choices, got {len(choices)}")
    return choices


def _guess(gold: Any, choices: list[str]) -> str:
    if choices:
        if isinstance(gold, list):
            return "labels"
        if isinstance(gold, int) and not isinstance(gold, bool):
            return "index"
        text = str(gold).strip()
        return "letter" if re.fullmatch(r"\(?[A-Za-z][).]?", text) else "text"
    if isinstance(gold, bool) or str(gold).strip().lower() in ("yes", "no", "true", "false"):
        return "yes_no"
    text = str(gold)
    if "####" in text:
        return "gsm8k"
    if "\\boxed" in text or "\\fbox" in text:
        return "boxed"
    if isinstance(gold, int | float) or re.match(r"\s*[-+−$]?\s*\d", text):
        return "number"
    return "plain"


def _gold_index(gold: Any, fmt: str, choices: list[str], where: str) -> int:
    span = f"{LETTERS[0]}–{LETTERS[len(choices) - 1]}"
    if fmt == "letter":
        text = str(gold).strip().strip("().").upper()
        if len(text) == 1 and text in LETTERS[:len(choices)]:
            return LETTERS.index(text)
        raise UsageError(f"{where}: answer: {str(gold)!r} is not the letter of one of the {len(choices)} choices "
                         f"({span})")
    if fmt == "index":
        try:
            index = int(str(gold).strip())
        except ValueError:
            index = -1
        if 0 <= index < len(choices):
            return index
        raise UsageError(f"{where}: answer: {str(gold)!r} is not a choice index (0–{len(choices) - 1})")
    if fmt == "labels":
        if isinstance(gold, str):
            try:
                gold = json.loads(gold)
            except ValueError:
                gold = None
        if isinstance(gold, list) and len(gold) == len(choices) and sorted(map(str, gold)) == \
                ["0"] * (len(choices) - 1) + ["1"]:
            return [str(v) for v in gold].index("1")
        raise UsageError(f"{where}: answer: labels must be one 1 and {len(choices) - 1} zeros, one per choice")
    wanted = " ".join(str(gold).split()).casefold()
    for index, choice in enumerate(choices):
        if " ".join(choice.split()).casefold() == wanted:
            return index
    raise UsageError(f"{where}: answer: {str(gold)[:60]!r} is the text of none of the choices")


def _gold(gold: Any, fmt: str, where: str) -> str:
    text = str(gold).strip()
    if fmt == "yes_no":
        word = {"true": "yes", "false": "no", "yes": "yes", "no": "no"}.get(text.lower())
        if word is None:
            raise UsageError(f"{where}: answer: {text[:60]!r} is not yes/no or true/false (answer_format=yes_no)")
        return word
    if fmt == "gsm8k":
        final = text.rpartition("####")[2].strip()
        if "####" not in text or parse_number(final) is None:
            raise UsageError(f"{where}: answer: no '#### <number>' at its end (answer_format=gsm8k)")
        return final.replace(",", "")
    if fmt == "boxed":
        inner = boxed(text)
        if not inner:
            raise UsageError(f"{where}: answer: no \\boxed{{…}} in the solution (answer_format=boxed)")
        return inner
    if fmt == "math":
        if math_form(text) is None:
            raise UsageError(f"{where}: answer: empty once normalised (answer_format=math)")
        return text
    if fmt == "number":
        value = parse_number(text)
        if value is None:
            raise UsageError(f"{where}: answer: {text[:60]!r} has no number (answer_format=number)")
        return str(int(value)) if value == int(value) else repr(value)
    return text
