"""Fixtures shared by the test modules (the fake server fixtures come from conclave's own pytest plugin)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conclave.testing.pytest_plugin import FAKE_KEYS

pytest_plugins = ["conclave.testing.pytest_plugin"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` run first (stable order otherwise): under pytest-xdist the longest ones start at once on
    their own workers while the many short ones fill the rest, so the whole run ends sooner."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@contextmanager
def _fake_keyed_home(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A fresh ``CONCLAVE_HOME`` with the fake server's provider keys set, for a module-scoped fixture."""
    home = tmp_path_factory.mktemp(name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONCLAVE_HOME", str(home))
        for var, value in FAKE_KEYS.items():
            mp.setenv(var, value)
        yield home


@pytest.fixture(scope="module")
def debates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Three consultations recorded by the engine on the fake server, in a home of their own (one per test
    module)."""
    with _fake_keyed_home(tmp_path_factory, "home") as home:
        from views_support import record_debates

        yield record_debates(home)


@pytest.fixture(scope="module")
def eval_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A home holding evaluation runs made by the harness on the fake server (one per test module): a sweep of two
    runs (eval.seed=1,2, with the quality protocol) and a lone run without it."""
    with _fake_keyed_home(tmp_path_factory, "eval-home") as home:
        from eval_helpers import record_eval_runs

        yield record_eval_runs(home)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium driven by Selenium, one per test module (tests using it are marked ``needs_browser``)."""
    from browser_support import headless_chromium

    with headless_chromium() as driver:
        yield driver
