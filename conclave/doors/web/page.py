"""The live view's two pages, self-contained (no script, style or font from the network)."""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any

from conclave.cli.panel import TOY_BANNER, TOY_DETAIL, TOY_MODEL, TOY_PROVIDER

_STYLE = """
:root { --fg:#1d2430; --muted:#5b6472; --line:#dfe3ea; --bg:#f7f8fa; --card:#fff; --ok:#1f7a4d; --bad:#b3261e;
        --run:#8a5a00; --accent:#2f5fd0; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui,-apple-system,Segoe UI,Roboto,sans-serif; color:var(--fg); background:var(--bg); }
header { padding:16px 24px; background:var(--card); border-bottom:1px solid var(--line); }
header h1 { margin:0; font-size:18px; } header .sub { color:var(--muted); font-size:13px; }
main { max-width:1100px; margin:0 auto; padding:20px 24px 60px; }
table { border-collapse:collapse; width:100%; background:var(--card); }
td,th { text-align:left; padding:8px 10px; border-bottom:1px solid var(--line); vertical-align:top; }
th { font-size:12px; text-transform:uppercase; color:var(--muted); }
a { color:var(--accent); text-decoration:none; } a:hover { text-decoration:underline; }
form { background:var(--card); border:1px solid var(--line); padding:16px; border-radius:8px; margin-bottom:20px; }
textarea,input[type=text] { width:100%; font:inherit; padding:8px; border:1px solid var(--line); border-radius:6px; }
button { font:inherit; padding:8px 16px; border:0; border-radius:6px; background:var(--accent); color:#fff; cursor:pointer; }
.row { display:flex; gap:16px; flex-wrap:wrap; margin:8px 0; } select { font:inherit; padding:6px; }
form.approve { border:0; padding:8px 0 0; margin:0; background:none; }
.note { padding:10px 14px; border-radius:6px; margin-bottom:14px; background:#fff7e6; border:1px solid #f0d49a; }
.error { background:#fdecea; border-color:#f3b4ae; }
.status { font-weight:600; } .status.complete,.status.completed_degraded { color:var(--ok); }
.status.partial,.status.aborted,.status.blocked,.status.interrupted { color:var(--bad); } .status.running { color:var(--run); }
.round { background:var(--card); border:1px solid var(--line); border-radius:8px; margin:14px 0; }
.round > h2 { margin:0; padding:10px 14px; font-size:15px; border-bottom:1px solid var(--line); display:flex; gap:10px; }
.round > h2 .state { margin-left:auto; font-weight:400; color:var(--muted); font-size:13px; }
.agents { display:grid; grid-template-columns:repeat(auto-fill,minmax(320px,1fr)); gap:10px; padding:12px; }
.agent { border:1px solid var(--line); border-radius:6px; padding:10px; min-height:64px; }
.agent .who { font-weight:600; } .agent .meta { color:var(--muted); font-size:12px; }
.agent.thinking .who::after { content:" · thinking…"; color:var(--run); font-weight:400; }
.agent.done .who::after { content:" ✓"; color:var(--ok); } .agent.failed .who::after { content:" ✗"; color:var(--bad); }
.stream { white-space:pre-wrap; font:12px/1.4 ui-monospace,Menlo,monospace; max-height:160px; overflow:auto;
          background:var(--bg); padding:6px; margin-top:6px; border-radius:4px; }
.raw summary { color:var(--muted); font-size:12px; cursor:pointer; }
.raw:has(.stream:empty) { display:none; }
.artifact dl { margin:6px 0 0; } .artifact dt { font-weight:600; font-size:13px; margin-top:6px; }
.artifact dd { margin:0 0 0 12px; } .artifact ul { margin:2px 0; padding-left:18px; }
.artifact .lead { font-weight:600; margin:6px 0 2px; } .artifact .conf { color:var(--muted); font-size:13px; margin:0; }
.artifact h4 { margin:8px 0 2px; font-size:12px; text-transform:uppercase; color:var(--muted); }
.tag { font-size:11px; color:var(--muted); border:1px solid var(--line); border-radius:4px; padding:0 4px; }
.fields summary { color:var(--muted); font-size:12px; cursor:pointer; margin-top:6px; }
.agent[data-agent=judge] { grid-column:1 / -1; }
#verdict { background:var(--card); border:2px solid var(--accent); border-radius:8px; padding:14px; margin:14px 0; }
#verdict:empty { display:none; }
#conn { font-size:12px; color:var(--muted); }
h2 { font-size:16px; margin:24px 0 8px; }
.status.in_progress { color:var(--run); } .status.expired,.status.cancelled,.status.failed { color:var(--bad); }
.status.completed { color:var(--ok); } td.id { font-family:ui-monospace,Menlo,monospace; }
.bar { height:6px; background:var(--line); border-radius:3px; margin-top:4px; width:220px; }
.bar > div { height:100%; background:var(--accent); border-radius:3px; }
"""

