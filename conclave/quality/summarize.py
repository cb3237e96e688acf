"""Progressive summarization: what one prompt of a long debate shows of the rounds before it.

Every round played is kept here (its agents' artifacts and the judge's). A round type's inputs always show the
latest play of their source; the plays a repeat superseded (an earlier cross-examination round) reach later
prompts through the ``$earlier_rounds`` value (appended to the user message when a template has no such
placeholder). In a debate of four rounds nothing is superseded and ``$earlier_rounds`` is empty. A superseded
round shown in full is filtered like any artifact shown again: the judge's artifact with ``filtering.round4``, each
agent's reply with ``filtering.replies`` (its most severe challenges; the judge's record of the round follows it),
except the calling agent's own reply, which it sees whole.

From round ``summarization.from_round`` (5) on, with ``summarization.enabled``, a call in round N shows:

- round N (the round being played) and round N-1 **in full** (the inputs and superseded plays from them);
- rounds N-2 and N-3 as **structured summaries** of at most ``summarization.summary_tokens`` (300) tokens each,
  made by code from the artifacts and the debate state (no extra model call: every field a summary needs —
  stances, confidences, votes, new claim and evidence ids, status decisions — is already structured data);
- older rounds **merged into the DEBATE STATE** block (added when the round's template does not show it): their
  claims and evidence keep their ``C…``/``E…`` ids there; an agent's own round-1 answer becomes one line;
- the whole user message under ``summarization.budget_tokens`` (8,000) tokens counted with the real tokenizer:
  when it is over, the full artifacts' strings are cut to fewer words (60, 30, 15, 8) until it fits; ids are
  never cut.

Full answers stay in the journal (``conclave logs show ID``, ``conclave show ID --round N``). Each real call's
user message is counted with and without summarization (:meth:`ContextWindow.summary`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import fmean
from typing import TYPE_CHECKING, Any

from conclave.engine.prompt_template import EARLIER_ROUNDS as PLACEHOLDER
from conclave.engine.prompt_template import user_message
from conclave.engine.record import prompt_json
from conclave.quality.exit import standing_of
from conclave.tokens import count_tokens

if TYPE_CHECKING:
    from conclave.config.settings import SummarizationSettings
    from conclave.engine.filtering import ArtifactFiltering
    from conclave.engine.labels import JudgeLabels
    from conclave.engine.record import Record
    from conclave.engine.rounds import RoundType, Step
    from conclave.engine.strategy import Strategy
    from conclave.quality.debate_state import DebateState

WORD_LIMITS = (60, 30, 15, 8)
ITEM_WORDS = (20, 12, 6)  # words per stance or reason in a summary, tried in turn until it fits


@dataclass
class PlayedRound:
    number: int
    title: str
    type_names: tuple[str, ...]
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    judge: dict[str, Any] | None = None
    schema: str | None = None  # the artifact schema of the agents' answers


@dataclass(frozen=True)
class WindowInputs:
    """What the context window reads of its consultation; the engine's session supplies each
    (:func:`conclave.engine.session_layers.with_layers`). The callables are read when a prompt is built: the labels
    and views are then the calling seat's, and the plan may have been replaced (``show-prompt``)."""

    settings: SummarizationSettings
    strategy: Strategy
    record: Record
    filtering: ArtifactFiltering
    state: DebateState  # the claims ledger
    consultation_id: str
    steps: Callable[[], list[Step]]  # the plan's steps
    present: Callable[[], list[str]]  # agents taking part, in the judge's order
    labels: Callable[[], JudgeLabels]
    view: Callable[..., dict[str, Any]]  # (artifact, seat) -> the artifact as later rounds see it
    debate_state: Callable[[], str]  # the DEBATE STATE block


