"""A sweep's whole estimate goes through the cost gate once, before any job spends anything (`conclave eval -m`):
job count × per-job estimate, approved, asked about or refused like one run. In process: `conclave eval` runs Hydra
in its own process anyway, so the test calls the command itself, in a worker thread beside the fake server."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from conclave.eval import run_store as store
from conclave.eval.command import run as eval_command
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer

# the default panel, every agent on the fake's gpt-4o (told apart by persona), the judge on gpt-4.1
PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o", "agents.pragmatist.provider=openai",
         "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1", "hedging.enabled=false"]
NAMES = ("Security Expert", "Systems Architect", "Pragmatic Engineer")


async def _sweep(fake: FakeProviderServer, *extra: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    argv = ["-m", "arithmetic", "eval.n=1", "eval.seed=1,2", "rounds=2", *PANEL, *fake.overrides(), *extra]
    code = await asyncio.to_thread(eval_command, argv)
    return code, capsys.readouterr().err


async def test_a_sweep_is_estimated_and_gated_once_as_a_whole(fake_provider_server: FakeProviderServer,
                                                              conclave_env: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    fake = fake_provider_server
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake)
    code, err = await _sweep(fake, "cost.always_allow_under=0", capsys=capsys)
    assert code == 1, err
    line = next(x for x in err.splitlines() if "estimated cost" in x)
    found = re.search(r"sweep sw-\S+: 2 item\(s\) in 2 job\(s\); estimated cost 2 job\(s\) × \$([\d.]+) per job = "
                      r"\$([\d.]+) for 8 planned call\(s\)", line)
    assert found, line
    per_job, whole = float(found.group(1)), float(found.group(2))
    assert whole == pytest.approx(2 * per_job, abs=3e-4)
    assert err.count("planned call(s)") == 1  # one gate for the sweep, none per job
    assert "sweep not started: the estimated cost" in err and "cost.auto_approve=true" in err
    assert fake.requests == [] and store.run_ids(conclave_env) == []  # nothing spent, no run started

    # A threshold every single job is under, but the sweep is not: the sweep as a whole is refused.
    code, err = await _sweep(fake, f"cost.always_allow_under={(per_job + whole) / 2:.4f}", capsys=capsys)
    assert code == 1 and "sweep not started" in err and fake.requests == []

    code, err = await _sweep(fake, f"cost.always_allow_under={whole * 2:.4f}", capsys=capsys)
    assert code == 0, err
    assert err.count("approved with its sweep's whole estimate") == 2
    runs = [store.read_run(conclave_env, r) for r in store.run_ids(conclave_env)]
    assert len(runs) == 2 and all(r["status"] == "complete" for r in runs)
    # estimated: 3 agents + the synthesis per item; the unanimous panel is decided by the vote after round 1
    assert len(fake.requests) == 2 * 3
