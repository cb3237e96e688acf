"""Reconstruct what ``conclave resume`` hands the engine from a consultation's journal.

The recorded config (``consultation:started``) is revalidated into :class:`~conclave.config.settings.Settings`; rounds
that ran to their end successfully give back their artifacts (the last run of each round wins, see
:func:`completed_round_artifacts`); a round that was cancelled, stopped or failed is run again. The cost already
spent is summed over every recorded provider attempt, finished rounds or not, because all of it was billed; the
engine adds it to the resumed run's cost (result and abort-ratio check).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from conclave import events as ev
from conclave.config.settings import Settings, settings_from_container
from conclave.errors import ConclaveError, UsageError
from conclave.store.heads import HeadsLog
from conclave.store.journal import JournalError, is_being_written, last_record, read_journal
from conclave.store.journal_file import expand_records
from conclave.store.paths import StoreLayout
from conclave.store.verify import RESUMABLE_STATUSES, check_journal, headed_lines

#: valid round-1 answers a debate needs (the engine stops on fewer, so such a round 1 is never worth restoring)
MIN_DEBATERS = 2


@dataclass(frozen=True)
class ResumePoint:
    consultation_id: str
    settings: Settings
    resume_from: dict[str, Any]
    next_seq: int  # the journal position the continued run starts at
    restored_rounds: list[int]


def load_resume_point(layout: StoreLayout, consultation_id: str, *, resumable: bool = True) -> ResumePoint:
    """Everything needed to continue ``consultation_id``; raises a one-line error when it cannot be resumed.

    ``resumable=False`` reads a finished consultation too (its stored rounds, e.g. for ``show-prompt --from``)."""
    path = layout.journal_path(consultation_id)
    if not path.exists():
        raise UsageError(f"no journal for consultation {consultation_id} in {layout.journal_dir}")
    if resumable and is_being_written(path):
        raise UsageError(f"consultation {consultation_id} is still running in another process")
    journal = read_journal(path)
    heads = HeadsLog(layout.heads_path).load(consultation_id).get(consultation_id, [])
    problem = check_journal(consultation_id, journal, heads)
    if problem is not None:
        raise JournalError(f"cannot resume: the journal fails verification: {problem}")
    # records after the last head are cut off when the run continues (see JournalWriter): nothing of them is reused
    records = expand_records([r for r in (line.record for line in headed_lines(journal, heads)) if r is not None])
    started = next((r for r in records if r["type"] == ev.CONSULTATION_STARTED), None)
    if started is None:
        raise ConclaveError(f"cannot resume {consultation_id}: its journal has no consultation:started record")
    final = _final_status(records)
    if resumable and final is not None and final not in RESUMABLE_STATUSES:
        raise UsageError(f"consultation {consultation_id} already ended ({final}); nothing to resume")
    settings = settings_from_container(_in_panel_order(started["data"]))
    rounds = completed_round_artifacts(records)
    resume_from = _resume_dict(consultation_id, started["data"], rounds, records)
    restored = sorted(resume_from["rounds"])
    return ResumePoint(consultation_id, settings, resume_from, len(records), restored)


def _in_panel_order(started: dict[str, Any]) -> dict[str, Any]:
    """The journaled config with its agents in the panel's configured order: the journal stores the config with
    sorted keys, while anchors, the debate state and a strategy's roles (the first agent) follow the panel order,
    which ``consultation:started`` keeps in its ``agents`` list."""
    config = dict(started["config"])
    agents = config.get("agents")
    order = [str(a.get("name")) for a in started.get("agents") or [] if isinstance(a, dict)]
    if isinstance(agents, dict) and sorted(order) == sorted(agents):
        config["agents"] = {name: agents[name] for name in order}
    return config


def _final_status(records: list[dict[str, Any]]) -> str | None:
    """The status of the last run's final record; None when the last run never finished (it was killed)."""
    status = None
    for record in records:
        if record["type"] == ev.CONSULTATION_COMPLETED:
            status = record["data"].get("status")
        elif record["type"] == ev.CONSULTATION_STARTED:
            status = None
    return status


