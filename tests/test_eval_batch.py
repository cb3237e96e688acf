"""`conclave eval eval.batch=…`: every round of the plan as one batch per provider across the items reaching it,
journaled before polling, resumed without resubmitting, priced at batch prices beside the interactive
equivalent."""

from __future__ import annotations

import json
from pathlib import Path

from eval_helpers import PERSONAS, evaluate

from conclave.eval import run_store as store
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import Fault, FakeProviderServer, RecordedRequest


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
        ev, code, out, err = await evaluate(fake, conclave_env, None, rounds=2, n=2, batch=True, batch_poll_s=0.05,
                                            quality="off")
        figures = store.read_run(conclave_env, ev.run_id)["summary"]["batch"]
        rows = store.read_items(conclave_env, ev.run_id)
        assert figures["retried"] == 1, err  # the 500 went into the next batch; the unreadable line did not
        assert fake.batches.resubmitted == 0
        assert len(rows) == 2  # the run went on
        beta = [r["answers"]["round_1"].get("beta") for r in rows]
        alpha = [r["answers"]["round_1"].get("alpha") for r in rows]
        assert beta.count(None) == 1 and None not in alpha  # Alpha answered after its retry; one Beta failed