_SCRIPT = r"""
const cid = document.body.dataset.id;
const rounds = document.getElementById("rounds");
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;","'":"&#39;"}[c]));
const title = {independent:"Independent", synthesis:"Synthesis", cross_exam:"Cross-examination", verdict:"Verdict",
               objection:"Critical objection"};
function render(v) {
  if (Array.isArray(v)) return "<ul>" + v.map(x => "<li>" + render(x) + "</li>").join("") + "</ul>";
  if (v && typeof v === "object") return "<dl>" + Object.entries(v).filter(([k]) =>
      !["artifact_type","schema_version","round_number","created_at","agent_id"].includes(k)).map(([k, x]) =>
      "<dt>" + esc(k.replaceAll("_", " ")) + "</dt><dd>" + render(x) + "</dd>").join("") + "</dl>";
  return esc(v);
}
// an artifact as a person reads it: its answer first, its confidence, its main lists; every field in a fold
const LEAD = ["position", "recommendation", "answer", "verdict", "summary"];
const LISTS = [["key_points", "Key points"], ["consensus_points", "Consensus"], ["tensions", "Tensions"],
               ["evidence", "Evidence"], ["dissent", "Dissent"], ["challenges", "Challenges"],
               ["rebuttals", "Rebuttals"], ["uncertainties", "Uncertainties"], ["claims", "Claims"]];
const TEXT = ["point", "text", "concern", "topic", "challenge", "claim", "insight", "position", "option", "failure"];
function line(x) {
  if (!x || typeof x !== "object") return esc(x);
  const main = TEXT.map(k => x[k]).find(v => typeof v === "string") ?? JSON.stringify(x);
  const tags = [x.id, x.label, x.agent, x.severity].filter(v => typeof v === "string" && v);
  return (tags.length ? "<span class=tag>" + tags.map(esc).join(" · ") + "</span> " : "") + esc(main);
}
function artifact(a) {
  if (!a || typeof a !== "object") return esc(a);
  let out = "";
  const lead = LEAD.find(k => typeof a[k] === "string");
  if (lead) out += "<p class=lead>" + esc(a[lead]) + "</p>";
  if (typeof a.confidence === "number") out += "<p class=conf>confidence " + Math.round(a.confidence * 100) + "%</p>";
  if (typeof a.rationale === "string") out += "<p>" + esc(a.rationale) + "</p>";
  for (const [k, label] of LISTS) {
    if (Array.isArray(a[k]) && a[k].length)
      out += "<h4>" + label + "</h4><ul>" + a[k].map(x => "<li>" + line(x) + "</li>").join("") + "</ul>";
  }
  return out + "<details class=fields><summary>all fields</summary>" + render(a) + "</details>";
}
function round(n, type) {
  let el = document.getElementById("round-" + n);
  if (!el) {
    el = document.createElement("section"); el.className = "round"; el.id = "round-" + n;
    el.innerHTML = "<h2>Round " + n + " · <span class=kind></span><span class=state>running</span></h2><div class=agents></div>";
    rounds.appendChild(el);
  }
  if (type) el.querySelector(".kind").textContent = title[type] || type;
  return el;
}
function agent(n, who) {
  const box = round(n).querySelector(".agents");
  let el = box.querySelector('[data-agent="' + CSS.escape(who) + '"]');
  if (!el) {
    el = document.createElement("div"); el.className = "agent thinking"; el.dataset.agent = who;
    el.dataset.start = Date.now();
    el.innerHTML = "<div class=who>" + esc(who) + "</div><div class=meta></div>"
      + "<details class=raw><summary>raw output as it arrives</summary><div class=stream></div></details><div class=artifact></div>";
    box.appendChild(el);
  }
  return el;
}
let panel = [];
const judgeRounds = ["synthesis", "verdict"];
setInterval(() => {
  for (const el of document.querySelectorAll(".agent.thinking")) {
    const chars = el.querySelector(".stream").textContent.length;
    el.querySelector(".meta").textContent = ((Date.now() - el.dataset.start) / 1000).toFixed(1) + " s"
      + (chars ? " · " + chars + " characters streamed" : "");
  }
}, 200);
const handlers = {
  "consultation:started": d => {
    panel = (d.agents || []).map(a => a.name);
    document.getElementById("question").textContent = d.question;
    document.getElementById("panel").textContent = (d.agents || []).map(a => a.name + " (" + a.model + ")").join(" · ")
      + " · judge " + (d.judge ? d.judge.model : "");
  },
  "round:started": d => {
    round(d.round_number, d.round_type);
    for (const who of judgeRounds.includes(d.round_type) ? ["judge"] : panel) agent(d.round_number, who);
  },
  "agent:chunk": d => { const s = agent(d.round_number, d.agent).querySelector(".stream"); s.textContent += d.text; s.scrollTop = s.scrollHeight; },
  "agent:completed": d => {
    const el = agent(d.round_number, d.agent);
    el.className = "agent " + (d.ok ? "done" : "failed");
    const cards = round(d.round_number).querySelectorAll(".agent");
    if (d.agent !== "judge" && ![...cards].some(c => c.classList.contains("thinking"))
        && round(d.round_number).querySelector(".kind").textContent !== "Independent") agent(d.round_number, "judge");
    el.querySelector(".meta").textContent = (d.model || "") + " · " + d.duration_s + " s · "
      + (d.input_tokens + d.output_tokens) + " tokens" + (d.error ? " · " + d.error : "");
  },
  "consultation:round_artifact": d => {
    const el = agent(d.round_number, d.agent || "judge");
    el.querySelector(".raw").style.display = "none";
    el.querySelector(".artifact").innerHTML = artifact(d.artifact);
  },
  "safety:checked": d => {  // a blocked answer is hidden from everyone watching (the journal keeps it)
    for (const w of d.withheld || []) {
      const el = agent(w.round_number, w.agent || "judge");
      el.querySelector(".raw").style.display = "none";
      el.querySelector(".artifact").innerHTML = "<p class='note error'>Withheld by the safety evaluator: "
        + esc((d.block || {}).reason || "") + "</p>";
    }
  },
  "round:completed": d => { round(d.round_number).querySelector(".state").textContent =
      (d.ok ? "done" : "failed") + " · " + d.duration_s + " s"; },
  "round:interrupted": d => { round(d.round_number).querySelector(".state").textContent = "interrupted: " + d.reason; },
  "consultation:completed": d => {
    const r = d.result || {}, v = r.verdict || {};
    const st = document.getElementById("status"); st.textContent = d.status; st.className = "status " + d.status;
    document.getElementById("verdict").innerHTML = "<h2>Verdict" + (r.confidence != null ? " · confidence "
      + Math.round(r.confidence * 100) + "%" : "") + "</h2><div class=artifact>" + artifact(v) + "</div>"
      + (r.abort_reason ? "<p class='note error'>" + esc(r.abort_reason) + "</p>" : "")
      + "<p><a class=report href='/c/" + encodeURIComponent(cid) + "/report'>Read the formatted report →</a></p>";
  },
};
function connect() {
  const source = new EventSource("/c/" + encodeURIComponent(cid) + "/events");
  source.onopen = () => { document.getElementById("conn").textContent = "live"; };
  source.onmessage = m => { const e = JSON.parse(m.data); (handlers[e.type] || (() => {}))(e.data); };
  source.addEventListener("end", () => { document.getElementById("conn").textContent = "finished"; source.close(); });
  source.onerror = () => { document.getElementById("conn").textContent = "reconnecting…"; };
}
connect();
"""


