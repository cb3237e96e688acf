"""``conclave resume``: a consultation killed at any point continues from the journal without re-running or
re-billing completed rounds, with its recorded configuration, and ends with the same result shape."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import clean_env, run_conclave

from conclave import events as ev
from conclave.config.settings import Settings
from conclave.errors import UsageError
from conclave.store.heads import HeadsLog
from conclave.store.journal import JournalError, JournalWriter, read_journal, read_records
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.redact import Redactor
from conclave.store.resume_points import interrupted_round, latest_interrupted, load_resume_point
from conclave.store.sqlite_index import connect
from conclave.testing.fake_server import FakeProviderServer, Fault, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for
from conclave.testing.synthetic_events import consultation_id, synthetic_events

CONFIG: dict[str, Any] = {
    "question": "Should we shard the database?",
    "agents": {
        "security": {"persona": "security", "provider": "openai", "model": "gpt-4o"},
        "architect": {"persona": "architecture", "provider": "anthropic", "model": "claude-sonnet-4-5"},
        "pragmatist": {"persona": "pragmatic", "provider": "gemini", "model": "gemini-2.5-pro"},
    },
    "judge": {"provider": "openai", "model": "gpt-4o"},
    "personas": {p: {"name": p.title(), "focus": f"{p} matters"} for p in ("security", "architecture", "pragmatic")},
    "providers": {p: {"api": p} for p in ("openai", "anthropic", "gemini")},
    "mode": {"strategy": "converge"},
    "home": None,
}


def record(home: Path, events: list[ev.Event]) -> None:
    recorder = Recorder(home, index=False)
    for event in events:
        recorder(event)
    recorder.close()


def cut(events: list[ev.Event], round_number: int, attempts: int) -> list[ev.Event]:
    """The events up to ``attempts`` provider calls into round ``round_number`` (a kill mid-round)."""
    start = next(i for i, e in enumerate(events) if e.type == ev.ROUND_STARTED and e.data["round_number"] == round_number)
    calls = [i for i, e in enumerate(events) if i > start and e.type == ev.PROVIDER_ATTEMPT]
    return events[: calls[attempts - 1] + 1]


def test_resume_point_restores_completed_rounds_only(tmp_path: Path) -> None:
    events = synthetic_events(15, config=CONFIG)  # a multiple of 3: explore mode, never stops after round 2
    killed = cut(events, 3, attempts=2)
    record(tmp_path, killed)
    point = load_resume_point(StoreLayout(tmp_path), consultation_id(15))

    artifacts = [e.data for e in events if e.type == ev.ROUND_ARTIFACT]
    started = events[0].data
    assert point.restored_rounds == [1, 2]
    assert point.resume_from["round_1"] == {a["agent"]: a["artifact"] for a in artifacts if a["round_number"] == 1}
    assert point.resume_from["round_2"] == next(a["artifact"] for a in artifacts if a["round_number"] == 2)
    assert point.resume_from["round_3"] is None and point.resume_from["round_3_replies"] == {}
    assert point.resume_from["labels"] == started["judge_labels"]
    assert point.resume_from["shuffle_seed"] == started["shuffle_seed"]
    assert point.resume_from["consultation_id"] == consultation_id(15)
    # everything billed so far counts, the two round-3 calls in flight included
    billed = [e.data for e in killed if e.type == ev.PROVIDER_ATTEMPT]
    assert point.resume_from["spent"]["cost"] == pytest.approx(sum(a["cost"] for a in billed))
    assert point.resume_from["spent"]["input_tokens"] == sum(a["input_tokens"] for a in billed)
    assert point.settings == Settings.model_validate(CONFIG)
    assert point.next_seq == len(killed)


def test_the_last_completed_run_of_a_round_wins(tmp_path: Path) -> None:
    events = synthetic_events(6, config=CONFIG)
    r2_end = next(i for i, e in enumerate(events) if e.type == ev.ROUND_COMPLETED and e.data["round_number"] == 2)
    r2_start = next(i for i, e in enumerate(events) if e.type == ev.ROUND_STARTED and e.data["round_number"] == 2)
    rerun = [ev.Event(e.type, e.consultation_id, 0, e.ts + 50, _changed(e)) for e in events[r2_start:r2_end + 1]]
    record(tmp_path, [*events[: r2_end + 1], *rerun])
    point = load_resume_point(StoreLayout(tmp_path), consultation_id(6))
    assert point.resume_from["round_2"]["rerun"] is True


def _changed(event: ev.Event) -> dict[str, Any]:
    if event.type != ev.ROUND_ARTIFACT:
        return event.data
    return {**event.data, "artifact": {**event.data["artifact"], "rerun": True}}


def test_a_round_killed_before_it_completed_is_not_restored(tmp_path: Path) -> None:
    events = synthetic_events(7, config=CONFIG)
    record(tmp_path, cut(events, 1, attempts=3))  # all three answers billed, but round 1 never completed
    point = load_resume_point(StoreLayout(tmp_path), consultation_id(7))
    assert point.restored_rounds == [] and point.resume_from["round_1"] == {}


def test_an_answer_is_durable_as_soon_as_it_arrives(tmp_path: Path) -> None:
    """Killed (SIGKILL: nothing flushes, nothing closes) after two agents answered inside round 3: both answers are
    on disk, and resume hands them over instead of asking (and paying for) them again."""
    events = synthetic_events(18, config=CONFIG)
    start = next(i for i, e in enumerate(events) if e.type == ev.ROUND_STARTED and e.data["round_number"] == 3)
    answers = [i for i, e in enumerate(events) if i > start and e.type == ev.ROUND_ARTIFACT and e.data["agent"]][:2]
    recorder = Recorder(tmp_path, index=False)
    for event in events[: answers[-1] + 1]:
        recorder(event)
    recorder.wait_for_writes()  # the I/O thread writes each answer out as it arrives: a few ms
    # no flush, no close: what the process leaves on disk is what resume reads
    interrupted = interrupted_round(read_records(StoreLayout(tmp_path).journal_path(consultation_id(18))))
    assert interrupted is not None
    assert interrupted["round_number"] == 3
    assert [a["agent"] for a in interrupted["artifacts"]] == [events[i].data["agent"] for i in answers]


def test_logs_list_shows_a_run_killed_before_the_index_had_it(tmp_path: Path) -> None:
    """The index is first written once round 1's requests have left: a run killed before that is only in its
    journal, and ``logs list`` still lists it, as interrupted, with what it had spent."""
    indexed, killed = synthetic_events(19, config=CONFIG), synthetic_events(20, config=CONFIG)
    Recorder(tmp_path).close()  # an index exists, holding one finished consultation
    recorder = Recorder(tmp_path)
    for event in indexed:
        recorder(event)
    recorder.close()
    record(tmp_path, cut(killed, 1, attempts=2))  # journal only
    proc = run_conclave("logs", "list", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("ID") and len(lines) == 3
    row = next(line for line in lines if line.startswith(consultation_id(20)))
    billed = sum(e.data["cost"] for e in cut(killed, 1, attempts=2) if e.type == ev.PROVIDER_ATTEMPT)
    assert " interrupted " in row and f"${billed:.4f}" in row
    assert consultation_id(20) in proc.stderr and "index rebuild" in proc.stderr


def _ended(events: list[ev.Event], status: str, completed_rounds: int) -> list[ev.Event]:
    """``events`` followed by the final record of a run stopped with ``completed_rounds`` counted."""
    last = events[-1]
    return [*events, ev.Event(ev.CONSULTATION_COMPLETED, last.consultation_id, 0, last.ts + 1,
                              {"status": status, "result": {"completed_rounds": completed_rounds}})]


def _round_end(events: list[ev.Event], round_number: int) -> int:
    return next(i for i, e in enumerate(events) if e.type == ev.ROUND_COMPLETED and e.data["round_number"] == round_number)


def test_an_interrupted_round_is_not_restored(tmp_path: Path) -> None:
    events = synthetic_events(16, config=CONFIG)
    end = _round_end(events, 2)
    interrupted = ev.Event(ev.ROUND_INTERRUPTED, events[end].consultation_id, 0, events[end].ts,
                           {**events[end].data, "reason": "cancelled", "detail": "interrupted by the user"})
    record(tmp_path, _ended([*events[:end], interrupted], "partial", 1))
    point = load_resume_point(StoreLayout(tmp_path), consultation_id(16))
    assert point.restored_rounds == [1] and point.resume_from["round_2"] is None


def test_a_round_that_failed_is_run_again(tmp_path: Path) -> None:
    events = synthetic_events(17, config=CONFIG)
    end = _round_end(events, 2)
    failed = ev.Event(ev.ROUND_COMPLETED, events[end].consultation_id, 0, events[end].ts,
                      {**events[end].data, "ok": False})
    record(tmp_path, _ended([*events[:end], failed], "partial", 1))
    assert load_resume_point(StoreLayout(tmp_path), consultation_id(17)).restored_rounds == [1]


def test_a_round_cancelled_under_the_old_journal_format_is_not_restored(tmp_path: Path) -> None:
    """Before ``round:interrupted`` existed, Ctrl-C journaled the cancelled round as ``round:completed``, then
    ended the run partial without counting it: such a round must be run again, not restored half-done."""
    events = synthetic_events(18, config=CONFIG)
    start = next(i for i, e in enumerate(events) if e.type == ev.ROUND_STARTED and e.data["round_number"] == 1)
    first_artifact = next(i for i, e in enumerate(events) if i > start and e.type == ev.ROUND_ARTIFACT)
    end = _round_end(events, 1)
    old_style = [*events[: first_artifact + 1], events[end]]  # one answer in, then "completed" by the finally
    record(tmp_path, _ended(old_style, "partial", 0))
    point = load_resume_point(StoreLayout(tmp_path), consultation_id(18))
    assert point.restored_rounds == [] and point.resume_from["round_1"] == {}
    # the same, cancelled in round 2 with round 1 genuinely done: round 1 is kept, round 2 is not
    events = synthetic_events(19, config=CONFIG)
    end = _round_end(events, 2)
    record(tmp_path, _ended(events[: end + 1], "partial", 1))
    assert load_resume_point(StoreLayout(tmp_path), consultation_id(19)).restored_rounds == [1]


def test_a_round_1_with_fewer_than_two_answers_is_not_restored(tmp_path: Path) -> None:
    events = synthetic_events(20, config=CONFIG)
    start = next(i for i, e in enumerate(events) if e.type == ev.ROUND_STARTED and e.data["round_number"] == 1)
    first_artifact = next(i for i, e in enumerate(events) if i > start and e.type == ev.ROUND_ARTIFACT)
    end = _round_end(events, 1)
    # an old journal whose round 1 ended with one valid answer (the engine stops on that: nothing to restore)
    record(tmp_path, _ended([*events[: first_artifact + 1], events[end]], "partial", 1))
    assert load_resume_point(StoreLayout(tmp_path), consultation_id(20)).restored_rounds == []


def test_spent_splits_the_cost_by_provider(tmp_path: Path) -> None:
    events = synthetic_events(21, config=CONFIG)
    killed = cut(events, 3, attempts=2)
    record(tmp_path, killed)
    spent = load_resume_point(StoreLayout(tmp_path), consultation_id(21)).resume_from["spent"]
    billed = [e.data for e in killed if e.type == ev.PROVIDER_ATTEMPT]
    by_provider = {p: sum(a["cost"] for a in billed if a["provider"] == p) for p in {a["provider"] for a in billed}}
    assert spent["by_provider"] == pytest.approx(by_provider)
    assert sum(spent["by_provider"].values()) == pytest.approx(spent["cost"])
    assert spent["output_tokens"] == sum(a["output_tokens"] for a in billed)
    assert spent["cached_input_tokens"] == 0 and spent["unknown_prices"] == []


def test_a_finished_consultation_cannot_be_resumed_but_an_aborted_one_can(tmp_path: Path) -> None:
    done = synthetic_events(8, config=CONFIG)
    record(tmp_path, done)
    with pytest.raises(UsageError, match="already ended"):
        load_resume_point(StoreLayout(tmp_path), consultation_id(8))
    aborted = [*cut(synthetic_events(9, config=CONFIG), 2, attempts=1)]
    aborted.append(ev.Event(ev.CONSULTATION_COMPLETED, consultation_id(9), 0, aborted[-1].ts + 1,
                                  {"status": "aborted", "result": {}}))
    record(tmp_path, aborted)
    assert load_resume_point(StoreLayout(tmp_path), consultation_id(9)).restored_rounds == [1]


def test_a_tampered_journal_is_not_resumed(tmp_path: Path) -> None:
    record(tmp_path, cut(synthetic_events(10, config=CONFIG), 2, attempts=1))
    path = StoreLayout(tmp_path).journal_path(consultation_id(10))
    path.write_text(path.read_text().replace('"round_number":1', '"round_number":7', 1))
    with pytest.raises(JournalError, match="fails verification"):
        load_resume_point(StoreLayout(tmp_path), consultation_id(10))


def test_latest_interrupted_skips_finished_and_running_consultations(tmp_path: Path) -> None:
    layout = StoreLayout(tmp_path)
    record(tmp_path, cut(synthetic_events(11, config=CONFIG), 2, attempts=1))
    record(tmp_path, synthetic_events(12, config=CONFIG))  # finished later
    os.utime(layout.journal_path(consultation_id(12)), (2e9, 2e9))
    assert latest_interrupted(layout) == consultation_id(11)
    running = JournalWriter(layout.journal_path("c-running"), "c-running", HeadsLog(layout.heads_path),
                            Redactor([]))
    running.append(ev.CONSULTATION_STARTED, 1.0, {})
    running.flush()
    os.utime(layout.journal_path("c-running"), (3e9, 3e9))
    assert latest_interrupted(layout) == consultation_id(11)  # still being written by "another process"
    with pytest.raises(UsageError, match="still running"):
        load_resume_point(layout, "c-running")
    running.close()
    assert latest_interrupted(layout) == "c-running"


# --------------------------------------------------------------------------------- killed for real (SIGKILL)

CLI = [sys.executable, "-m", "conclave"]
LATENCY_S = 0.5
ROUND_TITLE = re.compile(r"^Round (\d)")


def round_of(request: Any) -> int | None:
    """Which round a provider request belongs to, from the title of the artifact schema it carries."""
    match = ROUND_TITLE.match(str((request.schema or {}).get("title", "")))
    return int(match.group(1)) if match else None


def slow_replies(fake: FakeProviderServer) -> None:
    for model in ("gpt-4o", "claude-sonnet-4-5", "gemini-2.5-pro"):
        fake.script(model, lambda request: Reply(json=instance_for(request.schema), latency=LATENCY_S))


async def conclave(home: Path, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *CLI, *args, env=clean_env(home, FAKE_KEYS), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def journal_records(home: Path) -> list[dict[str, Any]]:
    paths = list(StoreLayout(home).journal_dir.glob("*.jsonl"))
    assert len(paths) == 1, f"expected the consultation's journal under {home}, found {len(paths)} journal(s)"
    return read_journal(paths[0]).records


async def kill_during_round(home: Path, fake: FakeProviderServer, round_number: int) -> None:
    """Start a consultation, SIGKILL it once round ``round_number`` has started and its calls are in flight."""
    process = await asyncio.create_subprocess_exec(
        *CLI, "Should we shard the database?", *fake.overrides(), "cost.auto_approve=true", "rounds=4",
        env=clean_env(home, FAKE_KEYS), cwd=home,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )
    journal_dir = StoreLayout(home).journal_dir
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        paths = list(journal_dir.glob("*.jsonl")) if journal_dir.is_dir() else []
        if paths and any(r["type"] == ev.ROUND_STARTED and r["data"]["round_number"] == round_number
                         for r in read_journal(paths[0]).records):
            break
        await asyncio.sleep(0.02)
    else:
        process.kill()
        pytest.fail(f"round {round_number} never started")
    await asyncio.sleep(LATENCY_S / 2)  # inside the round: its provider calls are in flight
    process.send_signal(signal.SIGKILL)
    assert await process.wait() == -signal.SIGKILL


@pytest.fixture(scope="module")
def uninterrupted_result_keys(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The keys of the final result of the same consultation run without interruption."""
    home = tmp_path_factory.mktemp("uninterrupted")

    async def run() -> tuple[int, str, str]:
        async with FakeProviderServer() as fake:
            return await conclave(home, "Should we shard the database?", *fake.overrides(), "cost.auto_approve=true", "rounds=4")

    code, _, err = asyncio.run(run())
    assert code == 0, err
    final = journal_records(home)[-1]
    assert final["type"] == ev.CONSULTATION_COMPLETED
    return set(final["data"]["result"])


