"""``/-/conclave/eval``: evaluation runs charted inside Datasette — accuracy against cost per protocol, and
accuracy by protocol with 95% intervals — drawn server-side as inline SVG from the ``eval_accuracy_vs_cost`` canned
query (the same SQL a user can open and edit).

``?run=ID`` shows one run, ``?sweep=ID`` every run of a sweep (each labelled with its swept values); without
either, the latest run — or its whole sweep when it belongs to one.
"""

from __future__ import annotations

import json
from typing import Any

from datasette.utils.asgi import Response
from markupsafe import escape

from conclave.cli.panel import TOY_BANNER
from conclave.datasette_plugin.databases import chart_rows, conclave_databases, page
from conclave.eval.charts import accuracy_intervals, accuracy_vs_cost, reliability_diagram
from conclave.eval.run_report import TOY_EVAL, swept_keys, swept_values, toy_run
from conclave.eval.summary import correct_across

QUERY = "eval_accuracy_vs_cost"


async def eval_page(datasette: Any, request: Any) -> Response:
    names = [n for n in conclave_databases(datasette) if await _has_runs(datasette, n)]
    if not names:
        body = ('<div class="cv-report"><h1>Evaluations</h1><p>No evaluation runs in the index yet: '
                "<code>conclave eval arithmetic</code> runs one.</p></div>")
        return Response.html(await page(datasette, "Evaluations", body, request))
    name = request.args.get("db") if request.args.get("db") in names else names[0]
    base = datasette.urls.database(name)
    rows = await chart_rows(datasette, name, QUERY)
    runs = _runs(rows)
    run_id, sweep_id = request.args.get("run"), request.args.get("sweep")
    if not run_id and not sweep_id:
        latest = max(runs.values(), key=lambda r: str(r["started_at"] or ""))
        run_id, sweep_id = (None, latest["sweep_id"]) if latest["sweep_id"] else (latest["run_id"], None)
    chosen = [r for r in runs.values() if (sweep_id and r["sweep_id"] == sweep_id) or r["run_id"] == run_id]
    if not chosen:
        what = f"sweep {sweep_id}" if sweep_id else f"run {run_id}"
        body = f'<div class="cv-report"><h1>Evaluations</h1><p>No {escape(what)} in {escape(name)}.</p></div>'
        return Response.html(await page(datasette, "Evaluations", body, request), status=404)
    body = await _body(datasette, name, base, chosen, runs, sweep_id)
    title = f"Evaluation sweep {sweep_id}" if sweep_id else f"Evaluation {run_id}"
    return Response.html(await page(datasette, title, body, request))


async def _has_runs(datasette: Any, name: str) -> bool:
    db = datasette.databases[name]
    if not await db.table_exists("eval_runs"):
        return False
    return bool((await db.execute("select count(*) from eval_runs")).rows[0][0])


