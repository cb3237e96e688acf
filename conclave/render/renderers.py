"""One renderer per record or artifact type, shared by every view.

A renderer turns one artifact (or journal record payload) into document nodes (:mod:`conclave.render.nodes`);
the Markdown report, the HTML report, ``conclave show``, the Datasette consultation page and Datasette's
``render_cell`` all call :func:`render_artifact`. A new record type therefore needs one ``@renderer("type")``
function (in conclave, or in a plugin module that calls :func:`register` when it is imported), and an unknown type
still shows readably through the generic renderer.

Keys are artifact schema names (``independent``, ``synthesis``, ``cross_exam_reply``, ``cross_exam_reply_explore``,
``cross_exam``, ``verdict``, ``verdict_explore``); an artifact's ``artifact_type`` is the fallback key.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conclave.render.nodes import Bullets, Card, Facts, Node, Para, Table, one_line

Renderer = Callable[[Mapping[str, Any], "Context"], list[Node]]


@dataclass(frozen=True)
class Context:
    """What a renderer may know beyond the artifact: the panel (agent → model) and how much detail to show."""

    models: Mapping[str, str] = field(default_factory=dict)
    brief: bool = False  # a table cell: the gist only
    omit: frozenset[str] = frozenset()  # fields already shown around the artifact (round 1's table has positions)


_RENDERERS: dict[str, Renderer] = {}
#: human titles of round types and artifact schemas, for section and card headings
TITLES: dict[str, str] = {
    "independent": "Independent answers",
    "synthesis": "Synthesis",
    "cross_exam": "Cross-examination",
    "cross_exam_reply": "Cross-examination reply",
    "cross_exam_reply_explore": "Cross-examination reply",
    "verdict": "Verdict",
    "verdict_explore": "Options",
    "objection": "Critical objection",
}


def register(kind: str, renderer: Renderer, *, title: str | None = None) -> None:
    """Make ``renderer`` the renderer of ``kind`` (a later registration replaces an earlier one)."""
    _RENDERERS[kind] = renderer
    if title:
        TITLES[kind] = title


def renderer(kind: str, *, title: str | None = None) -> Callable[[Renderer], Renderer]:
    """Decorator form of :func:`register`."""

    def decorate(fn: Renderer) -> Renderer:
        register(kind, fn, title=title)
        return fn

    return decorate


def kind_of(artifact: Mapping[str, Any], hint: str | None = None) -> str:
    """The registry key of an artifact: ``hint`` (its schema name) when known, else its ``artifact_type``, else
    a guess from its shape (round-3 replies carry no type field)."""
    if hint and hint in _RENDERERS:
        return hint
    declared = artifact.get("artifact_type")
    if declared == "verdict" and "recommendations" in artifact:
        return "verdict_explore"
    if isinstance(declared, str) and declared in _RENDERERS:
        return declared
    if "counterargument" in artifact and "alternative_hypothesis" in artifact:
        return "objection"
    if "refined_position" in artifact:
        return "cross_exam_reply_explore"
    if "revised_position" in artifact:
        return "cross_exam_reply"
    return hint or (declared if isinstance(declared, str) else "artifact")


def render_artifact(artifact: Any, kind: str | None = None, context: Context | None = None) -> list[Node]:
    """The nodes of one artifact, by its registered renderer (or the generic one)."""
    context = context or Context()
    if not isinstance(artifact, Mapping):
        return [Para(one_line(artifact))] if artifact not in (None, "") else []
    fn = _RENDERERS.get(kind_of(artifact, kind), _generic)
    return fn(artifact, context)


def title_of(kind: str) -> str:
    return TITLES.get(kind, kind.replace("_", " ").capitalize())


def pct(value: Any) -> str:
    return f"{round(float(value) * 100)}%" if isinstance(value, int | float) and not isinstance(value, bool) else "n/a"


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    return str(value).strip() if value not in (None, "") else ""


def _brief(text: str, limit: int = 160) -> str:
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


# ------------------------------------------------------------------------------------------------ built-ins


@renderer("independent")
def _independent(a: Mapping[str, Any], ctx: Context) -> list[Node]:
    if ctx.brief:
        return [Para(f"{_brief(_text(a.get('position')))} (confidence {pct(a.get('confidence'))})")]
    nodes: list[Node] = [] if "position" in ctx.omit else [Para(_text(a.get("position")), label="Position:")]
    if _list(a.get("key_points")):
        nodes.append(Bullets([str(p) for p in _list(a.get("key_points"))]))
    if _text(a.get("rationale")):
        nodes.append(Para(_text(a.get("rationale")), label="Rationale:"))
    if _text(a.get("prose_excerpt")):
        nodes.append(Para(_text(a.get("prose_excerpt")), label="In its own words:", muted=True))
    return nodes


@renderer("synthesis")
def _synthesis(a: Mapping[str, Any], ctx: Context) -> list[Node]:
    points = [_map(p) for p in _list(a.get("consensus_points"))]
    tensions = [_map(t) for t in _list(a.get("tensions"))]
    priorities = [str(p) for p in _list(a.get("priority_order"))]
    if ctx.brief:
        return [Para(f"{len(points)} consensus points, {len(tensions)} tensions"
                     + (f"; first priority: {_brief(priorities[0], 80)}" if priorities else ""))]
    nodes: list[Node] = []
    if points:
        lines = []
        for p in points:
            backers = ", ".join(map(str, _list(p.get("supporting_agents")))) or "no one named"
            lines.append(f"{p.get('point')} — supported by {backers} (confidence {pct(p.get('confidence'))})")
        nodes.append(Bullets(lines, label="Consensus"))
    else:
        nodes.append(Para("No consensus points.", muted=True))
    if tensions:
        rows = []
        for t in tensions:
            for v in (_map(v) for v in _list(t.get("viewpoints"))):
                rows.append([str(t.get("topic") or ""), str(v.get("agent") or ""), str(v.get("viewpoint") or "")])
        nodes += [Para("", label="Tensions"), Table(["Topic", "Agent", "Viewpoint"], rows)]
    if priorities:
        nodes.append(Bullets(priorities, label="Priorities", ordered=True))
    return nodes


@renderer("cross_exam_reply")
def _reply(a: Mapping[str, Any], ctx: Context) -> list[Node]:
    if ctx.brief:
        return [Para(f"Revised position: {_brief(_text(a.get('revised_position')))}")]
    nodes: list[Node] = []
    if _text(a.get("critique")):
        nodes.append(Para(_text(a.get("critique")), label="Critique:"))
    challenges = [_map(c) for c in _list(a.get("challenges"))]
    if challenges:
        nodes.append(Bullets([f"→ {c.get('target_agent')}: {c.get('challenge')}" + _evidence(c) for c in challenges],
                             label="Challenges"))
    if _text(a.get("defense")):
        nodes.append(Para(_text(a.get("defense")), label="Defence:"))
    nodes.append(Para(_text(a.get("revised_position")), label="Revised position:"))
    return nodes + _vote(a)


def _vote(a: Mapping[str, Any]) -> list[Node]:
    """A reply's exit vote and confidence (replies from before votes have none)."""
    if not a.get("vote"):
        return []
    reason = f" — {_text(a.get('vote_reason'))}" if _text(a.get("vote_reason")) else ""
    confidence = f" · confidence {pct(a.get('confidence'))}" if isinstance(a.get("confidence"), int | float) else ""
    return [Para(f"{a['vote']}{reason}{confidence}", label="Vote:")]