@pytest.mark.slow
@pytest.mark.parametrize("killed_in", [1, 2, 3])
async def test_a_consultation_killed_mid_round_resumes_without_rerunning_completed_rounds(
    tmp_path: Path, killed_in: int, uninterrupted_result_keys: set[str]
) -> None:
    expected_keys = uninterrupted_result_keys
    home = tmp_path / "home"
    home.mkdir()
    async with FakeProviderServer() as fake:
        slow_replies(fake)
        await kill_during_round(home, fake, killed_in)
        before = journal_records(home)
        assert not any(r["type"] == ev.CONSULTATION_COMPLETED for r in before)
        asked_before = len(fake.requests)
        assert Counter(round_of(r) for r in fake.requests)[killed_in] > 0

        code, out, err = await conclave(home, "resume")
        assert code == 0, err
        asked_after = Counter(round_of(r) for r in fake.requests[asked_before:])

    # completed rounds were neither re-run nor re-billed; the interrupted one ran again, and the rest after it
    assert all(asked_after[n] == 0 for n in range(1, killed_in)), asked_after
    assert all(asked_after[n] > 0 for n in range(killed_in, 5)), asked_after
    records = journal_records(home)
    final = records[-1]
    assert final["type"] == ev.CONSULTATION_COMPLETED and final["data"]["status"] == "complete"
    result = final["data"]["result"]
    assert set(result) == expected_keys
    assert result["completed_rounds"] == 4 and result["verdict"] is not None
    assert all(result["artifacts"][f"round_{n}"] for n in (1, 2, 3, 4))
    # the recorded configuration was reused as is
    configs = [r["data"]["config"] for r in records if r["type"] == ev.CONSULTATION_STARTED]
    assert len(configs) == 2 and configs[0] == configs[1]
    resumed = next(r for r in records if r["type"] == "consultation:resumed")
    assert resumed["data"]["restored_rounds"] == list(range(1, killed_in))

    code, out, err = await conclave(home, "logs", "verify")
    assert code == 0 and out.startswith("OK: 1 journal(s)"), out + err
    db = connect(StoreLayout(home).index_path)
    status, total_cost = db.conn.execute("select status, total_cost from consultations").fetchone()
    db.close()
    attempts = [r["data"] for r in records if r["type"] == ev.PROVIDER_ATTEMPT]
    assert status == "complete"
    assert total_cost == pytest.approx(sum(a["cost"] or 0 for a in attempts))
    assert_cost_covers_every_run(records, result, first_run_billed=killed_in > 1)


