"""Protocols read from one ``mode=answer`` consultation, so all of them share the same round-1 answers.

=========  ====================================================  =======================================
protocol   answer                                                what it costs (tokens, dollars, wall)
=========  ====================================================  =======================================
single     one agent's round-1 ``final_answer``                  that agent's round-1 call
vote       the most common round-1 answer (self-consistency)     round 1
judge      the round-2 synthesis' ``final_answer`` (an item the  rounds 1 and 2 (a ``rounds=2`` run)
           vote gate decided unanimously: the one answer)
debate     the answer the user gets: the final aggregate of the  every round the consultation ran
           answers that count after cross-examination when
           one decided, else the verdict's ``final_answer``
quality    the verdict of the same debate with the quality       round 1 (reused when its calls are the
           layer on (``eval.quality``, :mod:`.quality_arm`),     same, else its own) + the arm's rounds
           forked from the item's own round 1
vote_      self-consistency at the debate's budget               round 1 + extra independent samples of
matched    (``eval.matched_vote``): the most common answer over  the panel until they make as many model
           round 1 and further independent round-1 samples       calls as the debate plans
vote_      the ``confidence`` aggregator over round 1: answers   round 1
weighted   weighed by within-question relative confidence
vote_      the ``learned`` aggregator over round 1: per-seat     round 1
learned    weights fitted from the graded eval items already
           in the index (of the item's kind); none: equal
judge_     the judge's pick among the round-1 answers (the       rounds 1 and 2; an item the vote gate
pick       synthesis' ``final_answer`` when it is one of them)   decided unanimously: the one answer, round 1
sc_best    self-consistency of the best agent (``eval.sc_best``;   the best agent's round-1 call + its extra
           highest learned weight, else the single agent): the     samples, until their tokens reach the
           most common answer over its round-1 samples             debate's billed tokens
=========  ====================================================  =======================================

``debate`` is whatever the configured mode plays: in ``mode=answer`` with the vote gate on by default, an item the
panel agrees on is decided by the vote after round 1 and costs round 1 only.

A vote counts canonical answers (:func:`conclave.eval.scoring.canonical`); a tie goes to the tied answer of the
agent listed first in the panel. A protocol with no answer (the consultation stopped before it) is wrong.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conclave import events as ev
from conclave.engine.aggregation import Aggregate, AggregationContext, Ballot
from conclave.engine.strategy import consensus_confidence
from conclave.eval.graded import GradedHistory
from conclave.eval.items import Item
from conclave.eval.quality_arm import figures
from conclave.eval.scoring import canonical, is_correct
from conclave.plugin_manager import get_plugins

PROTOCOLS = ("single", "vote", "judge", "debate", "quality", "vote_matched", "vote_weighted", "vote_learned",
             "judge_pick", "sc_best")
#: the protocols every run scores; ``quality`` only runs when ``eval.quality`` defines its arm, ``vote_matched``
#: with ``eval.matched_vote=true``
BASE_PROTOCOLS = PROTOCOLS[:4]
#: the rounds each protocol's cost and wall time cover (single: one agent's round-1 call only)
PROTOCOL_ROUNDS = {"single": (1,), "vote": (1,), "judge": (1, 2), "debate": (1, 2, 3, 4)}


class Capture:
    """An event subscriber keeping what scoring needs: per-round and per-agent totals of one consultation."""

    def __init__(self) -> None:
        self.rounds: dict[int, dict[str, Any]] = {}
        self.agents: dict[tuple[int, str], dict[str, Any]] = {}
        self.shuffle_seed: int | None = None  # the judge labels' seed: a fork keeps the same labels

    def __call__(self, event: ev.Event) -> None:
        if event.type == ev.CONSULTATION_STARTED:
            self.shuffle_seed = event.data.get("shuffle_seed")
        elif event.type in (ev.ROUND_COMPLETED, ev.ROUND_INTERRUPTED):  # an interrupted round was billed too
            self.rounds[int(event.data["round_number"])] = dict(event.data)
        elif event.type == ev.AGENT_COMPLETED:
            key = (int(event.data["round_number"]), str(event.data["agent"]))
            self.agents[key] = dict(event.data)


@dataclass
class Outcome:
    """One protocol's result on one item."""

    answer: str | None
    correct: bool
    confidence: float | None
    cost: float | None
    tokens: int
    wall_s: float


