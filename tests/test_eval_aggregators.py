"""`conclave eval`'s protocols read from the same round-1 answers: the confidence-weighted vote, the learned-weight
vote (fitted from the graded items already in the index), the judge's pick; and the debate protocol plays the
vote gate of answer mode."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from eval_helpers import PERSONAS, evaluate

from conclave.eval import run_store as store
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer

STRONG_WEAK = {"Alpha": 0.95, "Beta": 0.55, "Gamma": 0.55}


async def test_learned_weights_pick_the_strong_agent_once_history_is_graded(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    first, code, _, _ = await evaluate(fake, conclave_env, AnswerPanel(STRONG_WEAK, seed=1), n=40, seed=1,
                                       quality="off")
    assert code == 0
    rows = store.read_items(conclave_env, first.run_id)
    # the first item had no graded history: the learned vote is the plain vote there
    assert rows[0]["vote_learned_answer"] == rows[0]["vote_answer"]
    second, code, _, _ = await evaluate(fake, conclave_env, AnswerPanel(STRONG_WEAK, seed=2), n=40, seed=2,
                                        quality="off")
    assert code == 0
    rows = store.read_items(conclave_env, second.run_id)
    split = [r for r in rows if r["answers"]["round_1"]["alpha"] != r["answers"]["round_1"]["beta"]
             == r["answers"]["round_1"]["gamma"]]
    assert split, "the seeded panel has items where the strong agent stands alone"
    # the strong agent alone outweighs the two weak ones once 40+ graded items back its weight
    assert all(r["vote_learned_answer"] == r["answers"]["round_1"]["alpha"] for r in split)
    assert sum(r["vote_learned_correct"] for r in rows) > sum(r["vote_correct"] for r in rows)
    # equal confidences: the confidence-weighted vote is the plain vote; the judge picks the majority's answer
    assert all(r["vote_weighted_answer"] == r["vote_answer"] for r in rows)
    assert all(r["judge_pick_correct"] == r["vote_correct"] for r in rows)
    with sqlite3.connect(conclave_env / "index.db") as db:
        indexed = db.execute("select count(*), sum(vote_learned_correct) from eval_items where run_id = ?",
                             (second.run_id,)).fetchone()
    assert indexed == (40, sum(r["vote_learned_correct"] for r in rows))


async def test_the_debate_protocol_plays_the_gate_and_pays_round_1_for_decided_items(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    run, code, _, _ = await evaluate(fake, conclave_env, AnswerPanel({n: 1.0 for n in PERSONAS.values()}), n=3,
                                     quality="off", rounds=None)  # type: ignore[arg-type]
    assert code == 0
    for row in store.read_items(conclave_env, run.run_id):
        assert row["rounds_completed"] == 1 and row["debate_correct"] == 1
        assert row["debate_tokens"] == row["vote_tokens"] and row["judge_pick_correct"] == 1


async def test_sc_best_samples_the_best_agent_alone_up_to_the_debates_billed_tokens(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    # no graded history yet: the best agent is the single agent; the panel splits, so every item is debated
    panel = {"Alpha": 1.0, "Beta": 0.0, "Gamma": 1.0}
    run, code, out, _ = await evaluate(fake, conclave_env, AnswerPanel(panel), n=2, quality="off", sc_best=True,
                                       single_agent="beta")
    assert code == 0 and run.best_agent == "beta"
    for row in store.read_items(conclave_env, run.run_id):
        assert row["rounds_completed"] == 4
        per_call = row["single_tokens"]
        assert row["debate_tokens"] <= row["sc_best_tokens"] < row["debate_tokens"] + 5 * per_call
        assert row["sc_best_correct"] == 0 and row["sc_best_answer"] == row["answers"]["round_1"]["beta"]
    assert "| best agent's self-consistency at the debate's tokens |" in out
    # with graded history the best agent is the one the learned weights favour, whatever the single agent is
    again, code, _, _ = await evaluate(fake, conclave_env, AnswerPanel(panel, seed=3), n=1, seed=3,
                                       quality="off", sc_best=True, single_agent="beta")
    assert code == 0 and again.best_agent in ("alpha", "gamma")
    (row,) = store.read_items(conclave_env, again.run_id)
    assert row["sc_best_correct"] == 1