def completed_round_artifacts(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Round number → the artifact payloads of its last run, when that run completed the round successfully.

    A round run counts only when it reached ``round:completed`` (not ``ok: false``, a failure that stopped the
    consultation) and the consultation was not cancelled inside it:

    - ``round:interrupted`` (Ctrl-C, the cost gate inside the round, an error) and a run killed before either
      end record leave the round unfinished;
    - journals written before ``round:interrupted`` existed recorded a cancelled round as ``round:completed``
      too. The engine counts a round in the result's ``completed_rounds`` only once it returned, so a round
      completed in a run whose ``consultation:completed`` (partial/aborted) counts fewer rounds was cancelled
      inside it and is dropped;
    - a round that starts again supersedes its earlier completion and those of the rounds after it, which were
      built on it.
    """
    running: dict[int, list[dict[str, Any]]] = {}
    done: dict[int, list[dict[str, Any]]] = {}
    this_run: set[int] = set()  # rounds completed by the current run (since its consultation:started)
    for record in records:
        type_, data = record["type"], record["data"]
        number = data.get("round_number")
        if type_ == ev.CONSULTATION_STARTED:
            running.clear()  # a round left running by an earlier run never ends
            this_run.clear()
        elif type_ == ev.ROUND_STARTED:
            running[number] = []
            for later in [n for n in done if n >= number]:
                del done[later]
                this_run.discard(later)
        elif type_ == ev.ROUND_ARTIFACT and number in running:
            running[number].append(data)
        elif type_ == ev.ROUND_INTERRUPTED:
            running.pop(number, None)
        elif type_ == ev.ROUND_COMPLETED and number in running:
            artifacts = running.pop(number)
            if data.get("ok", True) is not False:
                done[number] = artifacts
                this_run.add(number)
        elif type_ == ev.CONSULTATION_COMPLETED:
            counted = (data.get("result") or {}).get("completed_rounds")
            if data.get("status") in RESUMABLE_STATUSES and isinstance(counted, int):
                for cancelled in [n for n in this_run if n > counted]:
                    done.pop(cancelled, None)
            this_run.clear()
    return done


def _resume_dict(
    cid: str, started: dict[str, Any], rounds: dict[int, list[dict[str, Any]]], records: list[dict[str, Any]]
) -> dict[str, Any]:
    def by_agent(n: int) -> dict[str, Any]:
        return {a["agent"]: a["artifact"] for a in rounds.get(n, []) if a.get("agent")}

    def judge(n: int) -> dict[str, Any] | None:
        return next((a["artifact"] for a in reversed(rounds.get(n, [])) if not a.get("agent")), None)

    # Each round builds on the ones before: never hand over a later round without its predecessors.
    consecutive: dict[int, list[dict[str, Any]]] = {}
    for number in sorted(rounds):
        if number != len(consecutive) + 1:
            break
        consecutive[number] = [{k: a.get(k) for k in ("agent", "artifact", "round_type") if k in a}
                               for a in rounds[number]]
    if len(by_agent(1)) < MIN_DEBATERS:
        consecutive = {}  # the engine would stop on round 1 at once: run it again instead
    round_1 = by_agent(1) if consecutive else {}
    round_2 = judge(2) if 2 in consecutive else None
    round_3 = judge(3) if 3 in consecutive else None
    return {
        "consultation_id": cid,
        "rounds": consecutive,
        "interrupted": interrupted_round(records),
        # the standard plan's rounds under their own names (what the result calls them)
        "round_1": round_1,
        "round_2": round_2,
        "round_3_replies": by_agent(3) if round_3 else {},
        "round_3": round_3,
        "labels": started.get("judge_labels") or {},
        "shuffle_seed": started.get("shuffle_seed"),
        "spent": spent(records),
        # full safety evaluations already paid for, by the sha256 of the text they read: reused, never re-bought
        "safety": {e["content_sha256"]: e for r in records if r["type"] == ev.SAFETY_CHECKED
                   for e in [r["data"].get("evaluation") or {}]
                   if e.get("status") == "evaluated" and e.get("content_sha256")},
        # the plan as a controller extended it (a repeated cross-examination, an inserted round): restored rounds
        # follow it; a plan only ever cut (rounds=N, early termination) is rebuilt from the config instead
        "plan": next((r["data"]["plan"] for r in reversed(records) if r["type"] == ev.PLAN_CHANGED
                      and r["data"].get("action") in ("insert", "restore") and r["data"].get("plan")), None),
        # the exit controller's decisions, replayed for restored rounds instead of asking again
        "exit": [r["data"] for r in records if r["type"] == "exit:evaluated"],
        "judge_fallback": next((r["data"] for r in reversed(records) if r["type"] == ev.PROVIDER_SUBSTITUTED
                                and r["data"].get("judge_fallback")), None),
    }


def interrupted_round(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The round the last run started and did not complete successfully (cancelled, stopped, failed or killed),
    with the artifacts it recorded: the engine reuses its agents' answers, which were paid for, on resume."""
    current: dict[str, Any] | None = None
    for record in records:
        type_, data = record["type"], record["data"]
        if type_ == ev.ROUND_STARTED:
            current = {"round_number": data.get("round_number"), "artifacts": []}
        elif current is None:
            continue
        elif type_ == ev.ROUND_ARTIFACT and data.get("round_number") == current["round_number"]:
            current["artifacts"].append({k: data.get(k) for k in ("agent", "artifact", "round_type") if k in data})
        elif type_ == ev.ROUND_COMPLETED and data.get("round_number") == current["round_number"]:
            current = None if data.get("ok", True) is not False else current
    return current


def spent(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Cost and tokens of every provider attempt recorded so far, as the engine meters its own calls.

    ``cost``, ``input_tokens``, ``output_tokens``, ``cached_input_tokens``; ``by_provider`` {provider: cost};
    ``unknown_prices`` ["provider/model"] for attempts that used tokens at no known price (they count as 0).
    """
    total: dict[str, Any] = {"cost": 0.0, "input_tokens": 0, "output_tokens": 0, "cached_input_tokens": 0}
    by_provider: dict[str, float] = defaultdict(float)
    unknown: set[str] = set()
    for record in records:
        if record["type"] != ev.PROVIDER_ATTEMPT:
            continue
        data = record["data"]
        tokens_in, tokens_out = data.get("input_tokens") or 0, data.get("output_tokens") or 0
        total["input_tokens"] += tokens_in
        total["output_tokens"] += tokens_out
        total["cached_input_tokens"] += data.get("cached_input_tokens") or 0
        cost = data.get("cost")
        if cost is None:
            if tokens_in or tokens_out:
                unknown.add(f"{data.get('provider')}/{data.get('model')}")
            continue
        total["cost"] += cost
        if cost or tokens_in or tokens_out:
            by_provider[str(data.get("provider"))] += cost
    total["cost"] = round(total["cost"], 10)
    total["by_provider"] = {provider: round(cost, 10) for provider, cost in sorted(by_provider.items())}
    total["unknown_prices"] = sorted(unknown)
    return total


def latest_interrupted(layout: StoreLayout) -> str | None:
    """The most recently written journal whose consultation did not finish (or ended partial/aborted) and that
    no process is still writing; None when there is none. Reads only the last record of each journal."""
    if not layout.journal_dir.is_dir():
        return None
    paths = sorted(layout.journal_dir.glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for path in paths:
        last = last_record(path)
        if last is None:
            continue
        if last.get("type") == ev.CONSULTATION_COMPLETED and last.get("data", {}).get("status") not in (
            RESUMABLE_STATUSES
        ):
            continue
        if is_being_written(path):
            continue
        return path.name[: -len(".jsonl")]
    return None
