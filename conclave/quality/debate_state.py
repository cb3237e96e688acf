"""The debate state: every claim and piece of evidence of a consultation under a stable id, and its standing.

The engine, not the model, names things: each new claim becomes ``C1, C2, …`` and each new reference
``E1, E2, …``, numbered for the whole consultation in the order rounds, then agents (by name), then items are
absorbed — so replaying the same artifacts (a resume) gives the same ids. An agent that restates a state claim
gives its id (``C3``) as the claim's id; a claim ``supports``/``opposes`` state claims by id; a reply ``retracts``
its author's own claims; the round-3 judge sets statuses by id.

A claim's status: ``open`` when introduced; ``contested`` once another claim opposes it; ``accepted`` once another
agent backs it and nothing opposes it; ``retracted`` when its author withdraws it. The judge's statuses override.

:meth:`DebateState.block` is the "DEBATE STATE" prompt block: the claims a seat needs, grouped by agent, each in as
many words as the seat needs it (in full, shortened, or by id when the seat has its gist elsewhere or it is
settled), kept under a token budget by compressing, then dropping, the oldest settled (accepted or retracted)
claims first.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from conclave.quality.claims import claims_of
from conclave.tokens import count_tokens

STATUSES = ("accepted", "contested", "retracted", "open")
EVIDENCE_KINDS = ("citation", "tool_output", "calculation")
SETTLED = ("accepted", "retracted")
CLAIM_WORDS = 16  # a claim's text in the block: at most this many words (about 22 tokens)
GIST_WORDS = 16  # about 25 tokens
COMPRESSED_WORDS = 8  # an old settled claim, the seat's own claim, or another agent's the seat does not answer
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
    restated_by: list[str] = field(default_factory=list)  # other agents who restated it by id


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
                if agent != target.agent:
                    _add(target.restated_by, agent)
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

    def focus(self, seat: str | None, seen: Collection[str] = ()) -> dict[str, int]:
        """The claims a seat needs, each with how many of its words it is shown (0: its id and status only).

        The judge (``seat`` None): the claims the latest round introduced or touched, and the contested ones, in
        full. An agent: its own claims shortened (it wrote them, and its first-round answer is shown to it); in
        full, the other agents' claims that oppose or back its own and the contested ones; and the claims the
        judge's statements in its prompt rest on (``seen``: their ids), by id when the statement is all the seat
        needs (the claim is settled, or open with nobody backing or opposing it yet), otherwise shortened."""
        claims = list(self.claims.values())
        if seat is None:
            return {c.id: CLAIM_WORDS for c in claims if c.last_updated_round >= self.round or c.status == "contested"}
        linked = {i for c in claims if c.agent == seat for i in (*c.opposition, *c.backing, *c.opposes)}
        out: dict[str, int] = {}
        for c in claims:
            if c.agent == seat:
                out[c.id] = COMPRESSED_WORDS
            elif c.id in linked or c.status == "contested":
                out[c.id] = CLAIM_WORDS
            elif c.id in seen:
                untouched = c.status == "open" and not (c.opposition or c.backing or c.opposes)
                out[c.id] = 0 if c.status in SETTLED or untouched else COMPRESSED_WORDS
        return out

    def block(self, label: Callable[[str], str] = str, *, budget: int = BLOCK_BUDGET,
              count: Callable[[str], int] | None = None, focus: Mapping[str, int] | None = None,
              own: str | None = None, evidence: bool = True) -> str:
        """The "DEBATE STATE" prompt block in fewer than ``budget`` tokens (``count``: the real tokenizer).

        Claims are grouped by agent, one line each (``- C5 [INFER]: text [E1] (opposes C1)``; the status is
        written when it is not ``open``: ``[FACT/contested]``); claims shown by id only share one line per agent
        and status. ``focus``: claim id → words shown (:meth:`focus`; None: every claim in full); the claims left
        out are counted in one line. ``own``: the seat's agent, whose group is marked. ``evidence``: list the
        sources cited by the claims shown (the judge's seat); otherwise only their ids appear on the claim lines.
        Oldest settled claims are compressed first, then dropped; then the oldest open or contested ones."""
        if count is None:
            count = count_tokens
        measure = count
        lines: dict[str, int] = {}
        words = {c.id: CLAIM_WORDS for c in self.claims.values()} if focus is None else \
            {i: n for i, n in focus.items() if i in self.claims}
        shown = [c for c in self.claims.values() if c.id in words]
        hidden = len(self.claims) - len(shown)

        def parts() -> list[str]:
            return self._lines(label, shown, hidden, words, dropped, evidence, own)

        def fits() -> bool:
            # cheap first: the sum of per-line counts (cached), then the real count of the whole block
            found = parts()
            for line in found:
                if line not in lines:
                    lines[line] = measure(line) + 1
            return sum(lines[line] for line in found) < budget and measure("\n".join(found) + "\n") < budget

        order = sorted(shown, key=lambda c: (c.status not in SETTLED, c.last_updated_round, int(c.id[1:])))
        dropped: set[str] = set()
        for stage in ("compress", "drop"):
            for claim in order:
                if fits():
                    return "\n".join(parts()) + "\n"
                if stage == "compress":
                    words[claim.id] = min(words[claim.id], COMPRESSED_WORDS)
                else:
                    dropped.add(claim.id)
        return "\n".join(parts()) + "\n"

    def _lines(self, label: Callable[[str], str], shown: list[StateClaim], hidden: int, words: Mapping[str, int],
               dropped: set[str], evidence: bool, own: str | None = None) -> list[str]:
        kept = [c for c in shown if c.id not in dropped]
        lines = ["=== DEBATE STATE ==="]
        by_id_note = ("; claims by id only are summed up where the judge's statements above name them"
                      if any(words[c.id] == 0 for c in kept) else "")
        lines.append(f"CLAIMS (open unless marked{by_id_note}):")
        groups: dict[str, list[StateClaim]] = {}
        for c in kept:
            groups.setdefault(c.agent, []).append(c)
        for agent in sorted(groups, key=lambda a: (label(a), a)):
            lines.append(f"{label(agent)}{' (you)' if agent == own else ''}:")
            by_id: dict[str, list[str]] = {}
            for c in groups[agent]:
                if words[c.id] == 0:
                    by_id.setdefault(c.status, []).append(f"{c.id} {c.label}")
                    continue
                links = [f"{name} {', '.join(ids)}" for name, ids in (
                    ("opposes", c.opposes), ("opposed by", c.opposition), ("backed by", c.backing)) if ids]
                cites = f" [{', '.join(c.support)}]" if c.support and (evidence or agent != own) else ""
                suffix = f" ({'; '.join(links)})" if links else ""
                lines.append(f"- {c.id} [{_tag(c)}]: {_words(c.text, words[c.id])}{cites}{suffix}")
            lines += [f"- {status}, by id: {', '.join(ids)}" for status, ids in by_id.items()]
        if not self.claims:
            lines.append("- (none yet)")
        if dropped:
            lines.append(f"- … {len(dropped)} older settled claim(s) omitted: {', '.join(sorted(dropped, key=_num))}")
        if hidden:
            lines.append(f"- … {hidden} other claim(s) not shown here")
        cited = {e for c in kept if words[c.id] for e in c.support}
        sources = [e for e in self.evidence.values() if e.id in cited] if evidence else []
        if sources:
            lines.append("EVIDENCE (cited sources unless marked):")
            lines += [f"- {e.id}{'' if e.kind == 'citation' else f' [{e.kind}]'}: {_words(e.title, 10)}"
                      for e in sources]
        return lines


def _tag(claim: StateClaim) -> str:
    """``FACT`` for an open claim, ``FACT/contested`` otherwise."""
    return claim.label if claim.status == "open" else f"{claim.label}/{claim.status}"


def _add(items: list[str], item: str) -> None:
    if item not in items:
        items.append(item)


def _num(claim_id: str) -> int:
    return int(claim_id[1:])


def _words(text: str, limit: int) -> str:
    parts = text.split()
    return " ".join(parts) if len(parts) <= limit else " ".join(parts[:limit]) + " …"
