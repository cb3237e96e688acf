"""An evaluation reads the learned vote's graded history once and adds each item as it indexes it, instead of
re-reading the whole history for every item: each item's learned weights must still be fitted to exactly the
history a full re-read of the index would have given at that moment (every earlier run, plus this run's items
indexed before it), items finishing out of order four at a time included."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from conclave_plugins.aggregators import learned_weights
from eval_helpers import PERSONAS, evaluate

from conclave.engine.aggregation import Ballot
from conclave.eval import run_store as store
from conclave.eval.graded import GradedHistory, graded_history
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer

SKILL = {"Alpha": 0.9, "Beta": 0.6, "Gamma": 0.5}


async def test_each_item_gets_the_history_a_full_reread_would_have_given(
        fake_provider_server: FakeProviderServer, conclave_env: Path, tmp_path: Path) -> None:
    fake = fake_provider_server
    earlier, code, _, err = await evaluate(fake, conclave_env, AnswerPanel(SKILL, seed=1), rounds=2, n=12, seed=1,
                                           quality="off")
    assert code in (0, 1), err
    run, code, _, err = await evaluate(fake, conclave_env, AnswerPanel(SKILL, seed=2), rounds=2, n=36, seed=2,
                                       quality="off", concurrency=4)
    assert code in (0, 1), err
    lines = (store.run_dir(conclave_env, run.run_id) / "items.jsonl").read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines]  # in the order they were written, and indexed
    assert len(rows) == 36

    # replay: the index as it was before this run, then this run's rows one by one in the order they were indexed
    replay = tmp_path / "replay"
    replay.mkdir()
    with sqlite3.connect(conclave_env / "index.db") as source, sqlite3.connect(replay / "index.db") as copy:
        source.backup(copy)
    with sqlite3.connect(replay / "index.db") as db:
        db.execute("delete from eval_items where run_id = ?", (run.run_id,))
        seats = {(cid, agent): (persona, provider, model) for cid, agent, persona, provider, model in db.execute(
            "select consultation_id, agent, persona, provider, model from agents")}
    kept = GradedHistory(replay)  # the same history kept the new way, alongside
    grown = []
    for row in rows:
        recorded = row["vote_learned_weights"]
        history = graded_history(replay, row["kind"])  # the old way: the whole history, read now
        assert kept(row["kind"]) == history
        ballots = [Ballot(agent, *seats[(row["consultation_id"], agent)], "", None) for agent in recorded["weights"]]
        weights, basis, _ = learned_weights(ballots, history)
        assert recorded["basis"] == basis, row["item_id"]
        assert recorded["weights"] == {a: round(w, 4) for a, w in weights.items()}, row["item_id"]
        grown.append(sum(basis.values()))
        kept.forget(run.run_id, row["item_id"])
        store.index_item(replay, run.run_id, row)
        kept.learn(run.run_id, row["item_id"])
    kept.close()
    # not vacuous: the first item saw only the earlier run; the history grew with this run's items as they came
    assert grown[0] == 12 * 3 and grown[-1] == (12 + 35) * 3, grown
    assert len(set(grown)) > 20
    # and an item run again (a re-run replaces its row) is counted once
    again = GradedHistory(replay)
    before = again("numeric")
    again.forget(run.run_id, rows[0]["item_id"])
    store.index_item(replay, run.run_id, rows[0])
    again.learn(run.run_id, rows[0]["item_id"])
    assert again("numeric") == before == graded_history(replay, "numeric")
    again.close()
    assert earlier.run_id != run.run_id and set(PERSONAS) == set(rows[0]["vote_learned_weights"]["weights"])
    # a home whose path means something in a URI (the index is opened read-only by its URI)
    odd = tmp_path / "home #2 ?mode=rw&x=%41"
    odd.mkdir()
    shutil.copy(replay / "index.db", odd / "index.db")
    assert graded_history(odd, "numeric") == graded_history(replay, "numeric") != {}

