"""What the index tests share: the Datasette metadata conclave ships (its canned queries and table settings), and
the steps of SQLite's plan for a statement (which tables and indexes it reads)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import yaml

METADATA = Path(__file__).parent.parent / "conclave" / "store" / "datasette_metadata.yaml"


def metadata() -> dict[str, Any]:
    """The index database's part of the shipped Datasette metadata."""
    index: dict[str, Any] = yaml.safe_load(METADATA.read_text())["databases"]["index"]
    return index


def canned(name: str) -> str:
    """The SQL of the canned query ``name``."""
    sql: str = metadata()["queries"][name]["sql"]
    return sql


def plan(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[str]:
    """The steps (detail column) of SQLite's plan for ``sql``."""
    return [row[3] for row in conn.execute(f"explain query plan {sql}", params)]


def reads(steps: list[str]) -> set[str]:
    """The tables (by name or alias) the plan ``steps`` scan or search."""
    return {s.split()[1] for s in steps if s.startswith(("SCAN", "SEARCH"))}
