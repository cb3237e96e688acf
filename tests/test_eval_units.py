"""Scorers, statistics, item sets and the report of the evaluation harness (no providers involved)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conclave.errors import UsageError
from conclave.eval.items import Item, arithmetic, load_set, read_jsonl
from conclave.eval.protocols import majority
from conclave.eval.run_report import render, render_sweep, swept_keys
from conclave.eval.scoring import canonical, is_correct
from conclave.eval.significance import brier, clopper_pearson, ece, mcnemar_exact, reliability_table, wilson
from conclave.eval.summary import summarise

# ------------------------------------------------------------------------------------------------ scorers


@pytest.mark.parametrize(("answer", "ok"), [
    ("42", True), ("42.0", True), ("The answer is 42.", True), ("1,042", False), ("-42", False), ("", False),
    ("forty-two", False), (" 42 ", True),
])
def test_numeric_scorer(answer: str, ok: bool) -> None:
    assert is_correct(answer, Item("i", "q", "42", "numeric")) is ok


def test_numeric_scorer_reads_thousands_separators_and_negative_numbers() -> None:
    assert is_correct("1,042", Item("i", "q", "1042", "numeric"))
    assert is_correct("−7", Item("i", "q", "-7", "numeric"))


@pytest.mark.parametrize(("answer", "ok"), [
    ("B", True), ("(b)", True), ("B.", True), ("Paris", True), ("paris.", True), ("B) Paris", True),
    ("A", False), ("London", False), ("E", False), ("", False),
])
def test_choice_scorer_by_letter_or_text(answer: str, ok: bool) -> None:
    item = Item("i", "Capital of France?", "B", "choice", ["London", "Paris", "Rome", "Madrid"])
    assert is_correct(answer, item) is ok


@pytest.mark.parametrize(("answer", "ok"), [("yes", True), ("Yes.", True), ("true", True), ("no", False),
                                            ("maybe", False), ("Yes, because…", True)])
def test_yes_no_scorer(answer: str, ok: bool) -> None:
    assert is_correct(answer, Item("i", "q", "yes", "yes_no")) is ok


def test_exact_scorer_ignores_case_whitespace_and_surrounding_punctuation() -> None:
    item = Item("i", "q", "New York", "exact")
    assert is_correct("  new   york. ", item)
    assert not is_correct("New York City", item)


def test_votes_count_canonical_answers_and_ties_go_to_the_first_agent() -> None:
    assert canonical("42.0", "numeric") == canonical("The answer is 42", "numeric") == "42"
    assert majority([("a", "7"), ("b", "42"), ("c", "42.0")], "numeric", []) == ("42", pytest.approx(2 / 3))
    assert majority([("a", "7"), ("b", "8"), ("c", "9")], "numeric", [])[0] == "7"
    assert majority([("a", None), ("b", "no number")], "numeric", []) == (None, 0.0)


# ------------------------------------------------------------------------------------------------ statistics


def test_wilson_interval_matches_the_published_value() -> None:
    low, high = wilson(7, 10)
    assert low == pytest.approx(0.3968, abs=1e-4) and high == pytest.approx(0.8922, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)


def test_clopper_pearson_interval_matches_the_published_value() -> None:
    low, high = clopper_pearson(7, 10)
    assert low == pytest.approx(0.3475, abs=1e-4) and high == pytest.approx(0.9333, abs=1e-4)
    assert clopper_pearson(0, 10)[0] == 0.0 and clopper_pearson(10, 10)[1] == 1.0
    assert clopper_pearson(0, 10)[1] == pytest.approx(0.3085, abs=1e-4)


def test_mcnemar_exact_p_value_is_the_two_sided_binomial_tail() -> None:
    a = [True] * 1 + [False] * 9 + [True] * 5
    b = [False] * 1 + [True] * 9 + [True] * 5
    test = mcnemar_exact(a, b)
    assert (test.b, test.c) == (1, 9)
    assert test.p == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact([True, False], [True, False]).p == 1.0


def test_brier_ece_and_the_reliability_table() -> None:
    assert brier([1.0, 0.0], [True, True]) == pytest.approx(0.5)
    assert ece([0.9] * 4, [True, True, False, False]) == pytest.approx(0.4)
    assert ece([0.25, 0.75], [False, True]) == pytest.approx(0.25)
    table = reliability_table([0.05, 0.95, 1.0], [False, True, True])
    assert [(b.count, b.accuracy) for b in table if b.count] == [(1, 0.0), (2, 1.0)]
    assert brier([], []) is None and ece([], []) is None


# ------------------------------------------------------------------------------------------------ items


def test_arithmetic_items_follow_du_et_al_and_are_seeded() -> None:
    items = arithmetic(50, 3)
    assert items == arithmetic(50, 3) and items != arithmetic(50, 4)
    for item in items:
        expression = item.question.split("result of ")[1].split("?")[0]
        numbers = [int(x) for x in expression.replace("+", " ").replace("-", " ").replace("*", " ").split()]
        assert len(numbers) == 6 and all(0 <= x < 30 for x in numbers)
        a, b, c, d, e, f = numbers
        assert expression == f"{a}+{b}*{c}+{d}-{e}*{f}"
        assert int(item.answer) == a + b * c + d - e * f and item.kind == "numeric"


def test_a_jsonl_set_loads_with_every_kind(tmp_path: Path) -> None:
    path = tmp_path / "set.jsonl"
    rows = [{"id": "1", "question": "2+2?", "answer": 4, "kind": "numeric"},
            {"id": "2", "question": "Capital?", "answer": "B", "kind": "choice", "choices": ["Rome", "Paris"]},
            {"id": "3", "question": "Is water wet?", "answer": "yes", "kind": "yes_no"},
            {"id": "4", "question": "Colour of the sky?", "answer": "blue"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    items = load_set(str(path), n=0, seed=0)
    assert [i.kind for i in items] == ["numeric", "choice", "yes_no", "exact"]
    assert load_set(str(path), n=2, seed=0) == items[:2]


@pytest.mark.parametrize(("line", "message"), [
    ('{"id": "1", "question": "q", "answer": "a", "kind": "fuzzy"}',
     "set.jsonl:1: kind: 'fuzzy' is not one of: exact, numeric, choice, yes_no, math"),
    ('{"id": "1", "question": "q"}', "set.jsonl:1: answer: required, a non-empty string"),
    ('{"id": "1", "question": "q", "answer": "C", "kind": "choice", "choices": ["x", "y"]}',
     "set.jsonl:1: answer: 'C' is neither a choice letter nor one of the choices"),
    ('{"id": "1", "question": "q", "answer": "a", "hint": "h"}',
     "set.jsonl:1: hint: unknown key; allowed: id, question, answer, kind, choices"),
    ("not json", "set.jsonl:1: not JSON (Expecting value)"),
])
def test_a_bad_jsonl_line_is_named_with_its_key(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "set.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(UsageError) as caught:
        read_jsonl(path)
    assert str(caught.value) == message


def test_an_unknown_set_names_what_is_allowed() -> None:
    with pytest.raises(UsageError, match=r"allowed: a path to a \.jsonl, \.csv, \.parquet or \.arrow file or a saved "
                                         r"dataset directory, arithmetic, gym:<task>"):
        load_set("nonsense", n=1, seed=0)


# ------------------------------------------------------------------------------------------------ summary


def _row(i: int, vote: bool, debate: bool, **extra: object) -> dict[str, object]:
    row: dict[str, object] = {"item_id": str(i), "status": "complete", "agreement": 1.0}
    for name, ok, cost in (("single", vote, 1.0), ("vote", vote, 3.0), ("judge", debate, 4.0),
                           ("debate", debate, 9.0)):
        row.update({f"{name}_correct": int(ok), f"{name}_cost": cost, f"{name}_tokens": int(cost * 100),
                    f"{name}_wall_s": 1.0, f"{name}_answer": "x"})
    row.update(extra)
    return row


def test_the_verdict_line_states_the_gain_its_p_value_and_the_cost_ratio() -> None:
    rows = [_row(i, vote=i < 5, debate=i < 8) for i in range(10)]
    summary = summarise(rows)
    assert summary["protocols"]["vote"]["accuracy"] == 0.5
    assert summary["verdict_line"] == ("debate vs vote: +30.0 pp [-5.3, +56.6], p = 0.250 (Holm over 1 point), "
                                       "at 3.00× billed tokens (3.00× the cost), 10 items")


def test_an_unknown_price_reports_the_token_ratio_instead() -> None:
    rows = [_row(0, True, True, debate_cost=None)]
    assert summarise(rows)["verdict_line"].endswith("at 3.00× billed tokens (cost unknown: a model has no price), "
                                                    "1 items")


def test_a_keyed_endpoint_without_prices_is_not_called_free() -> None:
    rows = [_row(0, True, True, vote_cost=0.0, debate_cost=0.0)]
    line = summarise(rows, prices="unknown")["verdict_line"]
    assert "(cost unknown: a model has no price)" in line and "free" not in line


def test_a_free_local_run_reports_the_token_ratio() -> None:
    rows = [_row(0, True, True, vote_cost=0.0, debate_cost=0.0)]
    line = summarise(rows, prices="free")["verdict_line"]
    assert line.endswith("at 3.00× billed tokens (every call was free: a local model), 1 items")


def test_reports_render_in_every_format() -> None:
    rows = [_row(i, vote=i % 2 == 0, debate=True, debate_confidence=0.9, agreement_confidence=0.67)
            for i in range(4)]
    run = {"run_id": "ev-1", "set_spec": "arithmetic", "status": "complete", "summary": summarise(rows)}
    markdown = render(run, rows, "markdown")
    assert "debate vs vote: +50.0 pp" in markdown and "| debate | the verdict's stated confidence | 4 | 0 | 0.900 |" in markdown
    assert json.loads(render(run, rows, "json"))["summary"]["items"] == 4
    page = render(run, rows, "html")
    assert page.startswith("<!doctype html>") and "<svg" in page and "<circle" in page


def test_a_sweep_report_groups_runs_by_the_swept_values() -> None:
    runs = [{"run_id": f"r{t}", "overrides": ["mode=answer", f"early_termination.threshold={t}"],
             "summary": summarise([_row(0, True, t > 0.75)])} for t in (0.9, 0.7, 0.8)]
    assert swept_keys(runs) == ["early_termination.threshold"]
    table = render_sweep("sw-1", runs, "markdown")
    lines = [line for line in table.splitlines() if line.startswith("| 0.")]
    assert [line.split("|")[1].strip() for line in lines] == ["0.7", "0.8", "0.9"]


def test_the_html_report_renders_the_full_report_and_states_the_real_wall_time() -> None:
    # four items at 1 s each ran at once: the protocol column sums 4 s, the run took 1.3 s
    rows = [_row(i, vote=True, debate=True) for i in range(4)]
    run = {"run_id": "ev-1", "set_spec": "<b>x</b>", "status": "complete", "wall_s": 1.3,
           "summary": summarise(rows)}
    markdown = render(run, rows, "markdown")
    assert "| item time s (summed) |" in markdown and "| wall s |" not in markdown
    assert "Wall time of the run: 1.3 s." in markdown
    page = render(run, rows, "html")
    full = page.split("<h2>Full report</h2>", 1)[1]
    assert "<pre>" not in full and "| protocol |" not in full and "**" not in full  # HTML, not Markdown text
    assert "<th>protocol</th>" in full and "<h2>Calibration</h2>" in full and "Power: with 4 items" in full
    # said once, above the full report: the title (with the set and item count) and the verdict line
    assert "<h1>" not in full and page.count("<h1>") == 1 and "<h1>Evaluation ev-1 · &lt;b&gt;x&lt;/b&gt; · 4 item(s)" in page
    assert page.count(run["summary"]["verdict_line"]) == 1 and run["summary"]["verdict_line"] in markdown
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page  # still escaped
