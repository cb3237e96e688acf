"""What the rounds of one consultation share: settings, strategy, providers, labels, inputs, and the record.

The record holds artifacts with real agent names; :class:`Session` helpers produce the labelled JSON the judge
(and, in round 3, the agents) are shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conclave.config import AgentSpec, Settings, resolve_provider
from conclave.engine.calls import CallOutcome
from conclave.engine.filtering import ArtifactFiltering
from conclave.engine.judge import JudgeSeat
from conclave.engine.labels import JudgeLabels
from conclave.engine.strategy import Strategy
from conclave.events import ROUND_ARTIFACT, EventBus

if TYPE_CHECKING:
    from conclave.plugins import Plugins
    from conclave.providers.pool import ProviderPool


@dataclass
class AgentState:
    """One panel member's standing in this consultation."""

    name: str
    spec: AgentSpec
    absent: bool = False  # no valid round-1 artifact: takes no part in the debate
    errors: list[str] = field(default_factory=list)
    raw_text: str | None = None  # the last unusable answer, kept for the record
    actual_provider: str | None = None
    actual_model: str | None = None
    substituted: bool = False

    def note(self, round_number: int, outcome: CallOutcome) -> None:
        """Record who answered a call for this agent, and what went wrong if it failed."""
        if outcome.provider:
            if round_number == 1 or self.actual_provider is None:
                self.actual_provider, self.actual_model = outcome.provider, outcome.model
            self.substituted = self.substituted or outcome.substituted
        if not outcome.ok:
            self.errors.append(f"round {round_number}: {outcome.error}")
            self.raw_text = outcome.raw_text or self.raw_text


@dataclass
class Record:
    """Everything the consultation has produced so far (names, not labels)."""

    round_1: dict[str, dict[str, Any]] = field(default_factory=dict)
    round_2: dict[str, Any] | None = None
    round_3_replies: dict[str, dict[str, Any]] = field(default_factory=dict)
    round_3: dict[str, Any] | None = None
    round_4: dict[str, Any] | None = None
    verdict: dict[str, Any] | None = None
    completed_rounds: int = 0
    early_termination: dict[str, Any] | None = None
    abort_reason: str | None = None
    missing_replies: list[str] = field(default_factory=list)  # present agents with no round-3 reply


class Session:
    def __init__(
        self,
        *,
        settings: Settings,
        plugins: Plugins,
        strategy: Strategy,
        pool: ProviderPool,
        bus: EventBus,
        labels: JudgeLabels,
        question: str,
        context_text: str,
    ) -> None:
        self.settings = settings
        self.plugins = plugins
        self.strategy = strategy
        self.pool = pool
        self.bus = bus
        self.labels = labels
        self.question = question
        self.context_text = context_text
        self.record = Record()
        self.agents = {name: AgentState(name, spec) for name, spec in settings.agents.items()}
        self.judge = JudgeSeat(settings, self.native)
        self.filtering = ArtifactFiltering(settings, plugins, bus)

    def native(self, provider: str) -> bool:
        """Whether ``provider``'s implementation honours a JSON schema natively (structured output)."""
        try:
            api, _ = resolve_provider(self.settings, provider, self.plugins)
            return bool(getattr(self.plugins.providers.get(api), "supports_structured_output", False))
        except KeyError:
            return False

    # --------------------------------------------------------------------------------- who takes part

    def present(self) -> list[str]:
        """Agents with a valid round-1 artifact, in the judge's (shuffled) order."""
        return [name for name in self.labels.order() if name in self.record.round_1]

    def absent_notice(self, round_number: int) -> str:
        """One sentence for the judge: who is missing from the debate (by label), or that nobody is."""
        absent = [self.labels.label(n) for n in self.labels.order() if n not in self.record.round_1]
        silent = [self.labels.label(n) for n in self.record.missing_replies] if round_number >= 3 else []
        parts = []
        if absent:
            parts.append(f"Absent: {', '.join(absent)} gave no valid answer in round 1 and take no part in the debate.")
        if silent:
            parts.append(f"{', '.join(silent)} did not reply in round 3.")
        return " ".join(parts) or "Every panel member is present."

    # --------------------------------------------------------------------------------- what is shown

    def shown(self, artifact: dict[str, Any] | None) -> str:
        """The labelled JSON of one stored artifact as the judge or an agent is shown it."""
        return prompt_json(self.labels.judge_view(artifact) if artifact is not None else None)

    def shown_independents(self) -> str:
        return prompt_json([self.labels.judge_view(self.record.round_1[name]) for name in self.present()])

    def shown_replies(self) -> str:
        return prompt_json(
            {
                self.labels.label(name): self.labels.judge_view(self.record.round_3_replies[name])
                for name in self.labels.order()
                if name in self.record.round_3_replies
            }
        )

    # --------------------------------------------------------------------------------- events

    def emit_artifact(
        self, round_number: int, schema: str, agent: str | None, artifact: dict[str, Any], raw_text: str, status: str
    ) -> None:
        self.bus.emit(
            ROUND_ARTIFACT,
            round_number=round_number,
            artifact_type=artifact.get("artifact_type", schema),
            schema=schema,
            agent=agent,
            artifact=artifact,
            raw_text=raw_text,
            status=status,
        )


def prompt_json(obj: Any) -> str:
    """JSON as sent in prompts: compact separators (tokens cost money), non-ASCII kept readable."""
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))
