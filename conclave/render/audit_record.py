"""The audit record of one consultation, built from its verified journal, and its renderings (Markdown, HTML,
JSON, PDF). Every door that exports a record (``conclave export``, the MCP tool) uses these, so they all agree.

The record holds what an auditor needs to trust a verdict without rerunning it: the question, the panel, the rounds,
the verdict and dissent, costs, prompt versions, the configuration hash and the journal head with its verification.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from conclave import events as ev
from conclave.errors import UsageError
from conclave.extras import install_hint
from conclave.render.renderers import TITLES
from conclave.store.journal_file import read_journal
from conclave.store.paths import StoreLayout
from conclave.store.verify import verify_store

FORMATS = ("md", "html", "json", "pdf")


def final_result(records: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The result of the last run that finished (None while the first run is still going)."""
    final = next((r for r in reversed(records) if r["type"] == ev.CONSULTATION_COMPLETED), None)
    return (final["data"].get("result") or None) if final is not None else None


def round_summaries(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
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


def round_rows(rounds: Sequence[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """The rounds table's rows for a reader: each type by its title (``cross_exam`` → Cross-examination), a
    cross-examination the exit controller repeated named as the repeat it is."""
    rows, seen = [], 0
    for r in rounds:
        kind = r["round_type"]
        label = TITLES.get(kind, str(kind or "")) if kind else ""
        if kind == "cross_exam":
            label += f" (repeat {seen})" if seen else ""
            seen += 1
        rows.append((r["round_number"], label, r["ended"] or "not finished", _seconds(r["duration_s"]),
                     money(r["cost"], "")))
    return rows


def audit_record(layout: StoreLayout, cid: str) -> dict[str, Any]:
    """What an auditor needs to trust a verdict without rerunning it, read from the verified journal."""
    path = layout.journal_path(cid)
    if not path.exists():
        raise UsageError(f"no consultation {cid!r} in {layout.journal_dir}")
    records = read_journal(path).records
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
        "created_at": result.get("created_at") or _iso(records[0].get("ts")),
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
        "context_sources": result.get("context_sources") or started.get("context_sources") or [],
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


def _iso(ts: Any) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if isinstance(ts, int | float) else None


# ------------------------------------------------------------------------------------------ shared wording


def money(value: Any, missing: str) -> str:
    """A dollar figure to four decimals, or ``missing`` when there is none."""
    return f"${value:.4f}" if isinstance(value, int | float) else missing


def cost_lines(record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of the cost section: the estimate (or that there was none), what was spent, by provider,
    and the tokens."""
    cost = record.get("cost") or {}
    rows = [("estimated", money(cost.get("estimated"), "not estimated")),
            ("actual", money(cost.get("actual"), "not recorded"))]
    by_provider = cost.get("by_provider") or {}
    if by_provider:
        rows.append(("by provider", ", ".join(f"{name} {money(v, '?')}" for name, v in sorted(by_provider.items()))))
    if cost.get("unknown_prices"):
        rows.append(("no price known for", ", ".join(map(str, cost["unknown_prices"]))))
    tokens = record.get("tokens") or {}
    if tokens:
        rows.append(("tokens", f"{tokens.get('total', 0):,} ({tokens.get('input', 0):,} in, "
                               f"{tokens.get('cached_input', 0):,} of them cached; {tokens.get('output', 0):,} out)"))
    return rows


def prompt_version_rows(versions: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(prompt, template, version, hash) for each entry ``template@version#sha256:hash``; parts missing from an
    entry stay empty."""
    rows = []
    for key in sorted(versions):
        text = str(versions[key])
        rest, _, digest = text.partition("#")
        template, _, version = rest.partition("@")
        rows.append((key, template, version, digest.removeprefix("sha256:")))
    return rows


def context_text(source: Mapping[str, Any]) -> str:
    """What of one context source the panel saw, in words."""
    path = str(source.get("path"))
    if source.get("omitted"):
        return f"{path}: left out ({source['omitted']})"
    if source.get("pages"):
        return f"{path}: {source['pages']}"
    if source.get("kind") == "image":
        blind = source.get("not_sent_to") or []
        return f"{path}: image" + (f", not sent to {', '.join(map(str, blind))} (text-only)" if blind else "")
    if source.get("truncated"):
        return f"{path}: first {source.get('sent', 0):,} of {source.get('bytes', 0):,} bytes"
    return f"{path}: {source.get('bytes', 0):,} bytes"


def _seconds(value: Any) -> str:
    if not isinstance(value, int | float):
        return ""
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _confidence(record: Mapping[str, Any]) -> str:
    value = record.get("confidence")
    return f" (confidence {value:.0%})" if isinstance(value, int | float) else ""


def _seat(agent: Mapping[str, Any]) -> str:
    return f"{agent.get('provider')}/{agent.get('model')}"


def _journal_text(journal: Mapping[str, Any]) -> str:
    state = "verified" if journal["verified"] else "FAILED verification: " + "; ".join(journal["problems"])
    return f"{journal['records']} records, head seq {journal['head_seq']}, {state}"


def _origin(record: Mapping[str, Any]) -> str:
    client = record.get("client") or {}
    return (record.get("origin") or "cli/library") + (f" ({client.get('name')})" if client.get("name") else "")


# ------------------------------------------------------------------------------------------ Markdown


def _cell(value: Any) -> str:
    return " ".join(str("" if value is None else value).split()).replace("|", "\\|")


def _md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(_cell(v) for v in row) + " |" for row in rows)]


def audit_markdown(record: Mapping[str, Any]) -> str:
    lines = [f"# Audit record · {record['consultation_id']}", "", f"**Question:** {record['question']}", "",
             f"**Status:** {record['status']} · **mode:** {record['mode']}"
             + (f" · **recorded:** {record['created_at']}" if record.get("created_at") else "")]
    if record.get("recommendation"):
        lines += ["", f"## Verdict{_confidence(record)}", "", str(record["recommendation"])]
    if record["dissent"]:
        lines += ["", "## Dissent", ""]
        lines += _md_table(["agent", "severity", "concern"],
                           [(d.get("agent"), d.get("severity"), d.get("concern")) for d in record["dissent"]])
    if record.get("concerns"):
        lines += ["", "## Open concerns", "", *(f"- {c}" for c in record["concerns"])]
    judge = record["panel"].get("judge") or {}
    lines += ["", "## Panel", ""]
    lines += _md_table(["seat", "persona", "model"],
                       [*((a.get("name"), a.get("persona"), _seat(a)) for a in record["panel"]["agents"]),
                        ("judge", "", _seat(judge))])
    lines += ["", "## Rounds", ""]
    lines += _md_table(["round", "type", "ended", "seconds", "cost"], round_rows(record["rounds"]))
    lines += ["", "## Cost", "", *(f"- {label}: {value}" for label, value in cost_lines(record))]
    if record.get("context_sources"):
        lines += ["", "## Context sent", "", *(f"- {context_text(s)}" for s in record["context_sources"])]
    lines += ["", "## Prompt versions", ""]
    lines += _md_table(["prompt", "template", "version", "sha256"], prompt_version_rows(record["prompt_versions"]))
    journal_info = record["journal"]
    lines += ["", "## Provenance", "",
              f"- config hash: `{record['config_hash']}`",
              f"- conclave version: {record['conclave_version']}",
              f"- origin: {_origin(record)}",
              f"- journal: {_journal_text(journal_info)}",
              f"- journal head hash: `{journal_info['head_hash']}`"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ HTML and PDF

_STYLE = """
@page { size: A4; margin: 16mm 14mm; @bottom-right { content: counter(page) " / " counter(pages);
  font-size: 8pt; color: #666; } }
body { font-family: "DejaVu Sans", Arial, sans-serif; font-size: 10pt; line-height: 1.4; color: #1d1d1f;
  max-width: 60em; margin: 1.5em auto; padding: 0 1em; }
@media print { body { margin: 0; padding: 0; max-width: none; } }
h1 { font-size: 16pt; margin: 0 0 .6em; border-bottom: 2px solid #334; padding-bottom: .2em; }
h2 { font-size: 12pt; margin: 1.3em 0 .4em; color: #223; break-after: avoid; }
table { border-collapse: collapse; width: 100%; margin: .3em 0; }
th, td { border: 1px solid #ccd; padding: 3px 6px; text-align: left; vertical-align: top; }
th { background: #eef0f5; font-weight: 600; }
tr { break-inside: avoid; }
.num { text-align: right; white-space: nowrap; }
code, .hash { font-family: "DejaVu Sans Mono", monospace; font-size: 8.5pt; overflow-wrap: anywhere; }
.verdict { border-left: 4px solid #3a6; background: #f3faf5; padding: .5em .8em; margin: .4em 0; }
.failed { color: #b00; font-weight: 600; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: .2em 1em; margin: .3em 0; }
dl.facts dt { font-weight: 600; } dl.facts dd { margin: 0; }
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _html_table(header: Sequence[str], rows: Sequence[Sequence[Any]], numeric: Sequence[int] = ()) -> str:
    head = "".join(f"<th class='num'>{_e(h)}</th>" if i in numeric else f"<th>{_e(h)}</th>"
                   for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f"<td class='num'>{_e(v)}</td>" if i in numeric else f"<td>{_e(v)}</td>"
                                    for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _facts(rows: Sequence[tuple[str, str]]) -> str:
    return "<dl class='facts'>" + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in rows) + "</dl>"


def audit_html(record: Mapping[str, Any]) -> str:
    """A standalone HTML page of the audit record (every value escaped, nothing fetched)."""
    judge = record["panel"].get("judge") or {}
    journal_info = record["journal"]
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>Audit record {_e(record['consultation_id'])}</title><style>{_STYLE}</style></head><body>",
        f"<h1>Audit record · {_e(record['consultation_id'])}</h1>",
        _facts([("Question", _e(record["question"])),
                ("Status", f"{_e(record['status'])} · mode {_e(record['mode'])}"),
                ("Recorded", _e(record.get("created_at")))]),
    ]
    if record.get("recommendation"):
        parts.append(f"<h2>Verdict{_e(_confidence(record))}</h2>"
                     f"<div class='verdict'>{_e(record['recommendation'])}</div>")
    if record["dissent"]:
        parts.append("<h2>Dissent</h2>" + _html_table(
            ["agent", "severity", "concern"],
            [(d.get("agent"), d.get("severity"), d.get("concern")) for d in record["dissent"]]))
    if record.get("concerns"):
        parts.append("<h2>Open concerns</h2><ul>" + "".join(f"<li>{_e(c)}</li>" for c in record["concerns"])
                     + "</ul>")
    parts.append("<h2>Panel</h2>" + _html_table(
        ["seat", "persona", "model"],
        [*((a.get("name"), a.get("persona"), _seat(a)) for a in record["panel"]["agents"]),
         ("judge", "", _seat(judge))]))
    parts.append("<h2>Rounds</h2>" + _html_table(
        ["round", "type", "ended", "seconds", "cost"], round_rows(record["rounds"]), numeric=(0, 3, 4)))
    parts.append("<h2>Cost</h2>" + _facts([(label, _e(value)) for label, value in cost_lines(record)]))
    if record.get("context_sources"):
        parts.append("<h2>Context sent</h2><ul>" + "".join(
            f"<li>{_e(context_text(s))}</li>" for s in record["context_sources"]) + "</ul>")
    parts.append("<h2>Prompt versions</h2>" + _html_table(
        ["prompt", "template", "version", "sha256"], prompt_version_rows(record["prompt_versions"])))
    verified = (f"<span class='failed'>{_e(_journal_text(journal_info))}</span>" if not journal_info["verified"]
                else _e(_journal_text(journal_info)))
    parts.append("<h2>Provenance</h2>" + _facts([
        ("config hash", f"<code>{_e(record['config_hash'])}</code>"),
        ("conclave version", _e(record["conclave_version"])),
        ("origin", _e(_origin(record))),
        ("journal", verified),
        ("journal head hash", f"<code>{_e(journal_info['head_hash'])}</code>"),
    ]))
    parts.append("</body></html>\n")
    return "".join(parts)


def audit_json(record: Mapping[str, Any]) -> str:
    return json.dumps(record, indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def audit_pdf(record: Mapping[str, Any]) -> bytes:
    """The HTML record printed to PDF by WeasyPrint (the ``pdf`` extra); a usage error naming what to install when
    the extra is missing."""
    try:
        import weasyprint  # an optional extra (with the pango system library): only PDF export needs it
    except ImportError:
        raise UsageError(f"PDF export needs WeasyPrint: {install_hint('pdf')}") from None
    except OSError as exc:  # installed, but the pango library it loads is missing
        raise UsageError(f"PDF export needs the pango library for WeasyPrint ({exc}); on Debian/Ubuntu: "
                         "apt-get install libpango-1.0-0 libpangoft2-1.0-0") from None
    document: bytes = weasyprint.HTML(string=audit_html(record)).write_pdf()
    return document


__all__ = ["FORMATS", "audit_html", "audit_json", "audit_markdown", "audit_pdf", "audit_record", "final_result",
           "round_summaries"]
