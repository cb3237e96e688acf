"""The typed consultation result. ``ConsultationResult.as_dict()`` is the result JSON that renderers, the
journal (``consultation:completed``) and the index read; its keys are a storage contract like the events'."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Status = Literal["complete", "completed_degraded", "partial", "aborted", "blocked"]
SCHEMA_VERSION = "1.0"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class AgentRecord(_Frozen):
    name: str
    persona: str
    provider: str
    model: str
    label: str
    actual_provider: str | None
    actual_model: str | None
    substituted: bool
    absent: bool
    error: str | None
    raw_text: str | None = None  # the last unusable answer, kept so a failure can be audited
    anchor: str | None = None  # the perspective anchor it argued from (none in results from before anchors)


class JudgeRecord(_Frozen):
    provider: str
    model: str
    actual_provider: str | None
    actual_model: str | None
    fallback_used: bool


class Artifacts(_Frozen):
    round_1: dict[str, dict[str, Any]] = Field(default_factory=dict)
    round_2: dict[str, Any] | None = None
    round_3_replies: dict[str, dict[str, Any]] = Field(default_factory=dict)
    round_3: dict[str, Any] | None = None
    round_4: dict[str, Any] | None = None


class RoundRecord(_Frozen):
    """One step of the debate as it was played: its number, its round type, and what it produced — each agent's
    artifact (agents' seat, by name) or the judge's."""

    number: int
    round_type: str
    agents: dict[str, dict[str, Any]] = Field(default_factory=dict)
    judge: dict[str, Any] | None = None


#: the standard plan's rounds under the names of :class:`Artifacts`, to read a result written before ``rounds``
_STANDARD_ROUNDS = (("round_1", 1, "independent"), ("round_2", 2, "synthesis"),
                    ("round_3_replies", 3, "cross_exam_replies"), ("round_3", 3, "cross_exam"),
                    ("round_4", 4, "verdict"))


def rounds_from_artifacts(artifacts: Any) -> list[dict[str, Any]]:
    """The ``rounds`` of a result written before they existed, read from its ``artifacts`` (the standard plan)."""
    out: list[dict[str, Any]] = []
    if not isinstance(artifacts, dict):
        return out
    for key, number, round_type in _STANDARD_ROUNDS:
        value = artifacts.get(key)
        if not value:
            continue
        seat = {"agents": value} if key in ("round_1", "round_3_replies") else {"judge": value}
        out.append({"number": number, "round_type": round_type, **seat})
    return out


class EarlyTerminationRecord(_Frozen):
    offered: bool
    accepted: bool
    reason: str
    confidence: float
    threshold: float
    rounds_skipped: int
    estimated_cost_saved: float | None


class CostRecord(_Frozen):
    """Dollars. ``actual`` (and ``by_provider``, ``unknown_prices``) cover every billed provider attempt of the
    consultation across all its runs: after ``conclave resume``, what the interrupted runs spent is included.
    ``estimated`` is the pre-flight estimate of every planned round (restored rounds included), the figure the
    in-flight ``cost.abort_ratio`` check holds ``actual`` against; null when a price is unknown."""

    estimated: float | None
    actual: float
    unknown_prices: list[str]
    by_provider: dict[str, float]


class TokenRecord(_Frozen):
    """Tokens of every billed provider attempt across all runs of the consultation, like ``CostRecord.actual``."""

    input: int
    output: int
    cached_input: int
    total: int


class TransitionRecord(_Frozen):
    from_: str = Field(alias="from")
    to: str
    reason: str
    at: str


class ConsultationResult(_Frozen):
    """Everything one consultation produced and how; ``status`` says how far it got and how cleanly."""

    consultation_id: str
    schema_version: str = SCHEMA_VERSION
    question: str
    mode: str
    strategy: str
    status: Status
    created_at: str
    completed_at: str
    duration_s: float
    planned_rounds: int
    completed_rounds: int
    agents: list[AgentRecord]
    judge: JudgeRecord
    #: every step played, in play order (repeats and objection rounds included); ``artifacts`` keeps the latest of
    #: each standard round under its old name while callers move to ``rounds``
    rounds: list[RoundRecord] = Field(default_factory=list)
    artifacts: Artifacts
    verdict: dict[str, Any] | None
    #: the debate-quality record (anchors, checks per round and agent, debate state, metrics); None in results
    #: written before the layer existed
    quality: dict[str, Any] | None = None
    #: the safety evaluator's record (stage, tier reached, triggers, flags, evaluations, the block if any); None in
    #: results written before it existed
    safety: dict[str, Any] | None = None
    #: a critical objection round produced nothing new (``quality.groupthink``): a human should look at this
    #: result; the report opens with a banner saying so
    escalated: bool = False
    recommendation: str | None
    confidence: float | None
    dissent: list[dict[str, Any]]
    concerns: list[str]
    early_termination: EarlyTerminationRecord | None
    cost: CostRecord
    tokens: TokenRecord
    token_efficiency_stats: dict[str, Any] | None
    substitutions: list[dict[str, Any]]
    scrub_report: dict[str, Any]
    context_sources: list[dict[str, Any]]
    prompt_versions: dict[str, str]
    judge_labels: dict[str, str]
    shuffle_seed: int
    #: agent -> how it saw the panel (agent -> label): its own shuffled neutral labels, or persona names with
    #: ``anonymous_peers=false``; None in older results
    peer_labels: dict[str, dict[str, str]] | None = None
    #: answer changes in cross-examination and whether each counts for the aggregate
    #: (:func:`conclave.engine.conformity.effective_answers`); None when no agent answered in cross-examination
    anti_conformity: dict[str, Any] | None = None
    absent_agents: list[str]
    abort_reason: str | None
    config_hash: str
    transitions: list[TransitionRecord]
    #: why the debate ended (consensus|convergence|round-cap|user-stop|early-termination), rounds played, the
    #: cap, and each cross-examination round's exit decision (:mod:`conclave.quality.exit`); None in older results
    exit: dict[str, Any] | None = None
    #: the vote gate after round 1 (:mod:`conclave.engine.vote_gate`): decided or debated, with its inputs, the
    #: aggregator and its weights, and tau; None when the gate is off
    vote_gate: dict[str, Any] | None = None
    #: the answer decided after cross-examination from the answers that count (:mod:`conclave.engine.settle`,
    #: schema ``final_aggregate``): the aggregator, its weights, and the judge's verdict answer beside it; None
    #: when no aggregate decided (the vote gate did, anti-conformity is off, or no answer was cross-examined)
    final_aggregate: dict[str, Any] | None = None
    #: context tokens per round, with and without summarization (:mod:`conclave.quality.summarize`)
    context: dict[str, Any] | None = None
    #: the consultation this one follows up on (``parent=ID``); None for a fresh question and in older results
    parent: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _rounds_of_an_older_result(cls, data: Any) -> Any:
        if isinstance(data, dict) and "rounds" not in data and "artifacts" in data:
            return {**data, "rounds": rounds_from_artifacts(data["artifacts"])}
        return data

    def as_dict(self) -> dict[str, Any]:
        """The result JSON (snake_case keys; ``transitions`` items use ``from``/``to``)."""
        return self.model_dump(mode="json", by_alias=True)

    @property
    def ok(self) -> bool:
        return self.status in ("complete", "completed_degraded")
