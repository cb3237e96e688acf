"""Read-only views of the store for MCP tools and resources: sessions, one consultation, one round, an audit record.

Everything comes from the journal (the source of truth) except the session list and stats, which read the index.
Nothing here writes: no tool can change what was recorded.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from typing import Any

from conclave import events as ev
from conclave.cli.commands.logs import resolve_id as resolve
from conclave.errors import UsageError
from conclave.store.journal import read_journal
from conclave.store.journal_file import live_status
from conclave.store.paths import StoreLayout
from conclave.store.verify import verify_store


def resolve_id(layout: StoreLayout, prefix: str) -> str:
    """The consultation ``prefix`` names (a unique prefix is enough); a usage error otherwise."""
    return resolve(layout, prefix)


def sessions_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "No consultations recorded yet."
    lines = []
    for r in rows:
        cost = "-" if r["total_cost"] is None else f"${r['total_cost']:.4f}"
        question = (r["question"] or "").replace("\n", " ")
        question = question[:70] + ("…" if len(question) > 70 else "")
        lines.append(f"{r['id']}  {(r['started_at'] or '')[:19]}  {r['status'] or '-'}  {r['mode'] or '-'}  "
                     f"rounds {r['rounds_completed'] or 0}/{r['planned_rounds'] or '-'}  {cost}  {question}")
    return "\n".join(lines)


def journal(layout: StoreLayout, cid: str) -> list[dict[str, Any]]:
    path = layout.journal_path(cid)
    if not path.exists():
        raise UsageError(f"no consultation {cid!r} in {layout.journal_dir}")
    return read_journal(path).records


def final_result(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The result of the last run that finished (None while the first run is still going)."""
    final = next((r for r in reversed(records) if r["type"] == ev.CONSULTATION_COMPLETED), None)
    return (final["data"].get("result") or None) if final is not None else None


def consultation(layout: StoreLayout, cid: str) -> dict[str, Any]:
    """One consultation: what was asked, its panel, its rounds and, once it ended, its result (``interrupted``
    when it never ended and no process writes it any more)."""
    records = journal(layout, cid)
    started: dict[str, Any] = next((r["data"] for r in records if r["type"] == ev.CONSULTATION_STARTED), {})
    result = final_result(records)
    last_started = max((i for i, r in enumerate(records) if r["type"] == ev.CONSULTATION_STARTED), default=-1)
    running = not any(r["type"] == ev.CONSULTATION_COMPLETED for r in records[last_started:])
    status = live_status("running", layout.journal_path(cid)) if running else (result or {}).get("status")
    rounds = round_summaries(records)
    if status == "interrupted":  # killed: the round it left open will never record its end
        for run in rounds:
            if run["ended"] is None:
                run["ended"] = "interrupted (killed)"
    return {
        "consultation_id": cid,
        "status": status,
        "question": started.get("question"),
        "mode": started.get("mode"),
        "agents": started.get("agents") or [],
        "judge": started.get("judge"),
        "planned_rounds": started.get("planned_rounds"),
        "origin": started.get("origin"),
        "client": started.get("client"),
        "rounds": rounds,
        "result": result,
        "journal_records": len(records),
    }


