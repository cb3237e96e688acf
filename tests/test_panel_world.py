"""The panel world's knobs change what they should, through the real engine (`conclave eval` against the fake
server), and bench/beat_the_vote.py prints its table from CLI runs."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conclave.engine.interaction import Interaction
from conclave.eval import run_store as store
from conclave.eval.evaluate import EvalOptions, prepare, run_async
from conclave.plugin_manager import get_plugins
from conclave.testing.fake_server import FakeProviderServer
from conclave.testing.panel_world import PanelWorld, Shown, WorldAgent, panel_overrides, shown_answers, standard_world

ROOT = Path(__file__).resolve().parents[1]
SEATS = (("alpha", "Alpha", "gpt-4o"), ("beta", "Beta", "gpt-4o-mini"), ("gamma", "Gamma", "gpt-4.1-mini"))


def seats(accuracy: tuple[Any, Any, Any], **knobs: Any) -> list[WorldAgent]:
    return [WorldAgent(name=n, key=k, model=m, accuracy=a, **knobs)
            for (k, n, m), a in zip(SEATS, accuracy, strict=True)]


async def run_world(fake: FakeProviderServer, home: Path, world: PanelWorld, *, n: int = 40,
                    item_set: str = "arithmetic", judge_verdict: bool = False) -> list[dict[str, Any]]:
    """The world's rows of one `conclave eval` run of ``n`` items (every item debated, rounds=4; ``judge_verdict``:
    the judge also records the cross-examination and writes a verdict beside the final aggregate)."""
    fake.reset()
    world.install(fake)
    settings = fake.settings(
        question="eval", rounds=4, home=str(home), hedging={"enabled": False}, cost={"auto_approve": True},
        agents={a.key: {"persona": a.key, "provider": "openai", "model": a.model} for a in world.agents},
        personas={a.key: {"name": a.name, "focus": "arithmetic"} for a in world.agents},
        judge={"provider": "openai", "model": world.judge_model}, mode={"strategy": "answer"},
        selective={"enabled": False, "judge_verdict": judge_verdict})
    plugins = get_plugins()
    evaluation = prepare(settings, EvalOptions(set=item_set, n=n, seed=3, concurrency=8), plugins)
    code = await run_async(evaluation, plugins, Interaction.non_interactive(), out=io.StringIO(), err=io.StringIO())
    assert code == 0
    rows = store.read_items(home, evaluation.run_id)
    assert len(rows) == n
    return rows


def right_share(rows: list[dict[str, Any]], agent: str) -> float:
    return sum(r["answers"]["round_1"][agent] == r["expected"] for r in rows) / len(rows)


@pytest.mark.usefixtures("conclave_env")
async def test_accuracy_follows_each_agent_and_task_kind(fake_provider_server: FakeProviderServer,
                                                         tmp_path: Path) -> None:
    items = tmp_path / "kinds.jsonl"
    with items.open("w") as handle:
        for i in range(20):
            for kind in ("easy", "hard"):
                a, b = i + 2, 3 * i + 1
                handle.write(json.dumps({"id": f"{kind}-{i}", "kind": "numeric", "answer": str(a + b),
                                         "question": f"What is the result of {a}+{b}? (kind: {kind})"}) + "\n")
    world = PanelWorld(seats(({"easy": 1.0, "hard": 0.0}, 0.5, 0.0)))
    rows = await run_world(fake_provider_server, tmp_path / "home", world, item_set=str(items))
    easy = [r for r in rows if "(kind: easy)" in r["question"]]
    hard = [r for r in rows if "(kind: hard)" in r["question"]]
    assert right_share(easy, "alpha") == 1.0 and right_share(hard, "alpha") == 0.0
    assert right_share(rows, "gamma") == 0.0
    assert 0.3 <= right_share(rows, "beta") <= 0.7
    # what each agent was scripted to do is what the engine recorded as its round-1 answer
    assert all(world.log[("Beta", r["question"], "answer")] == r["answers"]["round_1"]["beta"] for r in rows)


@pytest.mark.usefixtures("conclave_env")
async def test_correlated_errors_fall_on_the_same_items_and_cost_the_vote(fake_provider_server: FakeProviderServer,
                                                                          tmp_path: Path) -> None:
    def disagreements(rows: list[dict[str, Any]]) -> int:
        return sum(len({r["answers"]["round_1"][k] == r["expected"] for k, _, _ in SEATS}) > 1 for r in rows)

    outcomes = {}
    for correlation in (0.0, 0.9):
        world = PanelWorld(seats((0.65, 0.65, 0.65)), correlation=correlation)
        rows = await run_world(fake_provider_server, tmp_path / f"home-{correlation}", world)
        mean_agent = sum(right_share(rows, k) for k, _, _ in SEATS) / 3
        vote = sum(r["vote_correct"] for r in rows) / len(rows)
        outcomes[correlation] = (disagreements(rows), vote - mean_agent, mean_agent)
    independent, correlated = outcomes[0.0], outcomes[0.9]
    assert correlated[0] < independent[0] / 2  # agents right and wrong together
    assert independent[1] > 0.05 and correlated[1] < independent[1]  # the vote's gain over one agent shrinks
    assert abs(independent[2] - correlated[2]) < 0.2  # at about the same accuracy per agent


@pytest.mark.usefixtures("conclave_env")
async def test_reported_confidence_is_informative_only_when_the_world_says_so(
        fake_provider_server: FakeProviderServer, tmp_path: Path) -> None:
    gaps = {}
    for informative in (True, False):
        world = PanelWorld(seats((0.5, 0.5, 0.5), confidence_informative=informative))
        rows = await run_world(fake_provider_server, tmp_path / f"home-{informative}", world)
        right = [r["single_confidence"] for r in rows if r["single_correct"]]
        wrong = [r["single_confidence"] for r in rows if not r["single_correct"]]
        assert right and wrong
        gaps[informative] = sum(right) / len(right) - sum(wrong) / len(wrong)
    assert gaps[True] > 0.2 and abs(gaps[False]) < 0.1


@pytest.mark.usefixtures("conclave_env")
async def test_conformity_moves_agents_to_the_answer_they_are_shown(fake_provider_server: FakeProviderServer,
                                                                    tmp_path: Path) -> None:
    """Alpha is always wrong, Beta and Gamma always right: the synthesis shows the right answer, and Alpha switches
    to it by its conformity, or by the confidence boost when the synthesis is confident; names are never shown to
    agents in today's cross-examination, so the name boost alone moves no one."""
    def alpha_switched(rows: list[dict[str, Any]]) -> int:
        return sum(r["answers"]["round_3"]["alpha"] == r["expected"] for r in rows)

    cases = {
        "stubborn": PanelWorld(seats((0.0, 1.0, 1.0))),
        "conformist": PanelWorld(seats((0.0, 1.0, 1.0), conformity=1.0)),
        "half": PanelWorld(seats((0.0, 1.0, 1.0), conformity=0.5)),
        "confident synthesis": PanelWorld(seats((0.0, 1.0, 1.0)), confidence_boost=1.0, judge_confidence=0.85),
        "hesitant synthesis": PanelWorld(seats((0.0, 1.0, 1.0)), confidence_boost=1.0, judge_confidence=0.5),
        "names": PanelWorld(seats((0.0, 1.0, 1.0)), name_boost=1.0),
    }
    switched = {}
    for label, world in cases.items():
        rows = await run_world(fake_provider_server, tmp_path / label.replace(" ", "-"), world, n=20)
        switched[label] = alpha_switched(rows)
    assert switched["stubborn"] == 0 and switched["conformist"] == 20
    assert 4 <= switched["half"] <= 16
    assert switched["confident synthesis"] == 20 and switched["hesitant synthesis"] == 0
    assert switched["names"] == 0


