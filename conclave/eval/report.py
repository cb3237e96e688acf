"""The report of an evaluation run (or of a sweep's runs) as Markdown, JSON or a self-contained HTML page."""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from markdown_it import MarkdownIt

from conclave.eval.charts import accuracy_intervals, accuracy_vs_cost, points_from_summary
from conclave.eval.protocols import PROTOCOLS
from conclave.panel import TOY_BANNER, toy_seats

LABELS = {"single": "single agent", "vote": "round-1 majority vote", "judge": "judge synthesis (rounds=2)",
          "debate": "full debate (rounds=4)", "quality": "debate, quality layer on",
          "vote_matched": "vote at the debate's budget"}
FORMATS = ("markdown", "json", "html")
TOY_EVAL = ("Offline panel on the local model: a 270M model's accuracy is not evidence about debate; this run only "
            "shows the harness working. Set a provider key for a real evaluation.")


def toy_run(run: Mapping[str, Any]) -> bool:
    """Whether an evaluation run (its ``run.json``, or its ``eval_runs`` row) ran on the toy offline panel: its
    recorded panel and judge, or the ``local_panel`` flag the zero-config choice set."""
    panel = run.get("panel")
    if isinstance(panel, str):
        try:
            panel = json.loads(panel)
        except ValueError:
            panel = None
    seats = [seat for seat in panel.values() if isinstance(seat, Mapping)] if isinstance(panel, Mapping) else []
    provider, _, model = str(run.get("judge") or "").partition("/")
    return bool(run.get("local_panel")) or toy_seats([*seats, {"provider": provider, "model": model}])


def render(run: dict[str, Any], rows: Sequence[dict[str, Any]], fmt: str) -> str:
    summary = run.get("summary") or {}
    if fmt == "json":
        notice = {"notice": f"{TOY_BANNER} {TOY_EVAL}"} if toy_run(run) else {}
        return json.dumps({**notice, "run": {k: v for k, v in run.items() if k != "summary"}, "summary": summary,
                           "items": list(rows)}, ensure_ascii=False, indent=2) + "\n"
    if fmt == "html":
        return _html(run, summary, rows)
    return _markdown(run, summary)


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:.4f}"


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _markdown(run: dict[str, Any], summary: dict[str, Any]) -> str:
    lines = [f"# Evaluation {run['run_id']} · {run.get('set_spec')} · {summary.get('items', 0)} item(s)", ""]
    if toy_run(run):
        lines += [f"> **⚠ {TOY_BANNER}**", ">", f"> {TOY_EVAL}", ""]
    if run.get("status") != "complete":
        lines += [f"> Run status: {run.get('status')} — resume with `conclave eval resume {run['run_id']}`.", ""]
    lines += [f"**{summary.get('verdict_line', '')}**", ""]
    for key in ("matched_line", "quality_line"):
        if summary.get(key):
            lines += [f"**{summary[key]}**", ""]
    lines += _protocol_table(summary)
    lines += _wall_note(run)
    lines += _quality_section(run, summary)
    flips, oracle, agreement = summary.get("flips", {}), summary.get("oracle", {}), summary.get("agreement", {})
    lines += ["", "## Paired comparisons (McNemar exact test)", "",
              "| comparison | Δ accuracy | A right, B wrong | A wrong, B right | p | cost ratio |",
              "|---|---:|---:|---:|---:|---:|"]
    for c in (summary.get("comparisons") or {}).values():
        a, b = c["a"], c["b"]
        ratio = "—" if c.get("cost_ratio") is None else f"{c['cost_ratio']:.1f}×"
        lines.append(f"| {b} vs {a} | {c['delta_pp']:+.1f} pp | {c[f'{a}_right_{b}_wrong']} | "
                     f"{c[f'{a}_wrong_{b}_right']} | {c['p']:.3g} | {ratio} |" if c["delta_pp"] is not None else
                     f"| {b} vs {a} | — | — | — | — | — |")
    lines += ["", "## Flips and the oracle", "",
              f"- Agents right in round 1 and wrong after cross-examination (round 3): "
              f"**{flips.get('agent_right_to_wrong', 0)}** (on {flips.get('items_with_right_to_wrong', 0)} item(s)); "
              f"wrong → right: **{flips.get('agent_wrong_to_right', 0)}**.",
              f"- Vote right, debate wrong: {flips.get('vote_right_debate_wrong', 0)}; vote wrong, debate right: "
              f"{flips.get('vote_wrong_debate_right', 0)}.",
              f"- Oracle (some round-1 answer right): {oracle.get('items_with_a_right_round_1_answer', 0)} item(s), "
              f"{_pct(oracle.get('oracle_accuracy'))}; **oracle gap** (right answer present in round 1, final answer "
              f"wrong): **{oracle.get('oracle_gap', 0)}**.",
              f"- Round-1 agreement: mean {_pct(agreement.get('mean'))}; unanimous on "
              f"{agreement.get('unanimous_items', 0)} item(s). Early termination after round 2: "
              f"{summary.get('early_terminated', 0)} item(s).", ""]
    lines += ["## Calibration", "",
              "| confidence | n | mean | min | s.d. | Brier | ECE |", "|---|---:|---:|---:|---:|---:|---:|"]
    for name, cal in (summary.get("calibration") or {}).items():
        lines.append(f"| {name} | {cal['n']} | {_num(cal['mean_confidence'])} | {_num(cal['min_confidence'])} | "
                     f"{_num(cal['sd_confidence'])} | {_num(cal['brier'])} | {_num(cal['ece'])} |")
    lines += ["", "Self-reported confidence (verdict, single agent) is known to saturate; the agreement confidence "
              "is the share of round-1 agents behind the vote's answer.", ""]
    for name in ("verdict", "agreement"):
        table = (summary.get("calibration") or {}).get(name, {}).get("reliability") or []
        if table:
            lines += [f"Reliability ({name}):", "", "| bin | items | mean confidence | accuracy |",
                      "|---|---:|---:|---:|"]
            lines += [f"| {r['bin']} | {r['count']} | {_num(r['mean_confidence'])} | {_pct(r['accuracy'])} |"
                      for r in table]
            lines.append("")
    lines.append(f"Browse: `conclave browse` (tables eval_runs, eval_items) · report: "
                 f"`conclave eval report {run['run_id']} --format html`")
    return "\n".join(lines) + "\n"


