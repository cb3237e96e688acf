"""`conclave eval eval.batch=…`: every round of the plan as one batch per provider across the items reaching it,
journaled before polling, resumed without resubmitting, priced at batch prices beside the interactive
equivalent."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from eval_helpers import PERSONAS, evaluate

from conclave.eval import run_store as store
from conclave.eval.run_report import render
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest

RECOMPUTE = Path(__file__).with_name("recompute_eval.py")


async def test_each_round_is_one_batch_per_provider_at_batch_prices(conclave_env: Path) -> None:
    tmp_path = conclave_env
    async with FakeProviderServer() as fake:
        fake.batches.latency = 0.3
        ev, code, out, err = await evaluate(fake, tmp_path, AnswerPanel({n: 0.5 for n in PERSONAS.values()}),
                                            rounds=4, n=6, batch=True, batch_poll_s=0.05, quality="off")
        assert code == 0, err
        assert "at batch prices (interactive:" in err and "submitted" in err
        assert not [r for r in fake.requests if r.path.endswith("/chat/completions")]  # nothing interactive
        created = fake.batches.created
        run = store.read_run(tmp_path, ev.run_id)
        figures = run["summary"]["batch"]
        # one batch per barrier: round 1 (all items), synthesis, cross-examination, its judge, verdict ...
        assert figures["most_batches_per_provider_per_wave"] == 1
        assert len(created) == figures["batches"] == figures["waves"]
        assert created[0][2] == 6 * 3  # every item's three round-1 agents in the first batch
        assert 0.49 <= figures["ratio"] <= 0.51
        assert fake.batches.resubmitted == 0
        rows = store.read_items(tmp_path, ev.run_id)
        assert abs(sum(r["batch_cost"] for r in rows) - figures["batch_cost"]) < 1e-6
        # the items' own costs are batch-priced: the debate's spend is the batch spend
        assert abs(sum(r["spent"]["debate"]["cost"] for r in rows) - figures["batch_cost"]) < 1e-6
        # the report prints both figures, and the recompute script recomputes them (and every other figure)
        assert "**Batch spend: $" in out and "the same calls interactively: $" in out
        (conclave_env / "report.json").write_text(render(run, rows, "json"))
        (conclave_env / "report.md").write_text(out)
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(RECOMPUTE), str(store.run_dir(conclave_env, ev.run_id) / "items.jsonl"),
            str(conclave_env / "report.json"), str(conclave_env / "report.md"), stdout=asyncio.subprocess.PIPE)
        report = (await process.communicate())[0].decode()
        assert process.returncode == 0 and " 0 mismatches" in report, report


async def test_a_failed_request_goes_into_the_next_batch_and_a_malformed_line_fails_its_item(
        conclave_env: Path) -> None:
    faults = {"You are Alpha": [Fault.server_error()], "You are Beta": [Fault.malformed()]}

    def gate(record: RecordedRequest) -> Fault | None:  # the first Alpha and Beta requests only
        text = json.dumps(record.json)
        for persona, left in faults.items():
            if persona in text and left:
                return left.pop()
        return None

    async with FakeProviderServer() as fake:
        AnswerPanel({n: 1.0 for n in PERSONAS.values()}).install(fake, gate=gate)
        fake.batches.latency = 0.1
        ev, _, _, err = await evaluate(fake, conclave_env, None, rounds=2, n=2, batch=True, batch_poll_s=0.05,
                                            quality="off")
        figures = store.read_run(conclave_env, ev.run_id)["summary"]["batch"]
        rows = store.read_items(conclave_env, ev.run_id)
        assert figures["retried"] == 1, err  # the 500 went into the next batch; the unreadable line did not
        assert fake.batches.resubmitted == 0
        assert len(rows) == 2  # the run went on
        beta = [r["answers"]["round_1"].get("beta") for r in rows]
        alpha = [r["answers"]["round_1"].get("alpha") for r in rows]
        assert beta.count(None) == 1 and None not in alpha  # Alpha answered after its retry; one Beta failed


# the default panel, every agent on the fake's gpt-4o (told apart by persona), the judge on gpt-4.1
PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o",
         "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]
NAMES = ("Security Expert", "Systems Architect", "Pragmatic Engineer")


async def _start(*args: str, home: Path) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(home), CONCLAVE_PROGRESS="0")
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=str(home), env=env)


async def test_sigkill_while_polling_then_resume_polls_the_same_batch_and_resubmits_nothing(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake)
    fake.batches.latency = 3.0
    process = await _start("eval", "arithmetic", "eval.n=4", "eval.run_id=ev-kill", "rounds=2", "eval.batch=true",
                           "eval.batch_poll_s=0.1", "selective.enabled=false", "cost.auto_approve=true", *PANEL,
                           *fake.overrides(), home=conclave_env)
    for _ in range(1200):  # until the first batch is accepted and journaled
        if (fake.batches.created and store.read_batches(conclave_env, "ev-kill")) or process.returncode is not None:
            break
        await asyncio.sleep(0.05)
    assert process.returncode is None, (await process.communicate())[1].decode()
    process.kill()  # SIGKILL: no handler runs
    await process.wait()
    (_, first_id, first_size) = fake.batches.created[0]
    assert len(fake.batches.created) == 1 and first_size == 4 * 3  # round 1 of every item, one batch
    assert store.read_batches(conclave_env, "ev-kill")[0]["batch_id"] == first_id  # journaled before polling
    process = await _start("eval", "resume", "ev-kill", home=conclave_env)
    out, err = await asyncio.wait_for(process.communicate(), timeout=240)
    assert process.returncode == 0, err.decode()
    assert f"batch {first_id} (openai): polling again after a restart, 12 request(s)" in err.decode()
    assert fake.batches.resubmitted == 0
    # the first batch was never sent again: every later batch holds only later rounds' requests
    assert [size for _, _, size in fake.batches.created] == [12, 4]  # round 1, then the 4 syntheses
    assert len(store.read_items(conclave_env, "ev-kill")) == 4
    assert "| round-1 majority vote | 4/4 = 100.0% |" in out.decode()
