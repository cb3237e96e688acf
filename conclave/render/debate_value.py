"""How each agent moved from round 1 to round 3, and whether the debate changed anything ("debate value").

Deterministic, no model call: an agent's final stance is its round-3 revised (or refined) position. Its final
confidence is the reply's own ``confidence`` when the reply has one; otherwise the verdict's confidence, times 0.8
when the agent's concern is in the verdict's dissent (a dissenter does not share the verdict's certainty).

How far a position moved is the overlap coefficient of the two positions' content-word stems (a word's first five
letters, so "sourcing" meets "source"; shared stems over the smaller set, so a shorter restatement still matches):
≥ 0.8 same, ≥ 0.5 minor refinement, ≥ 0.25 moderate shift, below that a significant change; a "same" position
whose confidence moved by 0.15 or more counts as a minor refinement. An agent changed position when its change is
not "same". ``convergence_score`` = 0.3 × clamp(mean confidence change / 0.3, 0, 1) + 0.7 × the share of agents
whose position stayed the same or was only refined: 1.0 means everyone held their ground and grew more certain.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_STOP = frozenset({
    "a", "an", "and", "are", "as", "at", "be", "by", "for", "from", "has", "have", "in", "is", "it", "its", "of",
    "on", "or", "that", "the", "this", "to", "was", "were", "will", "with", "we", "should", "not", "no", "do",
    "does", "our", "their", "they", "them", "than", "then", "so", "but", "if", "into", "about", "over", "more",
    "most", "very", "can",
})
_WORD = re.compile(r"[a-z0-9]+")

CHANGE_LABELS = {"same": "same", "minor_refinement": "refined", "moderate_shift": "shifted",
                 "significant_change": "changed"}


def _stems(text: str) -> set[str]:
    return {w[:5] for w in _WORD.findall(text.lower()) if w not in _STOP}


def similarity(a: str, b: str) -> float:
    """Overlap coefficient of the content-word stems of two texts (1.0 for two empty texts)."""
    wa, wb = _stems(a), _stems(b)
    if not wa or not wb:
        return 1.0 if wa == wb else 0.0
    return len(wa & wb) / min(len(wa), len(wb))


def _change(sim: float, delta: float | None) -> str:
    if sim >= 0.8:
        return "minor_refinement" if delta is not None and abs(delta) >= 0.15 else "same"
    if sim >= 0.5:
        return "minor_refinement"
    if sim >= 0.25:
        return "moderate_shift"
    return "significant_change"


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def debate_value(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """Per-agent movement and the summary metrics, or None when round 3 produced no replies to compare."""
    artifacts = _map(result.get("artifacts"))
    round_1, replies = _map(artifacts.get("round_1")), _map(artifacts.get("round_3_replies"))
    if not replies:
        return None
    verdict = _map(result.get("verdict"))
    verdict_confidence = _num(verdict.get("confidence", result.get("confidence")))
    dissenters = {d.get("agent") for d in result.get("dissent") or [] if isinstance(d, Mapping)}
    order = [str(a.get("name")) for a in result.get("agents") or [] if isinstance(a, Mapping)]
    names = [n for n in order if n in round_1] + [str(n) for n in round_1 if n not in order]
    agents: list[dict[str, Any]] = []
    for name in names:
        first = round_1[name]
        reply = replies.get(name)
        if not isinstance(first, Mapping) or not isinstance(reply, Mapping):
            continue
        final_position = str(reply.get("revised_position") or reply.get("refined_position") or "")
        r1_conf = _num(first.get("confidence"))
        final_conf = _num(reply.get("confidence"))
        if final_conf is None and verdict_confidence is not None:
            final_conf = round(verdict_confidence * (0.8 if name in dissenters else 1.0), 4)
        delta = round(final_conf - r1_conf, 4) if final_conf is not None and r1_conf is not None else None
        sim = similarity(str(first.get("position") or ""), final_position)
        change = _change(sim, delta)
        agents.append({
            "agent": name, "round1_position": first.get("position"), "round1_confidence": r1_conf,
            "final_position": final_position, "final_confidence": final_conf, "similarity": round(sim, 3),
            "change": change, "position_changed": change != "same", "confidence_delta": delta,
            "dissented": name in dissenters,
        })
    if not agents:
        return None
    changed = sum(a["position_changed"] for a in agents)
    deltas = [a["confidence_delta"] for a in agents if a["confidence_delta"] is not None]
    mean_delta = round(sum(deltas) / len(deltas), 4) if deltas else None
    steady = sum(a["change"] in ("same", "minor_refinement") for a in agents) / len(agents)
    confidence_part = min(max((mean_delta or 0.0) / 0.3, 0.0), 1.0)
    return {
        "agents": agents,
        "agents_changed_position": changed,
        "total_agents": len(agents),
        "change_rate": round(changed / len(agents), 4),
        "avg_confidence_change": mean_delta,
        "convergence_score": round(0.3 * confidence_part + 0.7 * steady, 4),
    }


__all__ = ["CHANGE_LABELS", "debate_value", "similarity"]
