"""What the views read from a consultation's journal records (the source of truth): its result (or, for a run
that never finished, a partial result rebuilt from its records), its artifacts in order, and its spending by round
and by provider. Only journal record payloads are read here, never engine internals."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

STARTED = "consultation:started"
COMPLETED = "consultation:completed"
ARTIFACT = "consultation:round_artifact"
ATTEMPT = "provider:attempt"
ROUND_STARTED = "round:started"
ROUND_COMPLETED = "round:completed"
ROUND_INTERRUPTED = "round:interrupted"
SUBSTITUTED = "consultation:provider_substituted"

ROUND_TYPES = {1: "independent", 2: "synthesis", 3: "cross_exam", 4: "verdict"}


@dataclass(frozen=True)
class ArtifactEntry:
    """One artifact of a round: ``agent`` is None for the judge's."""

    round_number: int
    kind: str  # schema name, the renderer key
    agent: str | None
    artifact: Mapping[str, Any]
    status: str = "valid"
    seq: int | None = None


def _data(record: Mapping[str, Any]) -> Mapping[str, Any]:
    data = record.get("data")
    return data if isinstance(data, Mapping) else {}


def result_from_records(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The last ``consultation:completed`` result; for a run without one (interrupted, or still running), a
    partial result rebuilt from its start record and artifacts, with ``status`` ``interrupted``."""
    for record in reversed(records):
        if record.get("type") == COMPLETED and isinstance(_data(record).get("result"), Mapping):
            return dict(_data(record)["result"])
    started = next((_data(r) for r in records if r.get("type") == STARTED), {})
    round_1: dict[str, Any] = {}
    replies: dict[str, Any] = {}
    judged: dict[int, Any] = {}
    for entry in artifact_entries(records):
        if entry.round_number == 1 and entry.agent:
            round_1[entry.agent] = entry.artifact
        elif entry.round_number == 3 and entry.agent:
            replies[entry.agent] = entry.artifact
        elif entry.agent is None:
            judged[entry.round_number] = entry.artifact
    done = [int(_data(r).get("round_number") or 0) for r in records
            if r.get("type") == ROUND_COMPLETED and _data(r).get("ok", True)]
    judge = _map(started.get("judge"))
    agents = [{"name": a.get("name"), "persona": a.get("persona"), "provider": a.get("provider"),
               "model": a.get("model"), "label": _map(started.get("judge_labels")).get(str(a.get("name"))),
               "absent": False, "substituted": False}
              for a in (_map(x) for x in _list(started.get("agents")))]
    verdict = judged.get(4)
    return {
        "consultation_id": records[0].get("consultation_id") if records else None,
        "question": started.get("question"),
        "mode": started.get("mode"),
        "strategy": started.get("strategy"),
        "status": "interrupted",
        "planned_rounds": started.get("planned_rounds"),
        "completed_rounds": max(done, default=0),
        "agents": agents,
        "judge": {"provider": judge.get("provider"), "model": judge.get("model")},
        "artifacts": {"round_1": round_1, "round_2": judged.get(2), "round_3_replies": replies,
                      "round_3": judged.get(3), "round_4": verdict},
        "verdict": verdict,
        "recommendation": _map(verdict).get("recommendation"),
        "confidence": _map(verdict).get("confidence"),
        "dissent": _list(_map(verdict).get("dissent")),
        "prompt_versions": started.get("prompt_versions"),
        "abort_reason": "the run never finished: `conclave resume "
                        f"{records[0].get('consultation_id') if records else 'ID'}` continues it",
        "cost": {"actual": sum(float(_data(r).get("cost") or 0) for r in records if r.get("type") == ATTEMPT)},
    }


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else []


def artifact_entries(records: Iterable[Mapping[str, Any]]) -> list[ArtifactEntry]:
    """Every artifact in journal order; a round run again after ``resume`` replaces the earlier run's artifacts."""
    latest: dict[tuple[int, str | None], ArtifactEntry] = {}
    for record in records:
        if record.get("type") != ARTIFACT:
            continue
        d = _data(record)
        artifact = d.get("artifact")
        if not isinstance(artifact, Mapping):
            continue
        entry = ArtifactEntry(int(d.get("round_number") or 0), str(d.get("schema") or d.get("artifact_type") or ""),
                              d.get("agent"), artifact, str(d.get("status") or "valid"), record.get("seq"))
        latest.pop((entry.round_number, entry.agent), None)  # re-insert: a re-run round moves to its new place
        latest[(entry.round_number, entry.agent)] = entry
    return sorted(latest.values(), key=lambda e: (e.round_number, e.agent is None, e.seq or 0))


def entries_from_result(result: Mapping[str, Any]) -> list[ArtifactEntry]:
    """The artifacts of a result dict (no journal at hand), in round order, agents before the judge."""
    artifacts = _map(result.get("artifacts"))
    entries = [ArtifactEntry(1, "independent", str(name), a)
               for name, a in _map(artifacts.get("round_1")).items() if isinstance(a, Mapping)]
    if isinstance(artifacts.get("round_2"), Mapping):
        entries.append(ArtifactEntry(2, "synthesis", None, artifacts["round_2"]))
    for name, reply in _map(artifacts.get("round_3_replies")).items():
        if isinstance(reply, Mapping):
            kind = "cross_exam_reply_explore" if "refined_position" in reply else "cross_exam_reply"
            entries.append(ArtifactEntry(3, kind, str(name), reply))
    if isinstance(artifacts.get("round_3"), Mapping):
        entries.append(ArtifactEntry(3, "cross_exam", None, artifacts["round_3"]))
    verdict = artifacts.get("round_4")
    if isinstance(verdict, Mapping):
        entries.append(ArtifactEntry(4, "verdict_explore" if "recommendations" in verdict else "verdict", None,
                                     verdict))
    return entries


def round_types(records: Iterable[Mapping[str, Any]]) -> dict[int, str]:
    types = dict(ROUND_TYPES)
    for record in records:
        if record.get("type") == ROUND_STARTED:
            d = _data(record)
            types[int(d.get("round_number") or 0)] = str(d.get("round_type") or "")
    return types


@dataclass
class Spend:
    calls: int = 0
    failed: int = 0
    hedged: int = 0
    retries: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0
    unknown_cost: int = 0
    seconds: float = 0.0

    def add(self, d: Mapping[str, Any]) -> None:
        self.calls += 1
        self.failed += d.get("outcome") not in ("ok", "cancelled")
        self.hedged += bool(d.get("hedge"))
        self.retries += int(d.get("number") or 1) > 1
        self.input_tokens += int(d.get("input_tokens") or 0)
        self.output_tokens += int(d.get("output_tokens") or 0)
        if isinstance(d.get("cost"), int | float):
            self.cost += float(d["cost"])
        else:
            self.unknown_cost += 1


def spending(records: Iterable[Mapping[str, Any]]) -> tuple[dict[int, Spend], dict[str, Spend]]:
    """Every billed provider attempt summed by round number and by provider (hedges and retries included)."""
    records = list(records)
    by_round: dict[int, Spend] = {}
    by_provider: dict[str, Spend] = {}
    for record in records:
        if record.get("type") != ATTEMPT:
            continue
        d = _data(record)
        by_round.setdefault(int(d.get("round_number") or 0), Spend()).add(d)
        by_provider.setdefault(str(d.get("provider") or "?"), Spend()).add(d)
    for record in records:
        if record.get("type") in (ROUND_COMPLETED, ROUND_INTERRUPTED):
            d = _data(record)
            spend = by_round.setdefault(int(d.get("round_number") or 0), Spend())
            spend.seconds += float(d.get("duration_s") or 0)
    return by_round, by_provider


def attempts(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [_data(r) for r in records if r.get("type") == ATTEMPT]


__all__ = ["ArtifactEntry", "Spend", "artifact_entries", "attempts", "entries_from_result", "result_from_records",
           "round_types", "spending"]
