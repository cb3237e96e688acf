"""Anti-conformity: an answer changed in cross-examination counts for the aggregate only when it is supported.

A reply whose ``final_answer`` differs from its author's previous answer is a *switch*. The switch is supported
when the reply cites a claim or evidence id the debate state marks accepted (evidence counts when it backs an
accepted claim) on grounds other than the switching agent's own say-so — the judge's ruling, or another agent
backing or restating it — or when the reply brought new support of its own that round (a source new to the
debate, or a new claim citing one); then its new answer counts for aggregation. An unsupported switch is still
shown and counted, but its author's earlier answer stands for aggregation (``anti_conformity``: on by default in
``mode=answer``). Support is judged against the debate state at the end of the debate, so a claim accepted later
still backs an earlier switch. Replies without a ``final_answer`` (modes whose answers are prose) have no switches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from conclave.quality.debate_state import DebateState

if TYPE_CHECKING:
    from conclave.engine.session import Session

_STATE_ID = re.compile(r"\b[CE][1-9][0-9]*\b")


@dataclass(frozen=True)
class Switch:
    """One changed answer: who, in which round, from what to what, and what (if anything) supports it."""

    agent: str
    round_number: int
    before: str
    after: str
    supported: bool
    accepted_ids: tuple[str, ...]  # accepted claim or evidence ids the reply cites
    new_ids: tuple[str, ...]  # claim or evidence ids the reply introduced

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(accepted_ids=list(self.accepted_ids), new_ids=list(self.new_ids))
        return data


def answer_of(artifact: Mapping[str, Any] | None) -> str | None:
    """The short answer an artifact states (``final_answer``), or None."""
    if not isinstance(artifact, Mapping):
        return None
    value = artifact.get("final_answer")
    text = str(value).strip() if isinstance(value, str | int | float) and not isinstance(value, bool) else ""
    return text or None


def same_answer(a: str, b: str) -> bool:
    """Two short answers are the same up to case, spacing and a final period."""
    def norm(text: str) -> str:
        return " ".join(text.casefold().split()).rstrip(".").strip()

    return norm(a) == norm(b)


def cited_ids(artifact: Any) -> set[str]:
    """Every claim or evidence id (``C3``, ``E1``) an artifact names anywhere: restated claim ids, supports,
    opposes, evidence lists and free text."""
    found: set[str] = set()
    if isinstance(artifact, str):
        found.update(_STATE_ID.findall(artifact))
    elif isinstance(artifact, Mapping):
        for value in artifact.values():
            found |= cited_ids(value)
    elif isinstance(artifact, list):
        for value in artifact:
            found |= cited_ids(value)
    return found


def is_accepted(state: DebateState, state_id: str, agent: str | None = None) -> bool:
    """A claim the state marks accepted, or evidence backing one. With ``agent``: accepted on grounds other than
    that agent's own say-so — the judge ruled it accepted (with a reason), or an agent other than ``agent`` backs
    or restates it (a switch cannot be supported by a claim it alone made accepted)."""
    claim = state.claims.get(state_id)
    if claim is not None:
        if claim.status != "accepted":
            return False
        if agent is None or claim.status_reason:
            return True
        # who made it accepted: the agents backing or restating it (never its author)
        backers = {state.claims[b].agent for b in claim.backing if b in state.claims} | set(claim.restated_by)
        return bool(backers - {agent, claim.agent})
    evidence = state.evidence.get(state_id)
    return evidence is not None and any(is_accepted(state, c, agent) for c in evidence.supports if c in state.claims)


def introduced_ids(state: DebateState, agent: str, round_number: int) -> list[str]:
    """What ``agent`` brought into the debate in round ``round_number`` to back an answer: sources new to the
    debate, and its new claims that cite a source (a bare new assertion backs nothing)."""
    return [*(c.id for c in state.claims.values()
              if c.agent == agent and c.introduced_round == round_number and c.support),
            *(e.id for e in state.evidence.values() if e.agent == agent and e.added_round == round_number)]


def effective_answers(first: Mapping[str, str | None], replies: Sequence[tuple[int, Mapping[str, Mapping[str, Any]]]],
                      state: DebateState, *, enabled: bool = True) -> tuple[dict[str, str | None], list[Switch]]:
    """Each agent's answer for aggregation after the debate, and every switch.

    ``first``: agent -> its round-1 answer; ``replies``: (round number, agent -> reply artifact) of the rounds
    after it. With ``enabled`` an unsupported switch leaves the agent's answer for aggregation where it was (a
    later reply that gives the same answer with support moves it); without, every agent's latest answer counts."""
    effective = dict(first)
    shown = dict(first)
    switches: list[Switch] = []
    for number, by_agent in sorted(replies, key=lambda item: item[0]):
        for agent in sorted(by_agent):
            after = answer_of(by_agent[agent])
            if after is None:
                continue
            before = shown.get(agent)
            current = effective.get(agent)
            shown[agent] = after
            if before is None or current is None:  # nothing to switch from: the answer counts as given
                effective[agent] = after
                continue
            accepted = tuple(sorted(i for i in cited_ids(by_agent[agent]) if is_accepted(state, i, agent)))
            new = tuple(introduced_ids(state, agent, number))
            supported = bool(accepted or new)
            if not same_answer(after, before):
                switches.append(Switch(agent, number, before, after, supported, accepted, new))
            if not enabled or supported or same_answer(after, current):
                effective[agent] = after
    return effective, switches


def anti_conformity_on(session: Session) -> bool:
    setting = session.settings.anti_conformity
    return bool(session.strategy.anti_conformity_by_default) if setting is None else setting


def conformity_record(session: Session) -> dict[str, Any] | None:
    """The result's ``anti_conformity`` record: whether it is on, every switch, the answers each agent gave last
    and the answers that count for aggregation. None when no agent stated a ``final_answer`` after round 1."""
    first_round = session.plan.types[0].name
    first = {name: answer_of(a) for name, a in session.record.by_agent(first_round).items()}
    played = session.context.played
    opening = min(played) if played else 1
    replies = [(number, dict(r.agents)) for number, r in sorted(played.items())
               if number != opening and r.agents and any(answer_of(a) for a in r.agents.values())]
    if not replies:
        return None
    enabled = anti_conformity_on(session)
    effective, switches = effective_answers(first, replies, session.quality.state, enabled=enabled)
    last = dict(first)
    for _, by_agent in replies:
        last.update({a: answer_of(x) for a, x in by_agent.items() if answer_of(x) is not None})
    return {
        "enabled": enabled,
        "switches": [s.as_dict() for s in switches],
        "unsupported_switches": sum(1 for s in switches if not s.supported),
        "last_answers": last,
        "effective_answers": effective,
    }
