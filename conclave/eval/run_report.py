"""The report of an evaluation run (or of a sweep's runs) as Markdown, JSON or a self-contained HTML page."""

from __future__ import annotations

import copy
import html
import json
from collections.abc import Mapping, Sequence
from typing import Any

from markdown_it import MarkdownIt

from conclave.cli.panel import TOY_BANNER, toy_seats
from conclave.eval.charts import accuracy_intervals, accuracy_vs_cost, points_from_summary, reliability_diagram
from conclave.eval.protocols import PROTOCOLS
from conclave.eval.summary import correct_across, summarise

LABELS = {"single": "single agent", "vote": "round-1 majority vote", "judge": "judge synthesis (rounds=2)",
          "debate": "full debate (rounds=4)", "quality": "debate, quality layer on",
          "vote_matched": "vote at the debate's budget", "vote_weighted": "confidence-weighted vote",
          "vote_learned": "learned-weight vote", "judge_pick": "judge picks the best round-1 answer",
          "sc_best": "best agent's self-consistency at the debate's tokens"}
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


def prices_of(run: Mapping[str, Any]) -> str:
    """How a run's dollars read: free (the local panel), unknown (a model had no price), or known."""
    if run.get("local_panel"):
        return "free"
    return "unknown" if run.get("estimated_cost") is None and run.get("status") else "known"


def render(run: dict[str, Any], rows: Sequence[dict[str, Any]], fmt: str) -> str:
    summary = run.get("summary") or {}
    if rows and "spent" not in summary:  # written by an earlier version: recomputed from its rows
        summary = summarise(rows, prices=prices_of(run))
        run = {**run, "summary": summary}
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


def label(name: str) -> str:
    """A protocol's name in tables (unknown protocols, added by plugins or other engineers, under their own)."""
    if name.startswith("single_") and name != "single_best" and name not in LABELS:
        return f"single agent {name.removeprefix('single_')}"
    return LABELS.get(name, name)


def ordered(protocols: Mapping[str, Any]) -> list[str]:
    """Every protocol a summary holds: the known ones in table order, then the rest as they come."""
    return [p for p in PROTOCOLS if p in protocols] + [p for p in protocols if p not in PROTOCOLS]


