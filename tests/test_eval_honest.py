"""Trustworthy evaluation figures against the fake server: failures accounted for, the vote's interval covering
theory, paired sweep points paying round 1 once, and every reported figure recomputed by an independent script."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest
from eval_helpers import PERSONAS, evaluate

from conclave.eval import run_store as store
from conclave.eval.items import arithmetic
from conclave.eval.run_report import render, render_sweep
from conclave.eval.significance import detectable_pp, holm, newcombe_paired
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest

RECOMPUTE = Path(__file__).with_name("recompute_eval.py")
#: no replacement judge: a failed verdict call fails the item's debate
STRICT = {"cost": {"auto_approve": True}, "strict_models": True}


def _failing_verdicts(fake: FakeProviderServer, panel: AnswerPanel, questions: set[str]) -> None:
    """``panel`` on ``fake``, except that the verdict call fails on the items asking ``questions``."""
    panel.install(fake)

    def judge(request: RecordedRequest) -> Any:
        text = json.dumps(request.json)
        if "The final answer." in text and any(q in text for q in questions):
            return Fault.bad_request("the verdict call failed")
        return panel._judge(request)

    fake.script("gpt-4.1", judge)


async def test_items_whose_verdict_failed_are_accounted_for_and_headlined_apart(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    items = arithmetic(10, 0)
    failing = {items[i].id for i in (1, 4, 7)}
    panel = AnswerPanel({name: 0.6 for name in PERSONAS.values()}, seed=3)
    _failing_verdicts(fake, panel, {i.question for i in items if i.id in failing})
    ev, code, out, err = await evaluate(fake, conclave_env, None, rounds=4, n=10, settings_extra=STRICT)
    summary = store.read_run(conclave_env, ev.run_id)["summary"]
    assert code == 1  # a run with failures does not exit clean
    debate, vote = summary["protocols"]["debate"], summary["protocols"]["vote"]
    assert (debate["completed"], debate["failed"], debate["skipped"]) == (7, 3, 0)
    assert sorted(debate["failed_ids"]) == sorted(failing)
    assert (vote["completed"], vote["failed"]) == (10, 0)
    headline = summary["comparisons"]["debate_vs_vote"]
    assert headline["n"] == 7 and headline["itt"]["n"] == 10
    rows = store.read_items(conclave_env, ev.run_id)
    done = [r for r in rows if r["item_id"] not in failing]
    expected = 100 * (sum(r["debate_correct"] for r in done) - sum(r["vote_correct"] for r in done)) / 7
    assert headline["delta_pp"] == round(expected, 2)
    assert headline["itt"]["delta_pp"] == round(10 * (sum(r["debate_correct"] for r in rows)
                                                     - sum(r["vote_correct"] for r in rows)), 2)
    # the answer first, then the failures, before anything else
    first = [line for line in out.splitlines() if line.strip()][:3]
    assert first[1].startswith("**debate vs vote: ") and ", 7 items both completed; intent to treat" in first[1]
    assert first[2].startswith("> **This run has failures**: 3 item(s) failed")
    assert "has failures: 3 item(s) failed" in err
    assert f"| full debate (rounds=4) | 7 | 3 | 0 | {', '.join(debate['failed_ids'])} |" in out
    # the calibration of the verdict counts only verdicts that were given
    assert summary["calibration"]["debate"]["n"] == 7 and summary["calibration"]["debate"]["excluded"] == 3
    # every call billed counts in the run's total, the failed verdict calls' included
    assert summary["spent"]["tokens"] == sum(r["spent"]["debate"]["tokens"] for r in rows) > debate["tokens"] - 1


@pytest.mark.slow
async def test_a_vote_of_three_agents_at_0_6_lands_within_its_interval_of_0_648(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    panel = AnswerPanel({name: 0.6 for name in PERSONAS.values()}, seed=11)
    # the vote gate off: every item plays its synthesis, so the request count below is exact
    ev, code, _, err = await evaluate(fake_provider_server, conclave_env, panel, rounds=2, n=500, concurrency=16,
                                      settings_extra={"cost": {"auto_approve": True}, "selective": {"enabled": False}})
    assert code == 0, err
    vote = store.read_run(conclave_env, ev.run_id)["summary"]["protocols"]["vote"]
    theory = 0.6**3 + 3 * 0.6**2 * 0.4  # 0.648
    assert vote["n"] == 500 and vote["ci_low"] <= theory <= vote["ci_high"], vote
    assert vote["exact_ci_low"] <= theory <= vote["exact_ci_high"]
    assert len(fake_provider_server.requests) == 500 * 4


def _round_one_calls(fake: FakeProviderServer) -> dict[str, int]:
    """Round-1 agent calls per question (answer-mode round 1: the schema asks for a position)."""
    calls: dict[str, int] = {}
    for request in fake.requests:
        schema = request.schema if isinstance(request.schema, dict) else {}
        if request.model == "gpt-4o" and "position" in (schema.get("properties") or {}):
            text = json.dumps(request.json)
            question = text.split("<question>\\n", 1)[1].split("\\n</question>", 1)[0]
            calls[question] = calls.get(question, 0) + 1
    return calls


@pytest.mark.slow
async def test_the_points_of_a_sweep_pay_round_one_once_per_item(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    n = 200
    panel = AnswerPanel({name: 0.6 for name in PERSONAS.values()}, seed=5)
    runs = []
    for threshold in (0.8, 0.85, 0.9):
        ev, code, _, err = await evaluate(
            fake, conclave_env, panel, rounds=2, n=n, concurrency=16, sweep_id="sw-paired",
            settings_extra={"cost": {"auto_approve": True}, "early_termination": {"threshold": threshold},
                            "selective": {"enabled": False}},  # every item synthesised: exact counts
            overrides=[f"early_termination.threshold={threshold}"])
        assert code == 0, err
        runs.append(ev.run_id)
    calls = _round_one_calls(fake)
    assert len(calls) == n and set(calls.values()) == {3}  # three agents, once per item, not once per point
    assert len(fake.requests) == n * 3 + 3 * n  # round 1 once; each point's synthesis call
    first, *later = runs
    for run_id in later:
        rows = store.read_items(conclave_env, run_id)
        assert all(r["round_1_from"] == first for r in rows)
        base = {r["item_id"]: r for r in store.read_items(conclave_env, first)}
        # the same round-1 answers, and the same cost attributed to the vote: the points differ by their setting only
        assert all(r["answers"]["round_1"] == base[r["item_id"]]["answers"]["round_1"] for r in rows)
        assert all(r["vote_tokens"] == base[r["item_id"]]["vote_tokens"] for r in rows)
        summary = store.read_run(conclave_env, run_id)["summary"]
        assert summary["paired_round_1"] == n
        assert summary["spent"]["by_protocol"]["debate"]["tokens"] < summary["protocols"]["judge"]["tokens"]
    table = render_sweep("sw-paired", [store.read_run(conclave_env, r) for r in runs], "markdown")
    assert "Holm over 3 points" in table


def test_paired_interval_holm_and_power_figures() -> None:
    # Newcombe (1998), method 10: 12 both right, 2 only A, 9 only B, 21 neither
    low, high = newcombe_paired(12, 2, 9, 21)
    assert low < 7 / 44 < high and 0 < low  # holds the estimate; 9 against 2 discordant pairs excludes zero
    assert newcombe_paired(12, 9, 2, 21) == (-high, -low)  # B vs A is A vs B mirrored
    none_low, none_high = newcombe_paired(5, 0, 0, 5)  # no discordant pair: an interval around zero
    assert none_low < 0 < none_high
    assert holm([0.01, 0.04, 0.03]) == [0.03, 0.06, 0.06]
    # twenty items with a quarter of them discordant detect only about a 31 pp difference
    assert round(detectable_pp(20, 0.25) or 0, 0) == 31


async def test_every_reported_figure_recomputes_from_items_jsonl(
        fake_provider_server: FakeProviderServer, conclave_env: Path, tmp_path: Path) -> None:
    fake = fake_provider_server
    items = arithmetic(12, 0)
    panel = AnswerPanel({"Alpha": 0.7, "Beta": 0.5, "Gamma": 0.6}, seed=2)
    _failing_verdicts(fake, panel, {items[2].question, items[9].question})
    ev, code, out, _ = await evaluate(fake, conclave_env, None, rounds=4, n=12, settings_extra=STRICT)
    assert code == 1
    run = store.read_run(conclave_env, ev.run_id)
    rows = store.read_items(conclave_env, ev.run_id)
    (tmp_path / "report.json").write_text(render(run, rows, "json"))
    (tmp_path / "report.md").write_text(out)
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(RECOMPUTE), str(store.run_dir(conclave_env, ev.run_id) / "items.jsonl"),
        str(tmp_path / "report.json"), str(tmp_path / "report.md"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await process.communicate()
    report = stdout.decode()
    assert process.returncode == 0, report + stderr.decode()
    assert " 0 mismatches" in report
    assert int(report.split(" figures", 1)[0]) > 300  # every protocol's, comparison's and calibration's figures


def _rows(vote: list[bool], debate: list[bool]) -> list[dict[str, Any]]:
    return [{"item_id": str(i), "status": "complete", "vote_correct": int(v), "debate_correct": int(d),
             "single_correct": int(v), "judge_correct": int(d), "vote_tokens": 100, "debate_tokens": 300}
            for i, (v, d) in enumerate(zip(vote, debate, strict=True))]


def test_a_sweep_corrects_across_its_points_and_pools_seeds_with_their_spread() -> None:
    from conclave.eval.summary import summarise

    runs = []
    for index, (threshold, seed, gain) in enumerate(((0.8, 1, 6), (0.8, 2, 2), (0.9, 1, 0), (0.9, 2, 4))):
        rows = _rows([False] * 10 + [True] * 10, [True] * gain + [False] * (10 - gain) + [True] * 10)
        runs.append({"run_id": f"r{index}", "overrides": [f"early_termination.threshold={threshold}",
                                                          f"eval.seed={seed}"], "summary": summarise(rows)})
    raw = [r["summary"]["comparisons"]["debate_vs_vote"]["p"] for r in runs]
    report = json.loads(render_sweep("sw", runs, "json"))
    corrected = {r["run_id"]: r["summary"]["comparisons"]["debate_vs_vote"]["p_corrected"] for r in report["runs"]}
    assert [corrected[f"r{i}"] for i in range(4)] == holm(raw)
    assert all("(Holm over 4 points)" in r["summary"]["verdict_line"] for r in report["runs"])
    pooled = {group["point"]: group["protocols"]["debate"] for group in report["seeds_pooled"]}
    assert pooled["early_termination.threshold=0.8"]["accuracy"] == (16 + 12) / 40
    assert math.isclose(pooled["early_termination.threshold=0.8"]["spread"], math.sqrt(2 * 0.1**2))
    assert "Seeds pooled" in render_sweep("sw", runs, "markdown")


def test_a_run_written_before_accounting_is_reported_from_its_rows() -> None:
    rows = _rows([True, False, True], [True, True, False])
    old = {"items": 3, "protocols": {}, "comparisons": {}, "verdict_line": "debate vs vote: +0.0 pp (p = 1) at …"}
    markdown = render({"run_id": "ev-old", "status": "complete", "estimated_cost": 0.1, "summary": old}, rows,
                      "markdown")
    assert "**debate vs vote: +0.0 pp [" in markdown and "## Every item accounted for" in markdown


class _Resampled(AnswerPanel):
    """Every call is a fresh draw, as from a panel sampling at temperature > 0."""

    draws = 0

    def right(self, persona: str, question: str) -> bool:
        self.draws += 1
        return super().right(persona, f"{question}\x00{self.draws}")


async def test_the_matched_vote_can_match_on_dollars(fake_provider_server: FakeProviderServer,
                                                     conclave_env: Path) -> None:
    panel = _Resampled({name: 0.6 for name in PERSONAS.values()}, seed=4)
    ev, code, _, err = await evaluate(fake_provider_server, conclave_env, panel, rounds=4, n=8, matched_vote=True,
                                      matched_on="dollars", concurrency=1)
    assert code == 0, err
    summary = store.read_run(conclave_env, ev.run_id)["summary"]
    rows = store.read_items(conclave_env, ev.run_id)
    debate = math.fsum(r["debate_cost"] for r in rows)
    matched = math.fsum(r["vote_matched_cost"] for r in rows)
    assert summary["matched_on"] == "dollars" and summary["matched_ratio"] == pytest.approx(matched / debate)
    assert abs(matched - debate) <= max(r["vote_cost"] for r in rows) / 2  # within half a sample of the debates
    assert f"matched vote: {matched / debate:.3f}× the debate's billed dollars" in err
