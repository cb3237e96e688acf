"""The report of one consultation as document nodes: the one layout every view serialises (Markdown on stdout,
the self-contained HTML file, ``conclave show`` and the Datasette consultation page).

Order: question and status, the verdict (or options), dissent (kept above the fold), the early-termination note,
the realized panel, round 1's positions side by side, then every later round through its artifacts' renderers
(synthesis, cross-examination, and whatever rounds a strategy adds), how each agent moved from round 1 to round 3,
and cost by provider and by round. Every key of the result may be null; a missing part is left out, never invented.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from conclave.cli.panel import TOY_BANNER, TOY_DETAIL, is_toy_result
from conclave.render import journal_view as jv
from conclave.render.debate_value import CHANGE_LABELS, debate_value
from conclave.render.nodes import Bullets, Card, Facts, Node, Note, Para, Section, Table, one_line
from conclave.render.renderers import Context, dissent_lines, pct, render_artifact, title_of
from conclave.render.safety_report import safety_section, withhold

_BANNERS = {
    "completed_degraded": ("⚠", "Completed, degraded.", "warn"),
    "partial": ("⚠", "Partial result.", "warn"),
    "aborted": ("✖", "Aborted.", "danger"),
    "blocked": ("⛔", "Blocked by the safety evaluator.", "danger"),
    "interrupted": ("⏸", "Interrupted.", "warn"),
}
ROUND_TITLES = {"independent": "Independent positions", "synthesis": "Synthesis", "cross_exam": "Cross-examination",
                "verdict": "Verdict"}


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _model(provider: Any, model: Any) -> str:
    return f"{provider}/{model}" if provider else str(model or "unknown")


def _actual(who: Mapping[str, Any]) -> str:
    """The provider/model that actually answered for an agent or the judge (the configured one if unknown)."""
    return _model(who.get("actual_provider") or who.get("provider"), who.get("actual_model") or who.get("model"))


def _context(result: Mapping[str, Any]) -> Context:
    return Context(models={str(a.get("name")): _actual(a) for a in map(_map, _list(result.get("agents")))})


def build_report(result: Mapping[str, Any], records: Sequence[Mapping[str, Any]] | None = None,
                 *, only_round: int | None = None, label: str = "") -> list[Node]:
    """The report nodes. ``records`` (the journal) adds cost by round, hedges and retries and any artifact the
    result dict does not carry; ``only_round`` limits the body to that round's artifacts."""
    records = list(records or [])
    entries = jv.artifact_entries(records) if records else jv.entries_from_result(result)
    entries = withhold(result, entries)  # answers a safety block stopped are not shown (the journal keeps them)
    if only_round is not None:
        return [*_header(result, label), *_round_sections(result, records, entries, only_round)]
    nodes: list[Node] = [*_header(result, label)]
    for part in (_verdict(result), _dissent(result), _vote_gate(result), _final_aggregate(result),
                 _early_termination(result), _exit(result), _panel(result)):
        if part is not None:
            nodes.append(part)
    nodes += _round_sections(result, records, entries, None)
    for part in (_movement(result), _switches(result), _quality(result), groupthink_section(result),
                 safety_section(result), _cost(result, records)):
        if part is not None:
            nodes.append(part)
    return nodes


# ------------------------------------------------------------------------------------------------ header


def _rounds(result: Mapping[str, Any]) -> str:
    done, planned = result.get("completed_rounds"), result.get("planned_rounds")
    if done is None:
        return ""
    cap = _map(result.get("exit")).get("round_cap")
    if isinstance(cap, int) and isinstance(planned, int) and cap > planned:  # cross-examination could repeat
        return f"{done} rounds (at most {cap})"
    if planned is not None and done > planned:  # a controller added rounds (an objection round)
        return f"{done} rounds ({planned} planned)"
    return f"{done} of {planned} rounds" if planned is not None else f"{done} rounds"