@renderer("objection")
def _objection(a: Mapping[str, Any], ctx: Context) -> list[Node]:
    """A critical objection answer: counterargument, alternative hypothesis, challenged assumption, where it now
    stands."""
    counter, alternative = _map(a.get("counterargument")), _map(a.get("alternative_hypothesis"))
    assumption = _map(a.get("challenged_assumption"))
    if ctx.brief:
        return [Para(f"Objects: {_brief(_text(counter.get('text')))}")]

    def against(item: Mapping[str, Any]) -> str:
        ids = [str(x) for x in _list(item.get("opposes"))]
        return f" (against {', '.join(ids)})" if ids else ""

    nodes: list[Node] = [
        Para(_text(counter.get("text")) + against(counter), label="Counterargument:"),
        Para(_text(alternative.get("text")), label="Alternative hypothesis:"),
        Para(f"{_text(assumption.get('assumption'))} — {_text(assumption.get('challenge'))}" + against(assumption),
             label="Challenged assumption:"),
    ]
    position = _text(a.get("revised_position"))
    if position:
        nodes.append(Para(position + (f" (confidence {pct(a.get('confidence'))})" if "confidence" in a else ""),
                          label="Position now:"))
    return nodes


@renderer("cross_exam_reply_explore")
def _reply_explore(a: Mapping[str, Any], ctx: Context) -> list[Node]:
    if ctx.brief:
        return [Para(f"Refined position: {_brief(_text(a.get('refined_position')))}")]
    nodes: list[Node] = []
    for key, label in (("extensions", "Extensions"), ("bridges", "Bridges"), ("gaps", "Gaps")):
        if _list(a.get(key)):
            nodes.append(Bullets([str(x) for x in _list(a.get(key))], label=label))
    nodes.append(Para(_text(a.get("refined_position")), label="Refined position:"))
    return nodes + _vote(a)


def _evidence(item: Mapping[str, Any]) -> str:
    evidence = [str(e) for e in _list(item.get("evidence"))]
    return f" (evidence: {'; '.join(evidence)})" if evidence else ""