def _runs(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The canned query's rows (one per run and protocol) grouped by run."""
    runs: dict[str, dict[str, Any]] = {}
    for row in rows:
        run = runs.setdefault(row["run_id"], {
            "run_id": row["run_id"], "sweep_id": row["sweep_id"], "started_at": row["started_at"],
            "items": row["items"] or 0, "overrides": _list(row["overrides"]), "protocols": []})
        if row["accuracy"] is not None:
            run["protocols"].append(row)
    return runs


def _list(value: Any) -> list[str]:
    try:
        found = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return []
    return [str(v) for v in found] if isinstance(found, list) else []


def points(chosen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chart points (:mod:`conclave.eval.charts`) of the chosen runs, each labelled with its swept values."""
    keys = [k for k in swept_keys(chosen) if k not in ("eval.sweep_id",)]
    ordered = sorted(chosen, key=lambda r: tuple(swept_values(r, keys).values()))
    out = []
    for run in ordered:
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in swept_values(run, keys).items()) \
            if len(chosen) > 1 else ""
        n = run["items"] or 1
        for row in run["protocols"]:
            out.append({"protocol": row["protocol"], "run": label, "accuracy": row["accuracy"],
                        "ci_low": row["ci_low"], "ci_high": row["ci_high"],
                        "cost": None if row["cost"] is None else row["cost"] / n, "tokens": (row["tokens"] or 0) / n})
    return out


async def _body(datasette: Any, name: str, base: str, chosen: list[dict[str, Any]],
                runs: dict[str, dict[str, Any]], sweep_id: str | None) -> str:
    drawn = points(chosen)
    db = datasette.databases[name]
    ids = [r["run_id"] for r in chosen]
    marks = ",".join("?" * len(ids))
    details = {r["run_id"]: dict(r) for r in (await db.execute(
        f"select run_id, status, set_spec, items_done, summary, panel, judge from eval_runs where run_id in ({marks})",
        ids)).rows}
    toy = any(toy_run(run) for run in details.values())
    summaries = {run_id: _summary(details.get(run_id, {}).get("summary")) for run_id in ids}
    # the points of a sweep are compared many times: their debate-vs-vote p-values are Holm-corrected
    correct_across([s for s in summaries.values() if s.get("comparisons")])
    keys = [k for k in swept_keys(chosen) if k != "eval.sweep_id"]
    labels = {r["run_id"]: ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in swept_values(r, keys).items())
              or r["run_id"] for r in chosen}
    lines = []
    diagrams = []
    for run_id in ids:
        summary = summaries[run_id]
        label = f"{escape(labels[run_id])}: " if len(ids) > 1 else ""
        # the answer first, then the vote at the debate's budget and the quality arm
        for key in ("verdict_line", "matched_line", "quality_line"):
            if summary.get(key):
                lines.append(f"<li>{label}<strong>{escape(summary[key])}</strong></li>")
        if summary.get("with_failures"):
            lines.append(f'<li class="cv-danger">{label}this run has failures: {summary.get("failed_items", 0)} '
                         "item(s) failed; headlines are on the items every compared protocol completed</li>")
        if summary.get("calibration"):
            diagrams.append(f"<figure><figcaption>{label}</figcaption>"
                            f"{reliability_diagram(summary['calibration'], summary.get('calibration_bins', ''))}"
                            "</figure>")
    scope = f"sweep {sweep_id} · {len(chosen)} run(s)" if sweep_id else f"run {chosen[0]['run_id']}"
    first = details.get(ids[0], {})
    heading = (f'<h1>Evaluations</h1><p class="cv-muted">{escape(scope)} · set {escape(first.get("set_spec") or "")}'
               f" · {sum(int(r['items'] or 0) for r in chosen)} item(s)</p>")
    if toy:
        heading += (f'<div class="cv-note cv-danger"><strong>⚠ {escape(TOY_BANNER)}</strong> {escape(TOY_EVAL)}'
                    "</div>")
    charts = (f'<section class="cv-section"><div class="cv-eval-charts">{accuracy_vs_cost(drawn, toy=toy)}'
              f"{accuracy_intervals(drawn, toy=toy)}</div>"
              f'<p class="cv-muted">Drawn from the canned query <a href="{base}/{QUERY}">{QUERY}</a>; '
              "points are per item, whiskers are 95% Wilson intervals. Protocols of one run share its round-1 "
              "answers, so their costs add up along the line.</p></section>")
    listing = _listing(runs, base)
    calibration = (f'<section class="cv-section"><h2>Calibration</h2><div class="cv-eval-charts">'
                   f'{"".join(diagrams)}</div></section>') if diagrams else ""
    return (f'<div class="cv-report">{heading}<ul class="cv-eval-lines">{"".join(lines)}</ul>{charts}{calibration}'
            f"{listing}</div>")


def _summary(value: Any) -> dict[str, Any]:
    try:
        found = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def _listing(runs: dict[str, dict[str, Any]], base: str) -> str:
    """Every run and sweep, newest first, each a link to its charts."""
    sweeps: dict[str, list[dict[str, Any]]] = {}
    rows = []
    for run in sorted(runs.values(), key=lambda r: str(r["started_at"] or ""), reverse=True):
        if run["sweep_id"]:
            if run["sweep_id"] in sweeps:
                sweeps[run["sweep_id"]].append(run)
                continue
            sweeps[run["sweep_id"]] = [run]
        link = (f'<a href="/-/conclave/eval?sweep={escape(run["sweep_id"])}">sweep {escape(run["sweep_id"])}</a>'
                if run["sweep_id"] else f'<a href="/-/conclave/eval?run={escape(run["run_id"])}">'
                f"{escape(run['run_id'])}</a>")
        rows.append((run, link))
    body = "".join(
        f'<tr><td class="cv-nowrap">{link}</td><td class="cv-nowrap">'
        f"{escape(str(run['started_at'] or '')[:19].replace('T', ' '))}</td>"
        f"<td class=\"cv-num\">{len(sweeps.get(run['sweep_id'] or '', [run]))}</td></tr>"
        for run, link in rows)
    return (f'<section class="cv-section"><h2>All evaluations</h2><div class="cv-table-wrap"><table class="cv-table">'
            f'<thead><tr><th>Run or sweep</th><th>Started</th><th class="cv-num">Runs</th></tr></thead>'
            f'<tbody>{body}</tbody></table></div><p><a href="{base}/eval_runs">Browse the eval_runs table</a> · '
            f'<a href="{base}/eval_runs_overview">Evaluation runs overview</a></p></section>')
