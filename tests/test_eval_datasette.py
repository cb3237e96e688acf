"""Evaluation charts inside Datasette (``/-/conclave/eval``, drawn by conclave's plugin as inline SVG): in process
through Datasette's own client, and once in a real ``datasette serve`` with headless Chromium."""

from __future__ import annotations

import asyncio
import math
import re
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
from browser_support import needs_browser, screenshot, serve_datasette
from eval_helpers import PERSONAS, EvalRuns, evaluate

from conclave.eval.charts import NAMES as ALL_NAMES
from conclave.store.paths import StoreLayout
from conclave.testing.answer_panel import AnswerPanel

#: the protocols the fixture's sweep scored (no vote at the debate's budget there)
NAMES = {k: v for k, v in ALL_NAMES.items() if k != "vote_matched"}


def get(home: Any, path: str) -> Any:
    from datasette.app import Datasette

    async def fetch() -> Any:
        return await Datasette([str(StoreLayout(home).index_path)]).client.get(path)

    return asyncio.run(fetch())


def accuracies(home: Any) -> dict[tuple[str, str], float]:
    """(run id, protocol) -> accuracy, as the index holds them."""
    db = sqlite3.connect(StoreLayout(home).index_path)
    out = {}
    for protocol in NAMES:
        for run_id, value in db.execute(f"select run_id, {protocol}_accuracy from eval_runs"):
            if value is not None:
                out[(run_id, protocol)] = value
    return out


def point_titles(page: str) -> list[str]:
    return re.findall(r'class="cv-point"[^>]*><title>([^<]*)</title>', page)


def test_the_latest_sweep_is_charted_with_every_protocol_of_each_run(eval_home: EvalRuns) -> None:
    response = get(eval_home.home, "/-/conclave/eval")
    assert response.status_code == 200
    page = response.text
    assert page.count('<svg xmlns="http://www.w3.org/2000/svg" class="cv-eval-chart"') == 2
    assert "sweep sw-chart · 2 run(s)" in page
    titles = point_titles(page)
    assert len(titles) == 2 * 5  # two runs × single, vote, judge, debate, quality
    known = accuracies(eval_home.home)
    for run_id, seed in zip(eval_home.sweep_runs, (1, 2), strict=True):
        for protocol, name in NAMES.items():
            # each point carries its run's swept value and the accuracy the index holds for it
            expected = f"{name} · seed={seed}: {known[(run_id, protocol)]:.1%}"
            assert any(t.startswith(expected) for t in titles), (expected, titles)
    assert page.count('class="cv-bar"') == 10
    assert "debate vs vote:" in page and "quality vs debate:" in page
    assert 'href="/index/eval_accuracy_vs_cost"' in page  # the SQL behind the chart


def test_one_run_is_charted_on_its_own(eval_home: EvalRuns) -> None:
    page = get(eval_home.home, f"/-/conclave/eval?run={eval_home.lone_run}").text
    titles = point_titles(page)
    assert len(titles) == 4 and not any("quality" in t for t in titles)  # that run had no quality protocol
    # a run's lone points are not labelled with swept values
    assert all(re.match(r"^[^·]+: \d+\.\d%", t) for t in titles), titles
    assert f'href="/-/conclave/eval?sweep={eval_home.sweep_id}"' in page  # every run and sweep is listed


def test_an_unknown_run_is_a_404(eval_home: EvalRuns) -> None:
    response = get(eval_home.home, "/-/conclave/eval?run=ev-nope")
    assert response.status_code == 404 and "No run ev-nope" in response.text


def test_the_eval_page_is_in_the_menu_and_the_canned_query_has_the_quality_rows(eval_home: EvalRuns) -> None:
    assert 'href="/-/conclave/eval"' in get(eval_home.home, "/index").text
    rows = get(eval_home.home, "/index/eval_accuracy_vs_cost.json?_shape=array").json()
    assert sorted(r["protocol"] for r in rows if r["run_id"] == eval_home.sweep_runs[0]) == sorted(NAMES)


@pytest.fixture(scope="module")
def server(eval_home: EvalRuns) -> Iterator[str]:
    with serve_datasette(StoreLayout(eval_home.home).index_path) as url:
        yield url


@needs_browser
def test_the_charts_render_in_a_real_browser(server: str, browser: Any) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{server}/-/conclave/eval")
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.cv-eval-chart")
    assert len(charts) == 2 and all(c.size["width"] > 400 and c.size["height"] > 200 for c in charts)
    points = browser.find_elements(By.CSS_SELECTOR, "svg.cv-eval-chart .cv-point")
    assert len(points) == 10 and all(p.is_displayed() for p in points)
    # every point lies inside its chart
    box = charts[0].rect
    for p in points:
        r = p.rect
        assert box["x"] <= r["x"] <= box["x"] + box["width"] and box["y"] <= r["y"] <= box["y"] + box["height"]
    assert screenshot(browser, "eval_charts").stat().st_size > 10_000


