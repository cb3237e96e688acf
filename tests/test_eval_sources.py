"""Benchmark files through a column map (JSONL, CSV, Parquet, a dataset saved to disk), the answer normalizers,
multiple-choice items reaching the model with their options and a constrained schema, and bad benchmark files
stopped with one line before anything is spent. Every file is generated here; nothing is downloaded."""

from __future__ import annotations

import asyncio
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from eval_helpers import PERSONAS, evaluate

from conclave.errors import ConfigError, UsageError
from conclave.eval.items import Item
from conclave.eval.scoring import canonical, is_correct
from conclave.eval.sources import SourceOptions, load
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer

pa = pytest.importorskip("pyarrow", reason="Parquet and saved datasets need pyarrow (the `data` extra)")
import pyarrow.parquet as pq  # noqa: E402  (after the skip: pyarrow is optional)

# ------------------------------------------------------------------------------------------------ normalizers


@pytest.mark.parametrize(("answer", "expected", "ok"), [
    ("so she has 18 left.\n#### 18", "18", True),          # GSM8K's worked answer
    ("#### 1,234", "1234", True),
    ("The acceleration is 12 m/s^2", "12", True),         # a unit's exponent is not the answer
    ("It costs $1,200.", "1200", True),
    ("45%", "45", True),
    ("3 × 10^8 m/s", "300000000", True),
    ("\\boxed{42}", "42", True),
    ("7 cm²", "7", True),
    ("12 m/s^2", "2", False),
])
def test_numbers_with_units_and_gsm8k_answers(answer: str, expected: str, ok: bool) -> None:
    assert is_correct(answer, Item("i", "q", expected, "numeric")) is ok


@pytest.mark.parametrize(("answer", "expected", "ok"), [
    ("Thus \\boxed{\\dfrac{1}{2}}.", "\\frac{1}{2}", True),
    ("$\\left( 3, \\frac{\\pi}{2} \\right)$", "\\left(3,\\frac{\\pi}{2}\\right)", True),
    ("\\boxed{10^\\circ}", "10", True),
    ("\\boxed{\\text{(C)}}", "\\text{(C)}", True),
    ("5.0", "5", True),
    ("\\frac{1}{3}", "\\frac{1}{2}", False),
])
def test_math_answers_compare_as_latex(answer: str, expected: str, ok: bool) -> None:
    assert is_correct(answer, Item("i", "q", expected, "math")) is ok
    if ok:
        assert canonical(answer, "math") == canonical(expected, "math")


# ------------------------------------------------------------------------------------------------ loaders

MMLU = [{"question": f"Q{i}?", "options": ["w", "x", "y", "z"], "answer": "ABCD"[i % 4], "src": "s"}
        for i in range(4)]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _save_to_disk(directory: Path, table: Any) -> Path:
    """What ``datasets.Dataset.save_to_disk`` writes: Arrow IPC stream files listed in ``state.json``."""
    directory.mkdir(parents=True)
    with pa.ipc.new_stream(str(directory / "data-00000-of-00001.arrow"), table.schema) as writer:
        writer.write_table(table)
    (directory / "state.json").write_text(json.dumps(
        {"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_split": None}))
    (directory / "dataset_info.json").write_text("{}")
    return directory


