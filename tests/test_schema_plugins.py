"""Plugins register artifact schemas: the built-in strategies' own schemas ship with the plugin that plays them
(``conclave_plugins/schemas/``), not in the core list, and come and go with it."""

from __future__ import annotations

from pathlib import Path

from cli_helpers import run_conclave

from conclave.artifacts.schema_registry import SCHEMA_PACKAGE, schema_names, schemas_in
from conclave.plugin_manager import get_plugins

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