@dataclass
class ItemResult:
    """Everything measured on one item: the protocols, the answers of every round, flips, agreement."""

    item: Item
    consultation_id: str
    status: str
    protocols: dict[str, Outcome]
    round_1: dict[str, str | None] = field(default_factory=dict)  # agent -> final_answer
    round_3: dict[str, str | None] = field(default_factory=dict)
    #: the round-3 answers that count for aggregation (anti-conformity: an unsupported switch keeps the earlier
    #: answer), and how many switches were unsupported; empty/0 when the consultation has no such record
    round_3_effective: dict[str, str | None] = field(default_factory=dict)
    unsupported_switches: int = 0
    agreement: float = 0.0  # share of the answering round-1 agents that gave the most common answer
    agreement_confidence: float | None = None  # the same share, as a confidence in the vote's answer
    oracle: bool = False  # some round-1 agent was right
    right_to_wrong: int = 0  # agents right in round 1 and wrong in round 3
    wrong_to_right: int = 0
    early_terminated: bool = False
    rounds_completed: int = 0
    #: the quality protocol's own consultation, whether it reused round 1, and its right→wrong flips
    quality_consultation_id: str | None = None
    quality_reused_round_1: bool | None = None
    quality_right_to_wrong: int | None = None
    #: protocol -> the quality layer's figures over the rounds that protocol uses (:func:`.quality_arm.figures`)
    quality_layer: dict[str, Any] = field(default_factory=dict)
    matched_samples: int | None = None  # round-1 answers the matched-budget vote counted
    #: protocol -> completed, failed or skipped on this item
    statuses: dict[str, str] = field(default_factory=dict)
    #: what this item spent, by the protocol that paid: {"debate": {"cost", "tokens"}, "quality": …}
    spent: dict[str, dict[str, Any]] = field(default_factory=dict)
    round_1_from: str | None = None  # the sweep run whose round-1 answers this item's consultation restored
    #: the learned vote's weights per agent and the graded items per agent they were fitted to
    learned: dict[str, Any] = field(default_factory=dict)

    @property
    def oracle_gap(self) -> bool:
        """The right answer was on the table in round 1, and the debate's final answer is wrong."""
        return self.oracle and not self.protocols["debate"].correct

    def as_row(self) -> dict[str, Any]:
        """The ``eval_items`` row (without the run id)."""
        row: dict[str, Any] = {
            "item_id": self.item.id, "consultation_id": self.consultation_id, "status": self.status,
            "kind": self.item.kind, "question": self.item.question, "expected": self.item.answer,
            "agreement": round(self.agreement, 4), "oracle": int(self.oracle), "oracle_gap": int(self.oracle_gap),
            "right_to_wrong": self.right_to_wrong, "wrong_to_right": self.wrong_to_right,
            "early_terminated": int(self.early_terminated), "rounds_completed": self.rounds_completed,
            "agreement_confidence": self.agreement_confidence,
        }
        for name, outcome in self.protocols.items():
            row[f"{name}_answer"] = outcome.answer
            row[f"{name}_correct"] = int(outcome.correct)
            row[f"{name}_confidence"] = outcome.confidence
            row[f"{name}_cost"] = outcome.cost
            row[f"{name}_tokens"] = outcome.tokens
            row[f"{name}_wall_s"] = round(outcome.wall_s, 4)
            row[f"{name}_status"] = self.statuses.get(name, "completed")
        row["spent"] = self.spent
        row["round_1_from"] = self.round_1_from
        if self.learned:
            row["vote_learned_weights"] = self.learned
        row["answers"] = {"round_1": self.round_1, "round_3": self.round_3,
                          "round_3_effective": self.round_3_effective,
                          "unsupported_switches": self.unsupported_switches}
        row["quality_layer"] = self.quality_layer
        if "vote_matched" in self.protocols:
            row["vote_matched_samples"] = self.matched_samples
        if "quality" in self.protocols:
            row.update(quality_consultation_id=self.quality_consultation_id,
                       quality_reused_round_1=int(bool(self.quality_reused_round_1)),
                       quality_right_to_wrong=self.quality_right_to_wrong)
        return row


def majority(answers: Sequence[tuple[str, str | None]], kind: str, choices: list[str]) -> tuple[str | None, float]:
    """The vote over ``(agent, answer)`` in panel order: (winning raw answer, share of answering agents behind it)."""
    readable = [(agent, raw, canonical(raw, kind, choices)) for agent, raw in answers]
    counted = [(agent, raw, form) for agent, raw, form in readable if form is not None]
    if not counted:
        return None, 0.0
    tally = Counter(form for _, _, form in counted)
    top = max(tally.values())
    for _, raw, form in counted:  # panel order breaks ties
        if tally[form] == top:
            return raw, top / len([a for a in answers if a[1] is not None])
    return None, 0.0  # unreachable


