"""Typed settings: the composed Hydra config validated once by pydantic. The rest of conclave sees only these.

Every model forbids extra keys, so a typo (``+filtering.round3.tension=1``) fails instead of being ignored.
:func:`settings_from_container` turns pydantic's errors into one line per problem naming the key and what is
allowed; the CLI prints them and exits 2.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from conclave.config.home import default_home
from conclave.errors import ConfigError

NonNegInt = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")]


class StrictModel(BaseModel):
    # The docstrings under fields document them (conf/config.yaml's comments are generated from them by
    # conclave.config.defaults_yaml); pydantic does not read them (use_attribute_docstrings reads each model's
    # source at import, about 0.1 s of every start).
    model_config = ConfigDict(extra="forbid", frozen=True)


class AgentSpec(StrictModel):
    """One panel member: which persona it plays and which provider/model answers for it."""

    persona: Name
    provider: Name
    model: Annotated[str, Field(min_length=1)]


class JudgeSpec(StrictModel):
    provider: Name
    model: Annotated[str, Field(min_length=1)]


class Persona(StrictModel):
    name: Annotated[str, Field(min_length=1)]
    focus: Annotated[str, Field(min_length=1)]


class ProviderSettings(StrictModel):
    """An endpoint: ``api`` names the registered implementation, keys come from ``api_key_env``.

    ``send_key`` says where the key may go: ``official`` only to the vendor's own host over https (a custom ``base_url``
    such as Ollama or a proxy gets no key), ``always`` also to a custom ``base_url``, ``never`` nowhere.
    ``structured_output`` is how an artifact's schema is asked for: ``auto`` negotiates it per (base URL, model),
    the other values force one form. ``max_concurrency`` caps the calls in flight to the endpoint (``null``: 1 for a
    server on this machine or the local network, unlimited otherwise; ``0``: unlimited).
    """

    api: Name
    base_url: Annotated[str, Field(pattern=r"^(https?://|local:|file:)")] | None = None
    api_key_env: list[Annotated[str, Field(pattern=r"^[A-Z_][A-Z0-9_]*$")]] = Field(default_factory=list)
    send_key: Literal["official", "always", "never"] = "official"
    timeout_s: Annotated[float, Field(gt=0, le=3600)] = 120.0
    max_attempts: Annotated[int, Field(ge=1, le=10)] = 3
    structured_output: Literal["auto", "json_schema", "json_object", "prompt", "off"] = "auto"
    max_concurrency: Annotated[int, Field(ge=0, le=1024)] | None = None
    #: prompt-caching hints: ``auto`` where the endpoint is known to take them, ``on`` also on a custom base_url,
    #: ``off`` none
    prompt_cache: Literal["auto", "on", "off"] = "auto"
    #: lengths added to the schema a grammar server (not a vendor's host) compiles: ``cap`` bounds arrays,
    #: ``fit`` also fits arrays and strings to each call's max_tokens (for tiny models that loop), ``off`` none
    grammar_lengths: Literal["cap", "fit", "off"] = "cap"
    model_path: str | None = None
    #: the vendor's batch API (``conclave eval eval.batch=…``): ``auto`` on the vendor's own host only, ``on`` also
    #: on a custom base_url that speaks it (a proxy, the fake server), ``off`` never
    batch_api: Literal["auto", "on", "off"] = "auto"

    @field_validator("base_url")
    @classmethod
    def _no_password_in_url(cls, value: str | None) -> str | None:
        # the configuration is journaled and indexed (resume rebuilds a run from it), so a credential in the URL
        # would be stored verbatim; keys come from the environment only
        if value is not None and "@" in value.split("://", 1)[-1].split("/", 1)[0]:
            raise ValueError("must not carry user info or credentials (user:password@); the configuration is "
                             "journaled — give the key through api_key_env (with send_key=always for a custom host)")
        return value

    @field_validator("model_path")
    @classmethod
    def _model_file_exists(cls, value: str | None) -> str | None:
        # checked here, before anything runs: a typo in a path is a configuration error, not an aborted consultation
        if value is not None and not Path(value).expanduser().is_file():
            raise ValueError(f"no such model file: {value}")
        return value

    @field_validator("api_key_env", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class ModeSettings(StrictModel):
    strategy: Name
    options: dict[str, Any] = Field(default_factory=dict)


class Round3Filter(StrictModel):
    consensus_points: NonNegInt = 3
    tensions: NonNegInt = 2


class Round4Filter(StrictModel):
    consensus_points: NonNegInt = 3
    tensions: NonNegInt = 2
    challenges: NonNegInt = 5
    rebuttals: NonNegInt = 5


class RepliesFilter(StrictModel):
    """Agents' replies of a cross-examination round shown again in a later round, to others than their author."""

    challenges: NonNegInt = 1