def test_a_name_next_to_the_shown_answer_raises_the_chance_to_switch() -> None:
    world = PanelWorld(seats((0.5, 0.5, 0.5), conformity=0.1), name_boost=0.6, confidence_boost=0.2)
    alpha = world.agent("Alpha")
    labelled = shown_answers('[{"agent_id": "Agent B", "final_answer": "7", "confidence": 0.5}]')
    named = shown_answers('[{"agent_id": "Beta", "final_answer": "7", "confidence": 0.5}]')
    by_model = shown_answers('[{"agent": "Agent B (gpt-4o-mini)", "final_answer": "7", "confidence": 0.5}]')
    confident = shown_answers('[{"agent_id": "Agent B", "final_answer": "7", "confidence": 0.9}]')
    own_name = shown_answers('[{"agent_id": "Alpha", "final_answer": "7", "confidence": 0.5}]')
    assert world.switch_chance(alpha, labelled, "6") == ("7", 0.1)
    assert world.switch_chance(alpha, named, "6") == ("7", 0.7)
    assert world.switch_chance(alpha, by_model, "6") == ("7", 0.7)
    assert world.switch_chance(alpha, confident, "6") == ("7", 0.1 + 0.2)
    assert world.switch_chance(alpha, own_name, "6") == ("7", 0.1)  # its own name is no peer's
    beta = world.agent("Beta")  # on gpt-4o-mini: "gpt-4o-mini" is its own model, not Alpha's gpt-4o
    own_model = shown_answers('[{"agent": "Agent A (gpt-4o-mini)", "final_answer": "7", "confidence": 0.5}]')
    assert world.switch_chance(beta, own_model, "6") == ("7", 0.1)
    assert world.switch_chance(alpha, [Shown("6", "")], "6") == (None, 0.0)


