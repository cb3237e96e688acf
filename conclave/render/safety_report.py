"""The safety evaluator in the report: what was blocked and why, the tier each check reached, and the answers a
block withholds (the journal keeps them; the report does not show them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from conclave.render import journal_view as jv
from conclave.render.nodes import Bullets, Facts, Node, Note, Para, Section, one_line
from conclave.render.renderers import Context, pct, register

TIER_NAMES = {0: "none", 1: "1 · lightweight patterns", 2: "2 · triggered", 3: "3 · full evaluation"}
WITHHELD = "withheld"


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def _withheld_keys(result: Mapping[str, Any]) -> set[tuple[int, str | None]]:
    block = _map(_map(result.get("safety")).get("block"))
    return {(int(w.get("round_number", -1)), w.get("agent")) for w in map(_map, _list(block.get("withheld")))}


def withhold(result: Mapping[str, Any], entries: list[jv.ArtifactEntry]) -> list[jv.ArtifactEntry]:
    """``entries`` with every answer a safety block withheld replaced by a notice saying why."""
    keys = _withheld_keys(result)
    if not keys:
        return entries
    reason = str(_map(_map(result.get("safety")).get("block")).get("reason") or "")
    return [replace(e, kind=WITHHELD, artifact={"reason": reason}) if (e.round_number, e.agent) in keys else e
            for e in entries]


def _withheld(artifact: Mapping[str, Any], ctx: Context) -> list[Node]:
    return [Note(f"Withheld from this report: {one_line(str(artifact.get('reason') or 'blocked'))}. The journal "
                 "keeps it (conclave logs show).", tone="danger", icon="⛔")]


def _evaluation(artifact: Mapping[str, Any], ctx: Context) -> list[Node]:
    facts = [("Verdict", str(artifact.get("verdict") or "—")), ("Risk", pct(artifact.get("risk"))),
             ("Categories", ", ".join(map(str, _list(artifact.get("categories")))) or "none")]
    nodes: list[Node] = [Facts(facts)]
    if artifact.get("reason"):
        nodes.append(Para(str(artifact["reason"]), label="Reason:"))
    if _list(artifact.get("concerns")):
        nodes.append(Bullets([str(c) for c in _list(artifact.get("concerns"))]))
    return nodes


register(WITHHELD, _withheld, title="Withheld answer")
register("safety_evaluation", _evaluation, title="Safety evaluation")


def safety_section(result: Mapping[str, Any]) -> Section | None:
    """The report's safety section: when a trigger fired, a pattern matched, a concern was raised or something was
    (or in the shadow stage would have been) blocked; None otherwise and for results from before the evaluator."""
    safety = _map(result.get("safety"))
    if not safety.get("enabled"):
        return None
    quiet = not (safety.get("triggers") or safety.get("flags") or safety.get("blocked") or safety.get("would_block")
                 or safety.get("concerns"))
    if quiet:
        return None  # tier 1 passed on everything and nothing asked for more: nothing to report
    tier = int(safety.get("tier_reached") or 0)
    ms = safety.get("tier1_ms_mean")
    facts = [
        ("Stage", str(safety.get("stage") or "on")),
        ("Tier reached", TIER_NAMES.get(tier, str(tier))),
        ("Responses checked (tier 1)", f"{safety.get('responses_checked', 0)}"
         + (f" · {ms:.3f} ms each on average" if isinstance(ms, int | float) else "")),
        ("Full evaluations", str(safety.get("evaluations", 0))),
    ]
    nodes: list[Node] = []
    block = _map(safety.get("block"))
    if safety.get("blocked"):
        nodes.append(Note(one_line(str(block.get("reason") or "blocked")), tone="danger", label="Blocked:",
                          icon="⛔"))
    elif safety.get("would_block"):
        nodes.append(Note(f"Shadow stage: this would have been blocked — {one_line(str(block.get('reason')))}",
                          tone="warn", label="Would block:"))
    nodes.append(Facts(facts))
    triggers = [_map(t) for t in _list(safety.get("triggers"))]
    if triggers:
        nodes.append(Para("Tier 2 triggers (a full evaluation was asked for):", muted=True))
        nodes.append(Bullets([f"{t.get('kind')}: {t.get('description')}"
                              + (f" — in {t.get('target')}" if t.get("target") not in (None, "mode") else "")
                              for t in triggers]))
    flags = [_map(f) for f in _list(safety.get("flags"))]
    if flags:
        nodes.append(Para("Tier 1 pattern hits:", muted=True))
        # the matched words are shown for the user's own text only: a model's harmful answer is not repeated here
        nodes.append(Bullets([f"{f.get('category')} in {f.get('target')}: {f.get('description')}"
                              + (f" (matched “{one_line(str(f.get('matched') or ''))}”)"
                                 if f.get("target") in ("question", "context") else "") for f in flags]))
    concerns = [str(c) for c in _list(safety.get("concerns"))]
    if concerns:
        nodes.append(Para("Concerns from the full evaluation:", muted=True))
        nodes.append(Bullets(list(dict.fromkeys(concerns))))
    return Section("Safety", nodes, anchor="safety")