def score(item: Item, result: Mapping[str, Any], capture: Capture, agent_order: Sequence[str],
          single_agent: str, home: Path | None = None, graded: GradedHistory | None = None) -> ItemResult:
    """Score every protocol of one consultation's ``result`` (its result JSON) on ``item``; ``home``: whose
    index the learned weights read (None: no history, equal weights), or ``graded``, that history as the
    evaluation keeps it."""
    arts = result.get("artifacts") or {}
    round_1 = {a: _answer(arts.get("round_1", {}).get(a)) for a in agent_order if a in arts.get("round_1", {})}
    round_3 = {a: _answer(r) for a, r in (arts.get("round_3_replies") or {}).items()}
    conformity = result.get("anti_conformity") or {}
    effective = conformity.get("effective_answers") or {}
    round_3_effective = {a: effective.get(a, answer) for a, answer in round_3.items()}
    synthesis = arts.get("round_2")
    verdict = result.get("verdict")
    completed = int(result.get("completed_rounds") or 0)

    def cost_of(rounds: Sequence[int]) -> tuple[float | None, int, float]:
        cost: float | None = 0.0
        tokens, wall = 0, 0.0
        for n in rounds:
            data = capture.rounds.get(n)
            if data is None:
                continue
            cost = None if cost is None or data.get("cost") is None else cost + float(data["cost"])
            tokens += int(data.get("input_tokens") or 0) + int(data.get("output_tokens") or 0)
            wall += float(data.get("duration_s") or 0.0)
        return cost, tokens, wall

    def round_ok(number: int) -> bool:
        data = capture.rounds.get(number)
        return data is not None and data.get("ok", True) is not False and "reason" not in data

    protocols: dict[str, Outcome] = {}
    first = capture.agents.get((1, single_agent), {})
    single_answer = round_1.get(single_agent)
    r1_single = (arts.get("round_1") or {}).get(single_agent) or {}
    protocols["single"] = Outcome(
        single_answer, is_correct(single_answer, item), _confidence(r1_single),
        None if first.get("cost") is None else float(first["cost"]),
        int(first.get("input_tokens") or 0) + int(first.get("output_tokens") or 0),
        float(first.get("duration_s") or 0.0),
    )
    statuses = {"single": "completed" if single_answer is not None else "failed"}
    for agent in agent_order:  # every agent alone: the single-agent baselines
        own = capture.agents.get((1, agent), {})
        answer = round_1.get(agent)
        protocols[f"single_{agent}"] = Outcome(
            answer, is_correct(answer, item), _confidence((arts.get("round_1") or {}).get(agent)),
            None if own.get("cost") is None else float(own["cost"]),
            int(own.get("input_tokens") or 0) + int(own.get("output_tokens") or 0), float(own.get("duration_s") or 0.0))
        statuses[f"single_{agent}"] = "completed" if answer is not None else "failed"
    vote_answer, agreement = majority([(a, round_1[a]) for a in round_1], item.kind, item.choices)
    protocols["vote"] = Outcome(vote_answer, is_correct(vote_answer, item), agreement if vote_answer else None,
                                *cost_of((1,)))
    judge_answer = _answer(synthesis)
    if synthesis is None and (result.get("vote_gate") or {}).get("decided"):
        # the vote gate decided after round 1, so no judge ran: a unanimous panel's answer is the only one the
        # judge could have read from round 1; with dissent there is no judge answer
        judge_answer, _ = _judge_pick(_ballots(result, round_1, agent_order), item, None)
    # by round type, not number: an inserted round (a critical objection round) shifts the numbers
    through_synthesis = next((n for n, d in sorted(capture.rounds.items()) if d.get("round_type") == "synthesis"), 2)
    protocols["judge"] = Outcome(judge_answer, is_correct(judge_answer, item), _consensus(synthesis),
                                 *cost_of([n for n in sorted(capture.rounds) if n <= through_synthesis] or (1, 2)))
    # the answer the user gets: the final aggregate after cross-examination when one decided, else the verdict's
    final = result.get("final_aggregate") or {}
    decided = final.get("answer") if final.get("answer") is not None else _answer(verdict)
    debate_answer = decided if result.get("status") in ("complete", "completed_degraded") else None
    early = bool((result.get("early_termination") or {}).get("accepted"))
    statuses.update(vote="completed" if round_ok(1) and round_1 else "failed",
                    judge="completed" if judge_answer is not None else "failed",
                    debate="completed" if debate_answer is not None else "failed")
    # the verdict's stated confidence only: an early-stopped debate's verdict is derived from the synthesis
    protocols["debate"] = Outcome(debate_answer, is_correct(debate_answer, item),
                                  None if early else _confidence(verdict),
                                  # every round played, repeated cross-examination and objection rounds too
                                  *cost_of(sorted(capture.rounds) or (1, 2, 3, 4)))

    round_1_cost = cost_of((1,))
    ballots = _ballots(result, round_1, agent_order)
    learned: dict[str, Any] = {}
    for name, aggregator in (("vote_weighted", "confidence"), ("vote_learned", "learned")):
        picked, weight, found = aggregate(aggregator, ballots, item,
                                          AggregationContext(home=home, kind=item.kind, graded=graded))
        protocols[name] = Outcome(picked, is_correct(picked, item), weight, *round_1_cost)
        if aggregator == "learned" and found is not None:  # what the learned vote weighed, and on what history
            learned = {"weights": found.weights, "basis": found.basis}
    picked, weight = _judge_pick(ballots, item, judge_answer)
    judge_cost = cost_of([n for n in sorted(capture.rounds) if n <= through_synthesis]) if synthesis is not None \
        else round_1_cost
    protocols["judge_pick"] = Outcome(picked, is_correct(picked, item), weight, *judge_cost)

    right_1 = {a: is_correct(ans, item) for a, ans in round_1.items()}
    flips_rw = sum(1 for a, ans in round_3.items() if right_1.get(a) and not is_correct(ans, item))
    flips_wr = sum(1 for a, ans in round_3.items() if a in right_1 and not right_1[a] and is_correct(ans, item))

    layer = {name: found for name, found in (
        ("single", figures(result, (1,), (single_agent,))), ("vote", figures(result, (1,))),
        ("judge", figures(result, (1, 2))), ("debate", figures(result))) if found is not None}
    return ItemResult(
        item=item, consultation_id=str(result.get("consultation_id")), status=str(result.get("status")),
        protocols=protocols, round_1=round_1, round_3=round_3, agreement=agreement,
        round_3_effective=round_3_effective, unsupported_switches=int(conformity.get("unsupported_switches") or 0),
        agreement_confidence=agreement if vote_answer else None, oracle=any(right_1.values()),
        right_to_wrong=flips_rw, wrong_to_right=flips_wr, early_terminated=early, rounds_completed=completed,
        quality_layer=layer, statuses=statuses, spent={"debate": spent_in(capture)}, learned=learned,
    )


