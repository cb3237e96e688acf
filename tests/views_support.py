"""Real consultations for the view tests (this module holds no tests): each one is run by the engine against the
fake provider server and recorded by the real Recorder (journal + index) into a CONCLAVE_HOME.

``record_debates(home)`` produces: a full converge debate with realistic text, a rate-limited first attempt and
a dissent (severity ``medium``) and a second dissent (``high``); an early-terminated converge run; and an explore
run. Artifact filtering trims the five consensus points before round 3, so ``filters_applied`` has rows.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from test_engine_support import AGENT_MODELS, JUDGE_MODEL, by_schema, independent, run_consultation, synthesis

from conclave.store.recorder import Recorder
from conclave.testing.fake_server import FakeProviderServer, Fault

QUESTION = "Should the billing service move to event sourcing next quarter?"
POSITIONS = {
    "security": ("Adopt event sourcing for invoices only, with an append-only hash-chained event store.", 0.7),
    "architect": ("Move billing to event sourcing incrementally, starting with the invoice aggregate.", 0.8),
    "pragmatist": ("Do not rewrite billing; add an audit table written in the same transaction.", 0.65),
}
REVISED = {
    "security": "Adopt event sourcing for invoices only, with a hash-chained event store and crypto-shredding.",
    "architect": "Move billing to event sourcing incrementally, invoice aggregate first, behind an outbox.",
    "pragmatist": "Accept event sourcing for invoices if it is staffed as its own project.",
}
POINTS = [("Auditability of every billing change comes first", ["Agent A", "Agent B", "Agent C"], 0.93),
          ("Start with the invoice aggregate, not all of billing", ["Agent A", "Agent B"], 0.81),
          ("Personal data must stay erasable", ["Agent A"], 0.7),
          ("Replays must be free of side effects", ["Agent B"], 0.62),
          ("Reporting must keep working during the move", ["Agent C"], 0.55)]
TENSIONS = [("Event store versus audit table", [("Agent A", "Only a log prevents lost updates"),
                                                ("Agent C", "An audit table gives most of the value")])]
CROSS_EXAM = {
    "challenges": [{"challenger": "Agent A", "target_agent": "Agent C",
                    "challenge": "An audit table written by application code misses manual fixes",
                    "evidence": ["Two manual invoice corrections left no trace"]}],
    "rebuttals": [{"agent": "Agent C", "rebuttal": "A database trigger closes most of that gap"}],
    "unresolved": ["Who staffs on-call for the event store"],
}
VERDICT = {"recommendation": "Event-source the invoice aggregate first; keep the rest of billing relational.",
           "confidence": 0.82, "evidence": ["Auditability ranks first for every agent"],
           "dissent": [{"agent": "Agent C", "concern": "Staffing is not agreed", "severity": "medium"},
                       {"agent": "Agent A", "concern": "Key management for crypto-shredding is unplanned",
                        "severity": "high"}]}


def _reply(name: str) -> dict[str, Any]:
    return {"critique": f"{name} sees gaps in the others' plans.", "challenges": [], "defense": "",
            "revised_position": REVISED[name], "vote": "MINOR", "confidence": 0.8}


def _first_rate_limited(answer: Any) -> Any:
    """The first call is rate limited (a retry and a provider-failure row), every later one is ``answer``."""
    calls = []

    def reply(request: Any) -> Any:
        calls.append(request)
        return Fault.rate_limited(retry_after=0) if len(calls) == 1 else answer(request)

    return reply


@dataclass
class Debates:
    home: Path
    converge: str
    early: str
    explore: str


async def _run(fake: FakeProviderServer, recorder: Recorder, *overrides: str, question: str = QUESTION) -> str:
    # no hedging: under load a hedge could add a call to the counts the views' tests read
    run = await run_consultation(fake, "hedging.enabled=false", *overrides, question=question, recorder=recorder)
    recorder.flush()
    return run.result.consultation_id


async def record_debates_async(home: Path) -> Debates:
    recorder = Recorder(home)
    try:
        async with FakeProviderServer() as fake:
            for name, model in AGENT_MODELS.items():
                position, confidence = POSITIONS[name]
                answer = by_schema(independent=independent(position, confidence), cross_exam_reply=_reply(name))
                fake.script(model, _first_rate_limited(answer) if name == "architect" else answer)
            fake.script(JUDGE_MODEL, by_schema(synthesis=synthesis(POINTS, TENSIONS), cross_exam=CROSS_EXAM,
                                               verdict=VERDICT))
            converge = await _run(fake, recorder)

            confident = [(p, a, 0.97) for p, a, _ in POINTS[:2]]
            fake.script(JUDGE_MODEL, by_schema(synthesis=synthesis(confident), verdict=VERDICT))
            early = await _run(fake, recorder, question="Should we keep the nightly invoice export?")

            fake.script(JUDGE_MODEL, by_schema())
            explore = await _run(fake, recorder, "mode=explore", question="How should we price the API?")
    finally:
        recorder.close()
    return Debates(home, converge, early, explore)


def record_debates(home: Path) -> Debates:
    return asyncio.run(record_debates_async(home))
