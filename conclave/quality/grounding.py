"""Judge grounding: every statement of the synthesis and the verdict should rest on what the agents said.

A judge statement (a consensus point, a tension, a partial-coverage point, a unique insight, a verdict evidence
item) is **grounded** when it names at least one existing claim id, or — for a statement that names none — when
at least half of its key terms (words of four or more letters, minus common words and agent names) occur in the
agents' own text. Otherwise it is flagged ``ungrounded``, with the reason.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

_WORD = re.compile(r"[a-z][a-z0-9-]{3,}")
_COMMON_WORDS = (
    "about above after again against also although among another because been before being between both "
    "could does doing during each either every from further have having here however into itself just "
    "more most must need needs only other over same should since some such than that their them then "
    "there these they this those through under until very what when where which while whom with within "
    "without would your agent agents panel point points consensus tension tensions position positions"
)
_COMMON = frozenset(_COMMON_WORDS.split())
GROUNDED_SHARE = 0.5


def key_terms(text: str, exclude: Iterable[str] = ()) -> set[str]:
    skip = _COMMON | {e.lower() for e in exclude}
    return {w for w in _WORD.findall(text.lower()) if w not in skip}


def agent_text(artifacts: Iterable[Mapping[str, Any]]) -> str:
    """Every string in the agents' artifacts, lower-cased: what a grounded statement's terms are looked up in."""
    out: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, Mapping):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for artifact in artifacts:
        walk(artifact)
    return "\n".join(out).lower()


def statements(artifact: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The judge's statements in a synthesis or verdict artifact: where, text, the claim ids it names."""
    out: list[dict[str, Any]] = []
    for i, p in enumerate(artifact.get("consensus_points") or []):
        out.append({"where": f"consensus_points[{i}]", "text": p.get("point", ""), "claim_ids": p.get("claim_ids")})
    for i, t in enumerate(artifact.get("tensions") or []):
        text = " ".join([str(t.get("topic", "")), *(str(v.get("viewpoint", "")) for v in t.get("viewpoints") or [])])
        out.append({"where": f"tensions[{i}]", "text": text, "claim_ids": t.get("claim_ids")})
    for i, p in enumerate(artifact.get("partial_coverage") or []):
        out.append({"where": f"partial_coverage[{i}]", "text": p.get("point", ""), "claim_ids": p.get("claim_ids")})
    for i, p in enumerate(artifact.get("unique_insights") or []):
        out.append({"where": f"unique_insights[{i}]", "text": p.get("insight", ""), "claim_ids": p.get("claim_ids")})
    if artifact.get("artifact_type") == "verdict" or "recommendation" in artifact:
        named = {str(e.get("evidence", "")): e.get("claim_ids") for e in artifact.get("evidence_claims") or []}
        for i, item in enumerate(artifact.get("evidence") or []):
            out.append({"where": f"evidence[{i}]", "text": str(item), "claim_ids": named.get(str(item))})
    return out


def check_grounding(artifact: Mapping[str, Any], known_ids: Iterable[str], corpus: str,
                    names: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Each judge statement with ``grounded`` and the ``reason``."""
    known, names = set(known_ids), list(names)
    out = []
    for s in statements(artifact):
        cited = [str(i) for i in s.get("claim_ids") or []]
        valid = [i for i in cited if i in known]
        terms = key_terms(str(s["text"]), names)
        found = [t for t in terms if t in corpus]
        if valid:
            grounded, reason = True, f"rests on {', '.join(valid)}"
        elif terms and len(found) / len(terms) >= GROUNDED_SHARE:
            grounded = True
            reason = f"names no claim; {len(found)} of {len(terms)} key terms appear in the agents' text"
        else:
            grounded = False
            unknown = ", ".join(i if i.strip() else repr(i) for i in cited)  # an empty id shows as ''
            reason = (f"names no existing claim{' (' + unknown + ' unknown)' if cited else ''}; "
                      f"{len(found)} of {len(terms)} key terms appear in the agents' text")
        out.append({"where": s["where"], "text": str(s["text"]), "claim_ids": valid, "grounded": grounded,
                    "reason": reason})
    return out