#: a CLI run killed (SIGKILL) right after round 2 ended: its records were written out, not fsynced yet
KILLED_BETWEEN_ROUNDS = """
import json, os, signal, sys
from conclave.store.journal import JournalWriter

write_out = JournalWriter.write_out

def killed_after_round_2(self):
    write_out(self)  # a round's end: its records written out (on the recorder's I/O thread), not fsynced
    records = [json.loads(line) for line in self.path.read_text().splitlines()]
    if any(r["type"] == "round:completed" and r["data"]["round_number"] == 2 for r in records):
        os.kill(os.getpid(), signal.SIGKILL)

JournalWriter.write_out = killed_after_round_2
from conclave.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


async def test_a_consultation_killed_between_two_rounds_resumes_without_paying_again(tmp_path: Path) -> None:
    """Between a round's end and the next round's start the journal is written out but not fsynced: a process
    killed there keeps the round it paid for, and the resume restores it (nothing is asked twice)."""
    home = tmp_path / "home"
    home.mkdir()
    async with FakeProviderServer() as fake:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", KILLED_BETWEEN_ROUNDS, "Should we shard the database?", *fake.overrides(),
            "cost.auto_approve=true", "rounds=4", env=clean_env(home, FAKE_KEYS), cwd=home,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        assert await process.wait() == -signal.SIGKILL
        before = journal_records(home)
        assert any(r["type"] == ev.ROUND_COMPLETED and r["data"]["round_number"] == 2 for r in before)
        asked_before = len(fake.requests)
        assert {round_of(r) for r in fake.requests} == {1, 2}  # killed before round 3 asked anyone
        code, _, err = await conclave(home, "resume")
        assert code == 0, err
        asked_after = Counter(round_of(r) for r in fake.requests[asked_before:])
    assert asked_after[1] == asked_after[2] == 0 and asked_after[3] > 0 and asked_after[4] > 0, asked_after
    records = journal_records(home)
    resumed = next(r for r in records if r["type"] == "consultation:resumed")
    assert resumed["data"]["restored_rounds"] == [1, 2]
    assert records[-1]["data"]["status"] == "complete"  # the resume appended to the journal: it verified


def assert_cost_covers_every_run(records: list[dict[str, Any]], result: dict[str, Any], *,
                                 first_run_billed: bool) -> None:
    """The final result's cost and tokens are those of every attempt the journal records, all runs included."""
    attempts = [r["data"] for r in records if r["type"] == ev.PROVIDER_ATTEMPT]
    resumed_at = next(i for i, r in enumerate(records) if r["type"] == ev.CONSULTATION_RESUMED)
    first_run = [r["data"] for r in records[:resumed_at] if r["type"] == ev.PROVIDER_ATTEMPT]
    assert (sum(a["cost"] or 0 for a in first_run) > 0) is first_run_billed
    precision = 2e-6  # the result reports dollars rounded to 6 decimals, per run and in total
    assert result["cost"]["actual"] == pytest.approx(sum(a["cost"] or 0 for a in attempts), abs=precision)
    providers = {a["provider"] for a in attempts if a["input_tokens"] or a["output_tokens"]}
    assert result["cost"]["by_provider"] == pytest.approx(
        {p: sum(a["cost"] or 0 for a in attempts if a["provider"] == p) for p in providers}, abs=precision)
    assert result["tokens"]["input"] == sum(a["input_tokens"] for a in attempts)
    assert result["tokens"]["output"] == sum(a["output_tokens"] for a in attempts)


