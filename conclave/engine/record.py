"""The record of a consultation's artifacts as data: what each round type produced (real agent names, not
labels), which fields later rounds are not shown, the prompts' JSON form, and the completed rounds a resumed run
starts from. Every layer (quality, safety, context) reads these types; nothing here plays a round."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: artifact fields later rounds are not shown (the state block carries claims and evidence; the rest is record)
RECORD_ONLY = frozenset({"claims", "references", "alternatives", "failure_modes", "uncertainties", "retracts",
                         "verification"})
#: synthesis fields for the judge's later rounds only: how round 1 was covered matters to the verdict, while an agent
#: gets the claims those fields name in its DEBATE STATE block
AGENTS_NOT_SHOWN = frozenset({"partial_coverage", "unique_insights", "blind_spots"})


@dataclass
class RoundOutput:
    """What one round type produced the last time it was played: each agent's artifact, or the judge's."""

    number: int
    by_agent: dict[str, dict[str, Any]] = field(default_factory=dict)
    judge: dict[str, Any] | None = None
    missing: list[str] = field(default_factory=list)  # agents asked who gave no valid answer


@dataclass
class Record:
    """Everything the consultation has produced so far (names, not labels), by round type.

    ``outputs`` keeps the latest run of each round type; the ``round_*`` properties read the standard
    round types under the names the result and the report use.
    """

    outputs: dict[str, RoundOutput] = field(default_factory=dict)
    verdict: dict[str, Any] | None = None
    completed_rounds: int = 0
    early_termination: dict[str, Any] | None = None
    vote_gate: dict[str, Any] | None = None  # the vote gate's decision after round 1 (:mod:`.vote_gate`)
    final_aggregate: dict[str, Any] | None = None  # the answer decided after cross-examination (:mod:`.settle`)
    abort_reason: str | None = None
    #: present agents who gave no answer in the latest agents' round after the first (the judge is told)
    missing_replies: list[str] = field(default_factory=list)
    #: every step played or restored, in play order: (round type name, its output) — the result's ``rounds``
    played: list[tuple[str, RoundOutput]] = field(default_factory=list)

    def put(self, round_type: str, output: RoundOutput) -> RoundOutput:
        """Record what a step of ``round_type`` produced: the latest of its type, and one more step played."""
        self.outputs[round_type] = output
        self.played.append((round_type, output))
        return output

    def output(self, round_type: str) -> RoundOutput | None:
        return self.outputs.get(round_type)

    def by_agent(self, round_type: str) -> dict[str, dict[str, Any]]:
        out = self.outputs.get(round_type)
        return out.by_agent if out is not None else {}

    def judged(self, round_type: str) -> dict[str, Any] | None:
        out = self.outputs.get(round_type)
        return out.judge if out is not None else None

    @property
    def round_1(self) -> dict[str, dict[str, Any]]:
        return self.by_agent("independent")

    @property
    def round_2(self) -> dict[str, Any] | None:
        return self.judged("synthesis")

    @property
    def round_3_replies(self) -> dict[str, dict[str, Any]]:
        return self.by_agent("cross_exam_replies")

    @property
    def round_3(self) -> dict[str, Any] | None:
        return self.judged("cross_exam")

    @property
    def round_4(self) -> dict[str, Any] | None:
        return self.judged("verdict")


def prompt_json(obj: Any) -> str:
    """JSON as sent in prompts: compact separators (tokens cost money), non-ASCII kept readable."""
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def round_runs(source: Mapping[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Round number -> the artifact payloads of its completed run (either form of ``resume_from``)."""
    if source.get("rounds"):
        return {int(n): list(payloads) for n, payloads in source["rounds"].items() if payloads}
    runs: dict[int, list[dict[str, Any]]] = {}
    if source.get("round_1"):
        runs[1] = [{"agent": a, "artifact": x, "round_type": "independent"} for a, x in source["round_1"].items()]
    if source.get("round_2"):
        runs[2] = [{"agent": None, "artifact": source["round_2"], "round_type": "synthesis"}]
    if source.get("round_3"):
        replies = source.get("round_3_replies") or {}
        runs[3] = [{"agent": a, "artifact": x, "round_type": "cross_exam_replies"} for a, x in replies.items()]
        runs[3].append({"agent": None, "artifact": source["round_3"], "round_type": "cross_exam"})
    return runs