class ContextWindow:
    """The history of one consultation's rounds and the context of each call built from it."""

    def __init__(self, inputs: WindowInputs) -> None:
        self.inputs = inputs
        self.played: dict[int, PlayedRound] = {}
        #: (round number, user message sent, the same message without summarization)
        self._sent: list[tuple[int, str, str]] = []
        self._counts: dict[str, int] = {}  # the messages of ``_sent`` counted so far
        self.over_budget: list[int] = []  # rounds with a call that stayed over the budget after every cut
        self._summaries: dict[tuple[Any, ...], str] = {}  # (round, debate-state round, filtered, labels) -> text

    # ------------------------------------------------------------------------------------------- recording

    def capture(self, steps: list[Step], restored: set[int]) -> None:
        """After every round (restored ones too): keep what it produced."""
        number = steps[0].number
        played = PlayedRound(number, steps[-1].type.title, tuple(s.type.name for s in steps))
        for step in steps:
            output = self.inputs.record.output(step.type.name)
            if output is None or output.number != number:
                continue
            played.agents.update(output.by_agent)
            if step.type.seat == "agents":
                played.schema = step.type.schema
            if output.judge is not None:
                played.judge = output.judge
        self.played[number] = played

    def applies(self, number: int) -> bool:
        settings = self.inputs.settings
        return settings.enabled and number >= settings.from_round

    # ------------------------------------------------------------------------------------------- one call

    def prepare(self, round_type: RoundType, number: int, values: Mapping[str, str], *, agent: str | None = None,
                measure: bool = False) -> dict[str, str]:
        """The template values of one call of ``round_type`` in round ``number`` (``agent``'s, or the judge's):
        ``$earlier_rounds`` added and, when summarization applies, older inputs summarized or merged and the
        message fitted to the budget. ``measure``: a real call, counted in :meth:`summary` (the cost estimate's
        calls are not, and load no tokenizer)."""
        inputs = self.inputs
        template = inputs.strategy.template(round_type.template).text
        sources = self._sources(round_type, number)
        superseded = self._superseded(number, set(sources.values()))
        if not self.applies(number):
            full = {**values, PLACEHOLDER: self._rounds_block(superseded, number, summarize=False, agent=agent)}
            if measure:
                message = user_message(inputs.strategy, round_type, full)
                self._note_sent(number, message, message)
            return full
        w8 = self._summarized(round_type, number, values, sources, superseded, template, agent)
        if measure or self.played:  # before round 1 (the cost estimate) there is nothing to fit
            message = self._fit(round_type, number, w8)
            if measure:
                with inputs.filtering.unrecorded():  # never sent: only measured beside the summarized message
                    full = {**values, PLACEHOLDER: self._rounds_block(superseded, number, summarize=False,
                                                                     agent=agent)}
                self._note_sent(number, message, user_message(inputs.strategy, round_type, full))
        return w8

    def _sources(self, round_type: RoundType, number: int) -> dict[str, int]:
        """Placeholder -> the round its input was produced in (inputs not produced yet are left out)."""
        out = {}
        for placeholder, source in round_type.inputs.items():
            output = self.inputs.record.output(source.source)
            if output is not None and output.number <= number:
                out[placeholder] = output.number
        return out

    def _superseded(self, number: int, shown: set[int]) -> list[int]:
        """Earlier rounds no input shows because a later round of the same kind replaced them."""
        earlier = [k for k in sorted(self.played) if k < number and k not in shown]
        return [k for k in earlier if any(self.played[j].type_names == self.played[k].type_names
                                          for j in self.played if k < j < number)
                or self._replayed_now(k, number)]

    def _replayed_now(self, k: int, number: int) -> bool:
        """Round ``k`` is of the kind being played now in round ``number`` (a repeat in progress)."""
        group = [s.type.name for s in self.inputs.steps() if s.number == number]
        return tuple(group) == self.played[k].type_names

    def _summarized(self, round_type: RoundType, number: int, values: Mapping[str, str], sources: Mapping[str, int],
                    superseded: Sequence[int], template: str, agent: str | None) -> dict[str, str]:
        out = dict(values)
        merged = False
        summarized: set[int] = set()
        for placeholder, k in sources.items():
            age = number - k
            if age <= 1 or k not in self.played:  # not played in this process yet: the cost estimate of a resume
                continue
            source = round_type.inputs[placeholder]
            if source.take == "own":
                out[placeholder] = self._own_line(values.get(placeholder, ""), k, agent)
                merged = merged or age > 3
            elif age <= 3:
                out[placeholder] = (self.round_summary(k) if k not in summarized
                                    else f"(round {k}: see its summary above)")
                summarized.add(k)
            else:
                out[placeholder] = (f"(round {k} — {self._title(k)} — is merged into the DEBATE STATE: its claims and "
                                    f"evidence keep their ids there; full text: conclave show "
                                    f"{self.inputs.consultation_id} --round {k})")
                merged = True
        block = self._rounds_block([k for k in superseded if k not in summarized], number, summarize=True,
                                  agent=agent)
        merged = merged or any(number - k > 3 for k in superseded)
        if merged and "debate_state" not in template:
            state = self.inputs.debate_state()
            block = f"{block}\nThe debate so far, every claim and source under a stable id:\n{state}"
        out[PLACEHOLDER] = block
        return out

    def _rounds_block(self, rounds: Sequence[int], number: int, *, summarize: bool, agent: str | None) -> str:
        parts = []
        for k in rounds:
            age = number - k
            if not summarize or age <= 1:
                # filtered, its lists keep their top-ranked items: the prompt says so instead of "in full"
                shown = ("in full" if not self.inputs.filtering.filtering else
                         "lists cut to top items" + (", your reply whole" if agent else ""))
                parts.append(f"Round {k} ({self._title(k)}, since repeated), {shown}, as JSON:\n"
                             f"{self._full(k, number, agent)}")
            elif age <= 3:
                parts.append(self.round_summary(k))
        return "\n\n".join(parts) + "\n" if parts else ""

    def _title(self, k: int) -> str:
        played = self.played.get(k)
        return played.title if played else "an earlier round"

    def _full(self, k: int, number: int, agent: str | None, words: int | None = None) -> str:
        """Round ``k`` in full as round ``number`` shows ``agent`` (None: the judge): its replies and the judge's
        artifact, each filtered as shown again (``filtering.replies``, ``filtering.round4``); ``agent``'s own
        reply whole."""
        inputs, played, labels = self.inputs, self.played[k], self.inputs.labels()
        body: dict[str, Any] = {}
        if played.agents:
            seat = "judge" if agent is None else "agents"
            others = len(inputs.present()) - 1 if agent is not None else 1  # the calls shown one reply again

            def shown(author: str, reply: dict[str, Any]) -> dict[str, Any]:
                if author == agent or played.schema is None:
                    return reply
                return inputs.filtering.reply(reply, played.schema, number, view=inputs.view, seat=seat,
                                              agent=author, recipients=others)

            body["replies"] = {labels.label(a): inputs.view(shown(a, x)) for a, x in sorted(
                played.agents.items(), key=lambda item: labels.label(item[0]))}
        if played.judge is not None:
            judge = inputs.filtering.later(played.judge, number, view=inputs.view)
            body["judge"] = inputs.view(judge) if judge is not None else None
        return prompt_json(_cut(body, words) if words else body)

    def _own_line(self, shown: str, k: int, agent: str | None) -> str:
        """An agent's own earlier answer in one line: its position (30 words), confidence, and its claim ids."""
        try:
            artifact = json.loads(shown)
        except ValueError:
            return shown
        if not isinstance(artifact, dict):
            return shown

        standing = standing_of(artifact)
        ids = [c.id for c in self.inputs.state.claims.values()
               if agent is not None and c.agent == agent and c.introduced_round == k]
        confidence = f"; confidence {standing.confidence:.2f}" if standing.confidence is not None else ""
        claims = f"; your claims from it: {', '.join(ids)}" if ids else ""
        return f'(round {k}, summarized) your position: "{_words(standing.position, 30)}"{confidence}{claims}'

    # ------------------------------------------------------------------------------------------- summaries

    def round_summary(self, k: int) -> str:
        """Round ``k`` as a structured summary under ``summarization.summary_tokens`` tokens (real tokenizer)."""
        # every call of a round shows the same summary (its unfiltered counterpart, when savings are counted,
        # its own)
        key = (k, self.inputs.state.round, self.inputs.filtering.filtering,
               tuple(self.inputs.labels().by_name.items()))  # each agent sees its own labels
        if key in self._summaries:
            return self._summaries[key]
        budget = self.inputs.settings.summary_tokens
        text = ""
        for words in ITEM_WORDS:
            for ids in (None, 12, 6):
                text = self._summary_text(k, words, ids)
                if count_tokens(text) <= budget:
                    self._summaries[key] = text
                    return text
        self._summaries[key] = text
        return text

    def _summary_text(self, k: int, words: int, max_ids: int | None) -> str:
        """Round ``k`` summarized; the judge's artifact as filtering keeps it (its top-ranked items first)."""
        inputs, played = self.inputs, self.played[k]
        state = inputs.state
        label = inputs.labels().label
        claims = [c for c in state.claims.values() if c.introduced_round == k]
        evidence = [e for e in state.evidence.values() if e.added_round == k]
        decided = [c for c in state.claims.values() if c.last_updated_round == k and c.introduced_round != k
                   and c.status != "open"]
        contested = [c for c in state.claims.values() if c.status == "contested" and c.last_updated_round <= k]
        previous = self._previous_standings(k)
        lines = [f"Round {k} · {played.title} (summary)"]
        standings = {a: standing_of(x) for a, x in played.agents.items()}
        if standings:
            votes = [s.vote for s in standings.values() if s.vote]
            tally = ", ".join(f"{v} {votes.count(v)}" for v in ("ACCEPT", "MINOR", "BLOCKER") if v in votes)
            known = [s.confidence for s in standings.values() if s.confidence is not None]
            mean = f"; mean confidence {fmean(known):.2f}" if known else ""
            lines.append(f"- {len(standings)} answer(s){'; votes ' + tally if tally else ''}{mean}")
        lines.append(f"- new claims: {_ids([c.id for c in claims], max_ids)} · new evidence: "
                     f"{_ids([e.id for e in evidence], max_ids)}")
        if decided:
            lines.append("- decisions: " + _ids([f"{c.id} {c.status}" for c in decided], max_ids))
        if contested:
            lines.append("- contested: " + _ids([c.id for c in contested], max_ids))
        for agent in sorted(standings, key=label):
            s = standings[agent]
            delta = ""
            before = previous.get(agent)
            if s.confidence is not None and before is not None and before.confidence is not None:
                delta = f" ({s.confidence - before.confidence:+.2f})"
            conf = f" · confidence {s.confidence:.2f}{delta}" if s.confidence is not None else ""
            vote = ""
            if s.vote:
                reason = str(played.agents[agent].get("vote_reason") or "")
                vote = f" · vote {s.vote}" + (f': "{_words(reason, words)}"' if reason and s.vote != "ACCEPT" else "")
            lines.append(f'- {label(agent)}: "{_words(s.position, words)}"{conf}{vote}')
        if played.judge is not None:
            judge = inputs.filtering.later(played.judge, state.round + 1, view=inputs.view)
            lines.extend(_judge_lines(judge or played.judge, words))
        return "\n".join(lines)

    def _previous_standings(self, k: int) -> dict[str, Any]:
        earlier = [j for j in self.played if j < k and self.played[j].agents]
        if not earlier:
            return {}
        return {a: standing_of(x) for a, x in self.played[max(earlier)].agents.items()}

    # ------------------------------------------------------------------------------------------- the budget

    def _fit(self, round_type: RoundType, number: int, values: dict[str, str]) -> str:
        """Cut the full artifacts' strings until the user message is under the budget; the message sent."""
        budget = self.inputs.settings.budget_tokens
        message = user_message(self.inputs.strategy, round_type, values)
        if count_tokens(message) <= budget:
            return message
        original = dict(values)
        for words in WORD_LIMITS:
            for placeholder, text in original.items():
                if placeholder != PLACEHOLDER:
                    values[placeholder] = _cut_json(text, words)
            values[PLACEHOLDER] = _cut_blocks(original[PLACEHOLDER], words)
            message = user_message(self.inputs.strategy, round_type, values)
            if count_tokens(message) <= budget:
                return message
        self.over_budget.append(number)
        return message

    # ------------------------------------------------------------------------------------------- the record

    def carried_tokens(self, steps: Sequence[Step], index: int, agents: int) -> int:
        """Upper bound of the ``$earlier_rounds`` tokens of the call at ``steps[index]`` (the cost estimate):
        superseded rounds at their producers' caps, or at the summary budget where summarization applies."""
        number = steps[index].number
        groups: dict[int, list[Step]] = {}
        for step in steps:
            groups.setdefault(step.number, []).append(step)
        names = {n: tuple(s.type.name for s in g) for n, g in groups.items()}
        total = 0
        for k in sorted(groups):
            if k >= number or not any(names[j] == names[k] for j in groups if k < j <= number):
                continue
            age = number - k
            if self.applies(number) and age > 1:
                total += self.inputs.settings.summary_tokens if age <= 3 else 0
            else:
                total += sum(s.type.max_tokens * (agents if s.type.seat == "agents" else 1) for s in groups[k])
        return total

    def _note_sent(self, number: int, sent: str, without: str) -> None:
        """Remember a real call's user message (and its unsummarized counterpart) for :meth:`summary`, which
        counts them."""
        self._sent.append((number, sent, without))

    def summary(self) -> dict[str, Any]:
        """Context tokens per round (every real call's user message, real tokenizer), with and without
        summarization; ``saved``: the share summarization removed over the rounds it applied to."""
        per: dict[int, dict[str, Any]] = {}
        cache = self._counts

        def count(text: str) -> int:
            if text not in cache:
                cache[text] = count_tokens(text)
            return cache[text]

        for number, sent, without in self._sent:
            row = per.setdefault(number, {"round_number": number, "calls": 0, "tokens": 0,
                                          "tokens_unsummarized": 0, "summarized": self.applies(number)})
            row["calls"] += 1
            row["tokens"] += count(sent)
            row["tokens_unsummarized"] += count(without)
        rows = [per[n] for n in sorted(per)]
        applied = [r for r in rows if r["summarized"]]
        before = sum(r["tokens_unsummarized"] for r in applied)
        after = sum(r["tokens"] for r in applied)
        return {
            "rounds": rows,
            "tokens": sum(r["tokens"] for r in rows),
            "tokens_unsummarized": sum(r["tokens_unsummarized"] for r in rows),
            "summarized_rounds": [r["round_number"] for r in applied],
            "saved": round(1 - after / before, 4) if before else None,
            "over_budget_rounds": sorted(set(self.over_budget)),
        }


