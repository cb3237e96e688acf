"""Read-only views of the store for MCP tools and resources: sessions, one consultation, one round, an audit record.

Everything comes from the journal (the source of truth) except the session list and stats, which read the index.
Nothing here writes: no tool can change what was recorded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from conclave import events as ev
from conclave.cli.commands.logs import resolve_id as resolve
from conclave.errors import UsageError
from conclave.render.audit_record import audit_html as audit_html  # the audit record is built door-neutrally there
from conclave.render.audit_record import audit_markdown as audit_markdown
from conclave.render.audit_record import audit_pdf as audit_pdf
from conclave.render.audit_record import audit_record as audit_record
from conclave.render.audit_record import final_result, round_summaries
from conclave.store.journal import read_journal
from conclave.store.journal_file import live_status
from conclave.store.paths import StoreLayout


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
