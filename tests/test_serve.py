"""``conclave serve``: the live web view behind a session token — 401 without it, a late joiner replays the
journal, a reconnect resumes after Last-Event-ID, a running consultation's rounds appear in a real browser while
the fake provider server is still answering, and each address is rate-limited."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_browser import CHROMEDRIVER, CHROMIUM, screenshot
from test_engine_support import AGENT_MODELS, JUDGE_MODEL
from views_support import Debates, record_debates

from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout
from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for


def start_serve(home: Path) -> tuple[subprocess.Popen[str], str, str]:
    """``conclave serve --port 0 --no-open``; returns the process, the base URL and the token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env["CONCLAVE_HOME"] = str(home)
    process = subprocess.Popen([sys.executable, "-m", "conclave", "serve", "--port", "0", "--no-open"],
                               stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+)/\?token=([\w-]+) ", line)
        if match:
            return process, match.group(1), match.group(2)
        if not line and process.poll() is not None:
            break
    process.kill()
    pytest.fail("conclave serve printed no URL")


@pytest.fixture(scope="module")
def debates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Debates]:
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CONCLAVE_HOME", str(home))
        for var, value in FAKE_KEYS.items():
            mp.setenv(var, value)
        yield record_debates(home)


@pytest.fixture(scope="module")
def served(debates: Debates) -> Iterator[tuple[str, str]]:
    process, base, token = start_serve(debates.home)
    try:
        yield base, token
    finally:
        process.terminate()
        process.wait(timeout=20)


def status_of(url: str, headers: dict[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def sse(url: str, headers: dict[str, str] | None = None) -> list[tuple[str, str, Any]]:
    """(id, event, data) of every event until the server ends the stream."""
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as response:
        text = response.read().decode()
    events = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields.get("id", ""), fields["event"], json.loads(fields["data"])))
    return events


def test_every_route_needs_the_token(served: tuple[str, str], debates: Debates) -> None:
    base, token = served
    for path in ("/", f"/c/{debates.converge}", f"/c/{debates.converge}/events", "/conclave.css"):
        assert status_of(base + path) == 401, path
        assert status_of(f"{base}{path}?token=not-{token}") == 401, path
    assert status_of(f"{base}/?token={token}") == 200
    assert status_of(f"{base}/", {"Cookie": f"conclave_session={token}"}) == 200  # the cookie set with the page


def test_a_late_joiner_gets_every_record_then_the_end(served: tuple[str, str], debates: Debates) -> None:
    base, token = served
    events = sse(f"{base}/c/{debates.converge}/events?token={token}")
    records = read_records(StoreLayout(debates.home).journal_path(debates.converge))
    assert [(e[0], e[2]["type"]) for e in events[:-1]] == [(str(r["seq"]), r["type"]) for r in records]
    assert events[-1][1] == "end"


def test_a_reconnect_resumes_after_the_last_event_id(served: tuple[str, str], debates: Debates) -> None:
    base, token = served
    events = sse(f"{base}/c/{debates.converge}/events?token={token}", {"Last-Event-ID": "20"})
    assert events[0][0] == "21" and events[-1][1] == "end"


def test_each_address_is_rate_limited(served: tuple[str, str]) -> None:
    base, token = served
    codes = [status_of(f"{base}/conclave.css?token={token}") for _ in range(90)]
    assert 429 in codes and codes[0] == 200


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                    reason="no Chromium/chromedriver found (Debian: `.ci/install-system-deps.sh` installs them)")
async def test_a_running_consultation_shows_its_rounds_live(fake_provider_server: FakeProviderServer,
                                                           conclave_env: Path) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    for model in [*AGENT_MODELS.values(), JUDGE_MODEL]:
        fake_provider_server.script(model, lambda request: Reply(json=instance_for(request.schema), latency=1.5))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(conclave_env), CONCLAVE_PROGRESS="0")
    consult = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "Watch me?", "cost.auto_approve=true", f"judge.model={JUDGE_MODEL}",
        *fake_provider_server.overrides(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL, cwd=str(conclave_env), env=env)
    journal_dir = conclave_env / "journal"
    for _ in range(300):
        if journal_dir.is_dir() and any(journal_dir.glob("*.jsonl")):
            break
        await asyncio.sleep(0.1)
    cid = next(journal_dir.glob("*.jsonl")).stem
    server, base, token = await asyncio.to_thread(start_serve, conclave_env)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={conclave_env / 'chromium'}"):
        options.add_argument(flag)
    driver = await asyncio.to_thread(webdriver.Chrome, service=Service(executable_path=str(CHROMEDRIVER)),
                                     options=options)
    try:
        await asyncio.to_thread(driver.get, f"{base}/c/{cid}?token={token}")

        def headings() -> list[str]:  # read in one script: the report is replaced as records arrive
            found: list[str] = driver.execute_script(
                "return Array.from(document.querySelectorAll('#report h2')).map(h => h.textContent)")
            return found

        seen_while_running = False
        for _ in range(600):
            if "Round 2 · Synthesis" in await asyncio.to_thread(headings):
                seen_while_running = consult.returncode is None
                break
            await asyncio.sleep(0.1)
        assert seen_while_running, "round 2 did not appear while the consultation was still running"
        assert await asyncio.wait_for(consult.wait(), timeout=120) == 0
        for _ in range(100):
            if driver.find_element(By.ID, "live-status").text == "finished":
                break
            await asyncio.sleep(0.1)
        assert "Round 3 · Cross-examination" in await asyncio.to_thread(headings)
        assert driver.find_element(By.ID, "live-status").text == "finished"
        await asyncio.to_thread(screenshot, driver, "live")
    finally:
        await asyncio.to_thread(driver.quit)
        server.terminate()
        server.wait(timeout=20)
