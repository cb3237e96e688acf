"""Synthesis completeness: the round-2 synthesis accounts for everything the panel said in round 1.

A round-1 claim is accounted for when a consensus point, a tension, a partial-coverage point or a unique insight
names its id (``claim_ids``); an agent's position is accounted for when the agent appears in one of them (a
supporting agent, a viewpoint, a partial-coverage agent, a unique insight's author). Blind spots are what no agent
addressed, so they account for no claim. Every miss is a rule violation, recorded and counted like the citation
rules: ``claim_unaccounted`` (with the claim id) and ``position_unaccounted`` (with the agent).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from conclave.quality.claims import RuleViolation

RULES = ("claim_unaccounted", "position_unaccounted")
#: the synthesis sections that account for claims and positions
SECTIONS = ("consensus_points", "tensions", "partial_coverage", "unique_insights")


def applies(synthesis: Mapping[str, Any]) -> bool:
    """Whether the artifact is a synthesis that can account for claims (a schema with the coverage sections)."""
    return "partial_coverage" in synthesis and "consensus_points" in synthesis


def named_claims(synthesis: Mapping[str, Any]) -> set[str]:
    return {str(i) for section in SECTIONS for item in _items(synthesis, section) for i in item.get("claim_ids") or []}


def named_agents(synthesis: Mapping[str, Any]) -> set[str]:
    out: set[str] = set()
    for item in _items(synthesis, "consensus_points"):
        out.update(str(a) for a in item.get("supporting_agents") or [])
    for item in _items(synthesis, "tensions"):
        out.update(str(v.get("agent")) for v in item.get("viewpoints") or [] if isinstance(v, Mapping))
    for item in _items(synthesis, "partial_coverage"):
        out.update(str(a) for a in item.get("agents") or [])
    out.update(str(item.get("agent")) for item in _items(synthesis, "unique_insights"))
    return out


def check_coverage(synthesis: Mapping[str, Any], claims: Mapping[str, str], agents: Iterable[str]
                   ) -> list[RuleViolation]:
    """What the synthesis leaves unaccounted: ``claims`` maps each round-1 claim id to its author, ``agents`` are
    the agents present (real names, as stored artifacts name them)."""
    named, speakers = named_claims(synthesis), named_agents(synthesis)
    out = [RuleViolation("claim_unaccounted", f"{cid} ({author}) is in no consensus point, tension, partial-coverage "
                         "point or unique insight", claim=cid, agent=author)
           for cid, author in claims.items() if cid not in named]
    out += [RuleViolation("position_unaccounted", f"{agent}'s position appears nowhere in the synthesis", agent=agent)
            for agent in agents if agent not in speakers]
    return out


def _items(synthesis: Mapping[str, Any], section: str) -> list[Mapping[str, Any]]:
    return [i for i in synthesis.get(section) or [] if isinstance(i, Mapping)]
