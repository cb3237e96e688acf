"""The Markdown report of one consultation result (``output.format=markdown``).

Layout: question, status banner, verdict (converge) or options menu (explore), realized panel, agent
perspectives, unresolved concerns, dissent, early-termination note, and a footer with cost, tokens, duration
and filtering savings. Every key of the result may be null; a missing part is left out, never invented.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_BANNERS = {
    "completed_degraded": "⚠ **Completed, degraded.**",
    "partial": "⚠ **Partial result.**",
    "aborted": "✖ **Aborted.**",
}


def render_markdown(result: Mapping[str, Any]) -> str:
    """The whole report as Markdown text, ending with a newline."""
    parts = [
        _header(result),
        _banner(result),
        _verdict(result),
        _panel(result),
        _perspectives(result),
        _concerns(result),
        _dissent(result),
        _early_termination(result),
        _quality(result),
        _footer(result),
    ]
    return "\n\n".join(p for p in parts if p) + "\n"


# ------------------------------------------------------------------------------------------------ helpers


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _pct(value: Any) -> str:
    return f"{round(float(value) * 100)}%" if isinstance(value, int | float) else "n/a"


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _cell(text: Any) -> str:
    """Table cell text: one line, pipes escaped."""
    return _one_line(text).replace("|", "\\|")


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines() or [""])


def _bullets(items: Iterable[Any]) -> str:
    return "\n".join(f"- {_one_line(item)}" for item in items)


def _model(provider: Any, model: Any) -> str:
    return f"{provider}/{model}" if provider else str(model or "unknown")


def _actual(who: Mapping[str, Any]) -> str:
    """The provider/model that actually answered for an agent or the judge (the configured one if unknown)."""
    return _model(who.get("actual_provider") or who.get("provider"), who.get("actual_model") or who.get("model"))


def _rounds(result: Mapping[str, Any]) -> str:
    done, planned = result.get("completed_rounds"), result.get("planned_rounds")
    if done is None:
        return ""
    return f"{done} of {planned} rounds" if planned is not None else f"{done} rounds"


# ------------------------------------------------------------------------------------------------ sections


def _header(result: Mapping[str, Any]) -> str:
    facts = [str(result["mode"]) if result.get("mode") else "", _rounds(result)]
    if result.get("consultation_id"):
        facts.append(f"id `{result['consultation_id']}`")
    lines = ["# Consultation summary", "", "**Question:**", "", _quote(str(result.get("question") or ""))]
    shown = [f for f in facts if f]
    if shown:
        lines += ["", " · ".join(shown)]
    return "\n".join(lines)


def _banner(result: Mapping[str, Any]) -> str:
    status = result.get("status")
    if status not in _BANNERS:
        return ""
    text = _BANNERS[status]
    if status == "completed_degraded":
        judge = _map(result.get("judge"))
        if judge.get("fallback_used"):
            text += (f" The judge model {_model(judge.get('provider'), judge.get('model'))} was unavailable; "
                     f"a fallback judge ({_model(judge.get('actual_provider'), judge.get('actual_model'))}) was used.")
        absent = _list(result.get("absent_agents"))
        if absent:
            text += f" Absent agents: {', '.join(map(str, absent))}."
    else:
        rounds = _rounds(result)
        text += f" Stopped after {rounds}." if rounds else ""
        if result.get("abort_reason"):
            text += f" Reason: {_one_line(result['abort_reason'])}"
    return _quote(text)


def _verdict(result: Mapping[str, Any]) -> str:
    verdict = _map(result.get("verdict"))
    if verdict.get("recommendations"):
        return _options(verdict)
    recommendation = verdict.get("recommendation") or result.get("recommendation")
    confidence = verdict.get("confidence", result.get("confidence"))
    if not recommendation:
        if result.get("status") == "complete" and result.get("planned_rounds") == 1:
            return "## Verdict\n\n_A one-round run asks for independent answers only: see the perspectives below._"
        return "## Verdict\n\n_No verdict was reached._"
    lines = [f"## Verdict (confidence {_pct(confidence)})", "", str(recommendation).strip()]
    evidence = _list(verdict.get("evidence"))
    if evidence:
        lines += ["", "**Evidence**", "", _bullets(evidence)]
    return "\n".join(lines)


def _options(verdict: Mapping[str, Any]) -> str:
    lines = [f"## Options (confidence {_pct(verdict.get('confidence'))})"]
    if verdict.get("summary"):
        lines += ["", str(verdict["summary"]).strip()]
    for number, option in enumerate(_list(verdict.get("recommendations")), start=1):
        option = _map(option)
        lines += ["", f"### {number}. {_one_line(option.get('option', ''))}"]
        if option.get("description"):
            lines += ["", str(option["description"]).strip()]
        facts = [
            ("Pros", "; ".join(map(_one_line, _list(option.get("pros"))))),
            ("Cons", "; ".join(map(_one_line, _list(option.get("cons"))))),
            ("Best when", _one_line(option.get("best_when") or "")),
            ("Championed by", ", ".join(map(str, _list(option.get("championed_by"))))),
        ]
        shown = [f"- **{label}:** {value}" for label, value in facts if value]
        if shown:
            lines += ["", *shown]
    synergies = _list(verdict.get("synergies"))
    if synergies:
        lines += ["", "**Synergies**", "", _bullets(synergies)]
    return "\n".join(lines)


def _panel(result: Mapping[str, Any]) -> str:
    agents = [_map(a) for a in _list(result.get("agents"))]
    if not agents:
        return ""
    rows = ["| Agent | Persona | Answered with | Note |", "| --- | --- | --- | --- |"]
    for agent in agents:
        actual = _actual(agent)
        if agent.get("absent"):
            note = "absent" + (f": {_one_line(agent['error'])}" if agent.get("error") else "")
            actual = "—"
        elif agent.get("substituted"):
            note = f"substituted for {_model(agent.get('provider'), agent.get('model'))}"
            reason = _substitution_reason(result, agent.get("name"))
            note += f" ({reason})" if reason else ""
        else:
            note = ""
        name = f"{agent.get('name')}" + (f" ({agent['label']})" if agent.get("label") else "")
        rows.append(f"| {_cell(name)} | {_cell(agent.get('persona') or '')} | {_cell(actual)} | {_cell(note)} |")
    lines = ["## Realized panel", "", *rows]
    judge = _map(result.get("judge"))
    if judge:
        line = f"Judge: {_actual(judge)}"
        if judge.get("fallback_used"):
            line += f" (fallback for {_model(judge.get('provider'), judge.get('model'))})"
        lines += ["", line]
    if not any(a.get("substituted") or a.get("absent") for a in agents) and not judge.get("fallback_used"):
        lines += ["", "_All models answered as configured._"]
    return "\n".join(lines)


def _substitution_reason(result: Mapping[str, Any], name: Any) -> str:
    for sub in _list(result.get("substitutions")):
        sub = _map(sub)
        if sub.get("agent") == name and sub.get("reason"):
            return str(sub["reason"])
    return ""


def _perspectives(result: Mapping[str, Any]) -> str:
    artifacts = _map(result.get("artifacts"))
    independents, replies = _map(artifacts.get("round_1")), _map(artifacts.get("round_3_replies"))
    agents = [_map(a) for a in _list(result.get("agents"))] or [{"name": n} for n in independents]
    blocks = []
    for agent in agents:
        name = str(agent.get("name"))
        artifact = _map(independents.get(name))
        if agent.get("absent") or not artifact:
            reason = f" ({_one_line(agent['error'])})" if agent.get("error") else ""
            blocks.append(f"### {name}\n\n_Absent: gave no round-1 answer{reason}._")
            continue
        lines = [f"### {name} (confidence {_pct(artifact.get('confidence'))})", "",
                 f"**Position:** {str(artifact.get('position', '')).strip()}"]
        points = _list(artifact.get("key_points"))
        if points:
            lines += ["", _bullets(points)]
        reply = _map(replies.get(name))
        revised = reply.get("revised_position") or reply.get("refined_position")
        if revised:
            lines += ["", f"**After cross-examination:** {str(revised).strip()}"]
        blocks.append("\n".join(lines))
    return "## Agent perspectives\n\n" + "\n\n".join(blocks) if blocks else ""


def _concerns(result: Mapping[str, Any]) -> str:
    if not _map(result.get("artifacts")).get("round_3"):
        return ""  # only a cross-examination can leave concerns unresolved
    concerns = _list(result.get("concerns"))
    body = _bullets(concerns) if concerns else "_None: the cross-examination left nothing unresolved._"
    return f"## Concerns raised\n\n{body}"


def _dissent(result: Mapping[str, Any]) -> str:
    dissent = [_map(d) for d in _list(result.get("dissent"))]
    if not dissent:
        return ""
    lines = [f"- **{d.get('agent')}** ({d.get('severity') or 'unrated'}): {_one_line(d.get('concern', ''))}"
             for d in dissent]
    return "## Dissent\n\n" + "\n".join(lines)


def _early_termination(result: Mapping[str, Any]) -> str:
    early = _map(result.get("early_termination"))
    if not early.get("offered"):
        return ""
    why = f"consensus confidence {_pct(early.get('confidence'))} reached the threshold {_pct(early.get('threshold'))}"
    if not early.get("accepted"):
        return _quote(f"Early termination was offered ({why}) and declined; all rounds ran.")
    skipped = early.get("rounds_skipped")
    text = f"Stopped early after round 2: {why}"
    text += f"; {skipped} rounds skipped" if skipped else ""
    saved = early.get("estimated_cost_saved")
    text += f" (estimated saving ${saved:.4f})." if isinstance(saved, int | float) else "."
    return _quote(text)


def _quality(result: Mapping[str, Any]) -> str:
    """Anchors, citation checks and verification per agent, claim standings and ungrounded judge statements."""
    quality = _map(result.get("quality"))
    if not quality:
        return ""  # a result from before the debate-quality layer
    figures = _map(quality.get("metrics"))
    lines = ["## Debate quality", "",
             f"Claims labelled {_pct(figures.get('label_adoption'))} · FACT claims cited "
             f"{_pct(figures.get('citation_compliance'))} · ungrounded judge statements "
             f"{figures.get('ungrounded_statements', 0)}"]
    claims = [_map(c) for c in _list(_map(quality.get("state")).get("claims"))]
    if claims:
        counts: dict[str, int] = {}
        for claim in claims:
            counts[str(claim.get("status"))] = counts.get(str(claim.get("status")), 0) + 1
        lines.append(f"{len(claims)} claims: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    anchors = _map(quality.get("anchors"))
    rows = []
    for number, agents in sorted(_map(quality.get("checks")).items(), key=lambda item: int(item[0])):
        for agent, entry in sorted(_map(agents).items()):
            entry = _map(entry)
            results = [_map(r) for r in _list(entry.get("verification"))]
            answered = [r for r in results if r.get("passed") is not None]
            failed = ", ".join(str(r.get("question_id")) for r in answered if not r.get("passed"))
            rules = ", ".join(sorted({str(_map(v).get("rule")) for v in _list(entry.get("rules"))}))
            rows.append(f"| {number} | {_cell(agent)} | {_cell(anchors.get(agent) or '—')} | "
                        f"{entry.get('labelled', 0)} | {_cell(rules or '—')} | "
                        f"{sum(1 for r in answered if r.get('passed'))}/{len(answered)} | {_cell(failed or '—')} |")
    if rows:
        lines += ["", "| Round | Agent | Anchor | Claims | Rule violations | Verification passed | Failed |",
                  "| --- | --- | --- | --- | --- | --- | --- |", *rows]
    ungrounded = [_map(s) for results in _map(quality.get("grounding")).values() for s in _list(results)
                  if not _map(s).get("grounded")]
    if ungrounded:
        lines += ["", "Ungrounded judge statements:",
                  *(f"- `{s.get('where')}` {_one_line(s.get('text', ''))} — {s.get('reason')}" for s in ungrounded)]
    return "\n".join(lines)


def _footer(result: Mapping[str, Any]) -> str:
    lines = ["---", "", summary_line(result)]
    extra = _context_line(result)
    if extra:
        lines += ["", extra]
    return "\n".join(lines)


def summary_line(result: Mapping[str, Any]) -> str:
    """``cost $0.0412 · 18,305 tokens · 14.2 s · saved 4,210 tokens (31%)``: the footer, also used by progress."""
    facts = [_cost(_map(result.get("cost")))]
    total = _map(result.get("tokens")).get("total")
    if isinstance(total, int):
        facts.append(f"{total:,} tokens")
    if isinstance(result.get("duration_s"), int | float):
        facts.append(f"{result['duration_s']:.1f} s")
    stats = _map(result.get("token_efficiency_stats"))
    saved = stats.get("tokens_saved_via_filtering")
    if isinstance(saved, int) and saved > 0:
        facts.append(f"saved {saved:,} tokens ({stats.get('efficiency_percentage', 0):g}%)")
    return " · ".join(facts)


def _cost(cost: Mapping[str, Any]) -> str:
    actual, unknown = cost.get("actual"), [str(m) for m in _list(cost.get("unknown_prices"))]
    unknown_text = f"cost unknown for: {', '.join(unknown)}" if unknown else ""
    if isinstance(actual, int | float):
        return f"cost ${actual:.4f}" + (f" + {unknown_text}" if unknown_text else "")
    return unknown_text or "cost unknown"


def _context_line(result: Mapping[str, Any]) -> str:
    """What went into the prompts besides the question: context files read and secrets redacted."""
    parts = []
    sources = [_map(s) for s in _list(result.get("context_sources"))]
    used = [s for s in sources if not s.get("omitted")]
    if used:
        size = sum(int(s.get("bytes") or 0) for s in used)
        left_out = len(sources) - len(used)
        parts.append(f"context: {len(used)} source{'s' if len(used) != 1 else ''} ({size:,} bytes)"
                     + (f", {left_out} left out" if left_out else ""))
    scrub = _map(result.get("scrub_report"))
    if scrub.get("total"):
        kinds = ", ".join(f"{k}: {n}" for k, n in sorted(_map(scrub.get("by_type")).items()))
        parts.append(f"secrets redacted before sending: {scrub['total']} ({kinds})")
    return " · ".join(parts)


__all__ = ["render_markdown", "summary_line"]
