"""Evaluation charts as inline SVG (no script, no network): drawn by the HTML report and by the Datasette plugin's
``/-/conclave/eval`` page from the same points.

A point is one protocol of one run: ``{"protocol", "run" (a label: the swept values, or the run id), "accuracy",
"ci_low", "ci_high", "cost" (per item, USD or None), "tokens" (per item)}``.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from typing import Any

from conclave.cli.panel import TOY_BANNER

#: one colour per protocol (colour-blind-safe Okabe-Ito hues), in the order the legend lists them
COLOURS = {"single": "#E69F00", "vote": "#56B4E9", "judge": "#009E73", "debate": "#D55E00", "quality": "#CC79A7",
           "vote_matched": "#0072B2"}
NAMES = {"single": "single agent", "vote": "round-1 vote", "judge": "judge synthesis", "debate": "full debate",
         "quality": "debate + quality layer", "vote_matched": "vote at debate's budget"}
#: one marker shape per protocol, so points at the same place stay apart (quality: a ring around whatever it
#: coincides with, typically the debate it was forked from)
SHAPES = {"single": "circle", "vote": "square", "judge": "triangle", "debate": "diamond", "quality": "ring",
          "vote_matched": "open-square"}
#: the reliability diagram's other series (the aggregators scored beside the protocols): a colour and a name each,
#: so no two series share the fallback colour and the legend names them as the report does
CALIBRATION_COLOURS = {**COLOURS, "vote_weighted": "#0072B2", "vote_learned": "#7F7F7F", "judge_pick": "#000000",
                       "sc_best": "#8C564B"}
CALIBRATION_NAMES = {**NAMES, "vote_weighted": "confidence-weighted vote", "vote_learned": "learned-weight vote",
                     "judge_pick": "judge's pick", "sc_best": "self-consistency best"}
FONT = 'font-family="system-ui,-apple-system,Segoe UI,sans-serif" font-size="12"'


def _title(title: str, x: float, toy: bool) -> str:
    """The chart's heading; on a toy run's chart it says so first, in red, so a copied chart keeps the warning."""
    if not toy:
        return f'<text x="{x}" y="20" {FONT} font-size="14" font-weight="600">{html.escape(title)}</text>'
    return (f'<text x="{x}" y="20" {FONT} font-size="14" font-weight="600"><tspan fill="#b91c1c">⚠ '
            f"{html.escape(TOY_BANNER)}</tspan> {html.escape(title)}</text>")


def points_from_summary(summary: Mapping[str, Any], run: str = "") -> list[dict[str, Any]]:
    """The points of one run's summary (``run.json``'s)."""
    out = []
    for name, p in (summary.get("protocols") or {}).items():
        if p.get("accuracy") is None:
            continue
        n = p.get("n") or 1
        out.append({"protocol": name, "run": run, "accuracy": p["accuracy"], "ci_low": p.get("ci_low"),
                    "ci_high": p.get("ci_high"), "cost": None if p.get("cost") is None else p["cost"] / n,
                    "tokens": (p.get("tokens") or 0) / n})
    return out


def _axis(points: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """Dollars per item when every point has a price and something was spent; else tokens per item."""
    if points and all(p.get("cost") is not None for p in points) and any(p["cost"] for p in points):
        return "cost", "cost per item (USD)"
    return "tokens", "tokens per item"


def _ticks(top: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values from 0 to at least ``top``."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10, 20) if m * magnitude >= raw)
    ticks, value = [], 0.0
    while value < top + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _fmt(value: float, unit: str) -> str:
    if unit == "cost":
        return f"${value:.4f}" if value < 0.01 else f"${value:.3f}" if value < 1 else f"${value:.2f}"
    return f"{value:,.0f}"


def marker(protocol: str, x: float, y: float, extra: str = "", title: str = "") -> str:
    """The protocol's marker centred on (x, y); ``extra``: attributes; ``title``: its tooltip."""
    colour = COLOURS.get(protocol, "#555")
    shape = SHAPES.get(protocol, "circle")
    inner = f"<title>{html.escape(title)}</title>" if title else ""
    if shape == "square":
        return (f'<rect {extra} x="{x - 5:.1f}" y="{y - 5:.1f}" width="10" height="10" fill="{colour}" '
                f'stroke="#fff" stroke-width="1">{inner}</rect>')
    if shape in ("triangle", "diamond"):
        corners = ((x, y - 7), (x + 6.5, y + 5), (x - 6.5, y + 5)) if shape == "triangle" else \
            ((x, y - 7), (x + 7, y), (x, y + 7), (x - 7, y))
        path = " ".join(f"{a:.1f},{b:.1f}" for a, b in corners)
        return f'<polygon {extra} points="{path}" fill="{colour}" stroke="#fff" stroke-width="1">{inner}</polygon>'
    if shape == "open-square":
        return (f'<rect {extra} x="{x - 6:.1f}" y="{y - 6:.1f}" width="12" height="12" fill="none" '
                f'stroke="{colour}" stroke-width="2.5">{inner}</rect>')
    if shape == "ring":
        return (f'<circle {extra} cx="{x:.1f}" cy="{y:.1f}" r="9" fill="none" stroke="{colour}" '
                f'stroke-width="3">{inner}</circle>')
    return (f'<circle {extra} cx="{x:.1f}" cy="{y:.1f}" r="6" fill="{colour}" stroke="#fff" stroke-width="1.5">'
            f"{inner}</circle>")


