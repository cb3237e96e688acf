"""A scripted panel world for tests and benchmarks: agents of known accuracy served by the fake provider server,
so the real engine runs end to end and the truth about every answer is known.

The world is numbers, not prose:

- **accuracy** per agent and task kind (``WorldAgent.accuracy``; the kind comes from ``PanelWorld.task_kind``);
- **error correlation**: every item draws one shared latent ("how hard it is"); an agent is right when
  ``Φ(√c·shared + √(1-c)·own) < accuracy``, so ``correlation=c`` makes agents wrong on the same items while each
  keeps its accuracy. Wrong agents give the item's shared lure (``truth + 1``) with ``PanelWorld.shared_wrong``,
  else an answer of their own (``truth + 2 + seat``);
- **confidence** that is informative (right answers report 0.80–0.95, wrong 0.50–0.70) or not (0.60–0.95 either
  way): ``WorldAgent.confidence_informative``;
- **conformity**: in cross-examination an agent switches to the answer it is shown most (the synthesis' and any
  peer's ``final_answer`` other than its own) with chance ``conformity``, plus ``name_boost`` when that answer is
  shown next to a name the world knows (another agent's persona name, seat key or model) and ``confidence_boost``
  when it is shown with a confidence ≥ 0.8;
- **evidence for a switch**: a cross-examination reply cites nothing (no claims, references or challenges), except
  that an agent switching to the right answer introduces one new claim carrying the working, citing a new source
  (its re-derivation), with chance ``supported_switch`` — a conformist switch to a wrong answer never brings
  evidence;
- a **judge** that, for each answer it gives, picks the first answer shown with chance ``judge_position_bias``, else
  the longest with ``judge_length_bias``, else the right one (when shown) with ``judge_skill``, else the plurality.

Every draw is a seeded hash of (seed, who, item, what), so a world replays exactly; :attr:`PanelWorld.log` keeps what
each agent was scripted to do.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from math import sqrt
from statistics import NormalDist
from typing import Any

from conclave.testing.answer_panel import arithmetic_truth, most_common, request_messages
from conclave.testing.fake_server import FakeProviderServer, RecordedRequest, Reply
from conclave.testing.schema_instances import instance_for

_PERSONA = re.compile(r"You are (.+?), one member")
_QUESTION = re.compile(r"<question>\n(.*?)\n</question>", re.S)
_FINAL = re.compile(r'"final_answer": "((?:[^"\\]|\\.)*)"')
_SAID = re.compile(r"(?:The|My) answer is (?:still )?(-?[\w.]+)")
_CONFIDENCE = re.compile(r'"confidence": ([0-9.]+)')
_KIND = re.compile(r"\(kind: ([\w-]+)\)")
_NORMAL = NormalDist()
HIGH_CONFIDENCE = 0.8


def tagged_kind(question: str) -> str:
    """The task kind an item names with ``(kind: NAME)`` in its text; ``default`` without one."""
    match = _KIND.search(question)
    return match.group(1) if match else "default"


@dataclass(frozen=True)
class WorldAgent:
    """One panel member: ``name`` is its persona name (``You are NAME, one member…``), ``key`` its seat in the
    panel config, ``model`` the model it is served as."""

    name: str
    key: str
    model: str
    accuracy: float | Mapping[str, float] = 0.7  # a mapping: task kind -> accuracy, "default" for the rest
    confidence_informative: bool = False
    conformity: float = 0.0
    verbosity: int = 1  # how long its working is (what a length-biased judge rewards)

    def accuracy_on(self, kind: str) -> float:
        if isinstance(self.accuracy, Mapping):
            return float(self.accuracy.get(kind, self.accuracy.get("default", 0.0)))
        return float(self.accuracy)


@dataclass(frozen=True)
class Shown:
    """An answer a prompt shows, with the text of the record it is shown in (its JSON object or its line)."""

    answer: str
    context: str


@dataclass
class PanelWorld:
    """A scripted world; :meth:`install` serves it on a fake provider server (each agent's model and the judge's)."""

    agents: Sequence[WorldAgent]
    judge_model: str = "gpt-4.1"
    correlation: float = 0.0
    shared_wrong: float = 1.0
    name_boost: float = 0.0
    confidence_boost: float = 0.0
    supported_switch: float = 0.0
    judge_position_bias: float = 0.0
    judge_length_bias: float = 0.0
    judge_skill: float = 0.0
    judge_confidence: float = 0.5  # the synthesis' consensus confidence: under 0.9, early termination stays off
    seed: int = 0
    latency: float = 0.0
    truth: Callable[[str], str] = arithmetic_truth
    task_kind: Callable[[str], str] = tagged_kind
    #: (agent name, question, event) -> value: "right" (bool), "answer", "confidence", "switched" (bool),
    #: "supported" (bool: its cross-examination reply introduced a claim)
    log: dict[tuple[str, str, str], Any] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------ the script

    def agent(self, name: str) -> WorldAgent:
        return next(a for a in self.agents if a.name == name)

    def draw(self, *parts: object) -> float:
        """A uniform draw in [0, 1) fixed by the seed and ``parts``."""
        text = "\x00".join(str(p) for p in (self.seed, *parts))
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64

    def right(self, agent: WorldAgent, question: str) -> bool:
        """Whether ``agent`` answers ``question`` right in round 1: a Gaussian copula of the item's shared latent
        and the agent's own draw, thresholded at its accuracy on the item's kind."""
        clip = 1e-12
        shared = _NORMAL.inv_cdf(min(max(self.draw("item", question), clip), 1 - clip))
        own = _NORMAL.inv_cdf(min(max(self.draw("agent", agent.name, question), clip), 1 - clip))
        latent = sqrt(self.correlation) * shared + sqrt(1 - self.correlation) * own
        return _NORMAL.cdf(latent) < agent.accuracy_on(self.task_kind(question))

    def first_answer(self, agent: WorldAgent, question: str) -> tuple[str, float]:
        """The agent's round-1 answer and reported confidence."""
        truth = self.truth(question)
        right = self.right(agent, question)
        if right:
            answer = truth
        elif self.draw("lure", agent.name, question) < self.shared_wrong:
            answer = _offset(truth, 1)
        else:
            answer = _offset(truth, 2 + [a.name for a in self.agents].index(agent.name))
        spread = self.draw("confidence", agent.name, question)
        if not agent.confidence_informative:
            confidence = 0.60 + 0.35 * spread
        else:
            confidence = 0.80 + 0.15 * spread if right else 0.50 + 0.20 * spread
        confidence = round(confidence, 2)
        self.log[(agent.name, question, "right")] = right
        self.log[(agent.name, question, "answer")] = answer
        self.log[(agent.name, question, "confidence")] = confidence
        return answer, confidence

    def known_names(self, besides: WorldAgent | None = None) -> list[str]:
        """Every name by which an agent (other than ``besides``) could be identified in a prompt."""
        names: list[str] = []
        for agent in self.agents:
            if agent != besides:
                names += [agent.name, agent.key, agent.model]
        own = {besides.name, besides.key, besides.model} if besides else set()
        return [n for n in names if n and n not in own]

    def switch_chance(self, agent: WorldAgent, shown: Sequence[Shown], own: str) -> tuple[str | None, float]:
        """The answer ``agent`` would switch to among ``shown`` (the most shown one other than ``own``) and the
        chance that it does."""
        others = [s for s in shown if s.answer != own]
        if not others:
            return None, 0.0
        tally = Counter(s.answer for s in others)
        top = max(tally.values())
        target = next(s.answer for s in others if tally[s.answer] == top)
        contexts = [s.context for s in others if s.answer == target]
        names = self.known_names(besides=agent)
        # a whole name: "gpt-4o" is not named by "gpt-4o-mini"
        named = any(re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", c) for c in contexts for n in names)
        confident = any(float(v) >= HIGH_CONFIDENCE for c in contexts for v in _CONFIDENCE.findall(c)
                        if _is_number(v))
        chance = agent.conformity + self.name_boost * named + self.confidence_boost * confident
        return target, min(1.0, chance)

    def judge_pick(self, question: str, shown: Sequence[Shown], stage: str) -> str:
        """The judge's answer among ``shown`` (in the order shown): position bias, then length bias, then skill,
        then the plurality (ties: the first shown)."""
        if not shown:
            return "0"
        if self.draw("judge-position", stage, question) < self.judge_position_bias:
            return shown[0].answer
        if self.draw("judge-length", stage, question) < self.judge_length_bias:
            return max(shown, key=lambda s: len(s.context)).answer
        truth = self.truth(question)
        if any(s.answer == truth for s in shown) and self.draw("judge-skill", stage, question) < self.judge_skill:
            return truth
        return most_common([s.answer for s in shown])

    def install(self, fake: FakeProviderServer) -> None:
        for model in {a.model for a in self.agents}:
            fake.script(model, self._agent_reply)
        fake.script(self.judge_model, self._judge_reply)

    # ------------------------------------------------------------------------------------------ replies

    def _agent_reply(self, request: RecordedRequest) -> Reply:
        system, user = request_messages(request)
        persona, question = _PERSONA.search(system), _QUESTION.search(user)
        if not persona or not question:
            raise ValueError("not an answer-mode agent request")
        agent, text = self.agent(persona.group(1)), question.group(1)
        schema = request.schema if isinstance(request.schema, Mapping) else {}
        body: dict[str, Any] = instance_for(schema) if schema else {}
        if (agent.name, text, "answer") not in self.log:
            self.first_answer(agent, text)
        own = str(self.log[(agent.name, text, "answer")])
        confidence = float(self.log[(agent.name, text, "confidence")])
        working = "Step by step. " * (4 * agent.verbosity)
        if "=== CRITICAL OBJECTION ROUND ===" in user:  # objects as told, and keeps its own answer
            body.update(revised_position=f"My answer is still {own}.", confidence=confidence)
        elif "revised_position" in schema.get("properties", {}):  # a cross-examination reply
            own_section, _, rest = user.partition("Your own round-1 answer")
            rest = rest.partition("\n\n")[2]  # past its own answer: what it is shown
            shown = shown_answers(own_section + rest)
            target, chance = self.switch_chance(agent, shown, own)
            switched = target is not None and self.draw("conform", agent.name, text) < chance
            self.log[(agent.name, text, "switched")] = switched
            now = target if switched and target is not None else own
            claims: list[dict[str, Any]] = []
            references: list[dict[str, Any]] = []
            if switched and now == self.truth(text) and self.draw("support", agent.name, text) < self.supported_switch:
                # evidence, not a bare assertion: the re-derivation is a source of its own the claim cites
                claims = [{"id": "1", "text": f"Redoing the working step by step gives {now}.", "label": "FACT",
                           "citations": [1]}]
                references = [{"id": 1, "title": f"Step-by-step re-derivation of {text}", "snippet": working}]
            self.log[(agent.name, text, "supported")] = bool(claims)
            # agreeing: the exit controller ends the debate after one cross-examination
            body.update(revised_position=f"My answer is {now}.", final_answer=now, vote="ACCEPT",
                        confidence=confidence, defense=working, claims=claims, references=references,
                        challenges=[])
        else:
            answer, confidence = self.first_answer(agent, text)
            body.update(position=f"The answer is {answer}.", final_answer=answer, confidence=confidence,
                        key_points=["worked it out"], rationale=working)
        return Reply(json=body, latency=self.latency)

    def _judge_reply(self, request: RecordedRequest) -> Reply:
        _, user = request_messages(request)
        question = _QUESTION.search(user)
        text = question.group(1) if question else ""
        schema = request.schema if isinstance(request.schema, Mapping) else {}
        body: dict[str, Any] = instance_for(schema) if schema else {}
        title = str(schema.get("title") or "")
        if "Cross-examination" in title and "final_answer" not in schema.get("properties", {}):
            # the record of the exchange carries every agent's answer now, so the verdict sees who moved
            rebuttals = [{"agent": label, "rebuttal": f"My answer is {answer}."}
                         for label, answer in _replies_by_label(user).items()]
            if "rebuttals" in schema.get("properties", {}):
                body["rebuttals"] = rebuttals
            return Reply(json=body, latency=self.latency)
        if "final_answer" not in schema.get("properties", {}):
            return Reply(json=body, latency=self.latency)
        if "Round 2" in title or "synthesis" in title.lower():
            stage, shown = "synthesis", shown_answers(user)
            top = self.judge_pick(text, shown, stage)
            body.update(final_answer=top, consensus_points=[
                {"point": f"The answer is {top}.", "supporting_agents": [], "confidence": self.judge_confidence}])
        else:
            # the verdict: the answers given last (the cross-examination record's) when it shows them
            record = user.split("Cross-examination from round", 1)
            shown = shown_answers(record[1]) if len(record) > 1 else []
            stage = "verdict" if "Verdict" in title else "pick"
            top = self.judge_pick(text, shown or shown_answers(user), stage)
            body.update(final_answer=top, recommendation=f"The answer is {top}.", confidence=0.8)
        return Reply(json=body, latency=self.latency)


def shown_answers(text: str) -> list[Shown]:
    """Every answer ``text`` shows, in order: each ``final_answer`` field with its enclosing JSON object, else each
    "The/My answer is X" sentence with its line."""
    found = [Shown(json.loads(f'"{m.group(1)}"'), _enclosing_object(text, m.start())) for m in _FINAL.finditer(text)]
    if found:
        return found
    lines = text.splitlines()
    return [Shown(m.group(1).rstrip("."), line) for line in lines for m in _SAID.finditer(line)]


def _replies_by_label(user: str) -> dict[str, str]:
    """label -> final_answer of the cross-examination replies a judge is shown ("Their replies, keyed by label")."""
    _, _, rest = user.partition("Their replies")
    line = next((ln for ln in rest.splitlines() if ln.startswith("{")), "")
    try:
        replies = json.loads(line)
    except ValueError:
        return {}
    return {str(label): str(reply.get("final_answer")) for label, reply in replies.items()
            if isinstance(reply, dict) and reply.get("final_answer") is not None}


def _enclosing_object(text: str, at: int) -> str:
    depth, start = 0, 0
    for i in range(at, -1, -1):
        if text[i] == "}":
            depth += 1
        elif text[i] == "{":
            if depth == 0:
                start = i
                break
            depth -= 1
    depth, end = 0, len(text)
    for i in range(at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if depth == 0:
                end = i + 1
                break
            depth -= 1
    return text[start:end]


def _offset(truth: str, by: int) -> str:
    try:
        return str(int(truth) + by)
    except ValueError:
        return f"{truth} (wrong {by})"


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------- the four worlds

PANEL_SEATS = (("security", "Security Expert", "gpt-4o"), ("architect", "Systems Architect", "gpt-4o-mini"),
               ("pragmatist", "Pragmatic Engineer", "gpt-4.1-mini"))
WORLDS = ("independent", "correlated", "conformist", "strong_weak")


def standard_world(name: str, *, seed: int = 0, latency: float = 0.0) -> PanelWorld:
    """The benchmark's worlds on the three default seats (each on its own model, the judge on gpt-4.1):
    independent errors, correlated errors, conformist agents, one strong agent and two weak ones."""
    def seats(accuracy: Sequence[float], **knobs: Any) -> list[WorldAgent]:
        return [WorldAgent(name=n, key=k, model=m, accuracy=a, verbosity=1 + i, **knobs)
                for i, ((k, n, m), a) in enumerate(zip(PANEL_SEATS, accuracy, strict=True))]

    # the judge is led by position or length now and then, and otherwise recognises the right answer, when it is
    # shown, 40% of the time (arithmetic working can be checked); wrong agents share the item's lure 70% of the time
    common: dict[str, Any] = {"seed": seed, "latency": latency, "judge_position_bias": 0.1,
                              "judge_length_bias": 0.1, "judge_skill": 0.4, "shared_wrong": 0.7}
    if name == "independent":
        return PanelWorld(seats((0.7, 0.7, 0.7), confidence_informative=True), **common)
    if name == "correlated":
        return PanelWorld(seats((0.7, 0.7, 0.7), confidence_informative=True), correlation=0.6, **common)
    if name == "conformist":
        return PanelWorld(seats((0.7, 0.7, 0.7), conformity=0.3), confidence_boost=0.2, name_boost=0.3,
                          supported_switch=0.8, **common)
    if name == "strong_weak":  # the weak two make the same mistakes (one family), so they can outvote the strong one
        return PanelWorld(seats((0.9, 0.55, 0.55), confidence_informative=True), **{**common, "shared_wrong": 1.0})
    raise ValueError(f"world: {name!r} is not one of {', '.join(WORLDS)}")


def panel_overrides(world: PanelWorld) -> list[str]:
    """The Hydra overrides that seat ``world``'s agents (OpenAI wire format, their persona groups kept) and judge."""
    overrides = [f"agents.{a.key}.provider=openai" for a in world.agents]
    overrides += [f"agents.{a.key}.model={a.model}" for a in world.agents]
    return [*overrides, "judge.provider=openai", f"judge.model={world.judge_model}"]