@pytest.mark.usefixtures("conclave_env")
async def test_the_judge_follows_its_position_and_length_bias(fake_provider_server: FakeProviderServer,
                                                              tmp_path: Path) -> None:
    fake = fake_provider_server
    verbose_wrong = [WorldAgent("Alpha", "alpha", "gpt-4o", 0.0, verbosity=12),
                     WorldAgent("Beta", "beta", "gpt-4o-mini", 1.0), WorldAgent("Gamma", "gamma", "gpt-4.1-mini", 1.0)]
    rows = await run_world(fake, tmp_path / "plurality", PanelWorld(verbose_wrong), n=12)
    assert all(r["judge_correct"] for r in rows)  # the plurality is right
    rows = await run_world(fake, tmp_path / "length", PanelWorld(verbose_wrong, judge_length_bias=1.0), n=12)
    assert not any(r["judge_correct"] for r in rows)  # the longest working is the wrong one
    rows = await run_world(fake, tmp_path / "position", PanelWorld(verbose_wrong, judge_position_bias=1.0), n=12)
    firsts = {}
    for request in fake.requests_for("gpt-4.1"):
        if "Round 2" in str((request.schema or {}).get("title")):
            user = "\n".join(str(m["content"]) for m in request.json["messages"] if m["role"] == "user")
            question = user.split("<question>\n", 1)[1].split("\n</question>", 1)[0]
            firsts[question] = shown_answers(user)[0].answer
    assert len(firsts) == 12
    assert all(r["judge_answer"] == firsts[r["question"]] for r in rows)  # whatever was shown first
    assert 0 < sum(r["judge_correct"] for r in rows) < 12  # the engine shuffles who is shown first


def test_the_bench_runs_conclave_eval_in_the_worlds_and_prints_the_table(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "beat_the_vote.py"), "--items", "6",
                           "--worlds", "independent", "strong_weak"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert out.startswith("# Beat the vote — SIMULATED WORLDS") and "not the accuracy of any real model" in out
    assert "## independent world: 6 item(s)" in out and "## strong_weak world: 6 item(s)" in out
    for protocol in ("vote", "single", "judge", "debate", "vote_weighted", "vote_learned", "judge_pick", "sc_best",
                     "single_best"):
        assert any(line.startswith(f"{protocol} ") and "%" in line for line in out.splitlines()), protocol
    assert "not available" not in out
    assert "## Goals (issue 25)" in out and "default − vote, independent:" in out
    goals = out.split("## Goals (issue 25)", 1)[1].splitlines()
    assert all("met)" in line for line in goals if line.startswith("- ") and "goal" in line)


async def test_the_bench_on_a_real_panel_prints_the_same_table(fake_provider_server: FakeProviderServer,
                                                               tmp_path: Path) -> None:
    """--real takes the panel from overrides: here a local OpenAI-compatible server (the fake, serving a world)."""
    world = standard_world("independent")
    world.install(fake_provider_server)
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(home), OPENAI_API_KEY="sk-local-0000")
    overrides = [f"--override={o}" for o in
                 (*fake_provider_server.overrides(), *panel_overrides(world), "cost.auto_approve=true")]
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / "bench" / "beat_the_vote.py"), "--real", "--items", "5", *overrides,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, env=env,
        cwd=tmp_path)
    out, err = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode == 0, err.decode()[-2000:]
    text = out.decode()
    assert "## real panel: 5 item(s)" in text and "## Goals (issue 25)" in text
    assert any(line.startswith("debate ") and "%" in line and "pp [" in line for line in text.splitlines())
    assert "SIMULATED" not in text and "sk-local-0000" not in text + err.decode()
    run_id = text.rsplit("conclave eval report ", 1)[1].split()[0]
    assert len(store.read_items(home, run_id)) == 5  # the run stays in the user's home


@pytest.mark.usefixtures("conclave_env")
async def test_only_a_switch_to_the_right_answer_brings_evidence(fake_provider_server: FakeProviderServer,
                                                                 tmp_path: Path) -> None:
    """With ``supported_switch`` a switch to the truth introduces a claim the engine puts in the debate state the
    judge reads next; a switch to a wrong answer, or any switch without it, cites nothing."""
    fake = fake_provider_server
    claim = "Redoing the working step by step gives"

    def judge_saw_new_claims() -> int:
        return sum(claim in str(m["content"]) for r in fake.requests_for("gpt-4.1") for m in r.json["messages"]
                   if "Their replies" in str(m["content"]))

    cases = {"to the truth": ((0.0, 1.0, 1.0), 1.0), "unsupported": ((0.0, 1.0, 1.0), 0.0),
             "to a wrong answer": ((1.0, 0.0, 0.0), 1.0)}
    seen = {}
    for label, (accuracy, supported) in cases.items():
        world = PanelWorld(seats(accuracy, conformity=1.0), supported_switch=supported)
        rows = await run_world(fake, tmp_path / label.replace(" ", "-"), world, n=6, judge_verdict=True)
        assert all(r["answers"]["round_3"]["alpha"] == r["judge_answer"] for r in rows)  # alpha always switched
        seen[label] = judge_saw_new_claims()
    assert seen == {"to the truth": 6, "unsupported": 0, "to a wrong answer": 0}
