"""An evaluation's state is whether its process still runs it, not what its ``run.json`` last said: a run
killed with SIGKILL (no handler runs, ``run.json`` keeps "running") reads "interrupted — resume with …" on
``conclave serve``'s pages and in ``conclave eval report``; a live run that is only waiting on a batch reads
"running", and a second process cannot run it at the same time."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import aiohttp

from conclave.cli.commands.browse import free_port
from conclave.eval import run_store as store
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer
from conclave.testing.pytest_plugin import FAKE_KEYS

TOKEN = "liveness-test-token"
PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o", "agents.pragmatist.provider=openai",
         "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1"]
NAMES = ("Security Expert", "Systems Architect", "Pragmatic Engineer")


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(FAKE_KEYS, CONCLAVE_HOME=str(home), CONCLAVE_PROGRESS="0", CONCLAVE_WEB_TOKEN=TOKEN)
    return env


async def _start(*args: str, home: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", *args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=str(home), env=_env(home))


async def _conclave(*args: str, home: Path) -> tuple[int, str, str]:
    process = await _start(*args, home=home)
    out, err = await asyncio.wait_for(process.communicate(), timeout=240)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def _get(client: aiohttp.ClientSession, url: str) -> str:
    async with client.get(url, params={"token": TOKEN}) as response:
        assert response.status == 200, url
        return await response.text()


async def test_a_killed_run_reads_interrupted_a_live_one_running_and_it_resumes(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    AnswerPanel({name: 1.0 for name in NAMES}).install(fake)
    fake.batches.latency = 30.0  # the live run only polls a batch meanwhile: nothing it writes says it is alive
    home = conclave_env
    port = free_port()
    server = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "serve", "--port", str(port), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, cwd=str(home), env=_env(home))
    base = f"http://127.0.0.1:{port}"
    process = await _start("eval", "arithmetic", "eval.n=3", "eval.run_id=ev-live", "rounds=2", "eval.batch=true",
                           "eval.batch_poll_s=0.2", "selective.enabled=false", "cost.auto_approve=true", *PANEL,
                           *fake.overrides(), home=home)
    try:
        async with aiohttp.ClientSession() as client:
            for _ in range(1200):  # until round 1's batch is accepted and being polled
                if (fake.batches.created and store.read_batches(home, "ev-live")) or process.returncode is not None:
                    break
                await asyncio.sleep(0.05)
            assert process.returncode is None, (await process.communicate())[1].decode()
            for _ in range(300):
                try:
                    await _get(client, f"{base}/")
                    break
                except (aiohttp.ClientError, AssertionError):
                    await asyncio.sleep(0.1)

            # alive and waiting: running, everywhere
            await asyncio.sleep(1.0)
            page = await _get(client, f"{base}/e/ev-live")
            assert "class='status running'>running<" in page, page
            assert "class='status running'>running<" in await _get(client, f"{base}/")
            code, out, _ = await _conclave("eval", "report", "ev-live", home=home)
            assert code == 0 and "Run status: running" in out, out
            # a second process may not run it meanwhile (it would pay for the same items twice)
            created = len(fake.batches.created)
            code, _, err = await _conclave("eval", "resume", "ev-live", home=home)
            assert code == 2, err
            assert err.count("\n") == 1 and "is being run by another process" in err and "Traceback" not in err, err
            assert len(fake.batches.created) == created

            async with client.get(f"{base}/e/ev-live/events", params={"token": TOKEN},
                                  timeout=aiohttp.ClientTimeout(total=120)) as stream:
                process.kill()  # SIGKILL: no handler runs, run.json still says "running"
                await process.wait()
                assert json.loads(store.run_dir(home, "ev-live").joinpath("run.json").read_text())["status"] == \
                    "running"
                body = (await stream.read()).decode()  # the stream ends once the run's process is gone
            assert 'event: end\ndata: {"status": "interrupted"}' in body, body
            fake.batches.latency = 0.5  # the batches the resumed run creates

            page = await _get(client, f"{base}/e/ev-live")
            assert "class='status interrupted'>interrupted<" in page, page
            assert "resume with <code>conclave eval resume ev-live</code>" in page
            assert "class='status interrupted'>interrupted<" in await _get(client, f"{base}/")
            code, out, _ = await _conclave("eval", "report", "ev-live", home=home)
            assert code == 0 and "Run status: interrupted — resume with `conclave eval resume ev-live`" in out, out

            code, out, err = await _conclave("eval", "resume", "ev-live", home=home)
            assert code == 0, err
            assert fake.batches.resubmitted == 0
            assert len(store.read_items(home, "ev-live")) == 3
            assert "class='status complete'>complete<" in await _get(client, f"{base}/e/ev-live")
    finally:
        for running in (process, server):
            if running.returncode is None:
                running.kill()
                await running.wait()