def _header(result: Mapping[str, Any], label: str) -> list[Node]:
    facts = [str(result["mode"]) if result.get("mode") else "", _rounds(result)]
    if result.get("consultation_id"):
        facts.append(f"id {result['consultation_id']}")
    nodes: list[Node] = [Note(str(result.get("question") or ""), tone="info", label="Question:")]
    if result.get("parent"):  # a follow-up question: the consultation it continues
        nodes.append(Para(f"Follow-up of {result['parent']}", muted=True))
    escalation = escalation_banner(result)
    if escalation is not None:
        nodes.insert(0, escalation)  # the first thing a reader sees
    if is_toy_result(result):  # before anything else, the numbers below included
        nodes.insert(0, Note(TOY_DETAIL, tone="danger", label=TOY_BANNER, icon="⚠"))
    if label:
        nodes.insert(0, Para(label, label="Sweep run:"))
    shown = [f for f in facts if f]
    if shown:
        nodes.append(Para(" · ".join(shown), muted=True))
    banner = _banner(result)
    if banner is not None:
        nodes.append(banner)
    return [Section("Consultation summary", nodes, level=1, anchor="summary")]


def _banner(result: Mapping[str, Any]) -> Note | None:
    status = result.get("status")
    if status not in _BANNERS:
        return None
    mark, title, tone = _BANNERS[status]
    text = ""
    if status == "completed_degraded":
        judge = _map(result.get("judge"))
        if judge.get("fallback_used"):
            text += (f"The judge model {_model(judge.get('provider'), judge.get('model'))} was unavailable; "
                     f"a fallback judge ({_model(judge.get('actual_provider'), judge.get('actual_model'))}) was used.")
        absent = _list(result.get("absent_agents"))
        if absent:
            text += f" Absent agents: {', '.join(map(str, absent))}."
    else:
        rounds = _rounds(result)
        text += f"Stopped after {rounds}." if rounds else ""
        if result.get("abort_reason"):
            text += f" Reason: {one_line(result['abort_reason'])}"
    return Note(text.strip(), tone=tone, label=title, icon=mark)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------ verdict


def _verdict(result: Mapping[str, Any]) -> Section:
    verdict = _map(result.get("verdict"))
    if verdict.get("recommendations"):
        return Section(f"Options (confidence {pct(verdict.get('confidence'))})",
                       render_artifact(verdict, "verdict_explore", _context(result)), anchor="verdict")
    recommendation = verdict.get("recommendation") or result.get("recommendation")
    if not recommendation:
        if result.get("status") == "complete" and result.get("planned_rounds") == 1:
            text = "A one-round run asks for independent answers only: see the positions below."
        else:
            text = "No verdict was reached."
        return Section("Verdict", [Para(text, muted=True)], anchor="verdict")
    confidence = verdict.get("confidence", result.get("confidence"))
    body = render_artifact(verdict, "verdict", _context(result)) if verdict else [Para(str(recommendation))]
    return Section(f"Verdict (confidence {pct(confidence)})", body, anchor="verdict")


def _dissent(result: Mapping[str, Any]) -> Section | None:
    lines = dissent_lines(result.get("dissent"))
    return Section("Dissent", [Bullets(lines)], anchor="dissent") if lines else None


def _vote_gate(result: Mapping[str, Any]) -> Note | None:
    """The vote gate after round 1: decided by the vote (with its agreement, tau and aggregator) or debated."""
    gate = _map(result.get("vote_gate"))
    if not gate.get("summary"):
        return None
    text = str(gate["summary"]) + "."
    weights = _map(gate.get("weights"))
    if gate.get("aggregator") not in (None, "plurality") and weights:
        text += " Weights: " + ", ".join(f"{a} {float(w):.2f}" for a, w in weights.items())
        text += f" ({gate.get('note')})." if gate.get("note") else "."
    return Note(text, tone="ok" if gate.get("decided") else "info")


