"""conclave's Datasette plugin: registered in Datasette's own entry-point group (``datasette``), so
``conclave browse`` and a plain ``datasette index.db`` both load it.

For every database that is a conclave index (it has conclave's ``_sqlite_migrations`` set), whatever its name:

- ``startup``: an index written by an earlier release is upgraded before the first request (as any conclave
  command would), unless Datasette serves it unchanging (``--immutable``/``-i``) or its home is read-only: then
  it is served as it is, and the dashboard, the database page and the canned queries that cannot answer say why;
- metadata (titles, facets, hidden internal tables, canned queries) through ``get_metadata``;
- ``/-/conclave``: a dashboard with charts drawn as inline SVG (no script, no network) and recent consultations;
- ``/-/conclave/eval``: evaluation runs and sweeps charted (accuracy against cost, accuracy with intervals);
- ``/-/conclave/<id>``: one consultation as a transcript, from its journal next to the index (or, without one, from
  the index tables), rendered by the same renderers as the Markdown report; ``/-/conclave/<id>/journal.json``
  serves the raw journal records;
- ``render_cell``: artifact JSON as readable content, long text clamped to two lines on table pages, and a
  ``running`` consultation or eval run shown as what it is now (``interrupted`` once its process was killed);
- table pages open on about ten columns (``?_col=…`` unless the URL picks columns; ``_all=1`` shows every one)
  and without suggested facets (the declared ones show), column descriptions folded away, and the SQL box starts
  on a useful query.
Other databases served by the same Datasette are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import yaml
from datasette import hookimpl
from datasette.utils.asgi import Response
from markupsafe import Markup, escape

from conclave.datasette_plugin.databases import chart_rows, conclave_databases, not_upgraded, page, upgrade_served
from conclave.datasette_plugin.eval_page import eval_page
from conclave.datasette_plugin.live_cells import home_of, shown_status, status_cell
from conclave.render.bar_charts import bar_chart
from conclave.render.html import report_fragment, stylesheet
from conclave.render.journal_view import result_from_records
from conclave.render.nodes import Facts, to_html
from conclave.render.renderers import Context, render_artifact
from conclave.store.journal import read_records
from conclave.store.threads import THREAD_SQL

CSS_URL = "/-/conclave/conclave.css"

#: the columns a table page opens on (about ten), per table; Datasette always adds the primary key in front
DEFAULT_COLUMNS = {
    "consultations": ["started_at", "status", "mode", "question", "confidence", "dissent_count", "total_cost",
                      "total_tokens", "duration_s"],
    # started_at: the page sorts by it (metadata sort_desc), and Datasette's next-page link reads the sort column
    # from the shown row (a hidden one answered 500)
    "calls": ["started_at", "round_number", "agent", "provider", "model", "attempt", "outcome", "latency_s",
              "output_tokens", "cost"],
    "artifacts": ["round_number", "artifact_type", "agent", "status", "artifact"],
}
DEFAULT_SQL = ("select id, started_at, status, mode, question, confidence, round(total_cost, 4) as cost\n"
               "from consultations\norder by started_at desc\nlimit 20")
#: columns whose text is clamped to two lines on table pages (the full text stays in the cell)
LONG_TEXT = {"question", "recommendation", "error", "concern", "reason", "example_error"}
JSON_COLUMNS = {"prompt_versions", "limits", "config"}


# ------------------------------------------------------------------------------------------------ detection


def _is_conclave(datasette: Any, database: str | None) -> bool:
    return database is not None and database in conclave_databases(datasette)


@cache
def _metadata_template() -> dict[str, Any]:
    text = (resources.files("conclave.store") / "datasette_metadata.yaml").read_text(encoding="utf-8")
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


# ------------------------------------------------------------------------------------------------ hooks


@hookimpl
def startup(datasette: Any) -> Any:
    async def upgrade() -> None:
        await upgrade_served(datasette)

    return upgrade


@hookimpl
def get_metadata(datasette: Any, key: Any, database: Any, table: Any) -> dict[str, Any]:
    names = conclave_databases(datasette)
    if not names:
        return {}
    template = _metadata_template()
    per_db = template["databases"]["index"]
    return {"title": template["title"], "description_html": template["description_html"],
            "databases": {name: _saying_why(per_db, not_upgraded(datasette, name)) for name in names}}


def _saying_why(per_db: dict[str, Any], behind: tuple[str, dict[str, str]] | None) -> dict[str, Any]:
    """The database's metadata, on an index left behind conclave's schema with the reason on its page and on each
    canned query that cannot answer there."""
    if behind is None:
        return per_db
    why, failing = behind
    queries = dict(per_db["queries"])
    for name, cause in failing.items():
        if not isinstance(queries.get(name), dict):  # a query the user's own metadata gives as bare SQL (Datasette
            continue  # merges the user's metadata into what this hook returns): Datasette's own error answers it
        queries[name] = {**queries[name], "description_html": str(
            _behind_note(why, f"this query cannot answer until then ({cause})")
            + Markup("<p>") + escape(queries[name].get("description", "")) + Markup("</p>"))}
    note = _behind_note(why, f"{len(failing)} of its canned queries cannot answer until then" if failing else "")
    return {**per_db, "description_html": str(note + Markup("<p>") + escape(per_db.get("description", ""))
                                              + Markup("</p>")), "queries": queries}


def _behind_note(why: str, consequence: str) -> Markup:
    return Markup('<p class="cv-note cv-warn">{}</p>').format(
        f"This index was written by an earlier release of conclave and is served as it is: {why}. Any conclave "
        "command run where it may write the index (`conclave stats`, say) upgrades it; restart Datasette "
        "afterwards" + (f"; {consequence}." if consequence else "."))


@hookimpl
def extra_css_urls(database: Any, datasette: Any) -> list[str]:
    if (database is None and conclave_databases(datasette)) or _is_conclave(datasette, database):
        return [CSS_URL]
    return []


@hookimpl
def extra_body_script(template: Any, database: Any, table: Any, view_name: Any, datasette: Any) -> str:
    if not _is_conclave(datasette, database):
        return ""
    script = [_FOLD_COLUMN_HELP]
    if view_name == "database":
        script.append(f"var cvSql = document.querySelector('textarea#sql-editor');"
                      f"if (cvSql && !new URLSearchParams(location.search).get('sql')) "
                      f"{{ cvSql.value = {json.dumps(DEFAULT_SQL)}; }}")
    if view_name == "table" and table in DEFAULT_COLUMNS:
        script.append(_SHOW_ALL_LINK)
    if view_name == "row" and table == "consultations":
        script.append(_TRANSCRIPT_LINK)
    return "\n".join(script)


_FOLD_COLUMN_HELP = """
(function () {
  var dl = document.querySelector('dl.column-descriptions');
  if (!dl) return;
  var details = document.createElement('details');
  var summary = document.createElement('summary');
  summary.textContent = 'About these columns';
  dl.parentNode.insertBefore(details, dl);
  details.appendChild(summary);
  details.appendChild(dl);
})();
"""
_SHOW_ALL_LINK = """
(function () {
  var params = new URLSearchParams(location.search);
  var target = document.querySelector('h3') || document.querySelector('form.filters');
  if (!target) return;
  var p = document.createElement('p');
  p.className = 'cv-columns-note';
  var a = document.createElement('a');
  if (params.get('_all')) {
    params.delete('_all');
    a.textContent = 'Show the main columns only';
  } else {
    params.delete('_col');
    params.set('_all', '1');
    a.textContent = 'Show all columns';
  }
  a.href = location.pathname + '?' + params.toString();
  p.appendChild(document.createTextNode('Showing ' + (params.get('_all') ? 'the main' : 'all') + ' columns. '));
  p.appendChild(a);
  target.parentNode.insertBefore(p, target.nextSibling);
})();
"""


_TRANSCRIPT_LINK = """
(function () {
  var cid = decodeURIComponent(location.pathname.split('/').pop());
  var h1 = document.querySelector('h1');
  if (!h1 || !cid) return;
  var p = document.createElement('p');
  p.className = 'cv-note cv-info';
  var a = document.createElement('a');
  a.href = '/-/conclave/' + encodeURIComponent(cid);
  a.textContent = 'Read this consultation as a transcript';
  p.appendChild(a);
  h1.parentNode.insertBefore(p, h1.nextSibling);
})();
"""


@hookimpl
def extra_template_vars(template: Any, datasette: Any) -> dict[str, Any]:
    if template != "index.html":
        return {}
    return {"conclave_databases": conclave_databases(datasette),
            "conclave_queries": list(_metadata_template()["databases"]["index"]["queries"])}


@hookimpl
def menu_links(datasette: Any) -> list[dict[str, str]]:
    if not conclave_databases(datasette):
        return []
    return [{"href": datasette.urls.path("/-/conclave"), "label": "Conclave dashboard"},
            {"href": datasette.urls.path("/-/conclave/eval"), "label": "Conclave evaluations"}]


@hookimpl
def asgi_wrapper(datasette: Any) -> Any:
    """Table pages of a conclave index open on about ten columns unless the URL chooses (``_col``, ``_nocol``,
    ``_all``) and without suggested facets; JSON, CSV, canned queries and every other path pass through
    untouched."""

    def wrap(app: Any) -> Any:
        async def table_page_defaults(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope.get("type") == "http":
                scope = _with_table_page_defaults(datasette, scope)
            await app(scope, receive, send)

        return table_page_defaults

    return wrap


def _with_table_page_defaults(datasette: Any, scope: dict[str, Any]) -> dict[str, Any]:
    parts = scope.get("path", "").strip("/").split("/")
    if len(parts) != 2 or "." in parts[1] or parts[1] in _canned_queries() or not _is_conclave(datasette, parts[0]):
        return scope
    query = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    # Suggesting facets runs a counting query per column and facet type, each up to Datasette's 50 ms limit: at
    # 10k consultations that was 2 s of a 2.4 s calls page, warm or cold. The declared facets still show, and
    # any column can be faceted from its menu.
    added = [("_nosuggest", "1")] if not any(k == "_nosuggest" for k, _ in query) else []
    if parts[1] in DEFAULT_COLUMNS and not any(k in ("_col", "_nocol", "_all") for k, _ in query):
        added += [("_col", c) for c in DEFAULT_COLUMNS[parts[1]]]
    if not added:
        return scope
    return {**scope, "query_string": urlencode(query + added).encode("latin-1")}


@cache
def _canned_queries() -> frozenset[str]:
    return frozenset(_metadata_template()["databases"]["index"].get("queries", {}))


TIME_COLUMNS = {"started_at", "completed_at", "resumed_at", "at", "last_seen"}
MONEY_COLUMNS = {"total_cost", "estimated_cost", "cost", "cost_saved"}


@hookimpl
def render_cell(row: Any, value: Any, column: str, table: Any, database: Any, datasette: Any) -> Any:
    if not _is_conclave(datasette, database):
        return None
    if column in MONEY_COLUMNS and isinstance(value, float):
        return Markup(f'<span class="cv-nowrap" title="{value!r}">${value:.4f}</span>')
    if not isinstance(value, str):
        return None
    if column == "status":  # a running consultation or eval run as it is now (one lock attempt), not as indexed
        live = status_cell(row, value, table, datasette.databases[database])
        if live is not None:
            return live
    if column in TIME_COLUMNS and len(value) >= 19 and value[10] == "T":
        return Markup(f'<span class="cv-nowrap" title="{escape(value)}">{escape(value[:10])} '
                      f"{escape(value[11:19])}</span>")
    if table == "artifacts" and column == "artifact":
        return _artifact_cell(value, _row_get(row, "schema"), _row_get(row, "consultation_id"),
                              _row_get(row, "artifact_type"))
    if column == "raw_text":
        return Markup(f'<div class="cv-clamp">{escape(value)}</div>')
    if column in JSON_COLUMNS and value.startswith("{"):
        try:
            data = json.loads(value)
        except ValueError:
            return None
        if isinstance(data, Mapping) and all(not isinstance(v, Mapping | list) for v in data.values()):
            facts = to_html([Facts([(str(k), str(v)) for k, v in data.items()])])
            return Markup(f'<div class="cv-cell cv-clamp">{facts}</div>')
        return None
    if column in LONG_TEXT:
        cid = _row_get(row, "id") if table in ("consultations", "run_summary") and column == "question" else None
        if cid:  # the question opens the consultation's transcript
            return Markup(f'<a class="cv-clamp" href="/-/conclave/{escape(cid)}" title="Open the transcript: '
                          f'{escape(value)}">{escape(value)}</a>')
        return Markup(f'<div class="cv-clamp" title="{escape(value)}">{escape(value)}</div>')
    return None


def _row_get(row: Any, key: str) -> Any:
    try:
        return row[key]
    except (KeyError, IndexError, TypeError):
        return None


def _artifact_cell(value: str, schema: Any, cid: Any = None, artifact_type: Any = None) -> Any:
    """The artifact's brief, from the gist the index keeps (store/artifact_gist.py; its type is the row's
    ``artifact_type``), and a link to the transcript, which reads the full artifact from the journal."""
    try:
        artifact = json.loads(value)
    except ValueError:
        return None
    if not isinstance(artifact, dict):
        return None
    if isinstance(artifact_type, str):
        artifact.setdefault("artifact_type", artifact_type)
    kind = schema if isinstance(schema, str) else None
    brief = to_html(render_artifact(artifact, kind, Context(brief=True)))
    if isinstance(cid, Mapping):  # a foreign key Datasette expanded to its label
        cid = cid.get("value")
    link = "" if not isinstance(cid, str) else (
        f' <a class="cv-nowrap" href="/-/conclave/{escape(cid)}" title="The full text, from the journal">Read it</a>')
    return Markup(f'<div class="cv-cell">{brief}{link}</div>')


@hookimpl
def register_routes() -> list[tuple[str, Any]]:
    return [
        (r"^/-/conclave/conclave\.css$", _css),
        (r"^/-/conclave$", _dashboard),
        (r"^/-/conclave/eval$", eval_page),  # before the consultation route, which would take "eval" as an id
        (r"^/-/conclave/(?P<cid>[A-Za-z0-9_.-]+)/journal\.json$", _journal_json),
        (r"^/-/conclave/(?P<cid>[A-Za-z0-9_.-]+)$", _consultation),
    ]


async def _css() -> Response:
    return Response(stylesheet() + _DATASETTE_CSS, content_type="text/css; charset=utf-8",
                    headers={"cache-control": "max-age=300"})


_DATASETTE_CSS = """
/* on Datasette's own pages of a conclave index */
body.table .cv-clamp, body.query .cv-clamp { display: -webkit-box; -webkit-line-clamp: 2; -webkit-box-orient: vertical;
  overflow: hidden; max-width: 36em; }
