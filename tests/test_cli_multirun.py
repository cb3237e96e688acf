"""Hydra multirun: `conclave -m "Q" key=a,b` runs one consultation per value; stdout stays pure results."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

from conclave.testing.fake_server import FakeProviderServer


def _documents(text: str) -> list[dict]:
    decoder, docs, pos = json.JSONDecoder(), [], 0
    while pos < len(text.rstrip()):
        while text[pos].isspace():
            pos += 1
        doc, pos = decoder.raw_decode(text, pos)
        docs.append(doc)
    return docs


async def test_sweep_runs_one_consultation_per_value(fake_provider_server: FakeProviderServer,
                                                     conclave_env: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(conclave_env), CONCLAVE_PROGRESS="0")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "-m", "Sweep, or not?", "early_termination.threshold=0.8,0.9",
        "rounds=2", "cost.auto_approve=true", "output.format=json", *fake_provider_server.overrides(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(conclave_env), env=env,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=180)
    assert process.returncode == 0, err.decode()
    results = _documents(out.decode())  # raises if anything but JSON (e.g. a Hydra log line) is on stdout
    assert len(results) == 2
    assert all(r["question"] == "Sweep, or not?" and r["status"] == "complete" for r in results)
    assert results[0]["config_hash"] != results[1]["config_hash"]  # each job ran its own threshold
    assert results[0]["consultation_id"] != results[1]["consultation_id"]
    stderr = err.decode()
    assert "Launching 2 jobs locally" in stderr
    assert "early_termination.threshold=0.8" in stderr and "early_termination.threshold=0.9" in stderr
