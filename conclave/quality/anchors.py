"""Perspective anchors: a fixed lens for each agent, assigned round-robin at the start of a consultation.

``quality.anchors``: ``auto`` (round-robin over the agents in configuration order), ``none``, or
``{agent: anchor}`` (every agent named; an agent left out gets none). An anchor sets the lens, not the
verdict: the agent applies it where the topic makes it relevant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

ANCHORS: dict[str, str] = {
    "Risk-Attentive": "Focus on safety, robustness, failure modes, adversarial scenarios, worst-case analysis",
    "Implementation-Focused": "Focus on practicality, feasibility, cost, timeline, resource constraints",
    "Evidence-Calibrated": "Focus on data quality, uncertainty quantification, empirical grounding, confidence bounds",
    "Systems-Aware": "Focus on long-term effects, second-order consequences, ecosystem impact",
}


def assign_anchors(agents: Sequence[str], setting: str | Mapping[str, str]) -> dict[str, str]:
    """Agent → anchor name, for the agents that get one."""
    if isinstance(setting, Mapping):
        return {name: setting[name] for name in agents if name in setting}
    if setting == "none":
        return {}
    names = list(ANCHORS)
    return {name: names[i % len(names)] for i, name in enumerate(agents)}


def anchor_prompt(anchor: str) -> str:
    """The system-prompt section that gives an agent its anchor: its name and definition, and how to apply it."""
    return f"=== PERSPECTIVE ANCHOR: {anchor} ===\n{ANCHORS[anchor]} — as far as the topic makes it relevant.\n"
