"""One source per default: conf/config.yaml's defaults are rendered from the pydantic models of
:mod:`conclave.config.settings` (values from the field defaults, comments from their docstrings).

The checked-in file is generated between two marker lines; the rest of it (Hydra's defaults list, the question,
the judge, ``home`` and the ``hydra`` block: choices and interpolations, not defaults) is written by hand.
A field's comment is its ``Field(description=...)``, else the docstring under it in the model's source (read here,
not by pydantic at every start).
``python -m conclave.config.defaults_yaml`` rewrites the generated part; a test fails when it is stale.
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import sys
import textwrap
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from conclave.config.settings import Settings

BEGIN = "# >>> generated from the defaults in conclave/config/settings.py by `python -m conclave.config.defaults_yaml`"
END = "# <<< end of generated defaults"
#: top-level keys written by hand: an environment interpolation, not a default
HAND_WRITTEN = {"home"}
COLUMN = 27  # where an inline comment starts (later when the key and value are longer)
WIDTH = 118


def _scalar(value: Any) -> str:
    """``value`` as one line of YAML (quoted only where YAML needs it, e.g. ``'on'``)."""
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=10_000)
    return text.removesuffix("\n...\n").strip()


@functools.cache
def attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the string literal right under its annotated assignment in ``model`` or a base model."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if not issubclass(cls, BaseModel) or cls is BaseModel:
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in itertools.pairwise(body):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                    and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _note(model: type[BaseModel], name: str, field: Any) -> str:
    return " ".join((field.description or attribute_docstrings(model).get(name, "")).split())


def _lines(model: type[BaseModel], indent: str = "") -> list[str]:
    lines: list[str] = []
    for name, field in model.model_fields.items():
        if field.is_required() or (not indent and name in HAND_WRITTEN):
            continue
        default = field.get_default(call_default_factory=True)
        note = _note(model, name, field)
        if isinstance(default, BaseModel):  # a section: its note above it, then its keys
            if not indent and lines and lines[-1]:
                lines.append("")  # a blank line either side of a top-level section
            lines += [f"{indent}# {line}" for line in textwrap.wrap(note, WIDTH - len(indent) - 2)]
            lines.append(f"{indent}{name}:")
            lines += _lines(type(default), indent + "  ")
            if not indent:
                lines.append("")
            continue
        head = f"{indent}{name}: {_scalar(default)}"
        if not note:
            lines.append(head)
            continue
        column = max(COLUMN, len(head) + 2)
        wrapped = textwrap.wrap(note, WIDTH - column - 2, break_long_words=False, break_on_hyphens=False)
        lines.append(f"{head.ljust(column)}# {wrapped[0]}")
        lines += [f"{' ' * column}# {line}" for line in wrapped[1:]]
    return lines


def render() -> str:
    """The generated part of conf/config.yaml, marker lines included."""
    lines = _lines(Settings)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join([BEGIN, *lines, END]) + "\n"


def config_path() -> Path:
    return Path(str(files("conclave.conf") / "config.yaml"))


def regenerate(text: str) -> str:
    """``text`` (a config.yaml) with its generated part replaced by :func:`render`'s."""
    head, begin, rest = text.partition(BEGIN + "\n")
    _, end, tail = rest.partition(END + "\n")
    if not begin or not end:
        raise ValueError(f"{config_path()}: the marker lines {BEGIN!r} and {END!r} are missing")
    return head + render() + tail


def main() -> int:
    path = config_path()
    text = path.read_text(encoding="utf-8")
    new = regenerate(text)
    if new != text:
        path.write_text(new, encoding="utf-8")
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