# --------------------------------------------------------------------------------- interrupted for real (SIGINT)

FAST_AGENT_MODEL = "gpt-4o"  # the architect (and the judge): answers round 1 at once
HANGING_AGENT_MODELS = ("claude-sonnet-4-5", "gemini-2.5-pro")  # security and pragmatist: never answer round 1


async def interrupt_during_round_1(home: Path, fake: FakeProviderServer) -> tuple[int, str]:
    """Start a consultation and send it SIGINT (Ctrl-C) once one agent answered round 1 and two still hang."""
    fake.script(FAST_AGENT_MODEL, lambda request: Reply(json=instance_for(request.schema)))
    for model in HANGING_AGENT_MODELS:
        fake.script(model, Fault.hang())
    process = await asyncio.create_subprocess_exec(
        *CLI, "Should we shard the database?", *fake.overrides(), "cost.auto_approve=true", "rounds=4",
        # no hedging: a hanging agent would be hedged 0.5 s after its peer answered (3 × the peer, the floor), and
        # the round could end just before the signal
        "hedging.enabled=false",
        env=clean_env(home, FAKE_KEYS), cwd=home,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        if sorted(r.model or "" for r in fake.requests if round_of(r) == 1) == sorted(
                (FAST_AGENT_MODEL, *HANGING_AGENT_MODELS)):
            break
        await asyncio.sleep(0.02)
    else:
        process.kill()
        pytest.fail("round 1 never asked all three agents")
    await asyncio.sleep(0.5)  # the fast answer is in; the other two hang
    process.send_signal(signal.SIGINT)
    _, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, err.decode()


@pytest.mark.slow
async def test_a_consultation_interrupted_by_ctrl_c_mid_round_1_resumes_asking_only_who_had_not_answered(
    tmp_path: Path, uninterrupted_result_keys: set[str]
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    async with FakeProviderServer() as fake:
        code, err = await interrupt_during_round_1(home, fake)
        assert code == 130, err
        before = journal_records(home)
        # the cancelled round is journaled as interrupted, never as completed
        round_ends = [r for r in before if r["type"] in (ev.ROUND_COMPLETED, ev.ROUND_INTERRUPTED)]
        assert [(r["type"], r["data"]["round_number"]) for r in round_ends] == [(ev.ROUND_INTERRUPTED, 1)]
        assert round_ends[0]["data"]["reason"] == "cancelled"
        assert [r["data"]["agent"] for r in before if r["type"] == ev.ROUND_ARTIFACT] == ["architect"]
        assert before[-1]["type"] == ev.CONSULTATION_COMPLETED and before[-1]["data"]["status"] == "partial"
        assert load_resume_point(StoreLayout(home), before[0]["consultation_id"]).restored_rounds == []

        asked_before = len(fake.requests)
        slow_replies(fake)  # the providers answer again
        code, out, err = await conclave(home, "resume")
        assert code == 0, err
        again = fake.requests[asked_before:]
    # the notice says the paid answer is reused, not that nothing was restored
    assert "(restored rounds: none; answers reused from round 1: architect)" in err.splitlines()[0], err

    # round 1 ran again for the agents that had not answered (the architect's answer was paid for and is reused),
    # and the debate went on to the end
    assert sorted(r.model or "" for r in again if round_of(r) == 1) == sorted(HANGING_AGENT_MODELS)
    assert all(Counter(round_of(r) for r in again)[n] > 0 for n in (2, 3, 4))
    records = journal_records(home)
    resumed = next(r for r in records if r["type"] == ev.CONSULTATION_RESUMED)
    assert resumed["data"]["restored_rounds"] == []
    final = records[-1]
    assert final["type"] == ev.CONSULTATION_COMPLETED and final["data"]["status"] == "complete"
    result = final["data"]["result"]
    assert set(result) == uninterrupted_result_keys
    assert result["completed_rounds"] == 4 and set(result["artifacts"]["round_1"]) == set(CONFIG["agents"])
    assert_cost_covers_every_run(records, result, first_run_billed=True)
    code, out, err = await conclave(home, "logs", "verify")
    assert code == 0 and out.startswith("OK: 1 journal(s)"), out + err


async def test_resume_without_an_interrupted_consultation_is_a_usage_error(tmp_path: Path) -> None:
    code, _, err = await conclave(tmp_path, "resume")
    assert code == 2 and "no interrupted consultation" in err


# --------------------------------------------------------------------------------- SIGTERM and SIGHUP, as Ctrl-C

async def signal_during_round_1(home: Path, fake: FakeProviderServer, signum: int) -> tuple[int, str]:
    """As :func:`interrupt_during_round_1`, with ``signum`` instead of SIGINT."""
    fake.script(FAST_AGENT_MODEL, lambda request: Reply(json=instance_for(request.schema)))
    for model in HANGING_AGENT_MODELS:
        fake.script(model, Fault.hang())
    process = await asyncio.create_subprocess_exec(
        *CLI, "Should we shard the database?", *fake.overrides(), "cost.auto_approve=true", "rounds=4",
        # no hedging: a hanging agent would be hedged 0.5 s after its peer answered (3 × the peer, the floor), and
        # the round could end just before the signal
        "hedging.enabled=false",
        env=clean_env(home, FAKE_KEYS), cwd=home,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    deadline = asyncio.get_running_loop().time() + 60
    while asyncio.get_running_loop().time() < deadline:
        if len([r for r in fake.requests if round_of(r) == 1]) == 3:
            break
        await asyncio.sleep(0.02)
    else:
        process.kill()
        pytest.fail("round 1 never asked all three agents")
    await asyncio.sleep(0.5)
    process.send_signal(signum)
    _, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, err.decode()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
async def test_sigterm_and_sighup_end_a_consultation_as_ctrl_c_does(tmp_path: Path, signum: int) -> None:
    home = tmp_path / "home"
    home.mkdir()
    async with FakeProviderServer() as fake:
        code, err = await signal_during_round_1(home, fake, signum)
    assert code == 130, err  # it used to die at once, leaving `running` and no end record
    assert "conclave: interrupted" in err and "Traceback" not in err
    records = journal_records(home)
    round_ends = [(r["type"], r["data"]["round_number"], r["data"].get("reason")) for r in records
                  if r["type"] in (ev.ROUND_COMPLETED, ev.ROUND_INTERRUPTED)]
    assert round_ends == [(ev.ROUND_INTERRUPTED, 1, "cancelled")]
    assert records[-1]["type"] == ev.CONSULTATION_COMPLETED and records[-1]["data"]["status"] == "partial"
    assert load_resume_point(StoreLayout(home), records[0]["consultation_id"]).restored_rounds == []
    db = connect(StoreLayout(home).index_path)
    status, round_status = db.conn.execute(
        "select c.status, r.status from consultations c join rounds r on r.consultation_id = c.id").fetchone()
    db.close()
    assert (status, round_status) == ("partial", "interrupted")


# --------------------------------------------------------------------------------- the index after SIGKILL

def indexed_rounds(home: Path) -> list[tuple[Any, ...]]:
    """``(round_number, status, end_reason)`` of the index's rounds; [] while the index has none yet."""
    import sqlite3

    try:
        conn = sqlite3.connect(f"{StoreLayout(home).index_path.resolve().as_uri()}?mode=ro", uri=True)
    except sqlite3.Error:
        return []
    try:
        return conn.execute("select round_number, status, end_reason from rounds order by round_number").fetchall()
    except sqlite3.Error:  # not created yet
        return []
    finally:
        conn.close()


@pytest.mark.slow
async def test_a_round_killed_by_sigkill_reads_interrupted_until_the_resume_ends_it(tmp_path: Path) -> None:
    """SIGKILL leaves no end record: the index's round stayed ``running`` while ``logs list`` called the consultation
    interrupted. Now the round reads ``interrupted`` (killed) too, and the resume gives it its real end."""
    home = tmp_path / "home"
    home.mkdir()
    async with FakeProviderServer() as fake:
        for model in (FAST_AGENT_MODEL, *HANGING_AGENT_MODELS):
            fake.script(model, Fault.hang())  # round 1 never ends by itself
        process = await asyncio.create_subprocess_exec(
            *CLI, "Should we shard the database?", *fake.overrides(), "cost.auto_approve=true", "rounds=4",
            "hedging.enabled=false",  # no backups asked while round 1 hangs
            env=clean_env(home, FAKE_KEYS), cwd=home,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )
        deadline = asyncio.get_running_loop().time() + 60
        while len([r for r in fake.requests if round_of(r) == 1]) < 3:  # round 1 asked every agent
            if asyncio.get_running_loop().time() > deadline:
                process.kill()
                pytest.fail("round 1 never asked all three agents")
            await asyncio.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL

        # a run killed in round 1 is in its journal only (the index is written at the round's end)
        code, _, err = await conclave(home, "index", "rebuild")
        assert code == 0, err
        assert indexed_rounds(home) == [(1, "interrupted", "killed")]
        code, out, err = await conclave(home, "logs", "list", "--json")
        assert code == 0, err
        assert [row["status"] for row in json.loads(out)] == ["interrupted"]

        for model in (FAST_AGENT_MODEL, *HANGING_AGENT_MODELS):  # the providers answer again
            fake.script(model, lambda request: Reply(json=instance_for(request.schema)))
        code, _, err = await conclave(home, "resume")
        assert code == 0, err
    assert indexed_rounds(home) == [(n, "ok", None) for n in (1, 2, 3, 4)]
