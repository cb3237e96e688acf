"""The package tree reads as the data path only if a module's file name says which one it is: no name twice."""

from __future__ import annotations

import collections
from pathlib import Path

import conclave

PACKAGE = Path(conclave.__file__).resolve().parent


def test_no_two_modules_under_conclave_share_a_file_name() -> None:
    by_name: dict[str, list[str]] = collections.defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py") and "__pycache__" not in path.parts:
            by_name[path.name].append(str(path.relative_to(PACKAGE)))
    repeated = {name: sorted(paths) for name, paths in by_name.items() if len(paths) > 1}
    assert repeated == {}