class FilteringSettings(StrictModel):
    """Filtering limits by section: ``round3``, ``round4`` and ``replies`` for the built-in rounds; a section a
    plugin's round type names (:attr:`conclave.engine.rounds.Input.filtered`) is an extra key mapping array fields
    to limits, checked against the strategy's plan in :func:`check_against_plugins`."""

    model_config = ConfigDict(extra="allow", frozen=True)

    enabled: bool = True
    """false: later rounds see earlier artifacts whole (higher token cost); display is verbose's"""
    filter: Name = "top_n"
    """a registered artifact filter"""
    round3: Round3Filter = Field(default_factory=Round3Filter)
    """What the round-3 agents see of the synthesis."""
    round4: Round4Filter = Field(default_factory=Round4Filter)
    """What the round-4 judge sees of synthesis and cross-examination."""
    replies: RepliesFilter = Field(default_factory=RepliesFilter)
    """An agent's cross-examination reply shown again in a later round (a repeat, the verdict's history) to others
    than its author: its most severe challenges; the judge's record of that round follows it. The judge recording a
    round, and the author, always see the reply whole."""

    @model_validator(mode="after")
    def _plugin_sections_are_limits(self) -> FilteringSettings:
        for key, value in (self.model_extra or {}).items():
            if not isinstance(value, dict) or not all(
                    isinstance(f, str) and isinstance(n, int) and not isinstance(n, bool) and n >= 0
                    for f, n in value.items()):
                raise ValueError(f"filtering.{key}: a filter section maps array fields to limits, e.g. "
                                 f"+filtering.{key}.consensus_points=3 (got {value!r})")
        return self

    def section(self, name: str) -> dict[str, int]:
        """The limits of ``filtering.<name>`` (empty for a section nobody set)."""
        if name in type(self).model_fields:
            limits = getattr(self, name)
            return dict(limits.model_dump()) if isinstance(limits, BaseModel) else {}
        return dict((self.model_extra or {}).get(name) or {})


class EarlyTermination(StrictModel):
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] = 0.90
    """mean consensus confidence after round 2 that offers skipping rounds 3-4"""
    non_interactive: Literal["accept", "decline"] = "accept"
    """accept | decline, when there is no terminal to ask"""


class SelectiveSettings(StrictModel):
    """The vote gate after round 1: decide on the aggregated answer when the panel agrees, else debate."""

    enabled: bool | None = None
    """null = the mode's default (true in mode=answer, false elsewhere)"""
    tau: Annotated[float, Field(ge=0.0, le=1.0)] = 0.8
    """weighted agreement needed to decide after round 1 (0-1)"""
    judge_verdict: bool = False
    """when the aggregate of the answers that count decides after cross-examination (anti_conformity on): also ask the
    judge for a verdict, kept beside the aggregate"""

    @field_validator("tau", mode="before")
    @classmethod
    def _tau(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"selective.tau: must be a number from 0 to 1 (got {value!r})")
        return value


class ExitSettings(StrictModel):
    """When repeated cross-examination stops: consensus, a convergence plateau, or the round cap."""

    consensus: Annotated[float, Field(ge=0.0, le=1.0)] = 0.80
    """share of ACCEPT or MINOR votes, with no BLOCKER and ..."""
    min_confidence: Annotated[float, Field(ge=0.0, le=1.0)] = 0.70
    """... every agent at least this confident"""
    plateau_delta: Annotated[float, Field(ge=0.0, le=1.0)] = 0.10
    """a round that moves votes, confidence and positions less than this is flat ..."""
    plateau_rounds: Annotated[int, Field(ge=1, le=5)] = 1
    """... this many flat rounds in a row without a new FACT claim: converged (1: cross-examination repeats only while
    the panel moves)"""
    round_cap: Annotated[int, Field(ge=2, le=12)] | None = None
    """rounds in all, the verdict included; null = the mode's default (answer: 4, i.e. one cross-examination round;
    other modes: 6)"""
    override: Literal["auto", "continue"] = "auto"
    """auto | continue (ignore consensus and convergence; repeat up to the cap)"""