def _final_aggregate(result: Mapping[str, Any]) -> Note | None:
    """The answer decided after cross-examination from the answers that count, its weights, and whether the
    judge's verdict agrees (a disagreement is said, and the aggregate's answer is the one given)."""
    final = _map(result.get("final_aggregate"))
    if not final.get("summary"):
        return None
    text = str(final["summary"]) + "."
    weights = _map(final.get("weights"))
    if weights:
        text += " Weights: " + ", ".join(f"{a} {float(w):.2f}" for a, w in weights.items())
        text += f" ({final.get('note')})." if final.get("note") else "."
    disagrees = final.get("agrees_with_judge") is False
    if disagrees:
        text += f" The answer given is the aggregate's, {final.get('answer')}; the verdict above is the judge's."
    return Note(text, tone="warn" if disagrees else "info")


def _early_termination(result: Mapping[str, Any]) -> Note | None:
    early = _map(result.get("early_termination"))
    if not early.get("offered"):
        return None
    why = f"consensus confidence {pct(early.get('confidence'))} reached the threshold {pct(early.get('threshold'))}"
    if not early.get("accepted"):
        return Note(f"Early termination was offered ({why}) and declined; all rounds ran.")
    skipped = early.get("rounds_skipped")
    text = f"Stopped early after round 2: {why}"
    text += f"; {skipped} rounds skipped" if skipped else ""
    saved = early.get("estimated_cost_saved")
    text += f" (estimated saving ${saved:.4f})." if isinstance(saved, int | float) else "."
    return Note(text, tone="ok")


_EXIT_TEXT = {
    "consensus": "Ended on consensus after round {last}: {share} voted ACCEPT or MINOR, no BLOCKER, every agent "
                 "at least 70% confident.",
    "convergence": "Ended on convergence after round {last}: the panel stopped moving (no real change, no new FACT "
                   "claim).",
    "round-cap": "Ended at the round limit ({cap} rounds).",
    "user-stop": "Stopped by the user after round {last}.",
}


def _exit(result: Mapping[str, Any]) -> Note | None:
    """Why the debate ended (the exit controller) and, when cross-examination repeated, how often."""
    ended = _map(result.get("exit"))
    reason = ended.get("reason")
    if reason not in _EXIT_TEXT or result.get("status") not in ("complete", "completed_degraded"):
        return None
    decisions = [_map(d) for d in _list(ended.get("decisions"))]
    last = decisions[-1] if decisions else {}
    found = _map(last.get("consensus"))
    text = _EXIT_TEXT[str(reason)].format(last=last.get("round_number", "?"), share=pct(found.get("share")),
                                          cap=ended.get("round_cap"))
    if reason == "round-cap" and found.get("blockers"):
        text += f" {len(found['blockers'])} BLOCKER vote(s) were still open."
    repeats = ended.get("cross_exam_rounds")
    if isinstance(repeats, int) and repeats > 1:
        text += f" Cross-examination ran {repeats} times."
    if any(d.get("overridden") for d in decisions):
        text += " An exit was overridden to keep debating."
    estimated = ended.get("estimated_rounds")
    if isinstance(estimated, int) and estimated > (result.get("completed_rounds") or 0):
        text += f" The cost estimate covered {estimated} rounds."
    return Note(text, tone="warn" if reason in ("round-cap", "user-stop") and decisions else "ok")


# ------------------------------------------------------------------------------------------------ panel