def add_quality(scored: ItemResult, arm: Mapping[str, Any] | None, arm_capture: Capture | None,
                base_capture: Capture, reused: bool) -> None:
    """Score the quality protocol from its consultation ``arm`` (None: it could not run, the protocol is wrong).
    Its cost, tokens and wall time are the arm's rounds plus, when reused, the base's round 1 (paid once, by the
    base consultation)."""
    item = scored.item
    if arm is None or arm_capture is None:
        scored.protocols["quality"] = Outcome(None, False, None, None, 0, 0.0)
        scored.statuses["quality"] = "skipped"  # the base consultation has no round 1 to fork from
        scored.quality_reused_round_1 = reused
        return
    cost: float | None = 0.0
    tokens, wall = 0, 0.0
    # reused, the arm's round 1 asked no one (it costs nothing there): the base paid for it
    sources = [(base_capture, (1,)), (arm_capture, tuple(n for n in arm_capture.rounds if n != 1))] if reused else \
        [(arm_capture, tuple(arm_capture.rounds))]
    for capture, numbers in sources:
        for n in numbers:
            data = capture.rounds.get(n) or {}
            cost = None if cost is None or data.get("cost") is None else cost + float(data["cost"])
            tokens += int(data.get("input_tokens") or 0) + int(data.get("output_tokens") or 0)
            wall += float(data.get("duration_s") or 0.0)
    verdict = arm.get("verdict")
    answer = _answer(verdict) if arm.get("status") in ("complete", "completed_degraded") else None
    scored.protocols["quality"] = Outcome(answer, is_correct(answer, item), _confidence(verdict), cost, tokens, wall)
    scored.statuses["quality"] = "completed" if answer is not None else "failed"
    scored.spent["quality"] = spent_in(arm_capture, skip=(1,) if reused else ())
    replies = (arm.get("artifacts") or {}).get("round_3_replies") or {}
    right_1 = {a: is_correct(ans, item) for a, ans in scored.round_1.items()}
    scored.quality_right_to_wrong = sum(1 for a, r in replies.items()
                                        if right_1.get(a) and not is_correct(_answer(r), item))
    scored.quality_consultation_id = str(arm.get("consultation_id"))
    scored.quality_reused_round_1 = reused
    found = figures(arm)
    if found is not None:
        scored.quality_layer["quality"] = found