def round_summaries(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per round run, in journal order: number, type, how it ended, duration and cost."""
    runs: list[dict[str, Any]] = []
    open_runs: dict[Any, dict[str, Any]] = {}
    for record in records:
        type_, data = record["type"], record["data"]
        if type_ == ev.ROUND_STARTED:
            run = {"round_number": data.get("round_number"), "round_type": data.get("round_type"),
                   "ended": None, "duration_s": None, "cost": None}
            open_runs[data.get("round_number")] = run
            runs.append(run)
        elif type_ in (ev.ROUND_COMPLETED, ev.ROUND_INTERRUPTED):
            ended_run = open_runs.pop(data.get("round_number"), None)
            if ended_run is not None:
                ended = "completed" if type_ == ev.ROUND_COMPLETED and data.get("ok", True) else (
                    "failed" if type_ == ev.ROUND_COMPLETED else f"interrupted ({data.get('reason')})")
                ended_run.update(ended=ended, duration_s=data.get("duration_s"), cost=data.get("cost"))
    return runs


def round_details(layout: StoreLayout, cid: str, number: int) -> dict[str, Any]:
    """Every run of round ``number``: each artifact (with the raw answer), each provider call and its cost."""
    records = journal(layout, cid)
    runs: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for record in records:
        type_, data = record["type"], record["data"]
        if data.get("round_number") != number:
            if type_ == ev.CONSULTATION_STARTED:
                current = None
            continue
        if type_ == ev.ROUND_STARTED:
            current = {"started_seq": record["seq"], "round_type": data.get("round_type"), "ended": None,
                       "artifacts": [], "calls": [], "agents": [], "totals": None}
            runs.append(current)
        elif current is None:
            continue
        elif type_ == ev.ROUND_ARTIFACT:
            current["artifacts"].append({k: data.get(k) for k in (
                "agent", "artifact_type", "schema", "status", "artifact", "raw_text")})
        elif type_ == ev.PROVIDER_ATTEMPT:
            current["calls"].append({k: data.get(k) for k in (
                "agent", "provider", "model", "number", "hedge", "outcome", "status", "error", "latency_s",
                "input_tokens", "output_tokens", "cached_input_tokens", "cost")})
        elif type_ == ev.AGENT_COMPLETED:
            current["agents"].append({k: data.get(k) for k in (
                "agent", "ok", "duration_s", "input_tokens", "output_tokens", "cost", "error")})
        elif type_ in (ev.ROUND_COMPLETED, ev.ROUND_INTERRUPTED):
            ok = data.get("ok", True)
            current["ended"] = ("completed" if ok else "failed") if type_ == ev.ROUND_COMPLETED else (
                f"interrupted ({data.get('reason')})")
            current["totals"] = {k: data.get(k) for k in (
                "duration_s", "input_tokens", "output_tokens", "cost")}
            current = None
    if not runs:
        raise UsageError(f"round {number}: consultation {cid} has no such round in its journal")
    return {"consultation_id": cid, "round_number": number, "runs": runs,
            "cost": round(sum(c["cost"] or 0 for run in runs for c in run["calls"]), 10)}


def round_text(details: Mapping[str, Any]) -> str:
    lines = [f"# {details['consultation_id']} · round {details['round_number']}"]
    for i, run in enumerate(details["runs"], 1):
        lines.append(f"\n## run {i} · {run['round_type']} · {run['ended'] or 'running or killed'}")
        for call in run["calls"]:
            lines.append(f"- call {call['agent']} {call['provider']}/{call['model']} #{call['number']}"
                         f"{' hedge' if call['hedge'] else ''} {call['outcome']} · {call['input_tokens']}→"
                         f"{call['output_tokens']} tok · ${call['cost']}")
        for artifact in run["artifacts"]:
            body = json.dumps(artifact["artifact"], indent=2, ensure_ascii=False)
            lines.append(f"\n### {artifact['agent'] or 'judge'} · {artifact['artifact_type']} ({artifact['status']})"
                         f"\n```json\n{body}\n```")
    lines.append(f"\nround cost: ${details['cost']}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ the audit record


def audit_record(layout: StoreLayout, cid: str) -> dict[str, Any]:
    """What an auditor needs to trust a verdict without rerunning it, read from the verified journal."""
    records = journal(layout, cid)
    started = next((r["data"] for r in records if r["type"] == ev.CONSULTATION_STARTED), None)
    if started is None:
        raise UsageError(f"consultation {cid} has no consultation:started record")
    result = final_result(records) or {}
    check = verify_store(layout, [cid])
    return {
        "consultation_id": cid,
        "question": started.get("question"),
        "mode": started.get("mode"),
        "status": result.get("status") or "running",
        "panel": {"agents": started.get("agents") or [], "judge": started.get("judge"),
                  "judge_labels": started.get("judge_labels") or {}},
        "rounds": round_summaries(records),
        "verdict": result.get("verdict"),
        "recommendation": result.get("recommendation"),
        "confidence": result.get("confidence"),
        "dissent": result.get("dissent") or [],
        "concerns": result.get("concerns") or [],
        "cost": result.get("cost"),
        "tokens": result.get("tokens"),
        "prompt_versions": started.get("prompt_versions") or {},
        "config_hash": started.get("config_hash"),
        "conclave_version": started.get("conclave_version"),
        "scrub_report": started.get("scrub_report"),
        "origin": started.get("origin"),
        "client": started.get("client"),
        "journal": {
            "records": len(records),
            "head_seq": records[-1]["seq"] if records else None,
            "head_hash": records[-1].get("hash") if records else None,
            "verified": check.ok,
            "problems": [str(p) for p in check.problems],
        },
    }


def audit_markdown(record: Mapping[str, Any]) -> str:
    lines = [f"# Audit record · {record['consultation_id']}", "", f"**Question:** {record['question']}", "",
             f"**Status:** {record['status']} · **mode:** {record['mode']}"]
    if record.get("recommendation"):
        confidence = record.get("confidence")
        shown = f" (confidence {confidence:.0%})" if isinstance(confidence, int | float) else ""
        lines += ["", f"## Verdict{shown}", "", str(record["recommendation"])]
    lines += ["", "## Panel", ""]
    for agent in record["panel"]["agents"]:
        lines.append(f"- {agent.get('name')} ({agent.get('persona')}): {agent.get('provider')}/{agent.get('model')}")
    judge = record["panel"].get("judge") or {}
    lines.append(f"- judge: {judge.get('provider')}/{judge.get('model')}")
    lines += ["", "## Rounds", ""]
    for run in record["rounds"]:
        lines.append(f"- round {run['round_number']} {run['round_type']}: {run['ended'] or 'not finished'} · "
                     f"{run['duration_s']} s · ${run['cost']}")
    if record["dissent"]:
        lines += ["", "## Dissent", ""]
        for d in record["dissent"]:
            lines.append(f"- {d.get('agent')} ({d.get('severity')}): {d.get('concern')}")
    cost = record.get("cost") or {}
    journal_info = record["journal"]
    lines += ["", "## Provenance", "",
              f"- cost: estimated ${cost.get('estimated')} · actual ${cost.get('actual')}",
              f"- prompt versions: {json.dumps(record['prompt_versions'], sort_keys=True)}",
              f"- config hash: `{record['config_hash']}`",
              f"- conclave version: {record['conclave_version']}",
              f"- origin: {record.get('origin') or 'cli/library'}"
              + (f" ({(record.get('client') or {}).get('name')})" if record.get("client") else ""),
              f"- journal: {journal_info['records']} records, head seq {journal_info['head_seq']}, "
              f"hash `{journal_info['head_hash']}`, "
              + ("verified" if journal_info["verified"] else "FAILED verification: "
                 + "; ".join(journal_info["problems"]))]
    return "\n".join(lines) + "\n"


def audit_html(record: Mapping[str, Any]) -> str:
    """A standalone HTML page of the audit record (every value escaped)."""

    def e(value: Any) -> str:
        return html.escape("" if value is None else str(value))

    rows = "".join(
        f"<tr><td>{e(r['round_number'])}</td><td>{e(r['round_type'])}</td><td>{e(r['ended'])}</td>"
        f"<td>{e(r['duration_s'])}</td><td>{e(r['cost'])}</td></tr>" for r in record["rounds"])
    panel = "".join(f"<li>{e(a.get('name'))} ({e(a.get('persona'))}): {e(a.get('provider'))}/{e(a.get('model'))}"
                    "</li>" for a in record["panel"]["agents"])
    dissent = "".join(f"<li>{e(d.get('agent'))} ({e(d.get('severity'))}): {e(d.get('concern'))}</li>"
                      for d in record["dissent"])
    journal_info = record["journal"]
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>Audit record {e(record['consultation_id'])}</title></head><body>"
        f"<h1>Audit record · {e(record['consultation_id'])}</h1>"
        f"<p><strong>Question:</strong> {e(record['question'])}</p>"
        f"<p><strong>Status:</strong> {e(record['status'])} · <strong>mode:</strong> {e(record['mode'])}</p>"
        f"<h2>Verdict</h2><p>{e(record.get('recommendation'))}</p>"
        f"<p>confidence {e(record.get('confidence'))}</p>"
        f"<h2>Panel</h2><ul>{panel}<li>judge: {e((record['panel'].get('judge') or {}).get('model'))}</li></ul>"
        "<h2>Rounds</h2><table><tr><th>round</th><th>type</th><th>ended</th><th>seconds</th><th>cost</th></tr>"
        f"{rows}</table>"
        f"<h2>Dissent</h2><ul>{dissent}</ul>"
        "<h2>Provenance</h2><ul>"
        f"<li>cost: {e(json.dumps(record.get('cost'), sort_keys=True))}</li>"
        f"<li>prompt versions: {e(json.dumps(record['prompt_versions'], sort_keys=True))}</li>"
        f"<li>config hash: <code>{e(record['config_hash'])}</code></li>"
        f"<li>journal head: seq {e(journal_info['head_seq'])}, <code>{e(journal_info['head_hash'])}</code>, "
        f"{'verified' if journal_info['verified'] else 'FAILED verification'}</li>"
        "</ul></body></html>\n"
    )