class SummarizationSettings(StrictModel):
    """Progressive summarization of long debates: which rounds a prompt shows in full, summarized or merged."""

    enabled: bool = True
    from_round: Annotated[int, Field(ge=2, le=12)] = 5
    """rounds from this one on get summarized context"""
    summary_tokens: Annotated[int, Field(ge=50, le=1000)] = 300
    """one earlier round's structured summary"""
    budget_tokens: Annotated[int, Field(ge=1000, le=100_000)] = 8000
    """one call's user message"""


class CostSettings(StrictModel):
    always_allow_under: Annotated[float, Field(ge=0.0)] = 0.50
    """dollars; estimates under this go ahead without asking"""
    auto_approve: bool = False
    """true never asks"""
    abort_ratio: Annotated[float, Field(ge=1.0)] = 1.5
    """abort in flight when actual cost exceeds this multiple of the estimate"""


class HedgingSettings(StrictModel):
    enabled: bool = True
    hedge_after_s: Annotated[float, Field(gt=0)] | None = None
    """null = 1.5 × the model's p90 latency, remembered across runs in $CONCLAVE_HOME/hedging.json (never below
    floor_s); a model without history: 3 × the slowest call that has answered in its round (or consultation), 10 s
    until one has"""
    floor_s: Annotated[float, Field(gt=0)] = 0.5
    budget: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05
    """hedge tokens earned per call started: the long-run share of extra calls"""
    burst: Annotated[float, Field(ge=1.0, le=100.0)] = 8.0
    """the most tokens held (a new home starts full): hedges ≤ burst + budget × calls"""


class OutputSettings(StrictModel):
    format: Literal["markdown", "json", "both", "html"] = "markdown"
    """markdown | json | both | html (one self-contained HTML document)"""
    progress: Literal["auto", "plain", "quiet"] = "auto"
    """auto (live on a terminal, plain lines when piped) | plain | quiet"""


ANCHOR_NAMES = ("Risk-Attentive", "Implementation-Focused", "Evidence-Calibrated", "Systems-Aware")


class SafetyPatterns(StrictModel):
    """Patterns added to the safety evaluator's built-in rules (case-insensitive Python regexes)."""

    block: dict[Name, list[str]] = Field(default_factory=dict)
    """tier 1 by category, e.g. +quality.safety.patterns.block.weapons=['...']"""
    topic: list[str] = Field(default_factory=list)
    """tier 2: the question's topic"""
    intent: list[str] = Field(default_factory=list)
    """tier 2: the asker's intent (question and responses)"""
    context: list[str] = Field(default_factory=list)
    """tier 2: what the material contains (context and responses)"""

    @model_validator(mode="after")
    def _patterns_compile(self) -> SafetyPatterns:
        lists = [(f"block.{k}", v) for k, v in self.block.items()]
        lists += [(kind, getattr(self, kind)) for kind in ("topic", "intent", "context")]
        for key, patterns in lists:
            for pattern in patterns:
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise ValueError(f"quality.safety.patterns.{key}: {pattern!r} is not a valid regular "
                                     f"expression ({exc})") from None
        return self


class SafetyThresholds(StrictModel):
    block_risk: Annotated[float, Field(ge=0.0, le=1.0)] = 0.7
    """a full evaluation with risk >= this blocks (0-1)"""
    concern_risk: Annotated[float, Field(ge=0.0, le=1.0)] = 0.4
    """risk >= this is reported as a concern (0-1, <= block_risk)"""

    @model_validator(mode="after")
    def _ordered(self) -> SafetyThresholds:
        if self.concern_risk > self.block_risk:
            raise ValueError(f"quality.safety.thresholds.concern_risk: must not exceed block_risk "
                             f"({self.block_risk}), got {self.concern_risk}")
        return self


