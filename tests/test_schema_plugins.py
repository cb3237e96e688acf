"""Plugins register artifact schemas: the built-in strategies' own schemas ship with the plugin that plays them
(``conclave_plugins/schemas/``), not in the core list, and come and go with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import run_conclave

from conclave.artifacts.schema_refs import fill_plan, get_schema, registry
from conclave.artifacts.schema_registry import SCHEMA_PACKAGE, schema_names, schemas_in
from conclave.plugin_manager import get_plugins
from conclave.providers.pricing import PriceTable

OWNERS = {
    "strategies": ["cross_exam_reply_adversarial", "cross_exam_reply_devils_advocate", "cross_exam_reply_explore",
                   "verdict_explore"],
    "answer": ["cross_exam_reply_answer", "independent_answer", "synthesis_answer", "verdict_answer"],
}


def test_strategy_schemas_are_registered_by_their_plugin_not_the_core() -> None:
    registered = get_plugins().schemas
    assert {owner: sorted(n for n in registered.names() if registered.owner(n) == owner) for owner in OWNERS} == OWNERS
    core = set(schemas_in(SCHEMA_PACKAGE))
    assert core == {"common", "independent", "synthesis", "cross_exam_reply", "cross_exam", "verdict", "objection",
                    "safety_evaluation", "vote_gate", "final_aggregate"}
    assert set(schema_names()) == core | {n for names in OWNERS.values() for n in names}


def test_without_the_plugin_its_schemas_are_gone(tmp_path: Path) -> None:
    proc = run_conclave("schemas", "list", home=tmp_path, env={"CONCLAVE_PLUGINS": "openai,filters,progress"})
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    assert names == ["common", "cross_exam", "cross_exam_reply", "final_aggregate", "independent", "objection",
                     "safety_evaluation", "synthesis", "verdict", "vote_gate"]
    listed = run_conclave("schemas", "list", home=tmp_path)
    assert "verdict_explore" in listed.stdout and "independent_answer" in listed.stdout


def test_a_narrower_plugin_set_asked_for_first_never_stands_for_the_full_one_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The schemas and price sheets built from the loaded plugins used to be cached once per process: a test (or any
    # caller) that set CONCLAVE_PLUGINS to a few plugins and touched them first left every later caller without the
    # strategies' schemas and the local model's sheet (a suite run in another order failed on "unknown schema
    # 'verdict_explore'" and on the price sheets).
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai")
    narrow_schemas, narrow_sheets = set(schema_names()), set(PriceTable.load().sheets)
    assert "verdict_explore" not in narrow_schemas and "local" not in narrow_sheets
    assert fill_plan("verdict_explore") is None
    monkeypatch.delenv("CONCLAVE_PLUGINS")
    assert "verdict_explore" in schema_names() and "local" in PriceTable.load().sheets
    assert fill_plan("verdict_explore") is not None
    schema_id = get_schema("verdict_explore")["$id"]
    assert registry().get_or_retrieve(schema_id).value.contents["$id"] == schema_id