def _panel(result: Mapping[str, Any]) -> Section | None:
    agents = [_map(a) for a in _list(result.get("agents"))]
    if not agents:
        return None
    rows = []
    for agent in agents:
        actual = _actual(agent)
        if agent.get("absent"):
            note = "absent" + (f": {one_line(agent['error'])}" if agent.get("error") else "")
            actual = "—"
        elif agent.get("substituted"):
            note = f"substituted for {_model(agent.get('provider'), agent.get('model'))}"
            reason = _substitution_reason(result, agent.get("name"))
            note += f" ({reason})" if reason else ""
        else:
            note = ""
        name = f"{agent.get('name')}" + (f" ({agent['label']})" if agent.get("label") else "")
        rows.append([name, str(agent.get("persona") or ""), actual, note])
    nodes: list[Node] = [Table(["Agent", "Persona", "Answered with", "Note"], rows)]
    judge = _map(result.get("judge"))
    if judge:
        line = f"Judge: {_actual(judge)}"
        if judge.get("fallback_used"):
            line += f" (fallback for {_model(judge.get('provider'), judge.get('model'))})"
        nodes.append(Para(line))
    # said only when someone answered: a question the safety evaluator refused was put to nobody
    answered = (result.get("completed_rounds") or 0) > 0 or bool(_map(_map(result.get("artifacts")).get("round_1")))
    substituted = any(a.get("substituted") or a.get("absent") for a in agents) or judge.get("fallback_used")
    if answered and not substituted:
        nodes.append(Para("All models answered as configured.", muted=True))
    peers = _peers_line(result)
    if peers:
        nodes.append(Para(peers, label="Peers:", muted=True))
    versions = _map(result.get("prompt_versions"))
    if versions:
        nodes.append(Para(", ".join(f"{k}: {v}" for k, v in versions.items()), label="Prompt versions:", muted=True))
    return Section("Realized panel", nodes, anchor="panel")


def _peers_line(result: Mapping[str, Any]) -> str:
    """How each agent saw the others in the debate (the labels mapped back to names)."""
    views = _map(result.get("peer_labels"))
    if not views:
        return ""
    parts = []
    for agent, view in views.items():
        others = [f"{name} as {label}" for name, label in sorted(_map(view).items(), key=lambda i: str(i[1]))
                  if name != agent]
        if others:
            parts.append(f"{agent} saw {', '.join(others)}")
    return "; ".join(parts)


def _substitution_reason(result: Mapping[str, Any], name: Any) -> str:
    """Why ``name`` was substituted, each reason once in the order it arose (``unavailable``: the model failed for
    good earlier and was not asked again from that round on)."""
    reasons: list[str] = []
    for sub in _list(result.get("substitutions")):
        sub = _map(sub)
        if sub.get("agent") != name or not sub.get("reason"):
            continue
        reason = str(sub["reason"])
        if reason == "unavailable":
            reason = f"not asked again from round {sub.get('round_number')}"
        if reason not in reasons:
            reasons.append(reason)
    return ", ".join(reasons)


# ------------------------------------------------------------------------------------------------ rounds


def _round_sections(result: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                    entries: list[jv.ArtifactEntry], only: int | None) -> list[Node]:
    """One section per round that left artifacts; the verdict round is the top section of a full report."""
    context = _context(result)
    types = jv.round_types(records)
    # round 1 is shown even when nobody answered it: the table then says who was absent
    # (not when the safety evaluator refused the question: nobody was asked)
    has_panel = bool(_list(result.get("agents"))) and not (result.get("status") == "blocked" and not entries)
    numbers = sorted({e.round_number for e in entries} | ({1} if has_panel and only in (None, 1) else set()))
    sections: list[Node] = []
    for number in numbers:
        if only is not None and number != only:
            continue
        mine = [e for e in entries if e.round_number == number]
        round_type = types.get(number) or (mine[0].kind if mine else "round")
        if only is None and round_type == "verdict":
            continue  # the verdict opens the report
        title = f"Round {number} · {ROUND_TITLES.get(round_type) or title_of(round_type)}"
        if number == 1:
            body = _positions(result, mine, context)
        else:
            judge = [e for e in mine if e.agent is None]
            order = [str(a.get("name")) for a in map(_map, _list(result.get("agents")))]
            agents = sorted((e for e in mine if e.agent is not None),
                            key=lambda e: order.index(e.agent) if e.agent in order else len(order))
            body = [n for e in judge for n in render_artifact(e.artifact, e.kind, context)]
            body += [_card(e, context) for e in agents]
        if not body:
            body = [Para("This round left no artifacts.", muted=True)]
        sections.append(Section(title, body, anchor=f"round-{number}"))
    if only is not None and not sections:
        sections.append(Section(f"Round {only}", [Para("This round left no artifacts.", muted=True)]))
    return sections


