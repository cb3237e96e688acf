"""The live web view in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver`` through Selenium):
a consultation started from the page streams its rounds while the fake server is still answering, a viewer who
opens the page late sees the rounds already played, and a wrong token gets 401. Screenshots go to
``tests/artifacts/``."""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import needs_browser, screenshot, serving
from test_engine_support import AGENT_MODELS, JUDGE_MODEL

from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

pytestmark = needs_browser

TOKEN = "browser-test-token"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """``conclave serve`` as a real process on a free port, with a known token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(FAKE_KEYS, CONCLAVE_HOME=str(tmp_path), CONCLAVE_WEB_TOKEN=TOKEN, CONCLAVE_PROGRESS="0")
    with serving([sys.executable, "-m", "conclave", "serve", "--port", "{port}"], f"/?token={TOKEN}", env=env,
                 cwd=tmp_path) as url:
        yield url


def _start(base: str, fake: FakeProviderServer) -> str:
    """Start a consultation through the page's form; the id it redirects to."""
    overrides = "\n".join([*fake.overrides(), f"judge.model={JUDGE_MODEL}", "cost.auto_approve=true", "rounds=2"])
    body = urllib.parse.urlencode({"question": "Should we watch it live?", "overrides": overrides}).encode()

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        opener.open(urllib.request.Request(f"{base}/consult?token={TOKEN}", data=body), timeout=60)
    except urllib.error.HTTPError as redirect:
        assert redirect.code == 303, redirect.read()
        return str(redirect.headers["Location"]).removeprefix("/c/")
    raise AssertionError("the form did not redirect to the consultation")


async def test_the_live_page_shows_rounds_while_they_run_and_to_late_joiners(
    served: str, browser: Any, fake_provider_server: FakeProviderServer
) -> None:
    from selenium.webdriver.common.by import By

    for model in [*AGENT_MODELS.values(), JUDGE_MODEL]:
        fake_provider_server.script(model, lambda r: Reply(json=instance_for(r.schema), latency=1.5))
    cid = await asyncio.to_thread(_start, served, fake_provider_server)
    await asyncio.to_thread(browser.get, f"{served}/c/{cid}?token={TOKEN}")

    def rounds() -> list[str]:
        found: list[str] = browser.execute_script(
            "return Array.from(document.querySelectorAll('.round h2 .kind')).map(k => k.textContent)")
        return found

    def thinking() -> int:
        return len(browser.find_elements(By.CSS_SELECTOR, ".agent.thinking"))

    seen_thinking = False
    for _ in range(300):  # while round 1 runs, its agents show as thinking, with their time running
        if thinking():
            seen_thinking = True
            break
        await asyncio.sleep(0.05)
    assert seen_thinking, "no agent was shown thinking while round 1 ran"
    for _ in range(600):
        if "Synthesis" in await asyncio.to_thread(rounds):
            break
        await asyncio.sleep(0.1)
    status = browser.find_element(By.ID, "status").text
    assert "Synthesis" in await asyncio.to_thread(rounds) and status == "running"
    await asyncio.to_thread(screenshot, browser, "live_running")
    for _ in range(600):
        if browser.find_element(By.ID, "status").text == "complete":
            break
        await asyncio.sleep(0.1)
    assert browser.find_element(By.ID, "conn").text == "finished"

    # a late joiner: everything so far, at once
    await asyncio.to_thread(browser.get, f"{served}/c/{cid}?token={TOKEN}")
    for _ in range(100):
        if browser.find_element(By.ID, "status").text == "complete":
            break
        await asyncio.sleep(0.1)
    assert await asyncio.to_thread(rounds) == ["Independent", "Synthesis"]
    cards = browser.find_elements(By.CSS_SELECTOR, ".agent.done")
    assert len(cards) == len(AGENT_MODELS) + 1  # every agent in round 1, the judge in round 2
    await asyncio.to_thread(screenshot, browser, "live_late_joiner")


def test_a_wrong_token_gets_401(served: str) -> None:
    for path in ("/", "/c/x/events", "/consult"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{served}{path}?token=not-it", timeout=10)
        assert refused.value.code == 401
    listing = urllib.request.urlopen(f"{served}/?token={TOKEN}", timeout=10).read().decode()
    assert "<form method=post action=/consult>" in listing