def add_matched_vote(scored: ItemResult, samples: Sequence[Mapping[str, Any]], captures: Sequence[Capture],
                     base_capture: Capture, *, skipped: bool = False) -> None:
    """Score self-consistency at the debate's budget: the vote over round 1 and the extra independent round-1
    samples (``samples``: their results); cost, tokens and wall time of every round-1 call, the base's included.
    ``skipped``: sampling was stopped (an endpoint repeating itself), so the protocol is not scored here."""
    item = scored.item
    answers: list[tuple[str, str | None]] = list(scored.round_1.items())
    for result in samples:
        round_1 = (result.get("artifacts") or {}).get("round_1") or {}
        answers += [(agent, _answer(artifact)) for agent, artifact in round_1.items()]
    answer, share = majority(answers, item.kind, item.choices)
    cost: float | None = 0.0
    tokens, wall = 0, 0.0
    for capture in (base_capture, *captures):
        data = capture.rounds.get(1) or {}
        cost = None if cost is None or data.get("cost") is None else cost + float(data["cost"])
        tokens += int(data.get("input_tokens") or 0) + int(data.get("output_tokens") or 0)
        wall += float(data.get("duration_s") or 0.0)
    scored.protocols["vote_matched"] = Outcome(answer, is_correct(answer, item), share if answer else None, cost,
                                               tokens, wall)
    scored.matched_samples = sum(1 for _, a in answers if a is not None)
    scored.statuses["vote_matched"] = "skipped" if skipped else "completed" if answer is not None else "failed"
    extra = [spent_in(c) for c in captures]
    scored.spent["vote_matched"] = {
        "cost": None if any(e["cost"] is None for e in extra) else round(sum(e["cost"] for e in extra), 8),
        "tokens": sum(e["tokens"] for e in extra)}


def spent_in(capture: Capture, skip: Sequence[int] = ()) -> dict[str, Any]:
    """Cost (None when unknown) and billed tokens of every round ``capture`` saw (failed and interrupted rounds
    too: their calls were billed), but ``skip``."""
    cost: float | None = 0.0
    tokens = 0
    for number, data in capture.rounds.items():
        if number in skip:
            continue
        cost = None if cost is None or data.get("cost") is None else cost + float(data["cost"])
        tokens += int(data.get("input_tokens") or 0) + int(data.get("output_tokens") or 0)
    return {"cost": None if cost is None else round(cost, 8), "tokens": tokens}


def same_round_1(sample: Mapping[str, Any], base: Mapping[str, Any]) -> bool:
    """Whether a re-sample's round-1 artifacts are exactly the base consultation's (an endpoint repeating
    itself)."""
    def artifacts(result: Mapping[str, Any]) -> Any:
        # what the agents said, without when they said it
        return {agent: {k: v for k, v in dict(artifact).items() if not k.endswith("_at")}
                for agent, artifact in ((result.get("artifacts") or {}).get("round_1") or {}).items()}
    return bool(artifacts(base)) and artifacts(sample) == artifacts(base)


