"""The debate state: every claim and piece of evidence of a consultation under a stable id, and its standing.

The engine, not the model, names things: each new claim becomes ``C1, C2, …`` and each new reference
``E1, E2, …``, numbered for the whole consultation in the order rounds, then agents (by name), then items are
absorbed — so replaying the same artifacts (a resume) gives the same ids. An agent that restates a state claim
gives its id (``C3``) as the claim's id; a claim ``supports``/``opposes`` state claims by id; a reply ``retracts``
its author's own claims; the round-3 judge sets statuses by id.

A claim's status: ``open`` when introduced; ``contested`` once another claim opposes it; ``accepted`` once another
agent backs it and nothing opposes it; ``retracted`` when its author withdraws it. The judge's statuses override.

:meth:`DebateState.block` is the "DEBATE STATE" prompt block, kept under a token budget by compressing, then
dropping, the oldest settled (accepted or retracted) claims first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from conclave.quality.claims import claims_of

STATUSES = ("accepted", "contested", "retracted", "open")
EVIDENCE_KINDS = ("citation", "tool_output", "calculation")
SETTLED = ("accepted", "retracted")
CLAIM_WORDS = 20  # a claim's text in the block: at most this many words (about 30 tokens)
GIST_WORDS = 16  # about 25 tokens
COMPRESSED_WORDS = 8
BLOCK_BUDGET = 2000  # tokens
_STATE_ID = re.compile(r"^[CE][1-9][0-9]*$")


@dataclass
class StateClaim:
    id: str
    text: str
    label: str
    agent: str
    introduced_round: int
    last_updated_round: int
    status: str = "open"
    support: list[str] = field(default_factory=list)  # evidence ids
    opposition: list[str] = field(default_factory=list)  # ids of claims that oppose it
    backing: list[str] = field(default_factory=list)  # ids of other agents' claims that support it
    opposes: list[str] = field(default_factory=list)  # ids of claims it opposes
    status_reason: str = ""


@dataclass
class Evidence:
    id: str
    kind: str
    title: str
    agent: str
    added_round: int
    url: str | None = None
    gist: str = ""
    supports: list[str] = field(default_factory=list)  # claim ids


@dataclass
class Absorbed:
    """What absorbing one artifact did: its claims' local id → state id, and its references' numbers → E ids."""

    claims: dict[str, str] = field(default_factory=dict)
    evidence: dict[int, str] = field(default_factory=dict)
    new_claims: list[str] = field(default_factory=list)
    unknown_ids: list[str] = field(default_factory=list)  # state ids it named that do not exist


class DebateState:
    """The claims, evidence and agents' standing of one consultation; serialisable, and rebuilt by replay."""

    def __init__(self, topic: str, participants: list[str]) -> None:
        self.topic = topic
        self.round = 0
        self.participants = list(participants)
        self.claims: dict[str, StateClaim] = {}
        self.evidence: dict[str, Evidence] = {}
        self.agent_status: dict[str, dict[str, Any]] = {
            name: {"status": "active", "claims": []} for name in participants}

    # ------------------------------------------------------------------------------------------- updating

    def absorb(self, round_number: int, agent: str, artifact: Mapping[str, Any]) -> Absorbed:
        """Take in one agent's artifact: new claims and references get ids, references to state ids link up."""
        self.round = max(self.round, round_number)
        done = Absorbed()
        claims, references, _ = claims_of(artifact)
        for ref in references:
            if isinstance(ref.get("id"), int):
                done.evidence[ref["id"]] = self._evidence_for(ref, agent, round_number)
        status = self.agent_status.setdefault(agent, {"status": "active", "claims": []})
        for claim in claims:
            local = str(claim.get("id", ""))
            cited = [done.evidence[n] for n in claim.get("citations") or [] if n in done.evidence]
            existing = self.claims.get(local) if _STATE_ID.match(local) else None
            if existing is not None:  # a restatement of a state claim
                target = existing
                target.last_updated_round = round_number
                if agent != target.agent and target.status == "open" and not target.opposition:
                    target.status = "accepted"  # another agent restates it: shared ground
            else:
                if _STATE_ID.match(local):
                    done.unknown_ids.append(local)
                target = StateClaim(f"C{len(self.claims) + 1}", str(claim.get("text", "")).strip(),
                                    str(claim.get("label", "")), agent, round_number, round_number)
                self.claims[target.id] = target
                done.new_claims.append(target.id)
                status["claims"].append(target.id)
            done.claims[local] = target.id
            for eid in cited:
                _add(target.support, eid)
                _add(self.evidence[eid].supports, target.id)
            for ref_id in claim.get("supports") or []:
                self._link(str(ref_id), target, round_number, oppose=False, done=done)
            for ref_id in claim.get("opposes") or []:
                self._link(str(ref_id), target, round_number, oppose=True, done=done)
        for ref_id in artifact.get("retracts") or []:
            withdrawn = self.claims.get(str(ref_id))
            if withdrawn is None:
                done.unknown_ids.append(str(ref_id))
            elif withdrawn.agent == agent:
                withdrawn.status, withdrawn.last_updated_round = "retracted", round_number
                withdrawn.status_reason = "withdrawn by its author"
        return done

    def set_status(self, claim_id: str, status: str, round_number: int, reason: str = "") -> bool:
        """The judge's ruling on a claim; False when the id or status is unknown."""
        claim = self.claims.get(claim_id)
        if claim is None or status not in STATUSES:
            return False
        claim.status, claim.last_updated_round, claim.status_reason = status, round_number, reason
        return True

    def mark_agents(self, round_number: int, present: list[str], answered: list[str] | None) -> None:
        """Who is absent (no first-round answer) and who stayed silent in round ``round_number``."""
        self.round = max(self.round, round_number)
        for name, status in self.agent_status.items():
            if name not in present:
                status["status"] = "absent"
            elif answered is not None:
                status["status"] = "active" if name in answered else "silent"

    def _link(self, ref_id: str, claim: StateClaim, round_number: int, *, oppose: bool, done: Absorbed) -> None:
        other = self.claims.get(ref_id)
        if other is None or other is claim:
            if other is None:
                done.unknown_ids.append(ref_id)
            return
        if oppose:
            _add(other.opposition, claim.id)
            _add(claim.opposes, other.id)
            if other.status != "retracted":
                other.status = "contested"
        elif other.agent != claim.agent:
            _add(other.backing, claim.id)
            if other.status == "open" and not other.opposition:
                other.status = "accepted"
        other.last_updated_round = round_number

    def _evidence_for(self, ref: Mapping[str, Any], agent: str, round_number: int) -> str:
        """The E id of a reference: the same source (url, else title) cited twice is one piece of evidence."""
        url = str(ref.get("url") or "").strip() or None
        title = str(ref.get("title") or "").strip()
        for item in self.evidence.values():
            if (url and item.url == url) or (not url and not item.url and item.title.lower() == title.lower()):
                return item.id
        eid = f"E{len(self.evidence) + 1}"
        self.evidence[eid] = Evidence(eid, "citation", title, agent, round_number, url,
                                      _words(str(ref.get("snippet") or ""), GIST_WORDS))
        return eid

    # ------------------------------------------------------------------------------------------- storing

    def as_dict(self) -> dict[str, Any]:
        return {
            "topic": self.topic, "round": self.round, "participants": list(self.participants),
            "claims": [asdict(c) for c in self.claims.values()],
            "evidence": [asdict(e) for e in self.evidence.values()],
            "agent_status": {k: {**v, "claims": list(v["claims"])} for k, v in self.agent_status.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DebateState:
        state = cls(str(data.get("topic", "")), list(data.get("participants") or []))
        state.round = int(data.get("round") or 0)
        state.claims = {c["id"]: StateClaim(**c) for c in data.get("claims") or []}
        state.evidence = {e["id"]: Evidence(**e) for e in data.get("evidence") or []}
        state.agent_status = {k: dict(v) for k, v in (data.get("agent_status") or {}).items()}
        return state

    # ------------------------------------------------------------------------------------------- the block

    def block(self, label: Callable[[str], str] = str, *, budget: int = BLOCK_BUDGET,
              count: Callable[[str], int] | None = None) -> str:
        """The "DEBATE STATE" prompt block in fewer than ``budget`` tokens (``count``: the real tokenizer).

        Oldest settled claims are compressed first, then dropped; then the oldest open or contested ones."""
        if count is None:
            from conclave.tokens import count_tokens

            count = count_tokens
        measure = count
        lines: dict[str, int] = {}

        def fits() -> bool:
            # cheap first: the sum of per-line counts (cached), then the real count of the whole block
            parts = self._lines(label, words, dropped)
            for line in parts:
                if line not in lines:
                    lines[line] = measure(line) + 1
            return sum(lines[line] for line in parts) < budget and measure("\n".join(parts) + "\n") < budget

        order = sorted(self.claims.values(), key=lambda c: (c.status not in SETTLED, c.last_updated_round,
                                                            int(c.id[1:])))
        words = {c.id: CLAIM_WORDS for c in self.claims.values()}
        dropped: set[str] = set()
        for stage in ("compress", "drop"):
            for claim in order:
                if fits():
                    return self._render(label, words, dropped)
                if stage == "compress":
                    words[claim.id] = COMPRESSED_WORDS
                else:
                    dropped.add(claim.id)
        return self._render(label, words, dropped)

    def _render(self, label: Callable[[str], str], words: Mapping[str, int], dropped: set[str]) -> str:
        return "\n".join(self._lines(label, words, dropped)) + "\n"

    def _lines(self, label: Callable[[str], str], words: Mapping[str, int], dropped: set[str]) -> list[str]:
        shown = [c for c in self.claims.values() if c.id not in dropped]
        lines = ["=== DEBATE STATE ===", f"Round {self.round} · participants: "
                 + ", ".join(label(p) for p in self.participants), "", "CLAIMS:"]
        for c in shown:
            links = []
            if c.support:
                links.append("supports: " + ", ".join(c.support))
            if c.opposes:
                links.append("opposes: " + ", ".join(c.opposes))
            if c.opposition:
                links.append("opposed by: " + ", ".join(c.opposition))
            if c.backing:
                links.append("backed by: " + ", ".join(c.backing))
            suffix = f" ({'; '.join(links)})" if links else ""
            lines.append(f'- {c.id} [{c.label}/{c.status}] {label(c.agent)}: "{_words(c.text, words[c.id])}"'
                         f"{suffix}")
        if not shown:
            lines.append("- (none yet)")
        if dropped:
            lines.append(f"- … {len(dropped)} older settled claim(s) omitted: {', '.join(sorted(dropped, key=_num))}")
        cited = {e for c in shown for e in c.support}
        evidence = [e for e in self.evidence.values() if e.id in cited]
        if evidence:
            lines += ["", "EVIDENCE:"]
            for e in evidence:
                gist = f' - "{e.gist}"' if e.gist else ""
                lines.append(f'- {e.id} [{e.kind}]: "{_words(e.title, 10)}"{gist} (supports: '
                             f"{', '.join(s for s in e.supports if s not in dropped)})")
        lines += ["", 'You can reference claims by ID (e.g., "Building on C1..." or "Challenging C2...")']
        return lines


def _add(items: list[str], item: str) -> None:
    if item not in items:
        items.append(item)


def _num(claim_id: str) -> int:
    return int(claim_id[1:])


def _words(text: str, limit: int) -> str:
    parts = text.split()
    return " ".join(parts) if len(parts) <= limit else " ".join(parts[:limit]) + " …"
