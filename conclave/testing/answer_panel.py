"""Scripted ``mode=answer`` panels for the fake provider server: agents of known accuracy, and a conformity panel.

Each agent is told apart by its persona name in the system prompt; the judge by its model. An agent is right on
an item with its probability ``accuracy[persona]``, decided by a seeded hash of (seed, persona, question), so
decisions are independent across agents and reproducible; every wrong agent gives the same wrong answer
(truth + 1), so the round-1 vote is right exactly when a majority is. The judge answers the most common
``final_answer`` it is shown (ties: the first shown). ``decisions`` records what each agent was scripted to do.

``conformity=True``: in round 3 every agent gives the answer the judge's synthesis gave (a right minority flips
to the wrong majority), citing nothing: an unsupported switch. In a critical objection round every agent keeps
its own answer.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest, Reply
from conclave.testing.schema_instances import instance_for

_PERSONA = re.compile(r"You are (.+?), one member")
_QUESTION = re.compile(r"<question>\n(.*?)\n</question>", re.S)
_FINAL = re.compile(r'"final_answer": "((?:[^"\\]|\\.)*)"')


def arithmetic_truth(question: str) -> str:
    """The right answer of a generated arithmetic item (``What is the result of a+b*c+d-e*f? …``)."""
    match = re.search(r"result of ([0-9+\-*]+)\?", question)
    if not match or not re.fullmatch(r"[0-9+\-*]+", match.group(1)):
        raise ValueError(f"not an arithmetic item: {question!r}")
    return str(eval(match.group(1), {"__builtins__": {}}, {}))  # digits and + - * only, checked above


@dataclass
class AnswerPanel:
    """A scripted panel; :meth:`install` scripts ``agent_model`` and ``judge_model`` on ``fake``."""

    accuracy: Mapping[str, float]
    truth: Callable[[str], str] = arithmetic_truth
    seed: int = 0
    conformity: bool = False
    judge_confidence: float = 0.5  # the synthesis' consensus confidence: under 0.9, early termination stays off
    verdict_confidence: float = 0.8
    latency: float = 0.0
    decisions: dict[tuple[str, str], bool] = field(default_factory=dict)  # (persona, question) -> scripted right

    def right(self, persona: str, question: str) -> bool:
        digest = hashlib.sha256(f"{self.seed}\x00{persona}\x00{question}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        decision = draw < self.accuracy[persona]
        self.decisions[(persona, question)] = decision
        return decision

    def answer(self, persona: str, question: str) -> str:
        truth = self.truth(question)
        return truth if self.right(persona, question) else wrong_answer(truth)

    def install(self, fake: FakeProviderServer, *, agent_model: str = "gpt-4o", judge_model: str = "gpt-4.1",
                gate: Callable[[RecordedRequest], Fault | None] | None = None) -> None:
        """Script both models on ``fake``; ``gate`` sees every request first and may answer it with a fault
        instead (a rate limit: :class:`conclave.testing.rate_limit.RateLimit`)."""
        fake.script(agent_model, self._agent if gate is None else _gated(gate, self._agent))
        fake.script(judge_model, self._judge if gate is None else _gated(gate, self._judge))

    # ------------------------------------------------------------------------------------------ replies

    def _agent(self, request: RecordedRequest) -> Reply:
        system, user = request_messages(request)
        persona = _PERSONA.search(system)
        question = _QUESTION.search(user)
        assert persona and question, "not an answer-mode agent request"
        name, text = persona.group(1), question.group(1)
        body: dict[str, Any] = instance_for(request.schema) if isinstance(request.schema, Mapping) else {}
        schema = request.schema if isinstance(request.schema, Mapping) else {}
        if "=== CRITICAL OBJECTION ROUND ===" in user:  # objects as told, and keeps its own answer
            own = _FINAL.findall(user)[0]
            body.update(revised_position=f"My answer is still {own}.", confidence=0.9)
        elif "revised_position" in schema.get("properties", {}):  # a cross-examination reply
            synthesis_answers = _FINAL.findall(user.split("synthesis of the panel", 1)[-1])
            own = _FINAL.findall(user)[0]
            now = synthesis_answers[-1] if self.conformity and synthesis_answers else own
            # agreeing with confidence: the exit controller ends the debate after one cross-examination
            body.update(revised_position=f"My answer is {now}.", final_answer=now, vote="ACCEPT", confidence=0.9)
            if now != own:  # a conformist switch brings no claim, source or claim id of its own
                body.update(claims=[], references=[], retracts=[], defense="I go with the panel.",
                            critique="None.")
        else:
            answer = self.answer(name, text)
            body.update(position=f"The answer is {answer}.", final_answer=answer, confidence=0.9,
                        key_points=["worked it out"], rationale="Step by step.")
        return Reply(json=body, latency=self.latency)

    def _judge(self, request: RecordedRequest) -> Reply:
        _, user = request_messages(request)
        body: dict[str, Any] = instance_for(request.schema) if isinstance(request.schema, Mapping) else {}
        answers = [json.loads(f'"{a}"') for a in _FINAL.findall(user)]
        if "Round 2 of 4" in user:
            top = most_common(answers)
            body.update(final_answer=top, consensus_points=[
                {"point": f"The answer is {top}.", "supporting_agents": [], "confidence": self.judge_confidence}])
        elif "The final answer." in user:  # the verdict
            # the answers given last (round-3 replies are not shown to the verdict; round 1 and the synthesis are)
            top = most_common(answers)
            body.update(final_answer=top, recommendation=f"The answer is {top}.", confidence=self.verdict_confidence)
        return Reply(json=body, latency=self.latency)


def _gated(gate: Callable[[RecordedRequest], Fault | None],
           reply: Callable[[RecordedRequest], Reply]) -> Callable[[RecordedRequest], Reply | Fault]:
    return lambda request: gate(request) or reply(request)


def wrong_answer(truth: str) -> str:
    try:
        return str(int(truth) + 1)
    except ValueError:
        return truth + " (wrong)"


def most_common(answers: Sequence[str]) -> str:
    """The most common answer, the first given on a tie ("0" for none)."""
    if not answers:
        return "0"
    counts = Counter(answers)
    top = max(counts.values())
    return next(a for a in answers if counts[a] == top)


def request_messages(request: RecordedRequest) -> tuple[str, str]:
    """The (system, user) text of a chat request: every system or developer message, every user message."""
    messages = (request.json or {}).get("messages") or []
    system = "\n".join(str(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
    user = "\n".join(str(m.get("content")) for m in messages if m.get("role") == "user")
    return system, user