# ------------------------------------------------------------------------------------------------ helpers


def _judge_lines(judge: Mapping[str, Any], words: int) -> list[str]:
    lines = []
    points = judge.get("consensus_points") or []
    if points:
        lines.append("- consensus: " + "; ".join(f'"{_words(str(p.get("point", "")), words)}"' for p in points[:3]))
    tensions = judge.get("tensions") or []
    if tensions:
        lines.append("- tensions: " + "; ".join(_words(str(t.get("topic") or t.get("area") or ""), words)
                                                 for t in tensions[:3]))
    unresolved = judge.get("unresolved") or []
    if unresolved:
        lines.append("- unresolved: " + "; ".join(f'"{_words(str(u), words)}"' for u in unresolved[:3]))
    if judge.get("recommendation"):
        lines.append(f'- recommendation: "{_words(str(judge["recommendation"]), words)}"')
    return lines


def _ids(ids: Sequence[str], limit: int | None) -> str:
    if not ids:
        return "none"
    if limit is None or len(ids) <= limit:
        return ", ".join(ids)
    return ", ".join(ids[:limit]) + f" (+{len(ids) - limit} more)"


def _words(text: str, limit: int) -> str:
    parts = text.split()
    return " ".join(parts) if len(parts) <= limit else " ".join(parts[:limit]) + " …"


def _cut(value: Any, words: int) -> Any:
    """Every string of a JSON value cut to ``words`` words (keys, numbers and ids untouched)."""
    if isinstance(value, str):
        return _words(value, words)
    if isinstance(value, list):
        return [_cut(v, words) for v in value]
    if isinstance(value, dict):
        return {k: _cut(v, words) for k, v in value.items()}
    return value


def _cut_json(text: str, words: int) -> str:
    """A JSON-valued template value with its strings cut; other values (the question, labels) as they are."""
    stripped = text.strip()
    if not stripped.startswith(("{", "[")):
        return text
    try:
        return prompt_json(_cut(json.loads(stripped), words))
    except ValueError:
        return text


def _cut_blocks(block: str, words: int) -> str:
    """The ``$earlier_rounds`` block with the JSON of its full rounds cut."""
    out = []
    for line in block.split("\n"):
        out.append(_cut_json(line, words) if line.startswith(("{", "[")) else line)
    return "\n".join(out)