.rows-and-columns td { max-width: 40em; }
.rows-and-columns td.col-question, .rows-and-columns td.col-recommendation { min-width: 12em; }
.rows-and-columns td.col-id, .cv-nowrap { white-space: nowrap; }
.rows-and-columns td.col-consultation_id { max-width: 14em; font-size: 0.9em; }
.rows-and-columns td.col-artifact { min-width: 34em; }
.cv-cell details summary { cursor: pointer; color: #0969da; font-size: 0.9em; }
.cv-live-status { border-bottom: 1px dotted #59636e; cursor: help; }
.cv-live-status.cv-killed { color: #9a6700; font-weight: 600; }
.cv-transcript-link { font-size: 0.85em; white-space: nowrap; }
.cv-columns-note { font-size: 0.9em; color: #59636e; }
details > summary { cursor: pointer; }
.cv-panel { border: 1px solid #d1d9e0; border-radius: 6px; padding: 0.6em 1em; margin: 1em 0; background: #f6f8fa; }
.cv-panel h2 { margin-top: 0.2em; }
.cv-eval-charts { display: flex; flex-wrap: wrap; gap: 1.5em; }
.cv-eval-charts svg { max-width: 100%; height: auto; border: 1px solid #d1d9e0; border-radius: 6px; }
.cv-eval-lines { list-style: none; padding-left: 0; }
.cv-thread-list { list-style: none; padding-left: 0; }
.cv-thread-item { margin: 0.35em 0; padding-left: 0.6em; border-left: 3px solid #d1d9e0; }
.cv-thread-id { font-size: 0.8em; }
"""


# ------------------------------------------------------------------------------------------------ pages


async def _find(datasette: Any, cid: str) -> tuple[str, Any] | None:
    for name in conclave_databases(datasette):
        db = datasette.databases[name]
        rows = (await db.execute("select id from consultations where id = ?", [cid])).rows
        if rows:
            return name, db
    return None


def journal_path(db: Any, cid: str) -> Path | None:
    """The journal of ``cid`` next to the index (``$CONCLAVE_HOME/journal/<id>.jsonl``), when it is there."""
    home = home_of(db)
    if home is None:
        return None
    candidate = home / "journal" / f"{cid}.jsonl"
    return candidate if candidate.is_file() else None


async def records_for(db: Any, cid: str) -> tuple[list[dict[str, Any]], str]:
    """The consultation's journal records, or records rebuilt from the index tables; and which it was."""
    path = journal_path(db, cid)
    if path is not None:
        return read_records(path), "journal"
    return await _records_from_index(db, cid), "index"


async def _records_from_index(db: Any, cid: str) -> list[dict[str, Any]]:
    """Journal-shaped records from the index: what the views need when the journal is not beside the index."""

    async def rows(sql: str) -> list[dict[str, Any]]:
        return [dict(r) for r in (await db.execute(sql, [cid])).rows]

    consultation = (await rows("select * from consultations where id = ?"))[0]
    agents = await rows("select agent as name, persona, provider, model, label from agents "
                        "where consultation_id = ? order by rowid")
    records: list[dict[str, Any]] = [{"type": "consultation:started", "consultation_id": cid, "seq": -1, "data": {
        "question": consultation.get("question"), "mode": consultation.get("mode"),
        "strategy": consultation.get("strategy"), "planned_rounds": consultation.get("planned_rounds"),
        "agents": agents, "judge_labels": {a["name"]: a["label"] for a in agents},
        "judge": {"provider": consultation.get("judge_provider"), "model": consultation.get("judge_model")},
        "prompt_versions": json.loads(consultation["prompt_versions"]) if consultation.get("prompt_versions") else None,
    }}]
    for r in await rows("select * from rounds where consultation_id = ? order by round_number"):
        records.append({"type": "round:started", "data": r})
        if r.get("completed_at"):
            records.append({"type": "round:completed", "data": {**r, "ok": True}})
    for r in await rows("select * from calls where consultation_id = ? order by seq"):
        records.append({"type": "provider:attempt", "seq": r["seq"], "data": {**r, "number": r.get("attempt")}})
    for r in await rows("select * from artifacts where consultation_id = ? order by seq"):
        try:
            artifact = json.loads(r["artifact"] or "null")
        except ValueError:
            continue
        if isinstance(artifact, dict):  # the gist leaves to the row what its columns say
            artifact = {"artifact_type": r["artifact_type"], "round_number": r["round_number"], **artifact}
        records.append({"type": "consultation:round_artifact", "seq": r["seq"], "data": {**r, "artifact": artifact}})
    for r in await rows("select * from substitutions where consultation_id = ? order by seq"):
        records.append({"type": "consultation:provider_substituted", "seq": r["seq"], "data": r})
    return records


async def _consultation(datasette: Any, request: Any) -> Response:
    cid = request.url_vars["cid"]
    found = await _find(datasette, cid)
    if found is None:
        return Response.html(await page(datasette, "Not found", f"<p>No consultation {escape(cid)}.</p>", request),
                             status=404)
    name, db = found
    records, source = await records_for(db, cid)
    result = result_from_records(records)
    if source == "journal" and not any(r.get("type") == "consultation:completed" for r in records):
        result["status"] = shown_status(db, cid, "running")  # running while a process writes it, else interrupted
    if source == "index":
        row = dict((await db.execute("select * from consultations where id = ?", [cid])).rows[0])
        result.update(status=shown_status(db, cid, row.get("status")), consultation_id=cid,
                      completed_rounds=row.get("rounds_completed"),
                      abort_reason=None if row.get("status") != "running" else result.get("abort_reason"))
        result["cost"] = {"actual": row.get("total_cost")}
        result["tokens"] = {"total": row.get("total_tokens")}
    base = datasette.urls.database(name)
    links = [
        ("Raw journal records" if source == "journal" else "Raw records (rebuilt from the index)",
         f"/-/conclave/{cid}/journal.json"),
        ("Provider calls", f"{base}/calls?consultation_id={cid}&_all=1"),
        ("Artifacts", f"{base}/artifacts?consultation_id={cid}"),
        ("Transitions", f"{base}/transitions?consultation_id={cid}"),
        ("Index row", f"{base}/consultations/{cid}"),
        ("All consultations", "/-/conclave"),
    ]
    nav = " ".join(f'<a href="{escape(url)}">{escape(label)}</a>' for label, url in links)
    report = report_fragment(result, records)
    toc = " ".join(f'<a href="#{a}">{t}</a>' for a, t in (("verdict", "Verdict"), ("dissent", "Dissent"),
                                                         ("panel", "Panel"), ("round-1", "Round 1"),
                                                         ("round-2", "Round 2"), ("round-3", "Round 3"),
                                                         ("movement", "Movement"), ("cost", "Cost"))
                   if f'id="{a}"' in report)
    body = (f'<p class="cv-nav">{nav}</p><p class="cv-nav">Jump to: {toc}</p>'
            + await _thread_section(db, cid)
            + report
            + ("" if source == "journal" else
               '<p class="cv-muted">The journal was not found next to this index; this page was rebuilt from the '
               "index tables, which keep each artifact's gist: the full texts are in the journal.</p>"))
    question = " ".join(str(result.get("question") or cid).split())
    return Response.html(await page(datasette, question[:90], body, request))


async def _thread_section(db: Any, cid: str) -> str:
    """The follow-up thread ``cid`` belongs to (its ancestors and its follow-ups), each linked to its page and
    indented by depth; empty for a consultation that is no follow-up and has none."""
    rows = [dict(r) for r in (await db.execute(THREAD_SQL, {"id": cid})).rows]
    if len(rows) < 2:
        return ""
    items = []
    for r in rows:
        question = " ".join(str(r.get("question") or "").split())
        short = question if len(question) <= 120 else question[:119] + "…"
        started = escape((r.get("started_at") or "")[:16].replace("T", " "))
        meta = f'<span class="cv-muted">{started} · {escape(r.get("status") or "")}</span>'
        if r["id"] == cid:
            head = f'<strong>{escape(short)}</strong> <span class="cv-muted">(this consultation)</span>'
        else:
            head = f'<a href="/-/conclave/{escape(r["id"])}">{escape(short)}</a>'
        items.append(f'<li class="cv-thread-item" style="margin-left: {1.5 * int(r["depth"]):g}em">{head}<br>'
                     f'<code class="cv-thread-id">{escape(r["id"])}</code> {meta}</li>')
    return (f'<section class="cv-section cv-thread" id="thread"><h2>Follow-up thread ({len(rows)} consultations)'
            f'</h2><ol class="cv-thread-list">{"".join(items)}</ol></section>')


async def _journal_json(datasette: Any, request: Any) -> Response:
    cid = request.url_vars["cid"]
    found = await _find(datasette, cid)
    if found is None:
        return Response.json({"ok": False, "error": f"no consultation {cid}"}, status=404)
    records, _ = await records_for(found[1], cid)
    return Response.json(records)


#: the dashboard's totals, summed from the consultation_daily rollup (a few rows a day; the consultations' covering
#: index took 75 ms cold at 100k): a consultation's total_tokens is its input plus output tokens, and only an early
#: termination that was accepted records what it saved
DASHBOARD_TOTALS = ("select coalesce(sum(consultations), 0) as n, total(cost) as cost, "
                    "total(input_tokens + output_tokens) as tokens, total(et_accepted) as early, "
                    "total(cost_saved) as saved, total(filter_saved) as filtered from consultation_daily")

CHARTS = [
    ("spending_per_day", "Spending per day (USD)", "day", "cost", lambda v: f"${v:.4f}"),
    ("spending_per_provider", "Spending per provider (USD)", "provider", "cost", lambda v: f"${v:.4f}"),
    ("confidence_distribution", "Verdict confidence (consultations per tenth)", "bucket", "consultations",
     lambda v: f"{v:g}"),
    ("early_termination_savings", "Early-termination savings per day (USD, estimated)", "day", "cost_saved",
     lambda v: f"${v:.4f}"),
    ("filter_savings", "Tokens saved by artifact filtering", "label", "tokens_saved", lambda v: f"{v:,.0f}"),
]


def _bucket(low: float) -> str:
    """``0.8`` → ``80–89%``; the top bucket includes 100%."""
    return f"{low * 100:.0f}–{'100' if low >= 0.9 else f'{low * 100 + 9:.0f}'}%"


def _pct(value: Any) -> str:
    return "" if value is None else f"{value:.0%}"


def _usd(value: Any) -> str:
    return "" if value is None else f"${value:.4f}"


async def _dashboard(datasette: Any, request: Any) -> Response:
    names = conclave_databases(datasette)
    if not names:
        return Response.html(await page(datasette, "conclave", "<p>No conclave index is being served.</p>",
                                         request), status=404)
    parts = []
    for name in names:
        base = datasette.urls.database(name)
        behind = not_upgraded(datasette, name)
        failing = behind[1] if behind else {}
        charts = []
        for query, title, label_key, value_key, fmt in CHARTS:
            if query in failing:
                charts.append(f'<div><p class="cv-muted">{escape(title)}: not drawn, <a href="{base}/{query}">'
                              f"{escape(query)}</a> cannot answer on this index ({escape(failing[query])})</p></div>")
                continue
            rows = await chart_rows(datasette, name, query)
            if query == "filter_savings":
                labels = [f"{r['filter']} r{r['round_number']}" for r in rows]
            elif query == "confidence_distribution":
                labels = [_bucket(float(r["bucket"])) for r in rows]
            else:
                labels = [str(r[label_key]) for r in rows]
            values = [float(r[value_key] or 0) for r in rows]
            charts.append(f'<div>{bar_chart(title, labels, values, fmt=fmt)}'
                          f'<p class="cv-muted"><a href="{base}/{query}">{escape(query)}</a> (the SQL behind it)</p>'
                          "</div>")
        # the totals and the recent consultations read tables every index has had since m004
        totals = (await datasette.databases[name].execute(DASHBOARD_TOTALS)).rows[0]
        summary = (f'<p>{totals["n"]:,} consultations · ${totals["cost"]:.4f} spent · {int(totals["tokens"]):,} '
                   f'tokens · {int(totals["early"])} stopped early (about ${totals["saved"]:.4f} saved) · '
                   f'{int(totals["filtered"]):,} tokens saved by filtering</p>')
        if behind:
            summary = str(_behind_note(behind[0], "the charts it cannot draw say so below")) + summary
        recent = (await datasette.databases[name].execute(
            "select id, started_at, status, mode, question, confidence, total_cost from consultations "
            "order by started_at desc limit 25")).rows
        rows_html = "".join(
            f'<tr><td class="cv-nowrap"><a href="/-/conclave/{escape(r["id"])}">{escape(r["id"])}</a></td>'
            f"<td class=\"cv-nowrap\">{escape((r['started_at'] or '')[:19].replace('T', ' '))}</td>"
            f"<td>{escape(shown_status(datasette.databases[name], r['id'], r['status']) or '')}</td>"
            f"<td>{escape(r['mode'] or '')}</td><td>{escape(r['question'] or '')}</td>"
            f'<td class="cv-num">{_pct(r["confidence"])}</td><td class="cv-num">{_usd(r["total_cost"])}</td></tr>'
            for r in recent)
        parts.append(
            f'<section class="cv-section"><h2>Recent consultations · <a href="{base}">{escape(name)}</a></h2>{summary}'
            f'<div class="cv-table-wrap"><table class="cv-table"><thead><tr><th>Id</th><th>Started</th>'
            f'<th>Status</th><th>Mode</th><th>Question</th><th class="cv-num">Confidence</th>'
            f'<th class="cv-num">Cost</th></tr></thead><tbody>{rows_html}</tbody></table></div>'
            f'<p><a href="{base}/consultations">Browse and facet all consultations</a></p></section>'
            f'<section class="cv-section"><h2>Charts</h2><div class="cv-grid">{"".join(charts)}</div></section>')
    body = '<div class="cv-report"><h1>Conclave dashboard</h1>' + "".join(parts) + "</div>"
    return Response.html(await page(datasette, "Conclave dashboard", body, request))
