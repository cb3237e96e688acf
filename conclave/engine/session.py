"""What the rounds of one consultation share: settings, strategy, providers, labels, inputs, and the record.

The record holds artifacts with real agent names; :class:`Session` helpers produce the labelled JSON the judge
(and, in round 3, the agents) are shown.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from conclave.config.settings import AgentSpec, Settings, resolve_provider
from conclave.engine.caching import prompt_cache_for
from conclave.engine.calls import CallOutcome
from conclave.engine.filtering import ArtifactFiltering
from conclave.engine.judge import JudgeSeat
from conclave.engine.labels import JudgeLabels
from conclave.engine.record import AGENTS_NOT_SHOWN, RECORD_ONLY, Record, prompt_json
from conclave.engine.rounds import Plan
from conclave.engine.settle import JUDGE_ROUNDS, skips_judge
from conclave.engine.strategy import Strategy
from conclave.events import ROUND_ARTIFACT, EventBus
from conclave.quality.exit import ExitLimits

if TYPE_CHECKING:
    from conclave.engine.quality import QualityLayer
    from conclave.engine.safety_gate import SafetyGuard
    from conclave.plugin_manager import Plugins
    from conclave.providers.base import ImagePart, PromptCache
    from conclave.providers.pool import ProviderPool
    from conclave.quality.summarize import ContextWindow


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


class Session:
    """What the rounds of one consultation share. Its layers — ``quality``, ``safety`` and ``context`` (what each
    call shows of earlier rounds, summarized in long debates) — are set by
    :func:`conclave.engine.session_layers.with_layers`."""

    quality: QualityLayer
    safety: SafetyGuard
    context: ContextWindow

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
        images: tuple[ImagePart, ...] = (),
    ) -> None:
        self.settings = settings
        self.plugins = plugins
        self.strategy = strategy
        self.pool = pool
        self.bus = bus
        self.labels = labels
        self.question = question
        self.context_text = context_text
        self.images = images  # attached images: sent only to seats whose model accepts images
        self.record = Record()
        # the aggregate decides after cross-examination and no judge verdict is asked for: the judge's record of
        # the exchange and its verdict are not played
        # the full debate (``rounds`` and ``quick`` not given) whose answer the aggregate decides, with no judge
        # verdict asked for, is the strategy's short plan; ``rounds=N`` plays the stages it names, the judge's too
        short = skips_judge(settings, strategy) and settings.rounds is None and not settings.quick
        types = (strategy.short_plan or [t for t in strategy.plan if t.name not in JUDGE_ROUNDS]) if short \
            else strategy.plan
        self.plan = Plan(types)
        #: rounds of the strategy's plan this one does not play: the round cap still counts them (quality.exit)
        self.rounds_not_played = len(Plan(strategy.plan).rounds()) - len(self.plan.rounds()) if short else 0
        self.plan.cut_to_stage(settings.planned_rounds)
        self.planned_rounds = len(self.plan.rounds())  # before any controller changes the plan
        self.agents = {name: AgentState(name, spec) for name, spec in settings.agents.items()}
        self.judge = JudgeSeat(settings, self.native)
        self.filtering = ArtifactFiltering(settings, plugins, bus)
        self.stream = False  # publish answers as they stream in (``agent:chunk``): the live view, the terminal
        self._prompt_cache: PromptCache | None = None
        self._prompt_cache_known = False

    def exit_limits(self) -> ExitLimits:
        """The exit controller's inputs: exit settings, whether cross-examination may repeat, the round cap."""
        return ExitLimits.of(self.settings, self.strategy.default_round_cap, self.rounds_not_played)

    def images_for(self, provider: str, model: str) -> tuple[ImagePart, ...]:
        """The attached images a call to ``provider``/``model`` carries: all of them when the model accepts images
        (its price sheet says ``vision: true``), none otherwise."""
        if not self.images or not self.pool.provider(provider).accepts_images(model):
            return ()
        return self.images

    @property
    def prompt_cache(self) -> PromptCache | None:
        """The caching hint every call of this consultation carries (None without a context)."""
        if not self._prompt_cache_known:
            self._prompt_cache, self._prompt_cache_known = prompt_cache_for(self), True
        return self._prompt_cache

    def native(self, provider: str) -> bool:
        """Whether ``provider``'s implementation honours a JSON schema natively (structured output)."""
        try:
            api, _ = resolve_provider(self.settings, provider, self.plugins)
            return bool(getattr(self.plugins.providers.get(api), "supports_structured_output", False))
        except KeyError:
            return False

    # --------------------------------------------------------------------------------- how agents see the panel

    def peer_labels(self, agent: str) -> JudgeLabels:
        """The labels ``agent`` sees the panel under: its own shuffled neutral labels (``anonymous_peers``), or
        persona names (a persona shared by several agents adds the agent's name)."""
        if self.settings.anonymous_peers:
            return self.labels.for_agent(agent)
        personas = {name: self.settings.personas[spec.persona].name if spec.persona in self.settings.personas
                    else name for name, spec in self.settings.agents.items()}
        shared = {p for p in personas.values() if list(personas.values()).count(p) > 1}
        return self.labels.named_view({n: f"{p} ({n})" if p in shared else p for n, p in personas.items()})

    def all_peer_labels(self) -> dict[str, dict[str, str]]:
        """Each agent's view of the panel (agent -> agent -> label), for the journal and the report."""
        return {name: dict(self.peer_labels(name).by_name) for name in self.settings.agents}

    @contextmanager
    def seen_by(self, agent: str) -> Iterator[None]:
        """Within: labels, the order agents are listed in and every artifact view are ``agent``'s own. Building a
        call's prompt is synchronous, so no other call is rendered meanwhile."""
        previous, self.labels = self.labels, self.peer_labels(agent)
        try:
            yield
        finally:
            self.labels = previous

    # --------------------------------------------------------------------------------- who takes part

    def present(self) -> list[str]:
        """Agents with a valid answer in the first round, in the judge's (shuffled) order."""
        first = self.record.by_agent(self.plan.types[0].name)
        return [name for name in self.labels.order() if name in first]

    def absent_notice(self) -> str:
        """One sentence for the judge: who is missing from the debate (by label), or that nobody is."""
        first = self.record.by_agent(self.plan.types[0].name)
        absent = [self.labels.label(n) for n in self.labels.order() if n not in first]
        silent = [self.labels.label(n) for n in self.record.missing_replies]
        parts = []
        if absent:
            parts.append(f"Absent: {', '.join(absent)} gave no valid answer in round 1 and take no part in the debate.")
        if silent:
            parts.append(f"{', '.join(silent)} did not reply in round {self._silent_round}.")
        return " ".join(parts) or "Every panel member is present."

    _silent_round = 0  # the round number of ``record.missing_replies``

    def note_missing(self, number: int, missing: list[str]) -> None:
        """Remember who did not answer agents' round ``number`` (after the first): the judge is told."""
        self.record.missing_replies, self._silent_round = missing, number

    # --------------------------------------------------------------------------------- what is shown

    def shown(self, artifact: dict[str, Any] | None, seat: str = "judge") -> str:
        """The labelled JSON of one stored artifact as the judge or an agent (``seat``) is shown it."""
        return prompt_json(self.view(artifact, seat) if artifact is not None else None)

    def view(self, artifact: dict[str, Any], seat: str = "judge") -> dict[str, Any]:
        """One stored artifact as later rounds see it: under labels, without its quality record — claims and
        references reach later rounds once, under their ids, in the DEBATE STATE block; checks stay in the record.
        Agents are not shown the synthesis' account of round-1 coverage (the claims behind it are in their block)."""
        hidden = RECORD_ONLY | AGENTS_NOT_SHOWN if seat == "agents" else RECORD_ONLY
        return {k: v for k, v in self.labels.judge_view(artifact).items() if k not in hidden}

    # --------------------------------------------------------------------------------- events

    def emit_artifact(
        self,
        round_number: int,
        schema: str,
        agent: str | None,
        artifact: dict[str, Any],
        raw_text: str,
        status: str,
        round_type: str | None = None,
    ) -> None:
        self.bus.emit(
            ROUND_ARTIFACT,
            round_number=round_number,
            round_type=round_type,
            artifact_type=artifact.get("artifact_type", schema),
            schema=schema,
            agent=agent,
            artifact=artifact,
            raw_text=raw_text,
            status=status,
        )
        self.safety.note_artifact(round_number, round_type or schema, agent, artifact)  # tier 1 on every answer
