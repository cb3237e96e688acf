"""The Datasette plugin and the HTML report in a real headless Chromium (Debian's ``chromium`` and
``chromium-driver``, driven by Selenium; ``.ci/install-system-deps.sh`` installs them). Screenshots of the main
pages are saved to ``tests/artifacts/`` (ignored by git) for a reviewer to look at."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_support import needs_browser, screenshot, serve_datasette
from views_support import Debates

from conclave.store.paths import StoreLayout

pytestmark = needs_browser


@pytest.fixture(scope="module")
def server(debates: Debates) -> Iterator[str]:
    """A real ``datasette serve`` of the index on 127.0.0.1 (the plugin loads from its entry point)."""
    with serve_datasette(StoreLayout(debates.home).index_path) as url:
        yield url


def test_consultation_page_shows_every_round(server: str, debates: Debates, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/-/conclave/{debates.converge}")
    headings = [h.text for h in browser.find_elements(By.CSS_SELECTOR, ".cv-report h2")]
    assert headings[:3] == ["Verdict (confidence 82%)", "Dissent", "Realized panel"]
    for expected in ("Round 1 · Independent positions", "Round 2 · Synthesis", "Round 3 · Cross-examination",
                     "How the agents moved (round 1 → round 3)", "Cost"):
        assert expected in headings
    cards = browser.find_elements(By.CSS_SELECTOR, ".cv-card")
    assert len(cards) == 6 and all(c.is_displayed() for c in cards)  # 3 round-1 answers + 3 round-3 replies
    dissent = browser.find_element(By.ID, "dissent")
    assert dissent.location["y"] < browser.find_element(By.ID, "panel").location["y"]
    assert screenshot(browser, "consultation").stat().st_size > 10_000


def test_consultations_table_has_normal_rows(server: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/index/consultations")
    headers = browser.find_elements(By.CSS_SELECTOR, "table.rows-and-columns th")
    assert 8 <= len(headers) <= 12
    heights = [r.size["height"] for r in browser.find_elements(By.CSS_SELECTOR, "table.rows-and-columns tbody tr")]
    assert heights and max(heights) < 90, heights
    table_width = browser.find_element(By.CSS_SELECTOR, "table.rows-and-columns").size["width"]
    assert table_width <= 1400
    folds = [s.text for s in browser.find_elements(By.CSS_SELECTOR, "details > summary")]
    assert "About these columns" in folds
    screenshot(browser, "consultations_table")


def test_index_page_leads_with_consultations(server: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/")
    first_link = browser.find_element(By.CSS_SELECTOR, ".cv-panel a[href$='/consultations']")
    assert first_link.is_displayed() and first_link.location["y"] < 400
    screenshot(browser, "index")


def test_sql_editor_starts_on_recent_consultations(server: str, browser: Any) -> None:
    browser.get(f"{server}/index")
    value = browser.execute_script("return document.querySelector('.CodeMirror').CodeMirror.getValue()")
    assert value.startswith("select id, started_at, status") and "from consultations" in value
    screenshot(browser, "database")


def test_dashboard_draws_the_charts(server: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/-/conclave")
    charts = browser.find_elements(By.CSS_SELECTOR, "figure.cv-chart svg")
    assert len(charts) == 5 and all(c.size["height"] > 100 for c in charts)
    assert len(browser.find_elements(By.CSS_SELECTOR, "figure.cv-chart rect")) >= 5
    screenshot(browser, "dashboard")


def test_artifact_cells_open_the_transcript(server: str, debates: Debates, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/index/artifacts?consultation_id={debates.converge}&artifact_type=cross_exam")
    screenshot(browser, "artifacts")
    browser.find_element(By.CSS_SELECTOR, ".cv-cell a").click()  # the index keeps the gist; the journal the text
    assert "A database trigger closes most of that gap" in browser.find_element(By.TAG_NAME, "body").text


def test_html_report_opens_offline(debates: Debates, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    report = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "conclave", "show", debates.converge, "--format", "html", "-o",
                    str(report)], check=True, env={"CONCLAVE_HOME": str(debates.home), "PATH": "/usr/bin:/bin"})
    browser.get(report.as_uri())
    headings = [h.text for h in browser.find_elements(By.CSS_SELECTOR, "h2")]
    assert "Round 2 · Synthesis" in headings
    # styled by the inlined stylesheet: the dissent box has its own background
    background = browser.find_element(By.ID, "dissent").value_of_css_property("background-color")
    assert background not in ("rgba(0, 0, 0, 0)", "transparent")
    screenshot(browser, "report_html")


def test_from_the_consultations_table_to_the_transcript(server: str, debates: Debates, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/index/consultations?id={debates.converge}")
    browser.find_element(By.CSS_SELECTOR, "td.col-question a").click()
    assert browser.current_url.endswith(f"/-/conclave/{debates.converge}")
    assert "Round 2 · Synthesis" in [h.text for h in browser.find_elements(By.CSS_SELECTOR, ".cv-report h2")]
    browser.get(f"{server}/index/consultations/{debates.converge}")
    browser.find_element(By.LINK_TEXT, "Read this consultation as a transcript").click()
    assert browser.current_url.endswith(f"/-/conclave/{debates.converge}")