def _page(title: str, body: str, data: str = "") -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport "
            f"content='width=device-width,initial-scale=1'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body{data}>{body}</body></html>")


@dataclass(frozen=True)
class FormChoices:
    """What the start form offers: the registered panels and modes (the server's own configuration decides the
    rest), and the directories context files may come from."""

    panels: tuple[str, ...]
    modes: tuple[str, ...]
    roots: tuple[str, ...] = ()


ROUND_CHOICES = (("", "the full debate"), ("1", "1 · independent answers"), ("2", "2 · + synthesis"),
                 ("3", "3 · + cross-examination"), ("4", "4 · + verdict"))


def _select(name: str, label: str, options: list[tuple[str, str]], picked: str) -> str:
    items = "".join(f"<option value='{html.escape(value)}'{' selected' if value == picked else ''}>"
                    f"{html.escape(text)}</option>" for value, text in options)
    return f"<label>{label}<br><select name={name}>{items}</select></label>"


def _form(form: FormChoices, csrf: str, question: str, picked: dict[str, str]) -> str:
    roots = ", ".join(form.roots) or "the server's working directory"
    return (
        "<form method=post action=/consult class=start>"
        f"<input type=hidden name=csrf value='{html.escape(csrf)}'>"
        "<label>Question<br><textarea name=question rows=3 required>"
        f"{html.escape(question)}</textarea></label><div class=row>"
        + _select("panel", "Panel", [("", "default (by your keys)"), *((p, p) for p in form.panels)],
                  picked.get("panel", ""))
        + _select("mode", "Mode", [("", "default"), *((m, m) for m in form.modes)], picked.get("mode", ""))
        + _select("rounds", "Rounds", list(ROUND_CHOICES), picked.get("rounds", ""))
        + "</div><label>Context files, one per line (under "
        f"{html.escape(roots)})<br><textarea name=context rows=2>{html.escape(picked.get('context', ''))}"
        "</textarea></label><br><button type=submit>Start</button></form>"
    )