def _legend(protocols: Sequence[str], x: float, y: float) -> list[str]:
    parts = []
    for i, name in enumerate(protocols):
        parts.append(marker(name, x + 6, y + i * 22)
                     + f'<text x="{x + 20}" y="{y + i * 22 + 4}" {FONT}>{html.escape(NAMES.get(name, name))}</text>')
    return parts


def accuracy_vs_cost(points: Sequence[Mapping[str, Any]], *, width: int = 720, height: int = 380,
                     title: str = "Accuracy against cost per protocol", toy: bool = False) -> str:
    """A scatter: accuracy (y, with its 95% interval) against cost per item (x; tokens per item when a price is
    unknown), one colour per protocol; the protocols of one run are joined by a thin line, labelled with the run."""
    if not points:
        return ""
    unit, xlabel = _axis(points)
    left, right, top, bottom = 64, 190, 34, 48
    plot_w, plot_h = width - left - right, height - top - bottom
    xticks = _ticks(max(float(p[unit] or 0) for p in points) * 1.05)
    xmax = xticks[-1] or 1.0

    def sx(value: float) -> float:
        return left + plot_w * value / xmax

    def sy(value: float) -> float:
        return top + plot_h * (1 - value)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="cv-eval-chart" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
             f'<rect width="{width}" height="{height}" fill="#fff"/>',
             _title(title, left, toy)]
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(tick):.1f}" y2="{sy(tick):.1f}" '
                     f'stroke="#e5e7eb"/><text x="{left - 8}" y="{sy(tick) + 4:.1f}" text-anchor="end" {FONT}>'
                     f"{tick:.0%}</text>")
    for tick in xticks:
        parts.append(f'<line x1="{sx(tick):.1f}" x2="{sx(tick):.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}" '
                     f'stroke="#333"/><text x="{sx(tick):.1f}" y="{top + plot_h + 18}" text-anchor="middle" {FONT}>'
                     f"{_fmt(tick, unit)}</text>")
    parts += [f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>',
              f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>',
              f'<text x="{left + plot_w / 2}" y="{height - 8}" text-anchor="middle" {FONT}>{xlabel}</text>',
              f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" '
              f'text-anchor="middle" {FONT}>accuracy (95% interval)</text>']
    runs: dict[str, list[Mapping[str, Any]]] = {}
    for p in points:
        runs.setdefault(str(p.get("run") or ""), []).append(p)
    placed: list[tuple[float, float]] = []  # run labels already drawn: the next one moves down to stay clear
    for label, group in runs.items():
        ordered = sorted(group, key=lambda p: float(p[unit] or 0))
        if len(ordered) > 1:
            path = " ".join(f"{sx(float(p[unit] or 0)):.1f},{sy(p['accuracy']):.1f}" for p in ordered)
            parts.append(f'<polyline points="{path}" fill="none" stroke="#9ca3af" stroke-width="1"/>')
        if label and len(runs) > 1:
            last = max(ordered, key=lambda p: (float(p[unit] or 0), p["accuracy"]))
            lx, ly = sx(float(last[unit] or 0)) + 12, sy(last["accuracy"]) + 4
            while any(abs(lx - x) < 60 and abs(ly - y) < 14 for x, y in placed):
                ly += 14
            placed.append((lx, ly))
            parts.append(f'<text x="{lx:.1f}" y="{ly:.1f}" {FONT} fill="#4b5563">{html.escape(label)}</text>')
    for p in points:
        cx, cy = sx(float(p[unit] or 0)), sy(p["accuracy"])
        colour = COLOURS.get(p["protocol"], "#555")
        if p.get("ci_low") is not None and p.get("ci_high") is not None:
            low, high = sy(p["ci_low"]), sy(p["ci_high"])
            parts.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{low:.1f}" y2="{high:.1f}" stroke="{colour}" '
                         f'stroke-width="2" opacity="0.6"/><line x1="{cx - 4:.1f}" x2="{cx + 4:.1f}" y1="{low:.1f}" '
                         f'y2="{low:.1f}" stroke="{colour}"/><line x1="{cx - 4:.1f}" x2="{cx + 4:.1f}" '
                         f'y1="{high:.1f}" y2="{high:.1f}" stroke="{colour}"/>')
        where = f" · {p['run']}" if p.get("run") else ""
        title_text = (f'{NAMES.get(p["protocol"], p["protocol"]) + where}: {p["accuracy"]:.1%} '
                      f'({_fmt(float(p[unit] or 0), unit)} per item)')
        parts.append(marker(p["protocol"], cx, cy, f'class="cv-point" data-protocol="{p["protocol"]}"', title_text))
    protocols = [name for name in COLOURS if any(p["protocol"] == name for p in points)]
    parts += _legend(protocols, left + plot_w + 24, top + 10)
    parts.append("</svg>")
    return "\n".join(parts)