class SafetySettings(StrictModel):
    """The three-tier safety evaluator (:mod:`conclave.quality.safety_rules`, :mod:`conclave.engine.safety_gate`)."""

    enabled: bool = True
    stage: Literal["shadow", "on"] | None = None
    """null (follow quality.stage; on if unset) | shadow (record, never block) | on"""
    max_tier: Annotated[int, Field(ge=1, le=3)] = 3
    """1 patterns only | 2 + triggers recorded | 3 + the judge's full evaluation"""
    tier1_action: Literal["block", "evaluate"] = "block"
    """block | evaluate (a tier-1 hit asks the judge before blocking)"""
    modes: list[Name] = Field(default_factory=lambda: ["adversarial", "devils_advocate"])
    """debate modes that always get a full evaluation"""
    patterns: SafetyPatterns = Field(default_factory=SafetyPatterns)
    """Added to the built-in rules (case-insensitive Python regexes)."""
    thresholds: SafetyThresholds = Field(default_factory=SafetyThresholds)
    on_evaluation_failure: Literal["allow", "block"] = "allow"
    """allow | block: when the judge gives no usable evaluation"""
    max_tokens: Annotated[int, Field(ge=128, le=4096)] = 1024
    """output budget of one full evaluation (128-4096)"""


Ratio = Annotated[float, Field(ge=0, le=1)]


class StagnationSettings(StrictModel):
    """Stagnation fires when, for ``consecutive_rounds`` agents' rounds in a row, each compared with the one
    before: new FACT claims per agent < ``new_facts_per_agent``, mean |confidence change| <
    ``confidence_change`` and the standard deviation of the agents' stances < ``stance_std``."""

    new_facts_per_agent: Annotated[float, Field(ge=0)] = 1.0
    confidence_change: Ratio = 0.10
    stance_std: Ratio = 0.15
    consecutive_rounds: Annotated[int, Field(ge=1, le=10)] = 2


class EarlyConvergenceSettings(StrictModel):
    """Early convergence fires on an agents' round numbered ≤ ``by_round`` when at least
    ``high_confidence_ratio`` of the agents are at confidence ≥ ``confidence`` and the diversity gate fails:
    fewer than ``min_sources`` distinct sources, premise overlap > ``max_premise_overlap``, or fewer than
    ``min_clusters`` semantic clusters."""

    by_round: Annotated[int, Field(ge=1, le=10)] = 2
    high_confidence_ratio: Ratio = 0.75
    confidence: Ratio = 0.85
    min_sources: NonNegInt = 3
    max_premise_overlap: Ratio = 0.70
    min_clusters: Annotated[int, Field(ge=1, le=5)] = 2


class GroupthinkSettings(StrictModel):
    """The groupthink detectors and the critical objection round they trigger (:mod:`conclave.quality.groupthink`).

    The similarity cut-offs belong to the offline measure of :mod:`conclave.quality.similarity`: two premises
    match at ``match_similarity``, positions share a cluster at ``cluster_similarity`` (mean cosine), and a claim
    is new when no earlier claim, position or key point reaches ``novelty_similarity``."""

    enabled: bool = True
    stagnation: StagnationSettings = Field(default_factory=StagnationSettings)
    """Fires after consecutive_rounds agents' rounds in a row below all three figures."""
    early_convergence: EarlyConvergenceSettings = Field(default_factory=EarlyConvergenceSettings)
    """Fires by round by_round: most agents very confident and the diversity gate fails."""
    match_similarity: Ratio = 0.3
    """TF-IDF cosine at which two premises match (premise overlap)"""
    cluster_similarity: Ratio = 0.35
    """mean cosine at which positions share a semantic cluster"""
    novelty_similarity: Ratio = 0.5
    """a claim at least this close to an earlier one is not new"""
    max_objection_rounds: Annotated[int, Field(ge=0, le=4)] = 2
    """at most this many objection rounds per consultation (0-4)"""