def index_page(rows: list[dict[str, Any]], *, form: FormChoices | None, csrf: str = "", error: str | None = None,
               refused: str | None = None, approval: str | None = None, question: str = "",
               picked: dict[str, str] | None = None, runs: list[dict[str, Any]] | None = None) -> str:
    parts = ["<header><h1>conclave</h1><div class=sub>consultations on this machine</div></header><main>"]
    if error:
        parts.append(f"<div class='note error'>{html.escape(error)}</div>")
    if refused:
        parts.append(f"<div class=note>Cost gate: {html.escape(refused)}")
        if approval and form is not None:
            parts.append("<form method=post action=/approve class=approve>"
                         f"<input type=hidden name=csrf value='{html.escape(csrf)}'>"
                         f"<input type=hidden name=approval value='{html.escape(approval)}'>"
                         "<button type=submit>Approve the estimate and start</button></form>")
        parts.append("</div>")
    if form is not None:
        parts.append(_form(form, csrf, question, picked or {}))
    if rows:
        parts.append("<table><thead><tr><th>Question</th><th>Mode</th><th>Status</th><th>Started</th></tr></thead>"
                     "<tbody>")
        for row in rows:
            status = html.escape(str(row.get("status") or ""))
            parts.append(
                f"<tr><td><a href='/c/{html.escape(row['id'])}'>"
                f"{html.escape((row.get('question') or '')[:160] or row['id'])}</a></td>"
                f"<td>{html.escape(str(row.get('mode') or ''))}</td><td class='status {status}'>{status}</td>"
                f"<td>{html.escape(_when(row.get('started_at')))}</td></tr>")
        parts.append("</tbody></table>")
    elif not error and not refused:
        parts.append("<p>No consultation yet.</p>")
    if runs:
        parts.append("<h2>Evaluations</h2><table class=runs><thead><tr><th>Run</th><th>Set</th><th>Batches</th>"
                     "<th>Status</th><th>Started</th></tr></thead><tbody>")
        for run in runs:
            status = html.escape(str(run.get("status") or ""))
            parts.append(
                f"<tr><td><a href='/e/{html.escape(str(run['run_id']))}'>{html.escape(str(run['run_id']))}</a></td>"
                f"<td>{html.escape(str(run.get('set_spec') or ''))}</td>"
                f"<td>{html.escape(str(run.get('batch_mode') or 'off'))}</td><td class='status {status}'>{status}</td>"
                f"<td>{html.escape(_when(run.get('started_at')))}</td></tr>")
        parts.append("</tbody></table>")
    parts.append("</main>")
    return _page("conclave", "".join(parts))


_RUN_SCRIPT = r"""
const rid = document.body.dataset.run;
const rows = document.getElementById("batches");
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;","\"":"&quot;","'":"&#39;"}[c]));
const source = new EventSource("/e/" + encodeURIComponent(rid) + "/events");
source.onopen = () => { document.getElementById("conn").textContent = "live"; };
source.onmessage = e => {
  const d = JSON.parse(e.data);  // one eval:batch_progress record
  let row = rows.querySelector('[data-batch="' + CSS.escape(d.batch_id) + '"]');
  if (!row) {
    row = document.createElement("tr"); row.dataset.batch = d.batch_id; rows.appendChild(row);
    document.getElementById("none").remove?.();
  }
  const share = d.total ? Math.round(100 * d.done / d.total) : 0;
  row.className = "batch " + d.state;
  row.innerHTML = "<td>" + esc(d.provider) + "</td><td class=id>" + esc(d.batch_id) + "</td><td>"
    + esc(d.rounds.join("/")) + "</td><td class='status " + esc(d.state) + "'>" + esc(d.status) + "</td>"
    + "<td class=counts>" + d.done + "/" + d.total + " done, " + d.failed + " failed"
    + "<div class=bar><div style='width:" + share + "%'></div></div></td>";
};
source.addEventListener("end", e => {
  source.close(); document.getElementById("conn").textContent = "run ended";
  const status = document.getElementById("status"), d = JSON.parse(e.data);
  status.textContent = d.status; status.className = "status " + d.status;
  if (d.status && d.status !== "complete")
    document.getElementById("hint").innerHTML = " — resume with <code>conclave eval resume " + esc(rid) + "</code>";
});
source.onerror = () => { document.getElementById("conn").textContent = "reconnecting…"; };
"""