def _markdown(run: dict[str, Any], summary: dict[str, Any], *, headline: bool = True) -> str:
    """The Markdown report; without ``headline`` it leaves out what the HTML page shows above its full report (the
    title, the toy banner, the verdict line and the matched/quality lines), so the page does not say them twice."""
    lines = []
    if headline:
        lines += [f"# Evaluation {run['run_id']} · {run.get('set_spec')} · {summary.get('items', 0)} item(s)", ""]
        if toy_run(run):  # before the headline: a toy panel's figures are no answer
            lines += [f"> **⚠ {TOY_BANNER}**", ">", f"> {TOY_EVAL}", ""]
        # the answer first
        lines += [f"**{summary.get('verdict_line', '')}**", ""]
    if summary.get("with_failures"):
        lines += [f"> **This run has failures**: {summary.get('failed_items', 0)} item(s) failed "
                  f"({', '.join(summary.get('failed_item_ids') or []) or 'none whole'}). Headlines are on the items "
                  "every compared protocol completed; the intent-to-treat figure (a failure counted wrong) is beside "
                  "them. Per-protocol counts are under *Every item accounted for*.", ""]
    if run.get("status") == "running":
        lines += [f"> Run status: running (process {run.get('pid')}); these figures cover the items finished so far.",
                  ""]
    elif run.get("status") != "complete":
        lines += [f"> Run status: {run.get('status')} — resume with `conclave eval resume {run['run_id']}`.", ""]
    for key in ("matched_line", "quality_line") if headline else ():
        if summary.get(key):
            lines += [f"**{summary[key]}**", ""]
    if summary.get("matched_ratio") is not None or summary.get("matched_stopped"):
        ratio = summary.get("matched_ratio")
        lines += [f"Matched vote: {'—' if ratio is None else f'{ratio:.3f}'}× the debate's billed "
                  f"{summary.get('matched_on', 'tokens')} (goal 0.95–1.05)"
                  + (f"; stopped: {summary['matched_stopped']}" if summary.get("matched_stopped") else "") + ".", ""]
    head = (summary.get("comparisons") or {}).get("debate_vs_vote") or {}
    if head.get("detectable_pp") is not None:
        lines += [f"Power: with {head['n']} items, this run detects a difference of ≥ {head['detectable_pp']:.1f} pp "
                  "at 80% power (two-sided 5% McNemar, normal approximation, at this run's share of discordant "
                  "items).", ""]
    lines += _protocol_table(summary)
    lines += _accounting(summary)
    lines += _spent(summary)
    lines += _wall_note(run)
    lines += _quality_section(run, summary)
    flips, oracle, agreement = summary.get("flips", {}), summary.get("oracle", {}), summary.get("agreement", {})
    lines += ["", "## Paired comparisons (McNemar exact test, Newcombe 95% interval of the difference)", "",
              "Each row is X vs Y on the items both completed; the intent-to-treat columns count every item, a "
              "failure as wrong.", "",
              "| X vs Y | n | Δ accuracy (X − Y) | 95% CI | X right, Y wrong | X wrong, Y right | p | p corrected "
              "| intent to treat: n, Δ, p | cost ratio |",
              "|---|---:|---:|---|---:|---:|---:|---:|---|---:|"]
    for c in (summary.get("comparisons") or {}).values():
        a, b = c["a"], c["b"]
        ratio = "—" if c.get("cost_ratio") is None else f"{c['cost_ratio']:.2f}×"
        itt = c.get("itt") or {}
        itt_cell = "—" if itt.get("delta_pp") is None else f"{itt['n']}, {itt['delta_pp']:+.1f} pp, {itt['p']:.3g}"
        if c["delta_pp"] is None:
            lines.append(f"| {b} vs {a} | 0 | — | — | — | — | — | — | {itt_cell} | — |")
            continue
        lines.append(f"| {b} vs {a} | {c['n']} | {c['delta_pp']:+.1f} pp | [{c['ci_low_pp']:+.1f}, "
                     f"{c['ci_high_pp']:+.1f}] | {c['a_wrong_b_right']} | {c['a_right_b_wrong']} | {c['p']:.3g} | "
                     f"{c['p_corrected']:.3g} | {itt_cell} | {ratio} |")
    lines += ["", "p corrected: Holm over the points of a sweep (a lone run is one point).", ""]
    lines += ["", "## Flips and the oracle", "",
              f"- Agents right in round 1 and wrong after cross-examination (round 3): "
              f"**{flips.get('agent_right_to_wrong', 0)}** (on {flips.get('items_with_right_to_wrong', 0)} item(s)); "
              f"wrong → right: **{flips.get('agent_wrong_to_right', 0)}**; changed answers citing no accepted claim "
              f"or evidence id and no new source (unsupported switches): **{flips.get('unsupported_switches', 0)}**.",
              f"- Vote right, debate wrong: {flips.get('vote_right_debate_wrong', 0)}; vote wrong, debate right: "
              f"{flips.get('vote_wrong_debate_right', 0)}.",
              f"- Oracle (some round-1 answer right): {oracle.get('items_with_a_right_round_1_answer', 0)} item(s), "
              f"{_pct(oracle.get('oracle_accuracy'))}; **oracle gap** (right answer present in round 1, final answer "
              f"wrong): **{oracle.get('oracle_gap', 0)}**.",
              f"- Round-1 agreement: mean {_pct(agreement.get('mean'))}; unanimous on "
              f"{agreement.get('unanimous_items', 0)} item(s). Early termination after round 2: "
              f"{summary.get('early_terminated', 0)} item(s).", ""]
    lines += ["## Calibration", "",
              "One stated meaning per protocol; items without it (and early-stopped debates, whose verdict is "
              "derived from the synthesis) are left out and counted. Bins: "
              f"{summary.get('calibration_bins', '10 equal-width bins over [0, 1]')}.", "",
              "| protocol | confidence means | n | left out | mean | min | s.d. | Brier | ECE |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, cal in (summary.get("calibration") or {}).items():
        lines.append(f"| {name} | {cal.get('meaning', '')} | {cal['n']} | {cal.get('excluded', 0)} | "
                     f"{_num(cal['mean_confidence'])} | {_num(cal['min_confidence'])} | "
                     f"{_num(cal['sd_confidence'])} | {_num(cal['brier'])} | {_num(cal['ece'])} |")
    for name, why in (summary.get("calibration_left_out") or {}).items():
        lines.append(f"\nNot calibrated: {name} — {why}.")
    lines.append("")
    for name, cal in (summary.get("calibration") or {}).items():
        table = cal.get("reliability") or []
        if table:
            lines += [f"Reliability diagram ({name}: {cal.get('meaning', '')}):", "",
                      "| bin | items | mean confidence | accuracy | |", "|---|---:|---:|---:|---|"]
            lines += [f"| {r['bin']} | {r['count']} | {_num(r['mean_confidence'])} | {_pct(r['accuracy'])} | "
                      f"{_bar(r['accuracy'])} |" for r in table]
            lines.append("")
    lines.append(f"Browse: `conclave browse` (tables eval_runs, eval_items) · report: "
                 f"`conclave eval report {run['run_id']} --format html`")
    return "\n".join(lines) + "\n"


def _bar(value: float | None) -> str:
    return "" if value is None else "█" * round(20 * value)


def _protocol_table(summary: dict[str, Any]) -> list[str]:
    lines = ["| protocol | accuracy (intent to treat) | 95% CI (Wilson) | exact CI | accuracy (completed) | cost | "
             "tokens | item time s (summed) |",
             "|---|---:|---|---|---:|---:|---:|---:|"]
    protocols = summary.get("protocols") or {}
    for name in ordered(protocols):
        p = protocols[name]
        title = label(name) + (f" ({p.get('agent')}, chosen in hindsight)" if p.get("hindsight") else "")
        done = p.get("completed", p["n"])
        lines.append(f"| {title} | {p['correct']}/{p['n']} = {_pct(p['accuracy'])} | "
                     f"{_pct(p['ci_low'])}–{_pct(p['ci_high'])} | {_pct(p['exact_ci_low'])}–{_pct(p['exact_ci_high'])}"
                     f" | {p.get('correct_completed', p['correct'])}/{done} = "
                     f"{_pct(p.get('accuracy_completed', p['accuracy']))} | {_money(p['cost'])} | {p['tokens']:,} | "
                     f"{p['wall_s']:.1f} |")
    return lines


def _accounting(summary: dict[str, Any]) -> list[str]:
    """Every item accounted for: each protocol's completed, failed and skipped items, and which."""
    protocols = summary.get("protocols") or {}
    lines = ["", "## Every item accounted for", "", "| protocol | completed | failed | skipped | failed or skipped "
             "items |", "|---|---:|---:|---:|---|"]
    for name in ordered(protocols):
        p = protocols[name]
        if name == "single_best" or "completed" not in p:
            continue
        ids = [*p.get("failed_ids", []), *p.get("skipped_ids", [])]
        lines.append(f"| {label(name)} | {p['completed']} | {p['failed']} | {p['skipped']} | "
                     f"{', '.join(ids) or '—'} |")
    return lines


def _spent(summary: dict[str, Any]) -> list[str]:
    """What the run spent, all of it, split by the protocol that paid."""
    spent = summary.get("spent") or {}
    if not spent:
        return []
    lines = ["", f"**Run total: {_money(spent.get('cost'))}, {spent.get('tokens', 0):,} billed tokens** — every "
             "consultation the run made (retries and failed calls included), split by who paid:", ""]
    for name, figures in (spent.get("by_protocol") or {}).items():
        what = {"debate": "each item's consultation (single, vote, judge and debate are read from its rounds)",
                "quality": "the quality arm's own calls", "vote_matched": "the matched vote's extra samples"}
        lines.append(f"- {name}: {_money(figures.get('cost'))}, {figures.get('tokens', 0):,} tokens — "
                     f"{what.get(name, 'its own calls')}")
    batch = summary.get("batch")
    if batch:
        ratio = "—" if batch.get("ratio") is None else f"{batch['ratio']:.3f}"
        lines += ["", f"**Batch spend: {_money(batch.get('batch_cost'))} at the providers' batch prices; the same "
                      f"calls interactively: {_money(batch.get('interactive_cost'))} (ratio {ratio})** — "
                      f"{batch.get('batches', 0)} batch(es), at most "
                      f"{batch.get('most_batches_per_provider_per_wave', 0)} per provider per round"]
        for lost in batch.get("lost") or []:
            lines.append(f"- batch {lost['batch_id']} {lost['state']}: item(s) {', '.join(lost['items'])}")
    if summary.get("paired_round_1"):
        lines.append(f"- round 1 restored from an earlier sweep point on {summary['paired_round_1']} item(s): "
                     "not paid again here")
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
    """One row per run of a sweep, grouped (sorted) by the swept values; debate vs vote Holm-corrected across the
    sweep's points, and runs differing only in ``eval.seed`` pooled with their spread."""
    runs = [{**r, "summary": copy.deepcopy(r.get("summary") or {})} for r in runs]
    correct_across([r["summary"] for r in runs if r["summary"].get("comparisons")])
    keys = swept_keys(runs)
    ordered = sorted(runs, key=lambda r: tuple(swept_values(r, keys).values()))
    toy = any(toy_run(run) for run in runs)
    pooled = pool_seeds(ordered, keys)
    if fmt == "json":
        notice = {"notice": f"{TOY_BANNER} {TOY_EVAL}"} if toy else {}
        return json.dumps({**notice, "sweep_id": sweep_id, "swept": keys, "runs": [
            {"run_id": r["run_id"], "swept": swept_values(r, keys), "status": r.get("status"),
             "summary": r.get("summary")} for r in ordered], "seeds_pooled": pooled},
            ensure_ascii=False, indent=2) + "\n"
    head = " | ".join(keys) or "run"
    lines = [f"# Sweep {sweep_id} · {len(runs)} run(s) · swept: {', '.join(keys) or 'nothing'}", "",
             *([f"> **⚠ {TOY_BANNER}** {TOY_EVAL}", ""] if toy else []),
             f"debate vs vote p-values are Holm-corrected over the sweep's {len(runs)} points.", "",
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
    if pooled:
        lines += ["", "Seeds pooled (accuracy over every seed's items; spread: s.d. of the per-seed accuracies):", "",
                  "| point | seeds | " + " | ".join(pooled[0]["protocols"]) + " |",
                  "|---|---:|" + "---:|" * len(pooled[0]["protocols"])]
        for group in pooled:
            cells = " | ".join(f"{_pct(v['accuracy'])} ± {_pct(v['spread'])}" for v in group["protocols"].values())
            lines.append(f"| {group['point'] or 'all'} | {group['seeds']} | {cells} |")
    if fmt == "html":
        def label(run: dict[str, Any]) -> str:
            return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in swept_values(run, keys).items())

        points = [point for run in ordered for point in points_from_summary(run.get("summary") or {}, label(run))]
        return _page(f"Sweep {sweep_id}", accuracy_vs_cost(points, title=f"Sweep {sweep_id}: accuracy against cost",
                                                           toy=toy)
                     + "<pre>" + html.escape("\n".join(lines)) + "</pre>")
    return "\n".join(lines) + "\n"


def pool_seeds(runs: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """Runs of one point (same swept values but ``eval.seed``) pooled: accuracy over all their items, and the
    sample s.d. of their per-seed accuracies. Empty when no point has more than one seed."""
    if "eval.seed" not in keys:
        return []
    others = [k for k in keys if k != "eval.seed"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        point = ", ".join(f"{k}={v}" for k, v in swept_values(run, others).items())
        groups.setdefault(point, []).append(run)
    out = []
    for point, members in groups.items():
        if len(members) < 2:
            continue
        figures: dict[str, Any] = {}
        for name in PROTOCOLS:
            found = [(m.get("summary") or {}).get("protocols", {}).get(name) for m in members]
            if any(f is None or not f.get("n") for f in found):
                continue
            accs = [f["accuracy"] for f in found if f]
            mean = sum(accs) / len(accs)
            figures[name] = {"accuracy": sum(f["correct"] for f in found if f) / sum(f["n"] for f in found if f),
                             "spread": (sum((a - mean) ** 2 for a in accs) / (len(accs) - 1)) ** 0.5,
                             "per_seed": accs}
        out.append({"point": point, "seeds": len(members), "protocols": figures})
    return out


def _html(run: dict[str, Any], summary: dict[str, Any], rows: Sequence[dict[str, Any]]) -> str:
    toy = toy_run(run)
    body = [f"<h1>Evaluation {html.escape(run['run_id'])} · {html.escape(str(run.get('set_spec')))} · "
            f"{summary.get('items', 0)} item(s)</h1>"]
    if toy:  # before the headline: a toy panel's figures are no answer
        body.append(f"<p class=danger><strong>⚠ {html.escape(TOY_BANNER)}</strong> {html.escape(TOY_EVAL)}</p>")
    body.append(f"<p><strong>{html.escape(summary.get('verdict_line', ''))}</strong></p>")
    if summary.get("with_failures"):
        body.append(f"<p class=danger><strong>This run has failures</strong>: {summary.get('failed_items', 0)} "
                    "item(s) failed; headlines are on the items every compared protocol completed.</p>")
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
    if summary.get("calibration"):
        body.append(reliability_diagram(summary["calibration"], summary.get("calibration_bins", ""), toy=toy))
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
    full = MarkdownIt("commonmark", {"html": False}).enable("table").render(_markdown(run, summary, headline=False))
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
