"""Axis labels of the server-drawn bar charts never overlap, however many bars (the dashboard's spending per day
has a bar per day: at a year of days its 13 date labels overlapped, each 10 characters in 37 pixels)."""

from __future__ import annotations

import re
from datetime import date, timedelta
from itertools import pairwise

from conclave.render.bar_charts import CHAR_PX, bar_chart

AXIS_LABEL = re.compile(r'<text x="([0-9.]+)" y="[0-9.]+" text-anchor="middle" font-size="11" fill="#59636e">([^<]+)<')


def axis_labels(svg: str) -> list[tuple[float, str]]:
    return [(float(x), text) for x, text in AXIS_LABEL.findall(svg)]


def test_a_year_of_days_gets_labels_that_do_not_overlap() -> None:
    days = [(date(2026, 1, 1) + timedelta(days=n)).isoformat() for n in range(365)]
    labels = axis_labels(bar_chart("Spending per day", days, [1.0] * len(days)))
    assert 4 <= len(labels) <= 10
    width = len(days[0]) * CHAR_PX
    assert all(b[0] - a[0] >= width for a, b in pairwise(labels))
    assert labels[0][1] == days[0]


def test_a_few_bars_are_each_labelled() -> None:
    names = ["openai", "anthropic", "gemini"]
    assert [text for _x, text in axis_labels(bar_chart("Per provider", names, [3.0, 2.0, 1.0]))] == names
