"""The evaluation harness end to end against the fake server: scripted agents of known accuracy, a conformity
panel, resume, the cost gate and the index tables."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sqlite3
from pathlib import Path

import pytest
from eval_helpers import PERSONAS, evaluate

from conclave.eval import run_store as store
from conclave.testing.answer_panel import AnswerPanel, arithmetic_truth
from conclave.testing.fake_server import FakeProviderServer, Fault

P = 0.7
#: a unanimous panel is decided by the vote gate after round 1; these tests are about the full debate
FULL_DEBATE = {"cost": {"auto_approve": True}, "selective": {"enabled": False}}


async def test_vote_accuracy_of_three_independent_agents_matches_theory(fake_provider_server: FakeProviderServer,
                                                                       conclave_env: Path) -> None:
    panel = AnswerPanel({name: P for name in PERSONAS.values()}, seed=7)
    n = 60
    ev, code, out, _ = await evaluate(fake_provider_server, conclave_env, panel, rounds=2, n=n, concurrency=8)
    assert code == 0
    rows = {r["item_id"]: r for r in store.read_items(conclave_env, ev.run_id)}
    assert len(rows) == n
    # Item by item, the harness scores exactly what the panel was scripted to do.
    for item in ev.items:
        right = [panel.decisions[(name, item.question)] for name in PERSONAS.values()]
        row = rows[item.id]
        assert row["single_correct"] == int(right[0]), item.id
        assert row["vote_correct"] == int(sum(right) >= 2), item.id
        assert row["oracle"] == int(any(right)), item.id
    # In aggregate, within 3 standard errors of the binomial expectation.
    summary = store.read_run(conclave_env, ev.run_id)["summary"]
    expected_vote = P**3 + 3 * P**2 * (1 - P)  # 0.784
    for protocol, expected in (("single", P), ("vote", expected_vote), ("judge", expected_vote)):
        accuracy = summary["protocols"][protocol]["accuracy"]
        tolerance = 3 * math.sqrt(expected * (1 - expected) / n)
        assert abs(accuracy - expected) < tolerance, (protocol, accuracy, expected)
        low, high = summary["protocols"][protocol]["ci_low"], summary["protocols"][protocol]["ci_high"]
        assert low < accuracy < high
    assert "debate vs vote:" in out and "| round-1 majority vote |" in out


async def test_costs_follow_the_rounds_each_protocol_uses(fake_provider_server: FakeProviderServer,
                                                          conclave_env: Path) -> None:
    panel = AnswerPanel({name: 1.0 for name in PERSONAS.values()})
    ev, code, _, _ = await evaluate(fake_provider_server, conclave_env, panel, rounds=4, n=3,
                                    settings_extra=FULL_DEBATE)
    assert code == 0
    for row in store.read_items(conclave_env, ev.run_id):
        assert 0 < row["single_cost"] < row["vote_cost"] < row["judge_cost"] < row["debate_cost"]
        assert row["single_tokens"] < row["vote_tokens"] < row["judge_tokens"] < row["debate_tokens"]
    # 3 agents + synthesis + 3 replies + cross-exam judge + verdict: 9 calls per item, and no more
    assert len(fake_provider_server.requests) == 3 * 9


async def test_conformity_shows_as_right_to_wrong_flips_and_an_oracle_gap(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    # Alpha is always right, Beta and Gamma always wrong; in round 3 everyone adopts the synthesis' answer.
    panel = AnswerPanel({"Alpha": 1.0, "Beta": 0.0, "Gamma": 0.0}, conformity=True)
    ev, code, out, _ = await evaluate(fake_provider_server, conclave_env, panel, rounds=4, n=4)
    assert code == 0
    rows = store.read_items(conclave_env, ev.run_id)
    for row in rows:
        truth = arithmetic_truth(row["question"])
        assert row["answers"]["round_1"]["alpha"] == truth
        assert row["answers"]["round_3"]["alpha"] != truth  # the right minority flipped
        assert (row["right_to_wrong"], row["wrong_to_right"]) == (1, 0)
        assert (row["single_correct"], row["vote_correct"], row["debate_correct"]) == (1, 0, 0)
        assert row["oracle"] == 1 and row["oracle_gap"] == 1
    summary = store.read_run(conclave_env, ev.run_id)["summary"]
    assert summary["flips"]["agent_right_to_wrong"] == 4
    assert summary["oracle"]["oracle_gap"] == 4
    assert "oracle gap** (right answer present in round 1, final answer wrong): **4**" in out


async def test_index_holds_the_run_and_its_items_linked_to_consultations(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    panel = AnswerPanel({name: 0.5 for name in PERSONAS.values()})
    ev, code, _, _ = await evaluate(fake_provider_server, conclave_env, panel, rounds=2, n=5)
    assert code == 0
    db = sqlite3.connect(conclave_env / "index.db")
    (status, accuracy, items_done), = db.execute(
        "select status, vote_accuracy, items_done from eval_runs where run_id = ?", [ev.run_id]).fetchall()
    assert (status, items_done) == ("complete", 5)
    linked = db.execute("select count(*) from eval_items e join consultations c on c.id = e.consultation_id "
                        "where e.run_id = ? and c.mode = 'answer'", [ev.run_id]).fetchone()[0]
    assert linked == 5
    stored = sum(r["vote_correct"] for r in store.read_items(conclave_env, ev.run_id)) / 5
    assert accuracy == stored


async def test_an_interrupted_run_resumes_without_repaying_finished_items(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    from conclave.eval.items import arithmetic

    fake = fake_provider_server
    items = arithmetic(4, 0)
    panel = AnswerPanel({name: 1.0 for name in PERSONAS.values()})
    panel.install(fake)
    answer = fake._scripts["gpt-4o"].function
    assert answer is not None
    # The third item's agents never answer, so the run is stuck there when it is interrupted.
    fake.script("gpt-4o", lambda r: Fault.hang() if items[2].question in json.dumps(r.json) else answer(r))
    task = asyncio.create_task(evaluate(fake, conclave_env, None, n=4, concurrency=1, run_id="ev-resume"))
    for _ in range(1200):  # the run's own progress is only visible in its files
        if len(store.read_items(conclave_env, "ev-resume")) >= 2:
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert len(store.read_items(conclave_env, "ev-resume")) == 2
    calls_before = {i.question: _calls_for(fake, i.question) for i in items[:2]}
    assert all(calls_before.values())

    fake.script("gpt-4o", answer)  # the provider recovers
    _, code, _, err = await evaluate(fake, conclave_env, None, n=4, concurrency=1, run_id="ev-resume")
    assert code == 0, err
    assert "2 of 4 item(s) to run (2 already finished)" in err
    assert {i.question: _calls_for(fake, i.question) for i in items[:2]} == calls_before  # not paid twice
    assert len(store.read_items(conclave_env, "ev-resume")) == 4
    assert store.read_run(conclave_env, "ev-resume")["status"] == "complete"


def _calls_for(fake: FakeProviderServer, question: str) -> int:
    return sum(1 for r in fake.requests if question in json.dumps(r.json))


async def test_the_whole_run_goes_through_the_cost_gate_once(fake_provider_server: FakeProviderServer,
                                                            conclave_env: Path) -> None:
    panel = AnswerPanel({name: 1.0 for name in PERSONAS.values()})
    _, code, out, err = await evaluate(fake_provider_server, conclave_env, panel, n=10,
                                        settings_extra={"cost": {"always_allow_under": 0.001}})
    assert code == 1
    assert "estimated cost $" in err and "for 90 planned call(s)" in err
    assert "run not started" in err and "cost.auto_approve=true" in err
    assert fake_provider_server.requests == []  # nothing was spent
    assert out == ""


async def test_a_reasoning_gym_set_runs_through_the_harness(fake_provider_server: FakeProviderServer,
                                                            conclave_env: Path) -> None:
    pytest.importorskip("reasoning_gym")
    from conclave.eval.items import load_set

    items = load_set("gym:basic_arithmetic", n=4, seed=1)
    assert items == load_set("gym:basic_arithmetic", n=4, seed=1)  # seeded
    assert all(i.kind == "numeric" for i in items)
    truth = {i.question: i.answer for i in items}
    panel = AnswerPanel({name: 1.0 for name in PERSONAS.values()}, truth=lambda q: truth[q.strip()])
    ev, code, _, err = await evaluate(fake_provider_server, conclave_env, panel, rounds=2, n=4,
                                      set="gym:basic_arithmetic", seed=1)
    assert code == 0, err
    summary = store.read_run(conclave_env, ev.run_id)["summary"]
    assert summary["protocols"]["vote"]["correct"] == 4


def test_an_unknown_gym_task_is_one_line() -> None:
    pytest.importorskip("reasoning_gym")
    from conclave.errors import UsageError
    from conclave.eval.items import load_set

    with pytest.raises(UsageError, match=r"^eval set 'gym:no_such_task': .*tasks that score well: basic_arithmetic"):
        load_set("gym:no_such_task", n=1, seed=0)


async def test_failed_items_count_wrong_and_are_retried_only_when_asked(fake_provider_server: FakeProviderServer,
                                                                       conclave_env: Path) -> None:
    fake = fake_provider_server
    panel = AnswerPanel({name: 1.0 for name in PERSONAS.values()})
    panel.install(fake)
    answer = fake._scripts["gpt-4o"].function
    assert answer is not None
    fake.script("gpt-4o", Fault.bad_request("model overloaded"))  # every agent call fails: no debate
    _, code, _, _ = await evaluate(fake, conclave_env, None, n=2, run_id="ev-failing")
    assert code == 1
    rows = store.read_items(conclave_env, "ev-failing")
    assert [r["status"] for r in rows] == ["aborted", "aborted"]
    assert all(r[f"{p}_correct"] == 0 for r in rows for p in ("single", "vote", "judge", "debate"))
    fake.script("gpt-4o", answer)
    calls = len(fake.requests)
    _, code, _, err = await evaluate(fake, conclave_env, None, n=2, run_id="ev-failing")
    assert "0 of 2 item(s) to run" in err and len(fake.requests) == calls  # kept as they are
    _, code, _, err = await evaluate(fake, conclave_env, None, n=2, run_id="ev-failing", retry_failed=True)
    assert code == 0 and "2 of 2 item(s) to run" in err
    assert store.read_run(conclave_env, "ev-failing")["summary"]["protocols"]["vote"]["correct"] == 2


async def test_evaluations_run_the_groupthink_detectors_in_shadow_unless_asked(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    # a confident panel citing nothing fires early convergence on every item; the compared debate stays the same
    panel = AnswerPanel({name: 1.0 for name in PERSONAS.values()})
    ev, code, _, _ = await evaluate(fake_provider_server, conclave_env, panel, rounds=4, n=1,
                                    settings_extra=FULL_DEBATE)
    assert code == 0 and ev.settings.quality.stage == "shadow"
    assert len(fake_provider_server.requests) == 9  # no objection round


async def test_with_the_detectors_on_the_debate_pays_for_its_objection_round(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    panel = AnswerPanel({name: 1.0 for name in PERSONAS.values()})
    ev, code, _, _ = await evaluate(fake_provider_server, conclave_env, panel, rounds=4, n=1,
                                    overrides=["quality.stage=on"], settings_extra=FULL_DEBATE)
    assert code == 0 and ev.settings.quality.stage == "on"
    assert len(fake_provider_server.requests) == 9 + 3  # three objections before the synthesis
    (row,) = store.read_items(conclave_env, ev.run_id)
    assert row["rounds_completed"] == 5
    assert row["vote_tokens"] < row["judge_tokens"] < row["debate_tokens"]
