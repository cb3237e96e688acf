"""What the browser tests share: Debian's ``chromium`` + ``chromium-driver`` (``.ci/install-system-deps.sh``
installs them), a real ``datasette serve`` of an index on 127.0.0.1, and full-page screenshots saved to
``tests/artifacts/`` (ignored by git) for a reviewer to look at. The ``browser`` fixture is in ``conftest.py``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conclave.cli.commands.browse import free_port, wait_until_up

ARTIFACTS = Path(__file__).parent / "artifacts"
CHROMIUM = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and Path(p).exists()), None)
CHROMEDRIVER = next((p for p in (shutil.which("chromedriver"), "/usr/bin/chromedriver") if p and Path(p).exists()),
                    None)

#: mark a test (or ``pytestmark``) that drives the real browser
needs_browser = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="no Chromium/chromedriver found (Debian: `.ci/install-system-deps.sh` installs chromium chromium-driver)",
)


@contextmanager
def serving(command: list[str], ready_path: str, **popen: Any) -> Iterator[str]:
    """A real server process: ``command`` with ``{port}`` replaced by a free port of 127.0.0.1; yields its base URL
    once ``ready_path`` answers, and stops it afterwards."""
    port = free_port()
    process = subprocess.Popen([part.replace("{port}", str(port)) for part in command],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **popen)
    try:
        wait_until_up(f"http://127.0.0.1:{port}{ready_path}", process)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=20)


@contextmanager
def serve_datasette(index: Path) -> Iterator[str]:
    """A real ``datasette serve`` of ``index`` on 127.0.0.1 (conclave's plugin loads from its entry point)."""
    with serving([sys.executable, "-m", "datasette", "serve", str(index), "--host", "127.0.0.1", "--port", "{port}"],
                 "/-/versions.json") as url:
        yield url


@contextmanager
def headless_chromium() -> Iterator[Any]:
    """A Selenium driver for headless Chromium with a throw-away profile and no background networking."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="conclave-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1400,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def screenshot(driver: Any, name: str) -> Path:
    """A full-page PNG in tests/artifacts/ (the window grows to the page's height first)."""
    ARTIFACTS.mkdir(exist_ok=True)
    height = driver.execute_script("return Math.min(document.documentElement.scrollHeight, 6000)")
    driver.set_window_size(1400, max(int(height), 600))
    path = ARTIFACTS / f"{name}.png"
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)
    return path
