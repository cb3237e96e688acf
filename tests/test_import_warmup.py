"""The CLI's import warm-up thread and the code that imports the same modules on the event loop's thread."""

from __future__ import annotations

import threading
import time

import pytest

from conclave.engine import warmup
from conclave.events import ROUND_STARTED, Event


def test_code_outside_the_warm_up_waits_until_it_is_past_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    # two threads importing one package at once can deadlock: the warm-up imports, the others wait for it
    monkeypatch.setattr(warmup, "_imported", {})
    warmup.settled("jsonschema")  # no warm-up started: returns at once
    gate = threading.Event()
    imported: list[str] = []

    def slow_import(name: str) -> None:
        gate.wait(5)
        imported.append(name)

    monkeypatch.setattr(warmup.importlib, "import_module", slow_import)
    monkeypatch.setattr(warmup, "WARMUP_AFTER_S", 0.0)
    warmup.warm_up_subscriber()(Event(ROUND_STARTED, "c", 1, time.time(), {"round_number": 1}))
    waiter = threading.Thread(target=warmup.settled, args=("jsonschema",))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # the warm-up is still importing jsonschema
    gate.set()
    waiter.join(5)
    assert not waiter.is_alive() and imported[0] == "jsonschema"
    warmup.settled()  # and past every module
    assert imported == list(warmup.LATER_MODULES)