def _card(entry: jv.ArtifactEntry, context: Context) -> Card:
    subtitle = context.models.get(entry.agent or "", "") if entry.agent else "judge"
    status = f"{entry.status}" if entry.status not in ("", "valid") else ""
    title = entry.agent or "judge"
    return Card(title, render_artifact(entry.artifact, entry.kind, context),
                subtitle=", ".join(s for s in (subtitle, status) if s))


def _positions(result: Mapping[str, Any], entries: list[jv.ArtifactEntry], context: Context) -> list[Node]:
    """Round 1 side by side (agent, model, position, confidence), then each agent's key points and rationale."""
    by_agent = {e.agent: e for e in entries if e.agent}
    agents = [_map(a) for a in _list(result.get("agents"))] or [{"name": n} for n in by_agent]
    rows, cards = [], []
    for agent in agents:
        name = str(agent.get("name"))
        entry = by_agent.get(name)
        if agent.get("absent") or entry is None:
            reason = f" ({one_line(agent['error'])})" if agent.get("error") else ""
            rows.append([name, context.models.get(name, ""), f"absent: gave no round-1 answer{reason}", "—"])
            continue
        rows.append([name, context.models.get(name, ""), one_line(entry.artifact.get("position") or ""),
                     pct(entry.artifact.get("confidence"))])
        cards.append(_card(entry, replace(context, omit=frozenset({"position"}))))
    return [Table(["Agent", "Model", "Position", "Confidence"], rows, numeric=frozenset({3})), *cards]


# ------------------------------------------------------------------------------------------------ movement


def _movement(result: Mapping[str, Any]) -> Section | None:
    value = debate_value(result)
    if value is None:
        return None
    rows = []
    for a in value["agents"]:
        delta = a["confidence_delta"]
        rows.append([a["agent"], CHANGE_LABELS[a["change"]] + (" (dissents)" if a["dissented"] else ""),
                     pct(a["round1_confidence"]), pct(a["final_confidence"]),
                     "n/a" if delta is None else f"{delta * 100:+.0f} pts", one_line(a["final_position"])])
    mean = value["avg_confidence_change"]
    facts = [
        ("Agents that changed position", f"{value['agents_changed_position']} of {value['total_agents']}"),
        ("Change rate", pct(value["change_rate"])),
        ("Mean confidence change", "n/a" if mean is None else f"{mean * 100:+.1f} pts"),
        ("Convergence score", f"{value['convergence_score']:.2f}"),
    ]
    return Section("How the agents moved (round 1 → round 3)", [
        Table(["Agent", "Position", "R1 confidence", "Final confidence", "Change", "Final stance"], rows,
              numeric=frozenset({2, 3, 4})),
        Facts(facts),
    ], anchor="movement")


def _switches(result: Mapping[str, Any]) -> Section | None:
    """Answers changed in cross-examination, and which of them count for the aggregate (anti-conformity)."""
    record = _map(result.get("anti_conformity"))
    switches = [_map(s) for s in _list(record.get("switches"))]
    if not switches:
        return None
    on = bool(record.get("enabled"))
    rows = []
    for s in switches:
        why = ", ".join([*_list(s.get("accepted_ids")), *_list(s.get("new_ids"))])
        if s.get("supported"):
            counts = f"yes (cites {why})"
        else:
            counts = f"no: {s.get('before')} stands" if on else "yes (anti-conformity off)"
        rows.append([str(s.get("agent")), str(s.get("round_number")), f"{s.get('before')} → {s.get('after')}",
                     "supported" if s.get("supported") else "unsupported switch", counts])
    unsupported = int(record.get("unsupported_switches") or 0)
    note = ("on: an answer changed without citing a claim or evidence id others accepted, or a new source of its "
            "own, keeps the earlier answer for aggregation" if on else "off: every changed answer counts")
    return Section("Answer changes in cross-examination", [
        Table(["Agent", "Round", "Answer", "Support", "Counts for the aggregate"], rows),
        Facts([("Unsupported switches", f"{unsupported} of {len(switches)}"), ("Anti-conformity", note)]),
    ], anchor="switches")