class QualitySettings(StrictModel):
    """The debate-quality layer: perspective anchors, the opt-in high-stakes question, the state block's size,
    the rollout stage and the groupthink detectors."""

    stage: Literal["shadow", "on"] = "on"
    """on | shadow: shadow runs every detector and records what it would do (journal and index), changing nothing"""
    groupthink: GroupthinkSettings = Field(default_factory=GroupthinkSettings)
    """Detectors run after every round; a firing inserts a critical objection round."""
    anchors: str | dict[str, str] = "auto"
    """auto (round-robin) | none | {agent: Risk-Attentive|Implementation-Focused|Evidence-Calibrated|Systems-Aware}"""
    high_stakes: Literal["security", "medical-legal", "agentic", "safety-critical"] | None = None
    """null | security | medical-legal | agentic | safety-critical: adds verification question HS1"""
    state_tokens: Annotated[int, Field(ge=200, le=2000)] = 2000
    """the DEBATE STATE block shown to round-3 prompts stays under this many tokens (200-2000)"""
    safety: SafetySettings = Field(default_factory=SafetySettings)
    """The three-tier safety evaluator: 1 patterns on every response, 2 triggers (mode/topic/intent/context), 3 a full
    evaluation by the judge seat when triggered. Blocked content ends the consultation as `blocked`."""

    @field_validator("anchors", mode="before")
    @classmethod
    def _anchors(cls, value: Any) -> Any:
        allowed = ", ".join(ANCHOR_NAMES)
        if isinstance(value, str) and value in ("auto", "none"):
            return value
        if isinstance(value, dict) and value and all(
            isinstance(k, str) and v in ANCHOR_NAMES for k, v in value.items()
        ):
            return dict(value)
        raise ValueError(f"quality.anchors: must be auto, none or {{agent: anchor}} with anchors from {allowed}"
                         f" (got {value!r})")