def _protocol_table(summary: dict[str, Any]) -> list[str]:
    lines = ["| protocol | accuracy | 95% CI (Wilson) | exact CI | cost | tokens | item time s (summed) |",
             "|---|---:|---|---|---:|---:|---:|"]
    for name in PROTOCOLS:
        p = (summary.get("protocols") or {}).get(name)
        if not p:
            continue
        lines.append(f"| {LABELS[name]} | {p['correct']}/{p['n']} = {_pct(p['accuracy'])} | "
                     f"{_pct(p['ci_low'])}–{_pct(p['ci_high'])} | {_pct(p['exact_ci_low'])}–{_pct(p['exact_ci_high'])}"
                     f" | {_money(p['cost'])} | {p['tokens']:,} | {p['wall_s']:.1f} |")
    return lines


def _wall_note(run: dict[str, Any]) -> list[str]:
    """The run's real elapsed time, beside the summed item times (items run several at a time, so those overlap)."""
    wall = run.get("wall_s")
    if not isinstance(wall, int | float):
        return []
    return ["", f"Wall time of the run: {wall:.1f} s. The item-time column adds up each item's rounds; items run "
                "`eval.concurrency` at a time, so those times overlap and their sum exceeds the wall time."]


#: the quality layer's figures shown per protocol (others it reports are in the JSON report)
QUALITY_FIGURES = (("claims", "claims labelled"), ("violations", "citation-rule violations"),
                   ("statements", "judge statements checked"), ("ungrounded", "ungrounded statements"))