def test_each_format_loads_the_same_items(tmp_path: Path) -> None:
    options = SourceOptions(columns={"choices": "options"}, answer_format="letter")
    jsonl = _write_jsonl(tmp_path / "mmlu.jsonl", MMLU)
    with (tmp_path / "mmlu.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, ["question", "options", "answer"])
        writer.writeheader()
        writer.writerows({"question": r["question"], "options": json.dumps(r["options"]), "answer": r["answer"]}
                         for r in MMLU)
    table = pa.Table.from_pylist(MMLU)
    pq.write_table(table, tmp_path / "mmlu.parquet")
    saved = _save_to_disk(tmp_path / "mmlu_saved", table)
    loaded = {name: load(str(path), n=0, seed=0, options=options) for name, path in
              (("jsonl", jsonl), ("csv", tmp_path / "mmlu.csv"), ("parquet", tmp_path / "mmlu.parquet"),
               ("saved", saved))}
    expected = [(f"Q{i}?", "ABCD"[i % 4], ["w", "x", "y", "z"], "choice") for i in range(4)]
    for name, items in loaded.items():
        assert [(i.question, i.answer, i.choices, i.kind) for i in items] == expected, name
    assert [i.id for i in loaded["csv"]] == ["mmlu-1", "mmlu-2", "mmlu-3", "mmlu-4"]  # no id column: row numbers
    assert len(load(str(saved), n=2, seed=0, options=options)) == 2


def test_a_saved_dataset_dict_is_read_by_split(tmp_path: Path) -> None:
    root = tmp_path / "strategyqa"
    _save_to_disk(root / "train", pa.Table.from_pylist([{"question": "Train?", "answer": True}]))
    _save_to_disk(root / "test", pa.Table.from_pylist([{"question": "Is ice cold?", "answer": True},
                                                       {"question": "Is fire cold?", "answer": False}]))
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    items = load(str(root), n=0, seed=0, options=SourceOptions())  # test by default; booleans are yes/no
    assert [(i.question, i.answer, i.kind) for i in items] == [("Is ice cold?", "yes", "yes_no"),
                                                               ("Is fire cold?", "no", "yes_no")]
    assert load(str(root), n=0, seed=0, options=SourceOptions(split="train"))[0].question == "Train?"
    with pytest.raises(ConfigError, match=r"eval\.split: 'dev' is not a split of strategyqa; allowed: train, test"):
        load(str(root), n=0, seed=0, options=SourceOptions(split="dev"))


def test_benchmark_recipes_read_their_native_columns(tmp_path: Path) -> None:
    gsm8k = _write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": "How many?", "answer": "3 + 4 = 7\n#### 7"}])
    assert load(str(gsm8k), n=0, seed=0, options=SourceOptions(answer_format="gsm8k"))[0].answer == "7"
    math = _write_jsonl(tmp_path / "math500.jsonl", [{"problem": "Half?", "solution": "It is \\boxed{\\frac12}.",
                                                       "answer": "\\frac{1}{2}", "unique_id": "test/algebra/1.json"}])
    item = load(str(math), n=0, seed=0, options=SourceOptions(
        columns={"question": "problem", "id": "unique_id"}, answer_format="math"))[0]
    assert (item.id, item.answer, item.kind) == ("test/algebra/1.json", "\\frac{1}{2}", "math")
    boxed = load(str(math), n=0, seed=0, options=SourceOptions(
        columns={"question": "problem", "answer": "solution"}, answer_format="boxed"))[0]
    assert boxed.answer == "\\frac12"
    truthful = tmp_path / "truthfulqa.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": f"T{i}?", "mc1_targets": {
        "choices": ["right", "wrong 1", "wrong 2", "wrong 3"], "labels": [1, 0, 0, 0]}} for i in range(20)]), truthful)
    options = SourceOptions(columns={"choices": "mc1_targets.choices", "answer": "mc1_targets.labels"},
                            answer_format="labels", shuffle_choices=True)
    items = load(str(truthful), n=0, seed=1, options=options)
    assert all(i.choices[ord(i.answer) - ord("A")] == "right" for i in items)
    assert len({i.answer for i in items}) > 1  # shuffled: the right choice is not always A
    assert load(str(truthful), n=0, seed=1, options=options) == items  # seeded
    gpqa = tmp_path / "gpqa.csv"
    gpqa.write_text("Record ID,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\n"
                    "rec1,Which?,yes it,no 1,no 2,no 3\n")
    item = load(str(gpqa), n=0, seed=0, options=SourceOptions(
        columns={"id": "Record ID", "question": "Question", "answer": "Correct Answer",
                 "choices": ["Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3"]},
        answer_format="text", shuffle_choices=True))[0]
    assert item.id == "rec1" and item.choices[ord(item.answer) - ord("A")] == "yes it"


@pytest.mark.parametrize(("name", "content", "options", "message"), [
    ("set.csv", "question,answer\nq1,4\nq2,\n", SourceOptions(), "set.csv:3: answer: column 'answer' is empty"),
    ("set.csv", "question,solution\nq1,4\n", SourceOptions(),
     "set.csv:2: answer: no column 'answer' (set eval.columns.answer; columns: question, solution)"),
    ("set.jsonl", '{"question": "q", "answer": "#### 4"}\n{"question": "q2", "answer": "no marker"}\n',
     SourceOptions(answer_format="gsm8k"), "set.jsonl:2: answer: no '#### <number>' at its end (answer_format=gsm8k)"),
    ("set.jsonl", '{"question": "q", "options": ["a", "b", "c"], "answer": "D"}\n',
     SourceOptions(columns={"choices": "options"}),
     "set.jsonl:1: answer: 'D' is not the letter of one of the 3 choices (A–C)"),
    ("set.jsonl", '{"question": "q", "answer": "B"}\n', SourceOptions(answer_format="letter"),
     "set.jsonl:1: choices: answer_format=letter needs choices (set eval.columns.choices)"),
])
def test_a_bad_row_names_the_file_line_and_field(tmp_path: Path, name: str, content: str, options: SourceOptions,
                                                 message: str) -> None:
    (tmp_path / name).write_text(content)
    with pytest.raises(UsageError) as caught:
        load(str(tmp_path / name), n=0, seed=0, options=options)
    assert str(caught.value) == message


def test_a_bad_parquet_row_is_named_by_row(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pylist([{"question": "q", "choices": ["a", "b"], "answer": 0},
                                         {"question": "q2", "choices": ["a", "b"], "answer": 5}]), tmp_path / "s.parquet")
    with pytest.raises(UsageError, match=r"^s\.parquet row 2: answer: '5' is not a choice index \(0–1\)$"):
        load(str(tmp_path / "s.parquet"), n=0, seed=0, options=SourceOptions())