class Settings(StrictModel):
    """The whole validated configuration of one consultation."""

    question: Annotated[str, Field(min_length=1)]
    agents: dict[Name, AgentSpec]
    judge: JudgeSpec
    personas: dict[Name, Persona]
    providers: dict[Name, ProviderSettings]
    mode: ModeSettings
    rounds: Annotated[int, Field(ge=1, le=4)] | None = None
    """null = the full debate (cross-examination may repeat, see exit.*); or exactly 1 independent · 2 +synthesis · 3
    +cross-examination · 4 +verdict"""
    quick: bool = False
    """true: an alias of rounds=2 (independent + synthesis; fewer if rounds asks)"""
    verbose: bool = False
    """true prints more progress (estimates, filter details); filtering is filtering.enabled"""
    strict_models: bool = False
    """true: any provider substitution is an error naming the agent and both models"""
    scrub: bool = True
    """scrub secrets from the question and context before anything is sent"""
    anonymous_peers: bool = True
    """agents see each other under neutral labels (Agent A…) in an order shuffled per agent; false: by persona name (the
    judge always sees neutral labels)"""
    anti_conformity: bool | None = None
    """a cross-examination answer change counts for the final aggregate only if the reply cites a claim/evidence id
    others accepted or a new source; null = the mode's default (true in mode=answer, false elsewhere)"""
    live: bool = False
    """true: serve a live web view of this consultation on 127.0.0.1 and print its URL"""
    live_port: Annotated[int, Field(ge=0, le=65535)] = 0
    """the live view's port (0: any free port)"""
    context: list[str] = Field(default_factory=list)
    """files whose contents join the prompt"""
    project: str | None = None
    """a directory summarised into the prompt (bounded)"""
    filtering: FilteringSettings = Field(default_factory=FilteringSettings)
    early_termination: EarlyTermination = Field(default_factory=EarlyTermination)
    cost: CostSettings = Field(default_factory=CostSettings)
    hedging: HedgingSettings = Field(default_factory=HedgingSettings)
    output: OutputSettings = Field(default_factory=OutputSettings)
    quality: QualitySettings = Field(default_factory=QualitySettings)
    exit: ExitSettings = Field(default_factory=ExitSettings)
    """When repeated cross-examination (rounds=null) stops and the verdict follows."""
    summarization: SummarizationSettings = Field(default_factory=SummarizationSettings)
    """Long debates: prompts from round from_round on summarize older rounds."""
    selective: SelectiveSettings = Field(default_factory=SelectiveSettings)
    """The vote gate after round 1: when the panel agrees (weighted agreement >= tau, nobody backing the answer below
    exit.min_confidence, no BLOCKER) the aggregated answer decides and no debate runs; otherwise the debate runs."""
    aggregator: Name | None = None
    """plurality | confidence | learned | judge_pick (any registered aggregator); null = the mode's default (answer:
    confidence; other modes: plurality)"""
    parent: str | None = None
    """A follow-up: the consultation (id or unique prefix) this one continues; its panel and mode are kept unless
    overridden, and the panel sees its verdict, dissent and debate state."""
    home: Path = Field(default_factory=lambda: default_home())

    @model_validator(mode="before")
    @classmethod
    def _quick_is_two_rounds(cls, data: Any) -> Any:
        """``quick=true`` is an alias of ``rounds=2`` (or fewer rounds when ``rounds`` asks for them): one code path."""
        if isinstance(data, dict) and data.get("quick") is True:
            rounds = data.get("rounds")
            return {**data, "rounds": min(rounds, 2) if isinstance(rounds, int) else 2}
        return data

    @model_validator(mode="before")
    @classmethod
    def _judge_from_panel(cls, data: Any) -> Any:
        """A judge left null (wholly or in part) is the provider and model most agents use, the first agent's on a
        tie; a given half narrows the choice to the agents that share it."""
        if not isinstance(data, dict) or not isinstance(data.get("agents"), dict):
            return data
        judge = data.get("judge") or {}
        if not isinstance(judge, dict):
            return data
        provider, model = judge.get("provider"), judge.get("model")
        if provider is not None and model is not None:
            return data
        seats = [(a.get("provider"), a.get("model")) for a in data["agents"].values() if isinstance(a, dict)]
        candidates = [s for s in seats if provider in (None, s[0]) and model in (None, s[1])]
        if not candidates:
            given, missing = ("provider", "model") if provider is not None else ("model", "provider")
            raise ValueError(f"judge.{missing}: required, since no agent uses judge.{given} "
                             f"{provider if provider is not None else model!r}")
        best = max(candidates, key=lambda s: (candidates.count(s), -candidates.index(s)))
        return {**data, "judge": {**judge, "provider": best[0], "model": best[1]}}

    @field_validator("parent", mode="before")
    @classmethod
    def _parent_is_an_id(cls, value: Any) -> Any:
        # it names a journal file: the id alphabet only, so it can never leave the journal directory
        if value is not None and not (isinstance(value, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}",
                                                                               value)):
            raise ValueError("parent: must be a consultation id or unique prefix (letters, digits, '_', '.', '-'); "
                             "`conclave logs list` shows them")
        return value

    @field_validator("agents")
    @classmethod
    def _panel_size(cls, agents: dict[str, AgentSpec]) -> dict[str, AgentSpec]:
        if not 2 <= len(agents) <= 5:
            names = ", ".join(agents) or "none"
            raise ValueError(f"a panel needs 2 to 5 agents, got {len(agents)} ({names})")
        return agents

    @field_validator("home", mode="before")
    @classmethod
    def _home_or_default(cls, value: Any) -> Any:
        if value in (None, ""):
            return default_home()
        return Path(str(value)).expanduser()

    @model_validator(mode="after")
    def _references_resolve(self) -> Settings:
        for name, agent in self.agents.items():
            if agent.persona not in self.personas:
                raise ValueError(
                    f"agents.{name}.persona: unknown persona {agent.persona!r}; allowed: "
                    + ", ".join(sorted(self.personas))
                )
        anchors = self.quality.anchors
        if isinstance(anchors, dict) and set(anchors) - set(self.agents):
            unknown = ", ".join(sorted(set(anchors) - set(self.agents)))
            raise ValueError(f"quality.anchors: unknown agent(s) {unknown}; allowed: {', '.join(self.agents)}")
        return self

    @property
    def planned_rounds(self) -> int:
        """How many rounds this run is configured for (``quick`` has already become ``rounds=2``)."""
        return 4 if self.rounds is None else self.rounds

    @property
    def may_repeat(self) -> bool:
        """Whether cross-examination may repeat: only in the full debate (``rounds`` not given)."""
        return self.rounds is None


def _describe_error(err: dict[str, Any]) -> str:
    loc = ".".join(str(part) for part in err["loc"] if part not in ("function-after", "function-before"))
    msg: str = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown key (check the spelling; `conclave --cfg job` shows every key)"
    if err["type"] == "missing":
        if loc == "question":
            return 'question: missing — pass the question as the first argument, e.g. conclave "Should we …?"'
        return f"{loc}: required key is missing"
    got = err.get("input")
    if isinstance(got, str):  # a credential in a URL is never echoed
        got = re.sub(r"(://)[^/@\s]*@", r"\1***@", got)
    shown = f" (got {got!r})" if got is not None and not isinstance(got, dict | list) else ""
    if re.match(r"^[\w.]+: ", msg) and (not loc or msg.startswith(f"{loc}")):  # validator named its key
        return msg
    return f"{loc or 'config'}: {msg[0].lower() + msg[1:]}{shown}"