@renderer("cross_exam")
def _cross_exam(a: Mapping[str, Any], ctx: Context) -> list[Node]:
    challenges = [_map(c) for c in _list(a.get("challenges"))]
    rebuttals = [_map(r) for r in _list(a.get("rebuttals"))]
    unresolved = [str(u) for u in _list(a.get("unresolved"))]
    if ctx.brief:
        return [Para(f"{len(challenges)} challenges, {len(rebuttals)} rebuttals, {len(unresolved)} unresolved")]
    nodes: list[Node] = []
    if challenges:
        rows = [[str(c.get("challenger") or ""), str(c.get("target_agent") or ""), str(c.get("challenge") or ""),
                 "; ".join(map(str, _list(c.get("evidence"))))] for c in challenges]
        nodes += [Para("", label="Challenges"), Table(["Challenger", "Target", "Challenge", "Evidence"], rows)]
    else:
        nodes.append(Para("No challenges were raised.", muted=True))
    if rebuttals:
        nodes.append(Bullets([f"{r.get('agent')}: {r.get('rebuttal')}" for r in rebuttals], label="Rebuttals"))
    if unresolved:
        nodes.append(Bullets(unresolved, label="Unresolved"))
    else:
        nodes.append(Para("None: the cross-examination left nothing unresolved.", label="Unresolved:", muted=True))
    return nodes


def dissent_lines(dissent: Any) -> list[str]:
    return [f"{d.get('agent')} ({d.get('severity') or 'unrated'}): {one_line(d.get('concern', ''))}"
            for d in (_map(x) for x in _list(dissent))]


@renderer("verdict")
def _verdict(a: Mapping[str, Any], ctx: Context) -> list[Node]:
    if ctx.brief:
        return [Para(f"{_brief(_text(a.get('recommendation')))} (confidence {pct(a.get('confidence'))})")]
    nodes: list[Node] = [Para(_text(a.get("recommendation")))]
    if _list(a.get("evidence")):
        nodes.append(Bullets([str(e) for e in _list(a.get("evidence"))], label="Evidence"))
    contributions = [_map(c) for c in _list(a.get("per_agent_contributions"))]
    if contributions:
        nodes.append(Table(["Agent", "Key insight", "Adopted"],
                           [[str(c.get("agent")), str(c.get("key_insight")), "yes" if c.get("adopted") else "no"]
                            for c in contributions]))
    return nodes


@renderer("verdict_explore")
def _verdict_explore(a: Mapping[str, Any], ctx: Context) -> list[Node]:
    options = [_map(o) for o in _list(a.get("recommendations"))]
    if ctx.brief:
        return [Para(f"{len(options)} options: " + "; ".join(_brief(str(o.get("option", "")), 60) for o in options))]
    nodes: list[Node] = []
    if _text(a.get("summary")):
        nodes.append(Para(_text(a.get("summary"))))
    for number, option in enumerate(options, 1):
        facts = [("Pros", "; ".join(map(one_line, _list(option.get("pros"))))),
                 ("Cons", "; ".join(map(one_line, _list(option.get("cons"))))),
                 ("Best when", one_line(option.get("best_when") or "")),
                 ("Championed by", ", ".join(map(str, _list(option.get("championed_by")))))]
        body: list[Node] = [Para(_text(option.get("description")))] if _text(option.get("description")) else []
        shown = [(k, v) for k, v in facts if v]
        if shown:
            body.append(Facts(shown))
        nodes.append(Card(f"{number}. {one_line(option.get('option', ''))}", body))
    if _list(a.get("synergies")):
        nodes.append(Bullets([str(s) for s in _list(a.get("synergies"))], label="Synergies"))
    return nodes


_SKIP = {"artifact_type", "schema_version", "round_number", "created_at"}


def _generic(a: Mapping[str, Any], ctx: Context) -> list[Node]:
    """Any artifact without its own renderer: scalars as facts, string lists as bullets, the rest as JSON."""
    facts: list[tuple[str, str]] = []
    nodes: list[Node] = []
    for key, value in a.items():
        if key in _SKIP:
            continue
        label = key.replace("_", " ").capitalize()
        if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            nodes.append(Bullets([str(v) for v in value], label=label))
        elif isinstance(value, Mapping | list):
            facts.append((label, json.dumps(value, ensure_ascii=False)))
        elif value not in (None, ""):
            facts.append((label, str(value)))
    if ctx.brief:
        return [Para("; ".join(f"{k}: {_brief(v, 60)}" for k, v in facts[:3]) or "(no scalar fields)")]
    return ([Facts(facts)] if facts else []) + nodes


__all__ = ["TITLES", "Context", "Renderer", "dissent_lines", "kind_of", "pct", "register", "render_artifact",
           "renderer", "title_of"]