# ------------------------------------------------------------------------------------------------ cost


def _money(value: float, unknown: int = 0) -> str:
    return f"${value:.4f}" + (f" + {unknown} unpriced" if unknown else "")


def _cost(result: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> Section | None:
    nodes: list[Node] = [Para(summary_line(result))]
    if records:
        by_round, by_provider = jv.spending(records)
        types = jv.round_types(records)
        if by_provider:
            nodes.append(Table(
                ["Provider", "Calls", "Failed", "Hedged", "Retries", "Tokens in", "Tokens out", "Cost"],
                [[p, str(s.calls), str(s.failed), str(s.hedged), str(s.retries), f"{s.input_tokens:,}",
                  f"{s.output_tokens:,}", _money(s.cost, s.unknown_cost)] for p, s in sorted(by_provider.items())],
                numeric=frozenset(range(1, 8))))
        if by_round:
            nodes.append(Table(
                ["Round", "Type", "Calls", "Seconds", "Tokens in", "Tokens out", "Cost"],
                [[str(n), types.get(n, ""), str(s.calls), f"{s.seconds:.1f}", f"{s.input_tokens:,}",
                  f"{s.output_tokens:,}", _money(s.cost, s.unknown_cost)] for n, s in sorted(by_round.items())],
                numeric=frozenset({0, 2, 3, 4, 5, 6})))
    else:
        by_provider_cost = _map(_map(result.get("cost")).get("by_provider"))
        if by_provider_cost:
            nodes.append(Table(["Provider", "Cost"], [[p, f"${c:.4f}" if isinstance(c, int | float) else "unknown"]
                                                        for p, c in by_provider_cost.items()],
                               numeric=frozenset({1})))
    extra = _context_line(result)
    if extra:
        nodes.append(Para(extra, muted=True))
    return Section("Cost", nodes, anchor="cost")


def summary_line(result: Mapping[str, Any]) -> str:
    """``cost $0.0412 · 18,305 tokens · 14.2 s · saved 4,210 tokens (31%)``: the footer, also used by progress."""
    facts = [_cost_text(_map(result.get("cost")))]
    tokens = _map(result.get("tokens"))
    total, cached = tokens.get("total"), tokens.get("cached_input")
    if isinstance(total, int):
        facts.append(f"{total:,} tokens" + (f" ({cached:,} read from prompt caches)"
                                            if isinstance(cached, int) and cached > 0 else ""))
    if isinstance(result.get("duration_s"), int | float):
        facts.append(f"{result['duration_s']:.1f} s")
    stats = _map(result.get("token_efficiency_stats"))
    saved = stats.get("tokens_saved_via_filtering")
    if isinstance(saved, int) and saved > 0:
        facts.append(f"saved {saved:,} tokens ({stats.get('efficiency_percentage', 0):g}%)")
    return " · ".join(facts)


def _cost_text(cost: Mapping[str, Any]) -> str:
    actual, unknown = cost.get("actual"), [str(m) for m in _list(cost.get("unknown_prices"))]
    unknown_text = f"cost unknown for: {', '.join(unknown)}" if unknown else ""
    if isinstance(actual, int | float):
        return f"cost ${actual:.4f}" + (f" + {unknown_text}" if unknown_text else "")
    return unknown_text or "cost unknown"


def _quality(result: Mapping[str, Any]) -> Section | None:
    """Anchors, citation checks and verification per agent, claim standings and ungrounded judge statements."""
    quality = _map(result.get("quality"))
    if not quality:
        return None  # a result from before the debate-quality layer
    figures = _map(quality.get("metrics"))
    children: list[Node] = [Para(
        f"Claims labelled {pct(figures.get('label_adoption'))} · FACT claims cited "
        f"{pct(figures.get('citation_compliance'))} · ungrounded judge statements "
        f"{figures.get('ungrounded_statements', 0)}")]
    claims = [_map(c) for c in _list(_map(quality.get("state")).get("claims"))]
    if claims:
        counts: dict[str, int] = {}
        for claim in claims:
            counts[str(claim.get("status"))] = counts.get(str(claim.get("status")), 0) + 1
        children.append(Para(f"{len(claims)} claims: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))))
    anchors = _map(quality.get("anchors"))
    rows = []
    for number, agents in sorted(_map(quality.get("checks")).items(), key=lambda item: int(item[0])):
        for agent, entry in sorted(_map(agents).items()):
            entry = _map(entry)
            answered = [r for r in (_map(r) for r in _list(entry.get("verification"))) if r.get("passed") is not None]
            failed = ", ".join(str(r.get("question_id")) for r in answered if not r.get("passed"))
            rules = ", ".join(sorted({str(_map(v).get("rule")) for v in _list(entry.get("rules"))}))
            rows.append([str(number), str(agent), str(anchors.get(agent) or "—"), str(entry.get("labelled", 0)),
                         rules or "—", f"{sum(1 for r in answered if r.get('passed'))}/{len(answered)}",
                         failed or "—"])
    if rows:
        children.append(Table(["Round", "Agent", "Anchor", "Claims", "Rule violations", "Verification passed",
                               "Failed"], rows))
    ungrounded = [_map(s) for results in _map(quality.get("grounding")).values() for s in _list(results)
                  if not _map(s).get("grounded")]
    if ungrounded:
        children.append(Bullets([f"{s.get('where')}: {s.get('text', '')} — {s.get('reason')}" for s in ungrounded],
                                label="Ungrounded judge statements:"))
    not_asked = _map(quality.get("not_applicable"))
    if not_asked:
        children.append(Bullets([f"{q}: {why}" for q, why in sorted(not_asked.items())],
                                label="Verification questions this mode does not ask:"))
    children.extend(_coverage(_map(quality.get("coverage"))))
    return Section("Debate quality", children)


def _coverage(coverage: Mapping[str, Any]) -> list[Node]:
    """Whether each synthesis accounted for every round-1 claim and position (results before the check: none)."""
    out: list[Node] = []
    for number, misses in sorted(coverage.items(), key=lambda item: int(item[0])):
        found = [_map(v) for v in _list(misses)]
        if found:
            out.append(Bullets([str(v.get("detail")) for v in found],
                               label=f"The round-{number} synthesis left unaccounted ({len(found)}):"))
        else:
            out.append(Para(f"The round-{number} synthesis accounts for every round-1 claim and position."))
    return out


# ------------------------------------------------------------------------------------------------ groupthink


_NOT_ACTED = {
    "shadow": "shadow stage, recorded only",
    "rounds": "a short run (rounds 1-2 or quick), recorded only",
    "objection_cap": "quality.groupthink.max_objection_rounds reached",
    "no_judge_step_left": "no judge step left to weigh it",
    "resumed": "the rounds after it were restored from the journal",
}


def escalation_banner(result: Mapping[str, Any]) -> Note | None:
    """When an objection round produced nothing new: the banner that opens the report."""
    if not result.get("escalated"):
        return None
    groupthink = _map(_map(result.get("quality")).get("groupthink"))
    escalation = _map(groupthink.get("escalation"))
    where = f" after round {escalation['round_number']}" if escalation.get("round_number") else ""
    text = (f"A human should look at this result: the panel agreed too easily, and the critical objection "
            f"round{where} produced no new claim and changed no claim's status.")
    if escalation.get("asked"):
        text += " Asked on the terminal, the user chose to " + (
            "continue the debate." if escalation.get("continued") else "stop it there.")
    return Note(text, tone="danger", label="Escalated.", icon="⚑")


def groupthink_section(result: Mapping[str, Any]) -> Section | None:
    """What the groupthink detectors found and what the objection rounds changed (nothing when none fired)."""
    groupthink = _map(_map(result.get("quality")).get("groupthink"))
    fired = [_map(c) for c in _list(groupthink.get("checks")) if _map(c).get("fired")]
    if not fired:
        return None
    children: list[Node] = []
    for check in fired:
        because = str(check.get("not_acted_because"))
        done = "an objection round ran" if check.get("acted") else (
            f"no objection round: {_NOT_ACTED.get(because, because)}")
        children.append(Para(f"Round {check.get('round_number')}: {check.get('why')} — {done}.",
                             label=f"{str(check.get('detector')).replace('_', ' ').capitalize()}:"))
    for outcome in map(_map, _list(groupthink.get("objection_rounds"))):
        changes = ", ".join(f"{_map(c).get('claim_id')} {_map(c).get('from')}→{_map(c).get('to')}"
                            for c in _list(outcome.get("status_changes")))
        new = ", ".join(map(str, _list(outcome.get("new_claims"))))
        text = (f"new claims: {new or 'none'}; status changes: {changes or 'none'}"
                + ("; nothing new — escalated" if outcome.get("escalated") else ""))
        children.append(Para(text, label=f"Objection round {outcome.get('round_number')}:"))
    if groupthink.get("stage") == "shadow":
        children.append(Para("Shadow stage: the detectors only recorded what they would have done.", muted=True))
    return Section("Groupthink", children, anchor="groupthink")


def _attachment(source: Mapping[str, Any]) -> str:
    """A PDF with the pages its text was sent from, or an image with the seats that did not get it."""
    path = source.get("path")
    if source.get("kind") == "pdf":
        return f"{path} {source.get('pages')}" + (" (no text extracted)" if not source.get("sent") else "")
    blind = [str(n) for n in _list(source.get("not_sent_to"))]
    return f"{path} (image" + (f"; not sent to {', '.join(blind)}, text-only" if blind else "") + ")"


def _context_line(result: Mapping[str, Any]) -> str:
    """What went into the prompts besides the question: context files read and secrets redacted."""
    parts = []
    sources = [_map(s) for s in _list(result.get("context_sources"))]
    used = [s for s in sources if not s.get("omitted")]
    if used:
        # PDFs and images are told apart below: their bytes on disk are not what the prompt carries
        text = [s for s in used if s.get("kind") not in ("pdf", "image")]
        size = sum(int(s.get("bytes") or 0) for s in text)
        # "sent" is absent from records written before it existed: then what was read is what was sent
        sent = sum(int(s.get("sent", s.get("bytes")) or 0) for s in text)
        left_out = len(sources) - len(used)
        amount = f"{size:,} bytes" if sent == size else f"{sent:,} of {size:,} bytes sent"
        line = f"context: {len(used)} source{'s' if len(used) != 1 else ''}" + (f" ({amount})" if text else "")
        if left_out:
            line += f", {left_out} left out"
        cut = [s for s in text if s.get("truncated")]
        if cut:
            shown = ", ".join(f"{s.get('path')} after its first {int(s.get('sent') or 0):,} bytes" for s in cut[:3])
            line += f"; cut: {shown}" + (f" and {len(cut) - 3} more" if len(cut) > 3 else "")
        attached = [_attachment(s) for s in used if s.get("kind") in ("pdf", "image")]
        if attached:
            line += "; " + "; ".join(attached)
        parts.append(line)
    scrub = _map(result.get("scrub_report"))
    if scrub.get("total"):
        kinds = ", ".join(f"{k}: {n}" for k, n in sorted(_map(scrub.get("by_type")).items()))
        parts.append(f"secrets redacted before sending: {scrub['total']} ({kinds})")
    context = _map(result.get("context"))
    if context.get("summarized_rounds"):
        rounds = [int(n) for n in _list(context["summarized_rounds"])]
        parts.append(f"summarized prompts from round {min(rounds)}: {context.get('tokens', 0):,} context tokens sent, "
                     f"{context.get('tokens_unsummarized', 0):,} without summaries (saved {pct(context.get('saved'))} "
                     "of those rounds' context)")
    return " · ".join(parts)


__all__ = ["build_report", "summary_line"]
