"""The ``conclave`` command pauses the garbage collector while it starts (conclave.gc_policy): every command must
get it back, and only a single consultation freezes what start-up left alive."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

from conclave import cli, gc_policy


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc_policy._paused = False
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


def test_pause_then_resume_with_freeze_moves_what_is_alive_out_of_every_collection() -> None:
    gc.unfreeze()
    gc_policy.pause()
    assert not gc.isenabled()
    gc_policy.resume(freeze=True)
    assert gc.isenabled()
    assert gc.get_freeze_count() > 1000  # the test process's modules, at least


def test_resume_without_freeze_only_turns_collection_back_on() -> None:
    gc.unfreeze()
    gc_policy.pause()
    gc_policy.resume(freeze=False)
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_resume_leaves_a_collector_alone_that_something_else_turned_off() -> None:
    gc.disable()  # e.g. a program embedding conclave
    gc_policy.resume(freeze=True)
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_subcommand_collects_as_usual(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `conclave browse` and `conclave mcp` live long: they must not run with the collector paused
    monkeypatch.setenv("CONCLAVE_HOME", str(tmp_path))
    gc_policy.pause()
    assert cli._main(["logs", "list"]) == 0
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