def settings_from_container(data: dict[str, Any]) -> Settings:
    """Validate a plain (resolved) config mapping; raise :class:`ConfigError` with one line per problem."""
    data = {k: v for k, v in data.items() if k != "hydra"}
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_describe_error(dict(e)) for e in exc.errors()]) from None


def settings_from_dictconfig(cfg: Any) -> Settings:
    """Resolve a composed DictConfig (``${...}`` in *our* YAML only; the question is escaped) and validate it."""
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        key = getattr(exc, "full_key", "") or "value"
        if key == "question":
            raise ConfigError([_describe_error({"type": "missing", "loc": ("question",), "msg": ""})]) from None
        raise ConfigError([f"{key}: required key is missing"]) from None
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or "config"
        raise ConfigError([f"{key}: {str(exc).splitlines()[0]}"]) from None
    assert isinstance(container, dict)
    return settings_from_container(container)  # type: ignore[arg-type]


def resolve_provider(settings: Settings, name: str, plugins: Any) -> tuple[str, ProviderSettings]:
    """The implementation name and endpoint settings for provider ``name`` as an agent or judge names it.

    A name configured under ``providers`` uses its ``api``; a bare registered provider (e.g. a plugin's) runs
    with its defaults.
    """
    if name in settings.providers:
        endpoint = settings.providers[name]
        return endpoint.api, endpoint
    if name in plugins.providers:
        return name, ProviderSettings(api=name)
    raise KeyError(name)


def check_against_plugins(settings: Settings, plugins: Any) -> None:
    """Check every name the config uses against what the loaded plugins registered (and plugin option models)."""
    problems: list[str] = []
    strategies, filters, providers = plugins.strategies, plugins.filters, plugins.providers

    def allowed(names: list[str]) -> str:
        return ", ".join(names) if names else "(none registered; check CONCLAVE_PLUGINS)"

    if settings.mode.strategy not in strategies:
        problems.append(
            f"mode.strategy: {settings.mode.strategy!r} is not a registered strategy; "
            f"allowed: {allowed(strategies.names())}"
        )
    else:
        problems += _check_options(strategies.get(settings.mode.strategy), settings.mode.options, "mode.options")
        declared = {s for t in getattr(strategies.get(settings.mode.strategy), "plan", ()) for s in t.filter_sections}
        sections = sorted({*FilteringSettings.model_fields, *declared} - {"enabled", "filter"})
        for key in sorted(set(settings.filtering.model_extra or {}) - declared):
            problems.append(f"filtering.{key}: unknown section; allowed: {', '.join(sections)}")
    aggregators = plugins.registries.get("aggregators")
    if settings.aggregator is not None and aggregators is not None and settings.aggregator not in aggregators:
        problems.append(
            f"aggregator: {settings.aggregator!r} is not a registered aggregator; "
            f"allowed: {allowed(aggregators.names())}"
        )
    if settings.filtering.filter not in filters:
        problems.append(
            f"filtering.filter: {settings.filtering.filter!r} is not a registered filter; "
            f"allowed: {allowed(filters.names())}"
        )
    for key, endpoint in settings.providers.items():
        if endpoint.api not in providers:
            problems.append(
                f"providers.{key}.api: {endpoint.api!r} is not a registered provider; "
                f"allowed: {allowed(providers.names())}"
            )
    known = sorted(set(settings.providers) | set(providers.names()))
    users = [(f"agents.{n}.provider", a.provider) for n, a in settings.agents.items()]
    users.append(("judge.provider", settings.judge.provider))
    for key, name in users:
        if name not in settings.providers and name not in providers:
            problems.append(f"{key}: unknown provider {name!r}; allowed: {allowed(known)}")
    if problems:
        raise ConfigError(problems)


def _check_options(plugin_cls: Any, options: dict[str, Any], key: str) -> list[str]:
    model = getattr(plugin_cls, "Options", None)
    if model is None:
        return [f"{key}.{k}: unknown option (this plugin takes none)" for k in options]
    try:
        model.model_validate(options)
    except ValidationError as exc:
        return [_describe_error({**dict(e), "loc": (*key.split("."), *e["loc"])}) for e in exc.errors()]
    return []
