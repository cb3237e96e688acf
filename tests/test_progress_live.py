"""The live terminal view of a real ``conclave`` process: spinners and elapsed times on a terminal (stderr is a
pseudo-terminal here), plain lines when piped, silence with ``output.progress=quiet``, and after Ctrl-C the
command that resumes the run."""

from __future__ import annotations

import asyncio
import os
import pty
import re
import signal
import sys
from pathlib import Path

from test_engine_support import AGENT_MODELS, JUDGE_MODEL

from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.testing.schema_instances import instance_for

SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


def slow_panel(fake: FakeProviderServer, latency: float) -> None:
    for model in [*AGENT_MODELS.values(), JUDGE_MODEL]:
        fake.script(model, lambda request: Reply(json=instance_for(request.schema), latency=latency))


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(home), TERM="xterm")
    return env


async def _run(fake: FakeProviderServer, home: Path, *args: str, tty: bool, interrupt_at: str | None = None,
               ) -> tuple[int, str]:
    """Run a consultation; return its exit code and everything it wrote to stderr (a pty when ``tty``)."""
    master, slave = pty.openpty() if tty else os.pipe()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "Live?", "cost.auto_approve=true", f"judge.model={JUDGE_MODEL}", *args,
        *fake.overrides(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=slave,
        cwd=str(home), env=_env(home))
    os.close(slave)
    chunks: list[bytes] = []
    loop = asyncio.get_running_loop()
    interrupted = False
    while True:
        try:
            chunk = await loop.run_in_executor(None, os.read, master, 4096)
        except OSError:  # the pty closes with EIO when the child exits
            break
        if not chunk:
            break
        chunks.append(chunk)
        if interrupt_at and not interrupted and interrupt_at in b"".join(chunks).decode(errors="replace"):
            await asyncio.sleep(0.2)
            process.send_signal(signal.SIGINT)
            interrupted = True
    os.close(master)
    code = await asyncio.wait_for(process.wait(), timeout=120)
    return code, b"".join(chunks).decode(errors="replace")


async def test_a_terminal_shows_each_agent_thinking_then_its_result(fake_provider_server: FakeProviderServer,
                                                                   conclave_env: Path) -> None:
    slow_panel(fake_provider_server, latency=0.8)
    code, err = await _run(fake_provider_server, conclave_env, "rounds=2", tty=True)
    assert code == 0, err
    # while round 1 waits, every agent is drawn with a spinner and a running time ...
    thinking = [line for line in err.split("\r") if "Round 1" in line and "✓" not in line]
    assert any(all(f"{name} " in line for name in AGENT_MODELS) and any(s in line for s in SPINNER)
               for line in thinking), thinking[-3:]
    times = {float(t) for line in thinking for t in re.findall(r"architect . (\d+\.\d)s", line)}
    assert len(times) >= 3  # the elapsed time moved while nothing else happened
    # ... and each ends as its result
    assert "judge ✓" in err and "✓ complete" in err


async def test_piped_progress_is_plain_lines(fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    slow_panel(fake_provider_server, latency=0.2)
    code, err = await _run(fake_provider_server, conclave_env, "rounds=2", tty=False)
    assert code == 0, err
    assert "\r" not in err and not any(s in err for s in SPINNER)
    assert [line.split("·")[1].split()[0] for line in err.splitlines() if "▸ Round" in line] == [
        "Independent", "Synthesis"]


async def test_progress_plain_on_a_terminal_and_quiet(fake_provider_server: FakeProviderServer,
                                                      conclave_env: Path) -> None:
    slow_panel(fake_provider_server, latency=0.2)
    code, err = await _run(fake_provider_server, conclave_env, "rounds=1", "output.progress=plain", tty=True)
    assert code == 0 and "▸ Round 1" in err and not any(s in err for s in SPINNER)
    code, err = await _run(fake_provider_server, conclave_env, "rounds=1", "output.progress=quiet", tty=True)
    assert code == 0 and "Round" not in err and "complete" not in err


async def test_ctrl_c_says_how_to_resume(fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    slow_panel(fake_provider_server, latency=1.0)
    code, err = await _run(fake_provider_server, conclave_env, tty=True, interrupt_at="Round 2")
    assert code == 130, err
    journal = sorted((conclave_env / "journal").glob("*.jsonl"))
    assert len(journal) == 1
    assert f"Resume it with: conclave resume {journal[0].stem}" in err
    assert "judge ✗ (stopped)" in err