def eval_run_page(run_id: str, run: dict[str, Any]) -> str:
    """The live page of one evaluation run: a row per provider batch (provider, id, rounds, status, counts
    done/failed/total), updated from its ``eval:batch_progress`` records as they arrive."""
    status = html.escape(str(run.get("status") or ""))
    hint = "" if status in ("running", "starting", "complete") else (
        f" — resume with <code>conclave eval resume {html.escape(run_id)}</code>")
    body = (
        f"<header><h1>Evaluation {html.escape(run_id)}</h1><div class=sub>{html.escape(str(run.get('set_spec') or ''))}"
        f" · {html.escape(str(run.get('items') or 0))} item(s) · batches: "
        f"{html.escape(str(run.get('batch_mode') or 'off'))} · <span id=status class='status {status}'>{status}"
        f"</span><span id=hint>{hint}</span> · <span id=conn>connecting…</span> · <a href='/'>all consultations</a>"
        "</div></header>"
        "<main><table><thead><tr><th>Provider</th><th>Batch</th><th>Round</th><th>Status</th><th>Requests</th>"
        "</tr></thead><tbody id=batches></tbody></table><p id=none>No batch yet.</p></main>"
        f"<script>{_RUN_SCRIPT}</script>"
    )
    return _page(f"conclave · {run_id}", body, f" data-run='{html.escape(run_id)}'")


def report_unavailable_page(consultation_id: str) -> str:
    return _page(f"conclave · {consultation_id}", "<main><p>This consultation has no report yet.</p>"
                 "<p><a href='/'>all consultations</a></p></main>")


def consultation_page(consultation_id: str, csrf: str | None = None) -> str:
    """The live page of one consultation; with ``csrf`` (a server that starts consultations) it ends with the
    "Ask a follow-up" form, posted to ``/c/ID/follow-up``."""
    cid = html.escape(consultation_id)
    follow_up = "" if csrf is None else (
        f"<form method=post action='/c/{cid}/follow-up' class=follow-up>"
        f"<input type=hidden name=csrf value='{html.escape(csrf)}'>"
        "<label>Ask a follow-up (same panel and mode; the panel sees this verdict and its claims)<br>"
        "<textarea name=question rows=2 required></textarea></label><br><button type=submit>Ask</button></form>")
    body = (
        "<header><h1 id=question>…</h1><div class=sub><span id=panel></span> · <span id=status class=status>"
        f"running</span> · <span id=conn>connecting…</span> · <a href='/c/{cid}/report'>"
        "report</a> · <a href='/'>all consultations</a></div></header>"
        f"<main><div id=rounds></div><div id=verdict></div>{follow_up}</main>"
        f"<script>{_SCRIPT}</script>{toy_banner_script()}"
    )
    return _page(f"conclave · {consultation_id}", body, f" data-id='{html.escape(consultation_id)}'")


def _when(started_at: Any) -> str:
    """``2026-11-28T01:02:03+00:00`` → ``2026-11-28 01:02 UTC``."""
    text = str(started_at or "")
    return f"{text[:10]} {text[11:16]} UTC" if len(text) >= 16 else text


def toy_banner_script() -> str:
    """A script that opens the page with the toy-panel banner once the started event shows a seat on the toy model
    (:func:`conclave.cli.panel.toy_seats`'s rule, on the event's recorded agents and judge), before any number."""
    toy = json.dumps({"provider": TOY_PROVIDER, "model": TOY_MODEL, "banner": TOY_BANNER, "detail": TOY_DETAIL})
    return ("<script>(() => { const toy = " + toy.replace("<", "\\u003c") + r""";
  const started = handlers["consultation:started"];
  handlers["consultation:started"] = d => {
    started(d);
    const seats = [...(d.agents || []), d.judge || {}];
    if (!seats.some(s => s && s.provider === toy.provider && s.model === toy.model)) return;
    if (document.getElementById("toy-panel")) return;
    const note = document.createElement("div"), strong = document.createElement("strong");
    note.id = "toy-panel"; note.className = "note error"; strong.textContent = "⚠ " + toy.banner;
    note.append(strong, " " + toy.detail);
    document.querySelector("main").prepend(note);
  };
})();</script>""")