def test_an_unknown_answer_format_or_field_is_a_config_error(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "s.jsonl", MMLU)
    with pytest.raises(ConfigError, match=r"eval\.answer_format: 'roman' is not one of: auto, plain, number"):
        load(str(path), n=0, seed=0, options=SourceOptions(answer_format="roman"))
    with pytest.raises(ConfigError, match=r"eval\.columns\.hint: unknown field; allowed: question, answer"):
        load(str(path), n=0, seed=0, options=SourceOptions(columns={"hint": "src"}))


# ------------------------------------------------------------------------------------------------ end to end

CAPITALS = {"Capital of France?": "B", "Capital of Italy?": "C"}


def _letter_truth(question: str) -> str:
    return CAPITALS[question.split("\n", 1)[0]]


async def test_choices_reach_the_model_and_its_answer_is_constrained_to_their_letters(
        fake_provider_server: FakeProviderServer, conclave_env: Path, tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "capitals.jsonl", [
        {"question": "Capital of France?", "options": ["London", "Paris", "Rome", "Madrid"], "answer": "B"},
        {"question": "Capital of Italy?", "options": ["London", "Paris", "Rome", "Madrid"], "answer": "C"}])
    panel = AnswerPanel({name: 1.0 for name in PERSONAS.values()}, truth=_letter_truth)
    # the vote gate off: a unanimous panel would otherwise be decided after round 1, and the judge never asked
    _, code, out, err = await evaluate(fake_provider_server, conclave_env, panel, rounds=2, n=0,
                                       set=str(path), columns={"choices": "options"},
                                       settings_extra={"cost": {"auto_approve": True}, "selective": {"enabled": False}})
    assert code == 0, err
    asked = fake_provider_server.requests_for("gpt-4o")
    assert asked
    for request in asked:
        user = "\n".join(str(m["content"]) for m in request.json["messages"] if m["role"] == "user")
        assert "Options:\nA. London\nB. Paris\nC. Rome\nD. Madrid" in user
        assert request.schema["properties"]["final_answer"]["enum"] == ["A", "B", "C", "D"]
    judged = fake_provider_server.requests_for("gpt-4.1")
    assert judged and all(r.schema["properties"]["final_answer"]["enum"] == ["A", "B", "C", "D"] for r in judged)
    assert "| round-1 majority vote | 2/2 = 100.0% |" in out


@pytest.mark.parametrize(("content", "extra", "message"), [
    ("question,solution\nq1,4\n", (), "set.csv:2: answer: no column 'answer'"),
    ("question,answer\nq1,no marker\n", ("eval.answer_format=gsm8k",),
     "set.csv:2: answer: no '#### <number>' at its end"),
    ('question,options,answer\nq1,"[""a"",""b""]",E\n', ("eval.columns.choices=options",),
     "set.csv:2: answer: 'E' is not the letter of one of the 2 choices (A–B)"),
])
async def test_a_bad_benchmark_file_stops_the_cli_with_one_line_and_spends_nothing(
        fake_provider_server: FakeProviderServer, tmp_path: Path, content: str, extra: tuple[str, ...],
        message: str) -> None:
    (tmp_path / "set.csv").write_text(content)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(tmp_path / "home"), CONCLAVE_PROGRESS="0", OPENAI_API_KEY="sk-test")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "eval", str(tmp_path / "set.csv"), *extra, "agents=openai_only",
        "cost.auto_approve=true", *fake_provider_server.overrides(), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(tmp_path), env=env)
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    lines = err.decode().strip().splitlines()
    assert process.returncode == 2 and len(lines) == 1, err.decode()
    assert lines[0].startswith(f"conclave: {message}")
    assert out == b"" and fake_provider_server.requests == []  # nothing asked, nothing spent


async def test_an_answer_outside_the_letters_is_re_asked_quoting_them(
        fake_provider_server: FakeProviderServer, conclave_env: Path, tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "capital.jsonl", [
        {"question": "Capital of France?", "choices": ["London", "Paris", "Rome", "Madrid"], "answer": "Paris"}])
    calls: list[str] = []

    def truth(question: str) -> str:  # the first answer names the choice by its text, as models do
        calls.append(question)
        return "Paris" if len(calls) == 1 else _letter_truth(question)

    panel = AnswerPanel({name: 1.0 for name in PERSONAS.values()}, truth=truth)
    _, code, out, err = await evaluate(fake_provider_server, conclave_env, panel, rounds=2, n=0, set=str(path),
                                       answer_format="text")
    assert code == 0, err
    reasks = [r for r in fake_provider_server.requests_for("gpt-4o")
              if "$.final_answer: 'Paris' is not one of ['A', 'B', 'C', 'D']" in json.dumps(r.json)]
    assert len(reasks) == 1
    assert "| round-1 majority vote | 1/1 = 100.0% |" in out and "| single agent | 1/1 = 100.0% |" in out
