"""Bar charts as inline SVG: drawn on the server, so a page with charts needs no script, library or network."""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

WIDTH, HEIGHT = 560, 240
MARGIN_LEFT, MARGIN_BOTTOM, MARGIN_TOP = 70, 56, 26
COLOR = "#0969da"
#: the width of a character of an 11-pixel axis label, at most (digits and lower case), and the room between labels
CHAR_PX, LABEL_GAP_PX = 6.5, 8


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], *,
              fmt: Callable[[float], str] = lambda v: f"{v:g}", color: str = COLOR) -> str:
    """A vertical bar chart: one bar per label, the value printed on each bar, a zero-based y axis."""
    e = html.escape
    head = (f'<figure class="cv-chart"><figcaption>{e(title)}</figcaption>'
            f'<svg xmlns="http://www.w3.org/2000/svg" role="img" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" aria-label="{e(title)}">'
            f"<title>{e(title)}</title>")
    caption = "</figure>"
    if not values:
        return (head + f'<text x="{WIDTH // 2}" y="{HEIGHT // 2}" text-anchor="middle" fill="#59636e" '
                f'font-size="14">No data yet</text></svg>' + caption)
    top = max(max(values), 0.0) or 1.0
    plot_w = WIDTH - MARGIN_LEFT - 10
    plot_h = HEIGHT - MARGIN_BOTTOM - MARGIN_TOP
    step = plot_w / len(values)
    bar_w = min(max(step * 0.7, 1.0), 90.0)
    parts = [head,
             f'<line x1="{MARGIN_LEFT}" y1="{MARGIN_TOP + plot_h}" x2="{WIDTH - 10}" y2="{MARGIN_TOP + plot_h}" '
             f'stroke="#8c959f"/>']
    for fraction in (0.5, 1.0):
        y = MARGIN_TOP + plot_h * (1 - fraction)
        parts.append(f'<line x1="{MARGIN_LEFT}" y1="{y:.1f}" x2="{WIDTH - 10}" y2="{y:.1f}" stroke="#eaeef2"/>'
                     f'<text x="{MARGIN_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11" '
                     f'fill="#59636e">{e(fmt(top * fraction))}</text>')
    # as many axis labels as fit side by side (a year of days is 365 bars but room for about 7 dates)
    widest = max(len(_short(label)) for label in labels) * CHAR_PX + LABEL_GAP_PX
    every = -(-len(labels) // max(1, int(plot_w // widest)))
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = plot_h * max(value, 0.0) / top
        x = MARGIN_LEFT + i * step + (step - bar_w) / 2
        y = MARGIN_TOP + plot_h - h
        parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" fill="{color}">'
                     f"<title>{e(label)}: {e(fmt(value))}</title></rect>")
        if len(values) <= 16:
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{y - 4:.1f}" text-anchor="middle" font-size="11" '
                         f'fill="#1f2328">{e(fmt(value))}</text>')
        if i % every == 0:
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{MARGIN_TOP + plot_h + 16}" text-anchor="middle" '
                         f'font-size="11" fill="#59636e">{e(_short(label))}</text>')
    parts.append("</svg>" + caption)
    return "".join(parts)


def _short(label: str) -> str:
    return label if len(label) <= 14 else label[:13] + "…"


__all__ = ["bar_chart"]
