"""The built-in aggregators, loaded through the plugin manager as a third-party one would be: their weights, the
pick, and learned weights fitted from graded history in a real index."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conclave.engine.aggregation import AggregationContext, Ballot, answer_groups
from conclave.plugin_manager import get_plugins
from conclave.store.sqlite_index import connect

PANEL = [("strong", "Security Expert"), ("weak1", "Systems Architect"), ("weak2", "Pragmatic Engineer")]


def _ballots(answers: list[str], confidences: list[float | None]) -> list[Ballot]:
    return [Ballot(agent, persona, "openai", "gpt-4o", answer, confidence)
            for (agent, persona), answer, confidence in zip(PANEL, answers, confidences, strict=True)]


def _aggregate(name: str, ballots: list[Ballot], context: AggregationContext | None = None):  # type: ignore[no-untyped-def]
    aggregator = get_plugins().aggregators.get(name)
    return aggregator.aggregate(ballots, answer_groups(ballots), context or AggregationContext())


def test_plurality_weighs_everyone_the_same() -> None:
    found = _aggregate("plurality", _ballots(["7", "8", "8"], [0.99, 0.5, 0.5]))
    assert found.weights == {"strong": 0.3333, "weak1": 0.3333, "weak2": 0.3333}
    assert found.group == 1 and found.agreement == pytest.approx(0.6667, abs=1e-4)


def test_confidence_weights_are_relative_within_the_question() -> None:
    sure = _aggregate("confidence", _ballots(["7", "8", "8"], [0.99, 0.3, 0.3]))
    assert sure.group == 0 and sure.weights["strong"] > 0.85  # one much surer agent outweighs two unsure ones
    # the same confidences shifted together change nothing: only relative confidence counts
    low = _aggregate("confidence", _ballots(["7", "8", "8"], [0.5, 0.5, 0.5]))
    high = _aggregate("confidence", _ballots(["7", "8", "8"], [0.9, 0.9, 0.9]))
    assert low.weights == high.weights == {"strong": 0.3333, "weak1": 0.3333, "weak2": 0.3333}


def test_learned_weights_without_history_are_equal_and_say_so(tmp_path: Path) -> None:
    found = _aggregate("learned", _ballots(["7", "8", "8"], [0.9, 0.9, 0.9]), AggregationContext(home=tmp_path))
    assert found.note == "no graded history: equal weights" and found.basis == {"strong": 0, "weak1": 0, "weak2": 0}
    assert found.group == 1


def _graded_history(home: Path, items: int, accuracy: dict[str, float], kind: str = "numeric") -> None:
    """``items`` graded eval items in the index: each agent right on the first accuracy × items of them."""
    db = connect(home / "index.db")
    for k in range(items):
        cid = f"c-{kind}{k:04d}"
        answers = {agent: "1" if k < accuracy[agent] * items else "2" for agent, _ in PANEL}
        db["eval_items"].insert({"run_id": "r1", "item_id": f"{kind}{k}", "consultation_id": cid, "kind": kind,
                                 "expected": "1", "answers": json.dumps({"round_1": answers})})
        for agent, persona in PANEL:
            db["agents"].insert({"consultation_id": cid, "agent": agent, "persona": persona, "provider": "openai",
                                 "model": "gpt-4o"})
    db.conn.commit()
    db.conn.close()


def test_learned_weights_follow_graded_accuracy_per_kind_and_show_their_basis(tmp_path: Path) -> None:
    _graded_history(tmp_path, 200, {"strong": 0.9, "weak1": 0.6, "weak2": 0.6})
    _graded_history(tmp_path, 10, {"strong": 0.0, "weak1": 1.0, "weak2": 1.0}, kind="exact")
    ballots = _ballots(["7", "8", "8"], [0.9, 0.9, 0.9])
    found = _aggregate("learned", ballots, AggregationContext(home=tmp_path, kind="numeric"))
    assert found.basis == {"strong": 200, "weak1": 200, "weak2": 200}
    assert found.weights["strong"] > found.weights["weak1"] + found.weights["weak2"]  # log-odds 2.2 vs 0.4 each
    assert found.group == 0 and "items: strong 200" in found.note
    # thin history of another kind: shrunk toward equal weights (10 items: a third learned)
    thin = _aggregate("learned", ballots, AggregationContext(home=tmp_path, kind="exact"))
    assert thin.basis == {"strong": 10, "weak1": 10, "weak2": 10}
    assert thin.weights["strong"] < thin.weights["weak1"] and thin.weights["strong"] > 0.15


def test_judge_pick_needs_the_judge_and_then_picks_its_answer() -> None:
    ballots = _ballots(["7", "8", "8"], [0.9, 0.9, 0.9])
    before = _aggregate("judge_pick", ballots)
    assert before.group is None and "has not picked" in before.note
    after = _aggregate("judge_pick", ballots, AggregationContext(judge_answer="7."))
    assert after.group == 0 and after.agreement == pytest.approx(0.3333, abs=1e-4)


def test_learned_history_skips_unreadable_rows_and_counts_numeric_answers_as_given(tmp_path: Path) -> None:
    """Rows whose answers are not JSON, or whose round 1 is not an object, are not graded; an answer stored as a
    JSON number is graded as the text it reads as; an agent absent from round 1 is not graded."""
    _graded_history(tmp_path, 4, {"strong": 1.0, "weak1": 0.5, "weak2": 0.0})
    db = connect(tmp_path / "index.db")
    rows = {"c-bad": "{not json", "c-list": json.dumps({"round_1": ["1", "1", "1"]}),
            "c-num": json.dumps({"round_1": {"strong": 1, "weak1": 1.0}})}
    for cid, answers in rows.items():
        db["eval_items"].insert({"run_id": "r1", "item_id": cid, "consultation_id": cid, "kind": "numeric",
                                 "expected": "1", "answers": answers})
        for agent, persona in PANEL:
            db["agents"].insert({"consultation_id": cid, "agent": agent, "persona": persona, "provider": "openai",
                                 "model": "gpt-4o"})
    db.conn.commit()
    db.conn.close()
    found = _aggregate("learned", _ballots(["7", "8", "8"], [0.9, 0.9, 0.9]),
                       AggregationContext(home=tmp_path, kind="numeric"))
    assert found.basis == {"strong": 5, "weak1": 5, "weak2": 4}
    assert "items: strong 5, weak1 5, weak2 4" in found.note