def test_sweep_lines_are_labelled_by_swept_values_and_corrected_across_points(eval_home: EvalRuns) -> None:
    page = get(eval_home.home, f"/-/conclave/eval?sweep={eval_home.sweep_id}").text
    lines = re.findall(r"<li>([^<]*)<strong>debate vs vote: ([^<]*)</strong>", page)
    assert sorted(label for label, _ in lines) == ["seed=1: ", "seed=2: "]
    assert all("(Holm over 2 points)" in line for _, line in lines)
    assert not any(run_id in label for run_id in eval_home.sweep_runs for label, _ in lines)
    # a reliability diagram per point, its bins stated
    assert page.count('class="cv-reliability"') == 2 and "10 equal-width bins over [0, 1]" in page


async def test_the_vote_at_the_debates_budget_line_is_kept(fake_provider_server: Any, conclave_env: Any) -> None:
    from datasette.app import Datasette

    ev, code, _, err = await evaluate(fake_provider_server, conclave_env,
                                      AnswerPanel({n: 0.5 for n in PERSONAS.values()}), rounds=2, n=2,
                                      matched_vote=True)
    assert code == 0, err
    page = (await Datasette([str(StoreLayout(conclave_env).index_path)]).client.get(
        f"/-/conclave/eval?run={ev.run_id}")).text
    first = page.index("<strong>debate vs vote: ")
    assert first < page.index("<strong>debate vs vote at the debate&#39;s budget: ") < page.index('class="cv-eval-chart"')


def test_each_calibration_series_has_its_own_colour_and_a_readable_name(eval_home: EvalRuns) -> None:
    page = get(eval_home.home, "/-/conclave/eval").text
    diagrams = re.findall(r'<svg[^>]*class="cv-reliability".*?</svg>', page, flags=re.S)
    assert diagrams
    for svg in diagrams:
        legend = re.findall(r'r="5" fill="([^"]+)"/><text[^>]*>([^:<]+):', svg)
        names = [name for _, name in legend]
        assert len(legend) >= 5 and "judge&#x27;s pick" in names and "confidence-weighted vote" in names
        assert not {"judge_pick", "vote_weighted", "vote_learned"} & set(names)  # not the raw identifiers
        assert len({colour for colour, _ in legend}) == len(legend), legend  # no two series share a colour


async def test_a_real_runs_shown_costs_add_up_from_its_item_rows(fake_provider_server: Any, conclave_env: Any) -> None:
    """A run made by `conclave eval` (a subprocess on the fake): the total the overview shows is the sum of what its
    items' consultations spent, and each chart point is its protocol's item costs over the items."""
    from datasette.app import Datasette
    from test_eval_cli import NAMES as PANEL_NAMES
    from test_eval_cli import PANEL, _conclave

    AnswerPanel({n: 0.7 for n in PANEL_NAMES}).install(fake_provider_server)
    code, _, err = await _conclave("eval", "arithmetic", "eval.n=5", "rounds=2", "cost.auto_approve=true", *PANEL,
                                   *fake_provider_server.overrides(), home=conclave_env)
    assert code == 0, err
    index = StoreLayout(conclave_env).index_path
    db = sqlite3.connect(index)
    db.row_factory = sqlite3.Row
    items = db.execute("select * from eval_items").fetchall()
    spent = db.execute("select sum(total_cost) from consultations where id in (select consultation_id from "
                       "eval_items)").fetchone()[0]
    assert len(items) == 5 and spent > 0
    total = math.fsum(i["debate_cost"] for i in items)  # every protocol here is read from the item's consultation
    assert total == pytest.approx(spent, abs=1e-5)
    datasette = Datasette([str(index)])
    (row,) = (await datasette.client.get("/index/eval_runs_overview.json?_shape=array")).json()
    assert row["cost"] == pytest.approx(total, abs=1e-4) and row["items"] == 5
    overview = (await datasette.client.get("/index/eval_runs_overview")).text
    assert f'col-cost"><span class="cv-nowrap" title="{row["cost"]!r}">${total:.4f}</span>' in overview
    page = (await datasette.client.get("/-/conclave/eval")).text
    assert "· 5 item(s)" in page and "(Holm over 1 point)" in page
    titles = point_titles(page)
    for protocol in ("single", "vote", "judge", "debate"):
        per_item = math.fsum(i[f"{protocol}_cost"] for i in items) / len(items)
        shown = f"${per_item:.4f}" if per_item < 0.01 else f"${per_item:.3f}"
        assert per_item > 0 and f"{NAMES[protocol]}: " in "".join(titles)
        assert any(t.startswith(f"{NAMES[protocol]}: ") and t.endswith(f"({shown} per item)") for t in titles), \
            (protocol, shown, titles)