def _quality_section(run: dict[str, Any], summary: dict[str, Any]) -> list[str]:
    """How the quality protocol ran, and the quality layer's figures per protocol where it has them."""
    protocols = summary.get("protocols") or {}
    lines = ["", "## Quality layer", ""]
    if "quality" in protocols:
        arm = ", ".join(f"{k}={v}" for k, v in (run.get("quality_overrides") or {}).items())
        reused = summary.get("quality_reused_round_1", 0)
        lines.append(f"The quality protocol is the same debate with {arm or 'the quality layer on'}; it continued "
                     f"from the item's own round 1 on {reused} of {summary.get('items', 0)} item(s) (round 1 paid "
                     f"once){'' if reused else ' — its round-1 calls differ, so it paid its own'}. Right → wrong "
                     f"flips in its cross-examination: {summary.get('quality_flips', 0)}; oracle gap: "
                     f"{summary.get('quality_oracle_gap', 0)}.")
    elif run.get("quality_off"):
        lines.append(f"Quality protocol not run: {run['quality_off']}.")
    shown = [(name, p["quality_layer"]) for name, p in protocols.items() if p.get("quality_layer")]
    if shown:
        extra = sorted({k for _, f in shown for k in f} - {k for k, _ in QUALITY_FIGURES})
        lines += ["", "| protocol | " + " | ".join(t for _, t in QUALITY_FIGURES) + "".join(f" | {k}" for k in extra)
                  + " |", "|---|" + "---:|" * (len(QUALITY_FIGURES) + len(extra))]
        for name, found in shown:
            cells = [str(found.get(k, "—")) for k, _ in QUALITY_FIGURES] + [str(found.get(k, "—")) for k in extra]
            lines.append(f"| {LABELS.get(name, name)} | " + " | ".join(cells) + " |")
    return lines if len(lines) > 3 else []


def swept_keys(runs: Sequence[dict[str, Any]]) -> list[str]:
    """The override keys whose values differ between ``runs`` (what a sweep swept)."""
    values: dict[str, set[str]] = {}
    for run in runs:
        for override in run.get("overrides") or []:
            key, _, value = str(override).partition("=")
            values.setdefault(key, set()).add(value)
    keys = [k for k, v in values.items() if len(v) > 1 or any(k not in _keys(r) for r in runs)]
    return sorted(keys)


def _keys(run: dict[str, Any]) -> set[str]:
    return {str(o).partition("=")[0] for o in run.get("overrides") or []}


def swept_values(run: dict[str, Any], keys: Sequence[str]) -> dict[str, str]:
    found = {str(o).partition("=")[0]: str(o).partition("=")[2] for o in run.get("overrides") or []}
    return {k: found.get(k, "(default)") for k in keys}


def render_sweep(sweep_id: str, runs: Sequence[dict[str, Any]], fmt: str) -> str:
    """One row per run of a sweep, grouped (sorted) by the swept values."""
    keys = swept_keys(runs)
    ordered = sorted(runs, key=lambda r: tuple(swept_values(r, keys).values()))
    toy = any(toy_run(run) for run in runs)
    if fmt == "json":
        notice = {"notice": f"{TOY_BANNER} {TOY_EVAL}"} if toy else {}
        return json.dumps({**notice, "sweep_id": sweep_id, "swept": keys, "runs": [
            {"run_id": r["run_id"], "swept": swept_values(r, keys), "status": r.get("status"),
             "summary": r.get("summary")} for r in ordered]}, ensure_ascii=False, indent=2) + "\n"
    head = " | ".join(keys) or "run"
    lines = [f"# Sweep {sweep_id} · {len(runs)} run(s) · swept: {', '.join(keys) or 'nothing'}", "",
             *([f"> **⚠ {TOY_BANNER}** {TOY_EVAL}", ""] if toy else []),
             f"| {head} | items | {' | '.join(PROTOCOLS)} | debate cost | debate vs vote |",
             "|" + "---|" * (len(keys) or 1) + "---:|" * (len(PROTOCOLS) + 2) + "---|"]
    for run in ordered:
        s = run.get("summary") or {}
        p = s.get("protocols") or {}
        cells = " | ".join(swept_values(run, keys).values()) or run["run_id"]
        accs = " | ".join(_pct((p.get(name) or {}).get("accuracy")) for name in PROTOCOLS)
        line = str(s.get("verdict_line", "")).removeprefix("debate vs vote: ")
        lines.append(f"| {cells} | {s.get('items', 0)} | {accs} | {_money((p.get('debate') or {}).get('cost'))} | "
                     f"{line} |")
    if fmt == "html":
        def label(run: dict[str, Any]) -> str:
            return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in swept_values(run, keys).items())

        points = [point for run in ordered for point in points_from_summary(run.get("summary") or {}, label(run))]
        return _page(f"Sweep {sweep_id}", accuracy_vs_cost(points, title=f"Sweep {sweep_id}: accuracy against cost",
                                                           toy=toy)
                     + "<pre>" + html.escape("\n".join(lines)) + "</pre>")
    return "\n".join(lines) + "\n"