def add_sc_best(scored: ItemResult, best: str, samples: Sequence[Mapping[str, Any]], captures: Sequence[Capture],
                base_capture: Capture) -> None:
    """Score self-consistency of agent ``best``: the vote over its base round-1 answer and every answer of the
    ``samples`` (consultations of its copies); cost, tokens and wall time of exactly those calls."""
    item = scored.item
    answers: list[tuple[str, str | None]] = [(best, scored.round_1.get(best))]
    for result in samples:
        round_1 = (result.get("artifacts") or {}).get("round_1") or {}
        answers += [(agent, _answer(artifact)) for agent, artifact in round_1.items()]
    answer, share = majority(answers, item.kind, item.choices)
    first = base_capture.agents.get((1, best), {})
    cost: float | None = None if first.get("cost") is None else float(first["cost"])
    tokens = int(first.get("input_tokens") or 0) + int(first.get("output_tokens") or 0)
    wall = float(first.get("duration_s") or 0.0)
    for capture in captures:
        data = capture.rounds.get(1) or {}
        cost = None if cost is None or data.get("cost") is None else cost + float(data["cost"])
        tokens += int(data.get("input_tokens") or 0) + int(data.get("output_tokens") or 0)
        wall += float(data.get("duration_s") or 0.0)
    scored.protocols["sc_best"] = Outcome(answer, is_correct(answer, item), share if answer else None, cost, tokens,
                                          wall)
    scored.statuses["sc_best"] = "completed" if answer is not None else "failed"
    extra = [spent_in(c) for c in captures]
    scored.spent["sc_best"] = {
        "cost": None if any(e["cost"] is None for e in extra) else round(sum(e["cost"] for e in extra), 8),
        "tokens": sum(e["tokens"] for e in extra)}


def _ballots(result: Mapping[str, Any], round_1: Mapping[str, str | None], order: Sequence[str]) -> list[Ballot]:
    """The round-1 answers as ballots (with each agent's seat and stated confidence), in panel order."""
    seats = {str(a.get("name")): a for a in result.get("agents") or [] if isinstance(a, Mapping)}
    arts = (result.get("artifacts") or {}).get("round_1") or {}
    out = []
    for agent in order:
        answer, seat = round_1.get(agent), seats.get(agent, {})
        if answer is None:
            continue
        out.append(Ballot(agent, str(seat.get("persona", "")), str(seat.get("provider", "")),
                          str(seat.get("model", "")), answer, _confidence(arts.get(agent))))
    return out


def groups_of(ballots: Sequence[Ballot], item: Item) -> list[list[int]]:
    """Ballots with the same canonical answer for ``item``'s kind (unreadable answers stand alone)."""
    index: dict[str, list[int]] = {}
    for i, ballot in enumerate(ballots):
        form = canonical(ballot.answer, item.kind, item.choices)
        index.setdefault(form if form is not None else f"\x00{i}", []).append(i)
    return list(index.values())


def aggregate(name: str, ballots: Sequence[Ballot], item: Item, context: AggregationContext
              ) -> tuple[str | None, float | None, Aggregate | None]:
    """(answer, weight behind it, the whole decision) of the registered aggregator ``name`` over ``ballots``."""
    if not ballots:
        return None, None, None
    found = get_plugins().aggregators.get(name).aggregate(ballots, groups_of(ballots, item), context)
    if found.group is None:
        return None, None, found
    groups = groups_of(ballots, item)
    best = max(groups[found.group], key=lambda i: (found.weights.get(ballots[i].agent, 0.0), -i))
    return ballots[best].answer, found.agreement, found


def _judge_pick(ballots: Sequence[Ballot], item: Item, judge_answer: str | None) -> tuple[str | None, float | None]:
    """The judge's pick among the round-1 answers (the synthesis' answer when some agent gave it; the share of the
    panel that did). Without a synthesis (the vote gate decided) a unanimous
    panel's answer is the only one the judge could pick; otherwise there is no pick."""
    if judge_answer is None:
        forms = {canonical(b.answer, item.kind, item.choices) for b in ballots}
        return (ballots[0].answer, 1.0) if ballots and len(forms) == 1 and None not in forms else (None, None)
    wanted = canonical(judge_answer, item.kind, item.choices)
    backing = [b for b in ballots if wanted is not None and canonical(b.answer, item.kind, item.choices) == wanted]
    return (backing[0].answer, round(len(backing) / len(ballots), 4)) if backing else (None, None)


def _answer(artifact: Mapping[str, Any] | None) -> str | None:
    if not isinstance(artifact, Mapping):
        return None
    value = artifact.get("final_answer")
    return str(value).strip() if isinstance(value, str | int | float) and str(value).strip() else None


def _confidence(artifact: Mapping[str, Any] | None) -> float | None:
    if not isinstance(artifact, Mapping) or not isinstance(artifact.get("confidence"), int | float):
        return None
    return float(artifact["confidence"])


def _consensus(synthesis: Mapping[str, Any] | None) -> float | None:
    if not isinstance(synthesis, Mapping):
        return None

    return round(consensus_confidence(synthesis), 4)
