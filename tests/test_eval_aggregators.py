"""`conclave eval`'s protocols read from the same round-1 answers: the confidence-weighted vote, the learned-weight
vote (fitted from the graded items already in the index), the judge's pick; and the debate protocol plays the
vote gate of answer mode."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from eval_helpers import PERSONAS, evaluate

from conclave.eval import store
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