def _html(run: dict[str, Any], summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    toy = toy_run(run)
    body = [f"<h1>Evaluation {html.escape(run['run_id'])}</h1>"]
    if toy:
        body.append(f"<p class=danger><strong>⚠ {html.escape(TOY_BANNER)}</strong> {html.escape(TOY_EVAL)}</p>")
    body.append(f"<p><strong>{html.escape(summary.get('verdict_line', ''))}</strong></p>")
    for key in ("matched_line", "quality_line"):
        if summary.get(key):
            body.append(f"<p><strong>{html.escape(summary[key])}</strong></p>")
    body.append("<table><tr><th>protocol</th><th>accuracy</th><th>95% CI</th><th>cost</th><th>tokens</th></tr>")
    for name in PROTOCOLS:
        p = (summary.get("protocols") or {}).get(name)
        if p:
            body.append(f"<tr><td>{LABELS[name]}</td><td>{_pct(p['accuracy'])}</td><td>{_pct(p['ci_low'])}–"
                        f"{_pct(p['ci_high'])}</td><td>{_money(p['cost'])}</td><td>{p['tokens']:,}</td></tr>")
    body.append("</table>")
    body.append(accuracy_cost_chart(summary, toy=toy))
    scored = [p for p in PROTOCOLS if p in (summary.get("protocols") or {})]
    body.append("<h2>Items</h2><table><tr><th>item</th><th>expected</th>"
                + "".join(f"<th>{p}</th>" for p in scored) + "<th>agreement</th><th>flips r→w</th></tr>")
    for r in rows:
        cells = "".join(f"<td class={'ok' if r.get(f'{p}_correct') else 'bad'}>"
                        f"{html.escape(str(r.get(f'{p}_answer') or '—'))}</td>" for p in scored)
        body.append(f"<tr><td>{html.escape(str(r['item_id']))}</td><td>{html.escape(str(r.get('expected')))}</td>"
                    f"{cells}<td>{_pct(r.get('agreement'))}</td><td>{r.get('right_to_wrong', 0)}</td></tr>")
    body.append("</table>")
    # the Markdown report rendered as HTML; raw HTML in it stays text (html off), unsafe link targets are dropped
    full = MarkdownIt("commonmark", {"html": False}).enable("table").render(_markdown(run, summary))
    body.append('<h2>Full report</h2><div class="full-report">' + full + "</div>")
    return _page(f"Evaluation {run['run_id']}", "\n".join(body))


def accuracy_cost_chart(summary: dict[str, Any], *, toy: bool = False) -> str:
    """Inline SVG: accuracy against cost per item, and accuracy with its 95% interval, per protocol."""
    points = points_from_summary(summary)
    return accuracy_vs_cost(points, toy=toy) + "\n" + accuracy_intervals(points, toy=toy)


def _page(title: str, body: str) -> str:
    style = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:60em}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:.2em .5em}.ok{background:#e6f4ea}.bad{background:#fce8e6}"
             ".warn{color:#a50}.danger{color:#b91c1c;border:2px solid #b91c1c;padding:.5em}")
    return (f"<!doctype html>\n<html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>\n{body}\n</body></html>\n")