def accuracy_intervals(points: Sequence[Mapping[str, Any]], *, width: int = 720,
                       title: str = "Accuracy by protocol, with 95% intervals", toy: bool = False) -> str:
    """Horizontal bars: one per protocol (per run when there are several), its accuracy and its 95% interval."""
    if not points:
        return ""
    row_h, left, right, top = 22, 250, 70, 34
    height = top + row_h * len(points) + 40
    plot_w = width - left - right

    def sx(value: float) -> float:
        return left + plot_w * value

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="cv-eval-chart" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
             f'<rect width="{width}" height="{height}" fill="#fff"/>',
             _title(title, 8, toy)]
    bottom = top + row_h * len(points)
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<line x1="{sx(tick):.1f}" x2="{sx(tick):.1f}" y1="{top}" y2="{bottom}" stroke="#e5e7eb"/>'
                     f'<text x="{sx(tick):.1f}" y="{bottom + 16}" text-anchor="middle" {FONT}>{tick:.0%}</text>')
    for i, p in enumerate(points):
        y = top + i * row_h
        colour = COLOURS.get(p["protocol"], "#555")
        label = NAMES.get(p["protocol"], p["protocol"]) + (f" · {p['run']}" if p.get("run") else "")
        parts.append(f'<text x="{left - 8}" y="{y + row_h / 2 + 4:.1f}" text-anchor="end" {FONT}>'
                     f"{html.escape(label[:40])}</text>")
        parts.append(f'<rect class="cv-bar" data-protocol="{p["protocol"]}" x="{left}" y="{y + 4}" '
                     f'width="{max(sx(p["accuracy"]) - left, 1):.1f}" height="{row_h - 8}" fill="{colour}" '
                     f'opacity="0.85"><title>{html.escape(label)}: {p["accuracy"]:.1%}</title></rect>')
        if p.get("ci_low") is not None and p.get("ci_high") is not None:
            mid = y + row_h / 2
            parts.append(f'<line x1="{sx(p["ci_low"]):.1f}" x2="{sx(p["ci_high"]):.1f}" y1="{mid:.1f}" '
                         f'y2="{mid:.1f}" stroke="#111" stroke-width="1.5"/>'
                         f'<line x1="{sx(p["ci_low"]):.1f}" x2="{sx(p["ci_low"]):.1f}" y1="{mid - 5:.1f}" '
                         f'y2="{mid + 5:.1f}" stroke="#111"/><line x1="{sx(p["ci_high"]):.1f}" '
                         f'x2="{sx(p["ci_high"]):.1f}" y1="{mid - 5:.1f}" y2="{mid + 5:.1f}" stroke="#111"/>')
        parts.append(f'<text x="{width - right + 8}" y="{y + row_h / 2 + 4:.1f}" {FONT}>{p["accuracy"]:.1%}</text>')
    parts.append(f'<text x="{left + plot_w / 2}" y="{height - 6}" text-anchor="middle" {FONT}>accuracy</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def reliability_diagram(calibration: Mapping[str, Any], bins: str = "10 equal-width bins over [0, 1]", *,
                        size: int = 360, toy: bool = False) -> str:
    """Inline SVG: accuracy against mean stated confidence per bin, one series per protocol (its one stated
    meaning in the legend), marker area by the bin's items; the diagonal is perfect calibration. The bins are
    stated under the chart."""
    left, top = 52, 34
    plot = size - left - top
    series = [(name, cal) for name, cal in calibration.items() if cal.get("reliability")]
    height = size + 18 * len(series) + 10
    width = 720  # the plot stays square at the left; the axis label and the legend's stated meanings need the width
    title = "Reliability diagram"

    def x(value: float) -> float:
        return left + value * plot

    def y(value: float) -> float:
        return top + (1 - value) * plot

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="cv-reliability" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{title}">',
             f'<rect width="{width}" height="{height}" fill="#fff"/>', _title(title, left, toy),
             f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(1)}" y2="{y(1)}" stroke="#9ca3af" stroke-dasharray="4 3"/>',
             f'<rect x="{left}" y="{top}" width="{plot}" height="{plot}" fill="none" stroke="#d1d5db"/>']
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<text x="{x(tick):.1f}" y="{y(0) + 16:.1f}" text-anchor="middle" {FONT}>{tick:g}</text>')
        parts.append(f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end" {FONT}>{tick:g}</text>')
    parts.append(f'<text x="{left}" y="{y(0) + 34:.1f}" {FONT}>mean stated confidence '
                 f"({html.escape(bins)})</text>")
    parts.append(f'<text x="14" y="{y(0.5):.1f}" transform="rotate(-90 14 {y(0.5):.1f})" text-anchor="middle" '
                 f"{FONT}>accuracy</text>")
    for index, (name, cal) in enumerate(series):
        colour = CALIBRATION_COLOURS.get(name, "#374151")
        shown = CALIBRATION_NAMES.get(name, name)
        total = max(1, sum(int(b.get("count") or 0) for b in cal["reliability"]))
        points = [(float(b["mean_confidence"]), float(b["accuracy"]), int(b["count"]), str(b.get("bin", "")))
                  for b in cal["reliability"] if b.get("mean_confidence") is not None and b.get("accuracy") is not None]
        if len(points) > 1:
            path = " ".join(f"{x(c):.1f},{y(a):.1f}" for c, a, _, _ in points)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
        for conf, acc, count, label in points:
            radius = 3 + 7 * math.sqrt(count / total)
            parts.append(f'<circle cx="{x(conf):.1f}" cy="{y(acc):.1f}" r="{radius:.1f}" fill="{colour}" '
                         f'fill-opacity="0.7" stroke="#fff"><title>{html.escape(shown)} · bin {html.escape(label)}: '
                         f"{count} item(s), confidence {conf:.2f}, accuracy {acc:.2f}</title></circle>")
        legend_y = size + 4 + 18 * index
        parts.append(f'<circle cx="{left + 6}" cy="{legend_y - 4}" r="5" fill="{colour}"/>'
                     f'<text x="{left + 16}" y="{legend_y}" {FONT}>{html.escape(shown)}: '
                     f"{html.escape(str(cal.get('meaning', '')))} (n = {cal.get('n', 0)}, left out "
                     f"{cal.get('excluded', 0)})</text>")
    parts.append("</svg>")
    return "\n".join(parts)
