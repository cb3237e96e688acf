"""pytest fixtures for conclave and its plugins: a running fake provider server and an isolated environment.

Enable with ``pytest_plugins = ["conclave.testing.pytest_plugin"]`` in a ``conftest.py`` (needs pytest-asyncio).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from conclave.testing.fake_server import FakeProviderServer

#: the fake keys ``conclave_env`` sets; tests assert none of them ever leaks
FAKE_KEYS = {
    "OPENAI_API_KEY": "sk-test-openai-0000000000000000000000000000",
    "ANTHROPIC_API_KEY": "sk-ant-test-0000",
    "GEMINI_API_KEY": "test-gemini-key-0000",
    "XAI_API_KEY": "xai-test-0000",
    "MISTRAL_API_KEY": "mistral-test-0000",
}


@pytest_asyncio.fixture
async def fake_provider_server() -> AsyncIterator[FakeProviderServer]:
    """A started :class:`FakeProviderServer` on 127.0.0.1, closed after the test."""
    async with FakeProviderServer() as fake:
        yield fake


@pytest.fixture
def conclave_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary ``CONCLAVE_HOME`` (returned) and fake keys for every built-in provider; the real home and real
    keys are out of reach."""
    home = tmp_path / "conclave-home"
    home.mkdir()
    monkeypatch.setenv("CONCLAVE_HOME", str(home))
    for var, value in FAKE_KEYS.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    return home
