"""The quality protocol of `conclave eval`: the debate with the quality layer on (``eval.quality``), forked from
each item's own round 1 (not paid again when its round-1 calls are the same), with the quality layer's figures per
protocol."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from eval_helpers import PERSONAS, evaluate, panel_settings

from conclave.errors import ConfigError
from conclave.eval import quality_arm
from conclave.eval import run_store as store
from conclave.eval.evaluate import REPEAT_PROBE, EvalOptions, prepare
from conclave.plugin_manager import get_plugins
from conclave.store.journal import read_records
from conclave.store.paths import StoreLayout
from conclave.testing.answer_panel import AnswerPanel, arithmetic_truth
from conclave.testing.fake_server import FakeProviderServer

#: an arm that changes nothing round 1 sends (the state block's budget shows in round-3 prompts only)
LATER_ROUNDS_ONLY = {"quality.state_tokens": 500}
#: a unanimous panel is decided by the vote gate after round 1; these tests compare full debates
FULL_DEBATE = {"cost": {"auto_approve": True}, "selective": {"enabled": False}}


def _round_one_requests(fake: FakeProviderServer, question: str) -> int:
    return sum(1 for r in fake.requests if question in json.dumps(r.json) and "Round 1 of 4" in json.dumps(r.json))


async def test_the_quality_arm_continues_from_round_one_without_paying_it_again(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    ev, code, out, err = await evaluate(fake, conclave_env, AnswerPanel({n: 1.0 for n in PERSONAS.values()}),
                                        n=2, quality=LATER_ROUNDS_ONLY, settings_extra=FULL_DEBATE)
    assert code == 0, err
    # base: 3 agents + synthesis + 3 replies + cross-exam judge + verdict = 9; the arm: the same minus round 1 = 6
    assert len(fake.requests) == 2 * (9 + 6)
    assert all(_round_one_requests(fake, item.question) == 3 for item in ev.items)
    assert "for 30 planned call(s)" in err  # the estimate covers the arm's calls, and not a second round 1
    rows = store.read_items(conclave_env, ev.run_id)
    for row in rows:
        assert row["quality_reused_round_1"] == 1 and row["quality_correct"] == 1
        assert row["quality_consultation_id"] not in (None, row["consultation_id"])
        # the arm's own journal holds the round-1 answers it continued from, marked as restored (not asked again)
        records = read_records(StoreLayout(conclave_env).journal_path(row["quality_consultation_id"]))
        round_1 = [r["data"] for r in records if r["type"] == "consultation:round_artifact"
                   and r["data"]["round_number"] == 1]
        assert sorted(a["agent"] for a in round_1) == sorted(PERSONAS) and {a["status"] for a in round_1} == {"restored"}
        # round 1 is shared: the arm costs the base's round 1 plus its own later rounds — at most the debate's cost
        # (its later prompts repeat the base's, so the provider's prompt cache may serve part of them)
        assert row["vote_cost"] < row["quality_cost"] <= row["debate_cost"] * 1.05
    summary = store.read_run(conclave_env, ev.run_id)["summary"]
    assert summary["protocols"]["quality"]["correct"] == 2
    assert summary["quality_line"].startswith("quality vs debate: +0.0 pp [") and ", p = 1 (Holm over 1 point), at " in summary["quality_line"]
    assert "| debate, quality layer on | 2/2 = 100.0% |" in out and "**quality vs debate: +0.0 pp" in out


async def test_the_arm_pays_its_own_round_one_when_its_prompts_differ(fake_provider_server: FakeProviderServer,
                                                                     conclave_env: Path) -> None:
    fake = fake_provider_server
    # without anchors the agents' system prompts differ: round 1 cannot be reused
    ev, code, out, err = await evaluate(fake, conclave_env, AnswerPanel({n: 1.0 for n in PERSONAS.values()}),
                                        n=1, quality={"quality.anchors": "none"}, settings_extra=FULL_DEBATE)
    assert code == 0, err
    assert len(fake.requests) == 9 + 9
    assert _round_one_requests(fake, ev.items[0].question) == 6
    (row,) = store.read_items(conclave_env, ev.run_id)
    assert row["quality_reused_round_1"] == 0 and row["quality_correct"] == 1
    assert "for 18 planned call(s)" in err
    assert "its round-1 calls differ, so it paid its own" in out


async def test_conformity_in_the_arm_shows_as_its_own_flips_and_oracle_gap(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    panel = AnswerPanel({"Alpha": 1.0, "Beta": 0.0, "Gamma": 0.0}, conformity=True)
    ev, code, _, err = await evaluate(fake_provider_server, conclave_env, panel, n=3, quality=LATER_ROUNDS_ONLY)
    assert code == 0, err
    for row in store.read_items(conclave_env, ev.run_id):
        assert row["answers"]["round_1"]["alpha"] == arithmetic_truth(row["question"])
        assert (row["quality_correct"], row["quality_right_to_wrong"]) == (0, 1)
    summary = store.read_run(conclave_env, ev.run_id)["summary"]
    assert (summary["quality_flips"], summary["quality_oracle_gap"]) == (3, 3)


async def test_quality_layer_figures_are_reported_per_protocol_and_indexed(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    ev, code, out, err = await evaluate(fake_provider_server, conclave_env,
                                        AnswerPanel({n: 1.0 for n in PERSONAS.values()}), n=2,
                                        quality=LATER_ROUNDS_ONLY, settings_extra=FULL_DEBATE)
    assert code == 0, err
    (row, _) = store.read_items(conclave_env, ev.run_id)
    layer = row["quality_layer"]
    assert set(layer) == {"single", "vote", "judge", "debate", "quality"}
    # round 1 has no judge statement; the synthesis and the verdict are checked for grounding
    assert layer["vote"]["statements"] == 0 and layer["judge"]["statements"] > 0
    assert layer["debate"]["statements"] > layer["judge"]["statements"]
    assert {"claims", "violations", "ungrounded"} <= set(layer["debate"])
    # answer mode's agents label claims: one per round-1 answer, more once the round-3 replies add theirs
    assert layer["vote"]["claims"] == 3 and layer["debate"]["claims"] > layer["vote"]["claims"]
    summary = store.read_run(conclave_env, ev.run_id)["summary"]
    assert summary["protocols"]["debate"]["quality_layer"]["statements"] == sum(
        r["quality_layer"]["debate"]["statements"] for r in store.read_items(conclave_env, ev.run_id))
    assert "## Quality layer" in out and "| judge statements checked |" in out
    db = sqlite3.connect(conclave_env / "index.db")
    accuracy, pp, overrides = db.execute("select quality_accuracy, quality_vs_debate_pp, quality_overrides "
                                         "from eval_runs").fetchone()
    assert (accuracy, pp, json.loads(overrides)) == (1.0, 0.0, LATER_ROUNDS_ONLY)
    assert db.execute("select count(*) from eval_items where quality_correct = 1").fetchone()[0] == 2


def test_auto_switches_the_layer_on_in_the_arm_and_to_its_off_value_in_the_base(
        monkeypatch: pytest.MonkeyPatch, fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    monkeypatch.setattr(quality_arm, "SWITCHES", {"quality.state_tokens": (500, 1500), "no.such": (1, 0)})
    settings = panel_settings(fake_provider_server, conclave_env)
    ev = prepare(settings, EvalOptions(n=1, quality="auto"), get_plugins())
    assert ev.arm is not None and ev.arm_overrides == {"quality.state_tokens": 500}
    assert (ev.settings.quality.state_tokens, ev.arm.quality.state_tokens) == (1500, 500)
    # a key the user set themselves is theirs in the base debate
    ev = prepare(settings, EvalOptions(n=1, quality="auto", overrides=["quality.state_tokens=800"]), get_plugins())
    assert ev.settings.quality.state_tokens == 2000 and ev.arm is not None


@pytest.mark.parametrize(("spec", "message"), [
    ({"quality.no_such_key": 1}, r"^eval\.quality\.quality\.no_such_key: unknown key"),
    ({"quality.state_tokens": 5}, r"^eval\.quality: quality\.state_tokens: "),
    ("sometimes", r"^eval\.quality: must be auto, off or a mapping"),
    ({"mode.strategy": "converge"}, r"^eval\.quality: mode: the quality protocol scores final answers"),
])
def test_a_bad_arm_is_one_line_naming_the_key(fake_provider_server: FakeProviderServer, conclave_env: Path,
                                              spec: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        prepare(panel_settings(fake_provider_server, conclave_env), EvalOptions(n=1, quality=spec), get_plugins())
    assert len(caught.value.problems) == 1


class _LearningPanel(AnswerPanel):
    """Alpha is always right; Beta and Gamma are wrong the first time they see a question, right afterwards."""

    def right(self, persona: str, question: str) -> bool:
        seen = self.decisions.get((persona, question)) is not None
        decision = persona == "Alpha" or seen
        self.decisions[(persona, question)] = decision
        return decision


async def test_the_vote_at_the_debates_budget_is_matched_on_billed_tokens(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    panel = _LearningPanel({n: 0.0 for n in PERSONAS.values()})
    ev, code, out, err = await evaluate(fake, conclave_env, panel, n=6, matched_vote=True, concurrency=1)
    assert code == 0, err
    assert ev.extra_samples >= 1
    rows = store.read_items(conclave_env, ev.run_id)
    samples = sum(r["vote_matched_samples"] for r in rows) // 3 - len(rows)  # extra panels drawn
    assert len(fake.requests) == 6 * 9 + 3 * samples  # the debates, then the samples, nothing else
    for row in rows:
        assert row["vote_correct"] == 0  # round 1 alone: only Alpha was right
        assert row["vote_matched_correct"] == 1 and row["vote_tokens"] < row["vote_matched_tokens"]
    summary = store.read_run(conclave_env, ev.run_id)["summary"]
    debate = sum(r["debate_tokens"] for r in rows)
    matched = sum(r["vote_matched_tokens"] for r in rows)
    # matched on billed tokens: within half a sample's tokens of the debates' over the run
    assert abs(matched - debate) <= max(r["vote_tokens"] for r in rows) / 2
    assert summary["matched_ratio"] == pytest.approx(matched / debate)
    assert 0.95 <= summary["matched_ratio"] <= 1.05
    assert f"matched vote: {matched / debate:.3f}× the debate's billed tokens" in err
    assert summary["matched_line"].startswith("debate vs vote at the debate's budget: -100.0 pp")
    assert "| vote at the debate's budget | 6/6 = 100.0% |" in out
    # the run's total is everything spent: the debates and the extra samples, split by who paid
    spent = summary["spent"]
    assert spent["by_protocol"]["vote_matched"]["tokens"] == matched - sum(r["vote_tokens"] for r in rows)
    assert spent["tokens"] == debate + spent["by_protocol"]["vote_matched"]["tokens"]
    assert store.read_run(conclave_env, ev.run_id)["total_tokens"] == spent["tokens"]


async def test_the_matched_vote_stops_against_an_endpoint_that_repeats_itself(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    panel = AnswerPanel({n: 0.5 for n in PERSONAS.values()})  # the same answer to every re-sample
    # the vote gate off: every item plays the full debate, so the request count below is exact
    ev, code, _, err = await evaluate(fake, conclave_env, panel, n=4, matched_vote=True, concurrency=1,
                                      settings_extra={"cost": {"auto_approve": True}, "selective": {"enabled": False}})
    assert code == 0, err
    assert len(fake.requests) == 4 * 9 + 3 * REPEAT_PROBE  # two copies paid, then no more
    assert err.count("conclave eval: matched vote stopped: the endpoint returned round 1 unchanged") == 1
    summary = store.read_run(conclave_env, ev.run_id)["summary"]
    assert summary["protocols"]["vote_matched"]["skipped"] == 4
    assert summary["matched_stopped"]
