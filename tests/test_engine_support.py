"""Helpers shared by the engine tests (this module holds no tests): run a consultation on the fake provider
server through the real config composition, and read back what the providers received."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conclave.api import compose_settings
from conclave.artifacts import schema_registry as artifacts
from conclave.engine.extraction import request_schema
from conclave.engine.interaction import Interaction
from conclave.engine.result import ConsultationResult
from conclave.engine.run import Consultation
from conclave.events import Event
from conclave.testing.fake_server import FakeProviderServer, RecordedRequest, Reply
from conclave.testing.schema_instances import instance_for

QUESTION = "Should the billing service move to event sourcing next quarter?"
JUDGE_MODEL = "gpt-4.1"  # distinct from every agent model, so scripts and requests tell the judge apart
AGENT_MODELS = {"security": "claude-sonnet-4-5", "architect": "gpt-4o", "pragmatist": "gemini-2.5-pro"}
#: the four-round debate most engine tests describe (``rounds=4``: cross-examination never repeats); tests of the
#: exit controller leave ``rounds`` out
FOUR_ROUNDS = "rounds=4"
BASE_OVERRIDES = ("cost.auto_approve=true", f"judge.model={JUDGE_MODEL}", FOUR_ROUNDS)

Answer = Mapping[str, Any] | Callable[[RecordedRequest], Any]


@dataclass
class Run:
    result: ConsultationResult
    events: list[Event] = field(default_factory=list)
    consultation: Consultation | None = None

    def of(self, type_: str) -> list[dict[str, Any]]:
        return [e.data for e in self.events if e.type == type_]

    def states(self) -> list[str]:
        return ["IDLE", *(t.to for t in self.result.transitions)]


async def run_consultation(
    fake: FakeProviderServer,
    *overrides: str,
    question: str = QUESTION,
    interaction: Interaction | None = None,
    recorder: Any = None,
    resume_from: Mapping[str, Any] | None = None,
    base: Iterable[str] = BASE_OVERRIDES,
) -> Run:
    """One consultation composed exactly as ``conclave.consult`` composes it, pointed at ``fake``."""
    settings = compose_settings(question, [*fake.overrides(), *base, *overrides])
    run = Run(result=None)  # type: ignore[arg-type]
    consultation = Consultation(
        settings, interaction=interaction, subscribers=[run.events.append], recorder=recorder, resume_from=resume_from
    )
    run.consultation = consultation
    run.result = await consultation.run()
    return run


@functools.cache
def _schema_titles() -> dict[str, str]:
    return {request_schema(n)["title"]: n for n in artifacts.schema_names() if n != "common"}


def schema_of(request: RecordedRequest) -> str | None:
    """The artifact schema a request asked for (by the schema's title), or None."""
    schema = request.schema if isinstance(request.schema, Mapping) else {}
    return _schema_titles().get(str(schema.get("title", "")))


def requests_with(fake: FakeProviderServer, schema: str, model: str | None = None) -> list[RecordedRequest]:
    return [r for r in fake.requests if schema_of(r) == schema and (model is None or r.model == model)]


def texts(request: RecordedRequest) -> str:
    """Every string in the request body, unescaped and joined: what the model was shown (and the schema)."""
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

    walk(request.json)
    return "\n".join(out)


def by_schema(**answers: Answer) -> Callable[[RecordedRequest], Reply]:
    """A fake script: the given answer for the named schemas, a schema-generated instance for the rest."""

    def reply(request: RecordedRequest) -> Reply:
        answer = answers.get(schema_of(request) or "")
        if answer is None:
            return Reply(json=instance_for(request.schema))
        value = answer(request) if callable(answer) else answer
        return value if isinstance(value, Reply) else Reply(json=value)

    return reply


def answering(asked: list[str], answer: str) -> Callable[[str], str]:
    """An injected terminal: records each prompt in ``asked`` and gives ``answer``."""

    def ask(prompt: str) -> str:
        asked.append(prompt)
        return answer

    return ask


def independent(position: str, confidence: float = 0.6, **extra: Any) -> dict[str, Any]:
    return {"position": position, "key_points": [f"{position} (key point)"], "rationale": f"Because {position}.",
            "confidence": confidence, "prose_excerpt": "", **extra}


def synthesis(points: list[tuple[str, list[str], float]], tensions: list[tuple[str, list[tuple[str, str]]]] | None = None,
              ) -> dict[str, Any]:
    return {
        "consensus_points": [{"point": p, "supporting_agents": a, "confidence": c} for p, a, c in points],
        "tensions": [{"topic": t, "viewpoints": [{"agent": a, "viewpoint": v} for a, v in views]}
                     for t, views in (tensions or [])],
        "priority_order": ["auditability"],
    }


def script_panel(fake: FakeProviderServer, confidence: float = 0.6, **judge: Answer) -> None:
    """Each agent answers round 1 with a position naming its model; the judge answers ``judge`` per schema."""
    for name, model in AGENT_MODELS.items():
        fake.script(model, by_schema(independent=independent(f"position of {name} via {model}", confidence)))
    fake.script(JUDGE_MODEL, by_schema(**judge))
