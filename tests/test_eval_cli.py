"""`conclave eval` as users run it: a subprocess against the fake server, sweeps with the joblib launcher,
reports, one-line errors, `conclave index merge` and `index rebuild`."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from pathlib import Path

import pytest
from cli_helpers import run_conclave
from eval_helpers import PERSONAS, evaluate

from conclave.eval import run_store as store
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer

# the default panel, every agent on the fake's gpt-4o (told apart by persona), the judge on gpt-4.1
PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o",
         "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]
NAMES = ("Security Expert", "Systems Architect", "Pragmatic Engineer")


async def _conclave(*args: str, home: Path, limit: float = 300) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(home), CONCLAVE_PROGRESS="0", CONCLAVE_SWEEP_DIR=str(home / "multirun"))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=str(home), env=env)
    out, err = await asyncio.wait_for(process.communicate(), timeout=limit)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_eval_runs_a_generated_set_and_reports(fake_provider_server: FakeProviderServer,
                                                     conclave_env: Path) -> None:
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake_provider_server)
    code, out, err = await _conclave("eval", "arithmetic", "eval.n=3", "rounds=2", "cost.auto_approve=true",
                                     *PANEL, *fake_provider_server.overrides(), home=conclave_env)
    assert code == 0, err
    assert out.startswith("# Evaluation ev-") and "**debate vs vote: +0.0 pp [" in out and ", p = 1 (Holm over 1 point), at " in out
    assert "| round-1 majority vote | 3/3 = 100.0% |" in out
    (run_id,) = store.run_ids(conclave_env)
    code, report, _ = await _conclave("eval", "report", run_id, "--format", "json", home=conclave_env)
    assert code == 0 and json.loads(report)["summary"]["protocols"]["single"]["correct"] == 3
    code, page, _ = await _conclave("eval", "report", "latest", "--format", "html", home=conclave_env)
    assert code == 0 and "<svg" in page


async def test_a_joblib_sweep_of_four_processes_loses_no_rows(fake_provider_server: FakeProviderServer,
                                                             conclave_env: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    AnswerPanel({name: 0.7 for name in NAMES}).install(fake_provider_server)
    code, out, err = await _conclave(
        "eval", "-m", "arithmetic", "eval.n=3", "eval.seed=1,2,3,4", "rounds=2", "cost.auto_approve=true",
        "hydra/launcher=joblib", "hydra.launcher.n_jobs=4", *PANEL, *fake_provider_server.overrides(),
        home=conclave_env, limit=600)
    assert code == 0, err
    runs = [store.read_run(conclave_env, r) for r in store.run_ids(conclave_env)]
    assert len(runs) == 4 and len({r["pid"] for r in runs}) == 4  # four worker processes
    db = sqlite3.connect(conclave_env / "index.db")
    assert db.execute("select count(*) from eval_runs where status = 'complete'").fetchone()[0] == 4
    assert db.execute("select count(*) from eval_items").fetchone()[0] == 12
    assert db.execute("select count(*) from consultations where status = 'complete'").fetchone()[0] == 12
    # one report, grouped by the swept value
    assert out.startswith("# Sweep sw-") and "swept: eval.seed" in out
    runs_table, pooled = out.split("Seeds pooled", 1)  # the four seeds are one point, pooled after the runs
    header, *rows = [line for line in runs_table.splitlines() if line.startswith("| ")]
    assert header.startswith("| eval.seed | items |")
    assert [row.split("|")[1].strip() for row in rows] == ["1", "2", "3", "4"]
    assert [row.split("|")[1:3] for row in pooled.splitlines() if row.startswith("| all")] == [[" all ", " 4 "]]
    verify = run_conclave("logs", "verify", home=conclave_env)
    assert verify.returncode == 0, verify.stderr


def test_a_bad_eval_value_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_conclave("eval", "arithmetic", "eval.concurrency=0", "agents=openai_only", home=tmp_path,
                          env={"OPENAI_API_KEY": "sk-test"})
    assert result.returncode == 2
    assert result.stderr.strip() == \
        "conclave: eval.concurrency: input should be greater than or equal to 1 (got 0)"


def test_eval_needs_answer_mode(tmp_path: Path) -> None:
    result = run_conclave("eval", "arithmetic", "mode=converge", "agents=openai_only", home=tmp_path,
                          env={"OPENAI_API_KEY": "sk-test"})
    assert result.returncode == 2
    assert result.stderr.strip() == ("conclave: mode: conclave eval scores final answers, which only mode=answer "
                                     "gives (got mode=converge)")


def test_an_unknown_set_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_conclave("eval", "missing.jsonl", "agents=openai_only", home=tmp_path,
                          env={"OPENAI_API_KEY": "sk-test"})
    assert result.returncode == 2
    assert result.stderr.strip().startswith("conclave: eval set 'missing.jsonl':")
    assert "Traceback" not in result.stderr


def test_report_rejects_an_unknown_format_and_an_unknown_run(tmp_path: Path) -> None:
    result = run_conclave("eval", "report", "ev-x", "--format", "pdf", home=tmp_path)
    assert (result.returncode, result.stderr.strip()) == (
        2, "conclave eval: --format: 'pdf' is not one of: markdown, json, html")
    result = run_conclave("eval", "report", "ev-x", home=tmp_path)
    assert result.returncode == 2 and "eval run 'ev-x' not found" in result.stderr


async def test_index_merge_brings_worker_homes_into_one_index_that_verifies(
        fake_provider_server: FakeProviderServer, tmp_path: Path, conclave_env: Path) -> None:
    homes = [tmp_path / "worker-1", tmp_path / "worker-2"]
    for home in homes:
        home.mkdir()
        panel = AnswerPanel({name: 0.7 for name in PERSONAS.values()})
        _, code, _, _ = await evaluate(fake_provider_server, home, panel, rounds=2, n=3)
        assert code == 0
    result = run_conclave("index", "merge", *map(str, homes), home=conclave_env)
    assert result.returncode == 0, result.stderr
    assert "6 journal(s) copied" in result.stderr and "2 eval run(s)" in result.stderr
    assert "verify ok" in result.stderr
    db = sqlite3.connect(conclave_env / "index.db")
    assert db.execute("select count(*) from eval_items e join consultations c on c.id = e.consultation_id")\
        .fetchone()[0] == 6
    assert run_conclave("logs", "verify", home=conclave_env).returncode == 0
    # merging again copies nothing and still verifies
    again = run_conclave("index", "merge", *map(str, homes), home=conclave_env)
    assert again.returncode == 0 and "0 journal(s) copied, 6 already present" in again.stderr


async def test_index_rebuild_keeps_the_eval_tables(fake_provider_server: FakeProviderServer,
                                                   conclave_env: Path) -> None:
    panel = AnswerPanel({name: 1.0 for name in PERSONAS.values()})
    ev, code, _, _ = await evaluate(fake_provider_server, conclave_env, panel, rounds=2, n=2)
    assert code == 0
    result = run_conclave("index", "rebuild", home=conclave_env)
    assert result.returncode == 0 and "1 eval run(s)" in result.stderr
    db = sqlite3.connect(conclave_env / "index.db")
    assert db.execute("select count(*) from eval_items where run_id = ?", [ev.run_id]).fetchone()[0] == 2


async def test_the_eval_canned_queries_answer_over_a_run(fake_provider_server: FakeProviderServer,
                                                         conclave_env: Path) -> None:
    panel = AnswerPanel({"Alpha": 1.0, "Beta": 0.0, "Gamma": 0.0}, conformity=True)
    ev, code, _, _ = await evaluate(fake_provider_server, conclave_env, panel, n=2, sweep_id="sw-test",
                                    overrides=["early_termination.threshold=0.8"])
    assert code == 0
    answers = _browse(conclave_env, ["eval_runs_overview", "eval_accuracy_vs_cost", "eval_sweep_by_value",
                                     "eval_lost_answers"])
    (overview,) = answers["eval_runs_overview"]
    assert overview["run_id"] == ev.run_id and overview["vote"] == 0.0 and overview["right_to_wrong"] == 2
    assert [r["protocol"] for r in answers["eval_accuracy_vs_cost"]] == ["single", "vote", "judge", "debate"]
    assert answers["eval_sweep_by_value"][0]["sweep_id"] == "sw-test"
    assert {r["item_id"] for r in answers["eval_lost_answers"]} == {i.id for i in ev.items}


def _browse(home: Path, queries: list[str]) -> dict[str, list[dict]]:
    """Rows of each canned query as `conclave browse` (a real Datasette on 127.0.0.1) serves them."""
    import re
    import subprocess
    import time
    import urllib.request

    server = subprocess.Popen([sys.executable, "-m", "conclave", "browse", "--port", "0", "--no-open"],
                              env={"CONCLAVE_HOME": str(home), "PATH": "/usr/bin:/bin"},
                              stderr=subprocess.PIPE, text=True)
    try:
        url, deadline = None, time.monotonic() + 60
        assert server.stderr is not None
        while url is None and time.monotonic() < deadline:
            match = re.search(r"at (http://127\.0\.0\.1:\d+/index) ", server.stderr.readline())
            url = match.group(1) if match else None
        assert url is not None
        answers = {}
        for name in queries:
            with urllib.request.urlopen(f"{url}/{name}.json?_shape=array", timeout=10) as response:
                answers[name] = json.load(response)
        return answers
    finally:
        server.terminate()
        server.wait(timeout=20)


def test_with_no_key_the_local_panel_runs_a_small_set_and_says_it_proves_nothing(tmp_path: Path) -> None:
    # A finished run of the 3 items the offline default picks, so the check does not wait on the local model.
    from conclave.eval.items import arithmetic
    from conclave.eval.protocols import PROTOCOLS

    items = arithmetic(3, 0)
    store.write_run(tmp_path, {"run_id": "ev-offline", "set_spec": "arithmetic", "seed": 0, "items": 3})
    for item in items:
        row = {"item_id": item.id, "status": "complete", "question": item.question, "expected": item.answer}
        for name in PROTOCOLS:
            row.update({f"{name}_answer": "0", f"{name}_correct": 0, f"{name}_cost": 0.0, f"{name}_tokens": 10})
        store.append_item(tmp_path, "ev-offline", row)
    result = run_conclave("eval", "eval.run_id=ev-offline", home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "offline panel on the local model — a 270M model's accuracy is not evidence about debate" in result.stderr
    assert "0 of 3 item(s) to run (3 already finished)" in result.stderr
    assert "> Offline panel on the local model: a 270M model's accuracy is not evidence about debate" in result.stdout



async def test_a_ray_sweep_on_a_local_instance_journals_per_worker_and_merges(
        fake_provider_server: FakeProviderServer, conclave_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Ray is large and not in the dev extra: this runs where `conclave[ray]` is installed.
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake_provider_server)
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    code, out, err = await _conclave(
        "eval", "-m", "arithmetic", "eval.n=2", "eval.seed=1,2", "rounds=2", "cost.auto_approve=true",
        "eval.sweep_id=sw-ray", f"home={conclave_env}/" + "${eval.sweep_id}/job-${hydra:job.num}",
        "hydra/launcher=conclave_ray_local", "+hydra.launcher.ray.init.num_cpus=2", "output.format=json", *PANEL,
        *fake_provider_server.overrides(), home=conclave_env, limit=600)
    assert code == 0, err
    assert "Started a local Ray instance" in err and "ran in other data homes" in err
    # the parent prints the result, read from the workers' homes: parseable, no Ray `(_run_job pid=…)` prefix
    report = json.loads(out)
    assert report["sweep_id"] == "sw-ray" and report["swept"] == ["eval.seed"]
    assert [r["summary"]["protocols"]["debate"]["correct"] for r in report["runs"]] == [2, 2]
    workers = sorted((conclave_env / "sw-ray").iterdir())
    assert [w.name for w in workers] == ["job-0", "job-1"]
    merged = run_conclave("index", "merge", *map(str, workers), home=conclave_env)
    assert merged.returncode == 0 and "4 journal(s) copied" in merged.stderr and "verify ok" in merged.stderr
    report = run_conclave("eval", "report", "sw-ray", home=conclave_env)
    assert report.returncode == 0 and "swept: eval.seed" in report.stdout
    assert report.stdout.count("| 100.0% | 100.0% | 100.0% | 100.0% |") == 2


async def test_a_submitit_sweep_runs_through_the_slurm_launchers_machinery_and_reports_json(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    # hydra-submitit-launcher is optional (conclave[slurm]); submitit_local is the SLURM launcher's machinery
    # (pickled task, job folders, results collected by the parent) with local processes in place of sbatch
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake_provider_server)
    code, out, err = await _conclave(
        "eval", "-m", "arithmetic", "eval.n=2", "eval.seed=1,2", "rounds=2", "cost.auto_approve=true",
        "hydra/launcher=submitit_local", "output.format=json", *PANEL, *fake_provider_server.overrides(),
        home=conclave_env, limit=600)
    assert code == 0, err
    report = json.loads(out)
    assert [r["swept"] for r in report["runs"]] == [{"eval.seed": "1"}, {"eval.seed": "2"}]
    assert all(r["status"] == "complete" for r in report["runs"])


def test_the_slurm_launcher_is_configured(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    result = run_conclave("eval", "arithmetic", "agents=openai_only", "hydra/launcher=conclave_slurm",
                          "hydra.launcher.partition=gpu", "--cfg", "hydra", home=tmp_path,
                          env={"OPENAI_API_KEY": "sk-test"})
    assert result.returncode == 0, result.stderr
    launcher = result.stdout.split("  launcher:\n", 1)[1]
    assert "SlurmLauncher" in launcher and "partition: gpu" in launcher and "timeout_min: 240" in launcher


async def test_optuna_searches_a_threshold_for_the_objective(fake_provider_server: FakeProviderServer,
                                                             conclave_env: Path) -> None:
    # hydra-optuna-sweeper is optional (conclave[optuna]): this runs where it is installed.
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake_provider_server)
    code, out, err = await _conclave(
        "eval", "-m", "arithmetic", "eval.n=2", "rounds=2", "cost.auto_approve=true",
        "eval.objective=vote_accuracy_per_dollar", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2",
        "hydra.sweeper.direction=maximize", "early_termination.threshold=interval(0.5,0.99)", *PANEL,
        *fake_provider_server.overrides(), home=conclave_env, limit=600)
    assert code == 0, err
    runs = [store.read_run(conclave_env, r) for r in store.run_ids(conclave_env)]
    assert len(runs) == 2
    per_dollar = [r["summary"]["protocols"]["vote"]["accuracy"] / r["summary"]["protocols"]["vote"]["cost_per_item"]
                  for r in runs]
    best = float(err.split("Best value: ")[1].split()[0])
    assert best == pytest.approx(max(per_dollar))  # the sweeper saw what the runs measured
    assert "swept: early_termination.threshold" in out


async def test_eval_resume_replays_the_runs_own_overrides(fake_provider_server: FakeProviderServer,
                                                          conclave_env: Path) -> None:
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake_provider_server)
    code, _, err = await _conclave("eval", "arithmetic", "eval.n=3", "eval.run_id=ev-cli", "rounds=2",
                                   "selective.enabled=false",  # two rounds each, not the vote after round 1
                                   "cost.auto_approve=true", *PANEL, *fake_provider_server.overrides(),
                                   home=conclave_env)
    assert code == 0, err
    # as if it had been interrupted after its first item
    items = store.run_dir(conclave_env, "ev-cli") / "items.jsonl"
    items.write_text(items.read_text().splitlines()[0] + "\n")
    run = store.read_run(conclave_env, "ev-cli")
    store.write_run(conclave_env, {**run, "status": "interrupted"})
    before = len(fake_provider_server.requests)
    code, out, err = await _conclave("eval", "resume", "ev-cli", home=conclave_env)
    assert code == 0, err
    assert "2 of 3 item(s) to run (1 already finished)" in err
    assert len(fake_provider_server.requests) - before == 2 * 4  # two items × (3 agents + the judge)
    assert "| round-1 majority vote | 3/3 = 100.0% |" in out
    code, _, err = await _conclave("eval", "resume", "ev-cli", home=conclave_env)
    assert code == 0 and "is complete; nothing to resume" in err


async def test_ctrl_c_saves_finished_items_and_exits_130(fake_provider_server: FakeProviderServer,
                                                         conclave_env: Path) -> None:
    import signal

    from conclave.eval.items import arithmetic
    from conclave.testing.fake_server import Fault

    fake = fake_provider_server
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake)
    answer = fake._scripts["gpt-4o"].function
    assert answer is not None
    second = arithmetic(2, 0)[1].question
    fake.script("gpt-4o", lambda r: Fault.hang() if second in json.dumps(r.json) else answer(r))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(conclave_env), CONCLAVE_PROGRESS="0")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "eval", "arithmetic", "eval.n=2", "eval.concurrency=1",
        "eval.run_id=ev-int", "rounds=2", "cost.auto_approve=true", *PANEL, *fake.overrides(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(conclave_env), env=env)
    for _ in range(1200):  # until the first item is saved and the second is in flight
        if store.read_items(conclave_env, "ev-int") and any(second in json.dumps(r.json) for r in fake.requests):
            break
        await asyncio.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 130, err.decode()
    assert "resume with: conclave eval resume ev-int" in err.decode()
    assert store.read_run(conclave_env, "ev-int")["status"] == "interrupted"
    assert len(store.read_items(conclave_env, "ev-int")) == 1


def test_the_quality_arm_is_a_mapping_on_the_command_line(tmp_path: Path) -> None:
    result = run_conclave("eval", "arithmetic", "eval.quality={quality.no_such: 1}", "agents=openai_only",
                          home=tmp_path, env={"OPENAI_API_KEY": "sk-test"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "conclave: eval.quality.quality.no_such: unknown key (check the spelling; `conclave --cfg job` shows every key)"]
