"""`conclave eval eval.batch=…`: every round of the plan as one batch per provider across the items reaching it,
journaled before polling, resumed without resubmitting, priced at batch prices beside the interactive
equivalent."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
from pathlib import Path

import pytest
from eval_helpers import PERSONAS, evaluate, panel_settings

from conclave.config.settings import Settings
from conclave.engine.interaction import Interaction
from conclave.eval import run_store as store
from conclave.eval.evaluate import EvalOptions, prepare, run_async
from conclave.eval.run_report import render
from conclave.plugin_manager import get_plugins
from conclave.providers.base import Usage
from conclave.providers.pricing import PriceTable, parse_sheet
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest

RECOMPUTE = Path(__file__).with_name("recompute_eval.py")


def test_the_sheets_price_the_three_batch_apis_at_half_and_reject_a_bad_share() -> None:
    table = PriceTable.load()
    usage = Usage(1_000_000, 100_000, 200_000)
    for provider, model in (("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4-5"), ("gemini", "gemini-2.5-pro")):
        interactive, batch = table.cost(provider, model, usage), table.cost(provider, model, usage, batch=True)
        assert interactive and batch and abs(batch / interactive - 0.5) < 1e-12
    assert table.cost("grok", "grok-4", usage, batch=True) is None  # no batch API priced: unknown, not guessed
    with pytest.raises(ValueError, match="batch must be a share of the interactive price"):
        parse_sheet({"provider": "x", "batch": 1.5, "models": {"m": {"input": 1, "output": 2}}}, "x.yaml")


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
        # the retried Alpha alone in the next batch, its answer reaching its item (not failed when the batch ended)
        assert [size for _, _, size in fake.batches.created[:2]] == [6, 1], err
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
    journaled = store.read_batches(conclave_env, "ev-kill")
    assert [r["event"] for r in journaled][:2] == ["intent", "submitted"]  # the intent, before the provider saw it
    assert journaled[1]["batch_id"] == first_id  # the id, journaled before polling
    process = await _start("eval", "resume", "ev-kill", home=conclave_env)
    out, err = await asyncio.wait_for(process.communicate(), timeout=240)
    assert process.returncode == 0, err.decode()
    assert f"batch {first_id} (openai): polling again after a restart, 12 request(s)" in err.decode()
    assert fake.batches.resubmitted == 0
    # the first batch was never sent again: every later batch holds only later rounds' requests
    assert [size for _, _, size in fake.batches.created] == [12, 4]  # round 1, then the 4 syntheses
    assert len(store.read_items(conclave_env, "ev-kill")) == 4
    assert "| round-1 majority vote | 4/4 = 100.0% |" in out.decode()


@pytest.mark.parametrize("api", ["openai", "anthropic", "gemini"])
async def test_sigkill_after_the_provider_accepted_before_the_id_was_journaled_adopts_the_batch(
        fake_provider_server: FakeProviderServer, conclave_env: Path, api: str) -> None:
    fake = fake_provider_server
    model = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-5", "gemini": "gemini-2.5-flash"}[api]
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake, agent_model=model,
                                                       judge_model="gpt-4.1" if api == "openai" else model)
    fake.batches.latency = 1.0
    fake.batches.stall_create = 600.0  # the batch is accepted; its id never reaches the client
    panel = PANEL if api == "openai" else all_on(api, model)
    process = await _start("eval", "arithmetic", "eval.n=3", "eval.run_id=ev-gap", "rounds=2", "eval.batch=true",
                           "eval.batch_poll_s=0.1", "selective.enabled=false", "cost.auto_approve=true", *panel,
                           *fake.overrides(), home=conclave_env)
    for _ in range(1200):  # until the provider accepted the first batch (its create call is still stalled)
        if fake.batches.created or process.returncode is not None:
            break
        await asyncio.sleep(0.05)
    assert process.returncode is None, (await process.communicate())[1].decode()
    process.kill()  # SIGKILL inside the window: accepted by the provider, its id not journaled
    await process.wait()
    assert [r["event"] for r in store.read_batches(conclave_env, "ev-gap")] == ["intent"]
    fake.batches.stall_create = 0.0
    process = await _start("eval", "resume", "ev-gap", home=conclave_env)
    _, err = await asyncio.wait_for(process.communicate(), timeout=240)
    assert process.returncode == 0, err.decode()
    assert fake.batches.resubmitted == 0  # counted at the fake: no request of the adopted batch sent again
    first_id = fake.batches.created[0][1]
    assert f"batch {first_id} ({api}): found by its tag" in err.decode()
    assert [size for _, _, size in fake.batches.created] == [9, 3]  # round 1 once, then the 3 syntheses
    submitted = [r for r in store.read_batches(conclave_env, "ev-gap") if r["event"] == "submitted"]
    assert submitted[0]["batch_id"] == first_id and submitted[0]["adopted"] is True
    rows = store.read_items(conclave_env, "ev-gap")
    assert len(rows) == 3 and all(r["status"] == "complete" for r in rows), rows


async def test_sigkill_before_the_provider_accepted_submits_the_batch_once_on_resume(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake)
    fake.batches.latency = 0.5
    fake.batches.stall_upload = 600.0  # OpenAI: the input file is uploaded, no batch is created of it yet
    process = await _start("eval", "arithmetic", "eval.n=3", "eval.run_id=ev-early", "rounds=2", "eval.batch=true",
                           "eval.batch_poll_s=0.1", "selective.enabled=false", "cost.auto_approve=true", *PANEL,
                           *fake.overrides(), home=conclave_env)
    for _ in range(1200):
        if fake.batches.files or process.returncode is not None:
            break
        await asyncio.sleep(0.05)
    assert process.returncode is None, (await process.communicate())[1].decode()
    process.kill()
    await process.wait()
    assert not fake.batches.created
    fake.batches.stall_upload = 0.0
    process = await _start("eval", "resume", "ev-early", home=conclave_env)
    _, err = await asyncio.wait_for(process.communicate(), timeout=240)
    assert process.returncode == 0, err.decode()
    assert "the provider never accepted it; its 9 request(s) go into a new batch" in err.decode()
    assert [size for _, _, size in fake.batches.created] == [9, 3] and fake.batches.resubmitted == 0
    assert [r["event"] for r in store.read_batches(conclave_env, "ev-early")][:2] == ["intent", "abandoned"]
    assert len(store.read_items(conclave_env, "ev-early")) == 3


def all_on(provider: str, model: str) -> list[str]:
    """Every seat of the default panel, and the judge, on one model of ``provider``."""
    return [f"agents.{seat}.{key}={value}" for seat in ("security", "architect", "pragmatist")
            for key, value in (("provider", provider), ("model", model))] + [f"judge.provider={provider}",
                                                                            f"judge.model={model}"]


async def test_a_provider_without_a_batch_api_is_one_line_and_exit_2(fake_provider_server: FakeProviderServer,
                                                                     conclave_env: Path) -> None:
    process = await _start("eval", "arithmetic", "eval.n=2", "eval.batch=true", "cost.auto_approve=true", *PANEL,
                           "agents.security.provider=grok", "agents.security.model=grok-4",  # xAI: no batch API
                           *fake_provider_server.overrides(), home=conclave_env)
    _, err = await asyncio.wait_for(process.communicate(), timeout=120)
    lines = err.decode().strip().splitlines()
    assert process.returncode == 2, err.decode()
    assert lines[-1].startswith("conclave: eval.batch: provider grok (") and "has no batch API" in lines[-1]
    assert "Traceback" not in err.decode()
    assert not fake_provider_server.batches.created and not fake_provider_server.requests


async def test_mixed_batches_openai_and_anthropic_and_asks_grok_interactively(conclave_env: Path) -> None:
    async with FakeProviderServer() as fake:
        panel = AnswerPanel({n: 1.0 for n in PERSONAS.values()})
        for model in ("gpt-4o", "grok-4"):  # Claude answers the fake's instance of each schema
            panel.install(fake, agent_model=model)
        fake.batches.latency = 0.2
        agents = {"alpha": ("openai", "gpt-4o"), "beta": ("anthropic", "claude-sonnet-4-5"),
                  "gamma": ("grok", "grok-4")}  # the fake's xAI endpoint has no batch API
        data = panel_settings(fake, conclave_env, rounds=2, cost={"auto_approve": True}).model_dump(mode="json")
        data["agents"] = {k: {"persona": k, "provider": p, "model": m} for k, (p, m) in agents.items()}
        settings = Settings.model_validate(data)
        plugins = get_plugins()
        ev = prepare(settings, EvalOptions(n=3, batch="mixed", batch_poll_s=0.05, quality="off"), plugins)
        err_io = io.StringIO()
        code = await run_async(ev, plugins, Interaction.non_interactive(), out=io.StringIO(), err=err_io)
        err = err_io.getvalue()
        assert code == 0, err
        first = [(api, size) for api, _, size in fake.batches.created][:2]
        assert sorted(first) == [("anthropic", 3), ("openai", 3)]  # round 1: one batch per batched provider
        assert len([r for r in fake.requests if r.model == "grok-4"]) == 3  # round 1 of 3 items, interactive
        figures = store.read_run(conclave_env, ev.run_id)["summary"]["batch"]
        assert figures["ratio"] == 0.5, fake.batches.created  # the batched calls, at half price
        rows = store.read_items(conclave_env, ev.run_id)
        assert all(r["answers"]["round_1"].get("beta") for r in rows), fake.batches.created  # Claude, batched
        assert fake.batches.resubmitted == 0


async def test_an_expired_batch_is_reported_with_its_items_and_its_requests_go_into_the_next(
        conclave_env: Path) -> None:
    async with FakeProviderServer() as fake:
        fake.batches.latency = 0.1
        fake.batches.outcomes = ["expired"]
        ev, code, out, err = await evaluate(fake, conclave_env, AnswerPanel({n: 1.0 for n in PERSONAS.values()}),
                                            rounds=2, n=2, batch=True, batch_poll_s=0.05, quality="off")
        assert code == 0, err
        lost = store.read_run(conclave_env, ev.run_id)["summary"]["batch"]["lost"]
        first_id = fake.batches.created[0][1]
        assert lost == [{"batch_id": first_id, "state": "expired", "items": sorted(i.id for i in ev.items)}]
        assert f"batch {first_id} expired: 6 request(s) unanswered, of item(s) " in err
        assert f"- batch {first_id} expired: item(s) " in out  # and in the report
        assert fake.batches.created[1][2] == 6  # its round-1 requests, in the next batch
        assert fake.batches.resubmitted == 0  # nothing answered was sent again


async def test_a_round_over_the_batch_size_is_split_not_refused(conclave_env: Path) -> None:
    async with FakeProviderServer() as fake:
        fake.batches.latency = 0.1
        ev, code, _, err = await evaluate(fake, conclave_env, AnswerPanel({n: 1.0 for n in PERSONAS.values()}),
                                          rounds=2, n=4, batch=True, batch_poll_s=0.05, batch_max_requests=5,
                                          quality="off")
        assert code == 0, err
        assert [size for _, _, size in fake.batches.created][:3] == [5, 5, 2]  # round 1: 12 requests
        assert store.read_run(conclave_env, ev.run_id)["summary"]["batch"]["most_batches_per_provider_per_wave"] == 3


async def test_a_gemini_panel_runs_through_gemini_batch_mode(conclave_env: Path) -> None:
    async with FakeProviderServer() as fake:  # unscripted: each answer is the fake's instance of the schema
        fake.batches.latency = 0.1
        data = panel_settings(fake, conclave_env, rounds=2, cost={"auto_approve": True}).model_dump(mode="json")
        data["agents"] = {k: {"persona": k, "provider": "gemini", "model": "gemini-2.5-flash"} for k in PERSONAS}
        data["judge"] = {"provider": "gemini", "model": "gemini-2.5-pro"}
        plugins = get_plugins()
        ev = prepare(Settings.model_validate(data), EvalOptions(n=2, batch=True, batch_poll_s=0.05, quality="off"),
                     plugins)
        err = io.StringIO()
        await run_async(ev, plugins, Interaction.non_interactive(), out=io.StringIO(), err=err)
        assert fake.batches.created[0][0] == "gemini" and fake.batches.created[0][2] == 2 * 3, err.getvalue()
        assert not [r for r in fake.requests if r.path.endswith(":generateContent")]  # nothing interactive
        rows = store.read_items(conclave_env, ev.run_id)
        assert len(rows) == 2 and all(len(r["answers"]["round_1"]) == 3 for r in rows)
        assert store.read_run(conclave_env, ev.run_id)["summary"]["batch"]["ratio"] == 0.5


async def test_the_matched_votes_samples_go_through_the_batches_too(conclave_env: Path) -> None:
    async with FakeProviderServer() as fake:
        fake.batches.latency = 0.1
        ev, code, _, err = await evaluate(fake, conclave_env, AnswerPanel({n: 0.6 for n in PERSONAS.values()}),
                                          rounds=2, n=3, batch=True, batch_poll_s=0.05, quality="off",
                                          matched_vote=True)
        assert code == 0, err
        assert not [r for r in fake.requests if r.path.endswith("/chat/completions")]  # nothing interactive
        rows = store.read_items(conclave_env, ev.run_id)
        assert all(r.get("vote_matched_samples") for r in rows)  # samples drawn, from batches
        assert fake.batches.resubmitted == 0


async def test_a_batch_journal_that_cannot_be_written_fails_the_items_instead_of_hanging(conclave_env: Path) -> None:
    async with FakeProviderServer() as fake:
        fake.batches.latency = 0.1
        panel = AnswerPanel({n: 1.0 for n in PERSONAS.values()})
        store.run_dir(conclave_env, "ev-nojournal").mkdir(parents=True)
        (store.run_dir(conclave_env, "ev-nojournal") / "batches.jsonl").mkdir()  # every append fails
        ev, code, _, err = await asyncio.wait_for(evaluate(
            fake, conclave_env, panel, rounds=2, n=2, batch=True, batch_poll_s=0.05, quality="off",
            run_id="ev-nojournal"), timeout=120)
        assert code == 1, err
        rows = store.read_items(conclave_env, ev.run_id)
        assert len(rows) == 2 and all(not r["answers"]["round_1"] for r in rows)  # nothing answered, nothing hung
        assert fake.batches.created == []  # its intent could not be journaled: the provider never saw the batch
