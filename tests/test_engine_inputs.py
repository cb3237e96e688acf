"""What leaves the machine: secrets are scrubbed from question and context, interpolations are never resolved,
the context rides in the system prompt; plus the CLI end to end as a subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from test_engine_support import AGENT_MODELS, run_consultation, texts

from conclave.testing.fake_server import FakeProviderServer

AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
ANTHROPIC_KEY = "sk-ant-api03-" + "x7Yq" * 20


def _everything_sent(fake: FakeProviderServer) -> str:
    return "\n".join(json.dumps(r.json) + json.dumps(r.headers) for r in fake.requests)


async def test_planted_secrets_never_reach_a_provider(fake_provider_server: FakeProviderServer, conclave_env: Any,
                                                      tmp_path: Path) -> None:
    fake = fake_provider_server
    notes = tmp_path / "deploy.env"
    notes.write_text(f"ANTHROPIC_API_KEY={ANTHROPIC_KEY}\nregion=eu-west-1\n")
    run = await run_consultation(fake, f"context=[{notes}]",
                                 question=f"Is it safe that our CI prints {AWS_KEY} in its logs?")
    sent = _everything_sent(fake)
    assert fake.requests and AWS_KEY not in sent and ANTHROPIC_KEY not in sent
    assert "region=eu-west-1" in sent  # the rest of the context is sent
    assert run.result.scrub_report["total"] >= 2
    assert AWS_KEY not in run.result.question
    assert run.of("consultation:started")[0]["scrub_report"] == run.result.scrub_report
    assert AWS_KEY not in json.dumps([e.as_dict() for e in run.events])


async def test_a_prefixless_provider_key_pasted_into_context_never_reaches_a_provider(
    fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A Mistral key has no prefix, and nothing around it says what it is: only its value gives it away.
    key = "Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lz9Xc"
    monkeypatch.setenv("MISTRAL_API_KEY", key)
    notes = tmp_path / "notes.txt"
    notes.write_text(f"build 4411 used {key} by mistake\n")
    run = await run_consultation(fake_provider_server, f"context=[{notes}]", "rounds=1",
                                 question=f"Is {key} a problem?")
    assert fake_provider_server.requests and key not in _everything_sent(fake_provider_server)
    assert run.result.scrub_report["by_type"]["provider_key"] == 2
    assert key not in json.dumps(run.result.as_dict())


async def test_a_configured_key_variable_is_scrubbed_too(fake_provider_server: FakeProviderServer,
                                                         conclave_env: Any) -> None:
    from conclave.engine.inputs import prepare_inputs
    from conclave.engine.interaction import Interaction

    providers = fake_provider_server.providers_config()
    providers["openai"] = {**providers["openai"], "api_key_env": ["ACME_GATEWAY_TOKEN"]}
    token = "acme-gw-0b9c8d7e6f5a4b3c"
    settings = fake_provider_server.settings(question=f"Rotate {token}?", providers=providers)
    inputs = prepare_inputs(settings, Interaction.non_interactive(), environ={"ACME_GATEWAY_TOKEN": token})
    assert inputs.question == "Rotate [REDACTED_PROVIDER_KEY]?"


def _stored_bytes(home: Path) -> bytes:
    """Every byte conclave wrote under its home: journals, heads log, index."""
    return b"".join(path.read_bytes() for path in home.rglob("*") if path.is_file())


async def test_secrets_in_the_question_are_kept_out_of_the_journal_and_the_index(
    fake_provider_server: FakeProviderServer, conclave_env: Path
) -> None:
    from conclave.store.recorder import Recorder

    runner_token = "glrt-" + "Ab3dEf6hIj9kLm2nOp5q"
    hf_token = "hf_" + "kLmNoPqRsTuVwXyZaBcDeFgHiJkLmNoPqR"
    run = await run_consultation(fake_provider_server, "rounds=1", recorder=Recorder(conclave_env),
                                 question=f"Our runner uses {runner_token} and the model pull uses {hf_token}.")
    stored = _stored_bytes(conclave_env)
    assert run.result.scrub_report["by_type"] == {"gitlab_token": 1, "huggingface_token": 1}
    assert stored and runner_token.encode() not in stored and hf_token.encode() not in stored
    assert runner_token not in _everything_sent(fake_provider_server)


async def test_an_oversized_context_file_is_cut_and_the_cut_is_reported(
    fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from conclave.engine.context import MAX_CONTEXT_FILE_BYTES
    from conclave.render.markdown import render_markdown

    big = tmp_path / "big.log"
    size = MAX_CONTEXT_FILE_BYTES + 1_000_000
    big.write_text("x" * (size - 1) + "\n")
    # the 2 MB sent (~264k tokens) needs 1M-token models: Claude's and gpt-4o's seats would be refused before
    # anything runs (tests/test_context_limits.py)
    wide = ("agents.security.provider=gemini", "agents.security.model=gemini-2.5-flash",
            "agents.architect.model=gpt-4.1")
    run = await run_consultation(fake_provider_server, f"context=[{big}]", "rounds=1", *wide, question="Why slow?")
    err = capsys.readouterr().err
    assert f"context file {big} is" in err and f"only its first 2.0 MB ({MAX_CONTEXT_FILE_BYTES:,} bytes) is sent" in err
    (source,) = run.result.context_sources
    assert source["bytes"] == size and source["sent"] == MAX_CONTEXT_FILE_BYTES and source["truncated"] is True
    report = render_markdown(run.result.as_dict())
    assert f"{MAX_CONTEXT_FILE_BYTES:,} of {size:,} bytes sent" in report
    assert f"cut: {big} after its first {MAX_CONTEXT_FILE_BYTES:,} bytes" in report


async def test_scrub_false_sends_the_text_as_is_with_a_warning(fake_provider_server: FakeProviderServer,
                                                               conclave_env: Any,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = await run_consultation(fake_provider_server, "scrub=false", "rounds=1",
                                 question=f"Why does {AWS_KEY} show up?")
    assert AWS_KEY in _everything_sent(fake_provider_server)
    assert "scrub=false" in capsys.readouterr().err
    assert run.result.scrub_report == {"total": 0, "by_type": {}}


async def test_context_rides_in_the_system_prompt_and_the_question_in_the_user_turn(
    fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path
) -> None:
    notes = tmp_path / "adr.md"
    notes.write_text("ADR-7: billing writes go through one service.")
    run = await run_consultation(fake_provider_server, f"context=[{notes}]", "rounds=1", question="Keep ADR-7?")
    (request,) = fake_provider_server.requests_for(AGENT_MODELS["architect"])
    system, user = request.json["messages"][0], request.json["messages"][1]
    assert system["role"] == "system" and "ADR-7: billing writes" in system["content"]
    assert user["role"] == "user" and "Keep ADR-7?" in user["content"] and "billing writes" not in user["content"]
    assert run.result.context_sources[0]["path"] == str(notes)


async def test_an_interpolation_in_the_question_arrives_verbatim(fake_provider_server: FakeProviderServer,
                                                                 conclave_env: Any) -> None:
    question = "Should ${oc.env:HOME} and ${oc.env:OPENAI_API_KEY} be logged?"
    run = await run_consultation(fake_provider_server, "rounds=1", question=question)
    assert run.result.question == question
    shown = texts(fake_provider_server.requests_for(AGENT_MODELS["architect"])[0])
    assert question in shown and os.environ["OPENAI_API_KEY"] not in _everything_sent(fake_provider_server)


async def _conclave(fake: FakeProviderServer, home: Path, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(home), CONCLAVE_PROGRESS="0")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", *args, *fake.overrides(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(home), env=env,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    return process.returncode or 0, out.decode(), err.decode()


@pytest.mark.slow
async def test_cli_runs_a_consultation_and_prints_the_result(fake_provider_server: FakeProviderServer,
                                                             conclave_env: Path) -> None:
    question = "Is ${oc.env:HOME} a safe place for state?"
    code, out, err = await _conclave(fake_provider_server, conclave_env, question, "rounds=2",
                                     "cost.auto_approve=true", "output.format=json")
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "complete" and result["question"] == question and result["completed_rounds"] == 2
    shown = texts(fake_provider_server.requests_for(AGENT_MODELS["architect"])[0])
    assert question in shown and str(conclave_env) not in shown


@pytest.mark.slow
async def test_cli_never_sends_or_prints_a_provider_key_pasted_into_context(
    fake_provider_server: FakeProviderServer, conclave_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = "Zx9Cv8Bn7Mq6Wl5Ek4Rt3Yu2Io1Pa0Sd"
    monkeypatch.setenv("MISTRAL_API_KEY", key)
    (conclave_env / "notes.txt").write_text(f"the deploy used {key}\n")
    code, out, err = await _conclave(fake_provider_server, conclave_env, f"Is {key} leaked?", "rounds=1",
                                     "context=[notes.txt]", "cost.auto_approve=true", "output.format=json")
    assert code == 0, err
    assert key not in out and key not in err and key not in _everything_sent(fake_provider_server)
    assert json.loads(out)["scrub_report"]["by_type"]["provider_key"] == 2


@pytest.mark.slow
async def test_cli_refuses_an_unapproved_cost_without_a_terminal(fake_provider_server: FakeProviderServer,
                                                                 conclave_env: Path) -> None:
    code, out, err = await _conclave(fake_provider_server, conclave_env, "Move billing?",
                                     "cost.always_allow_under=0.001")
    assert code == 1 and out == "" and fake_provider_server.requests == []
    assert "cost.auto_approve=true" in err and "cost.always_allow_under" in err


@pytest.mark.slow
async def test_cli_interrupt_prints_the_partial_result_and_exits_130(fake_provider_server: FakeProviderServer,
                                                                     conclave_env: Path) -> None:
    import signal

    from conclave.testing.fake_server import Fault, RecordedRequest

    fake = fake_provider_server
    judge_asked = asyncio.Event()

    def hang(request: RecordedRequest) -> Fault:
        judge_asked.set()
        return Fault.hang()

    fake.script("gpt-4.1", hang)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONCLAVE_")}
    env.update(CONCLAVE_HOME=str(conclave_env), CONCLAVE_PROGRESS="0")
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", "Move billing?", "judge.model=gpt-4.1", "cost.auto_approve=true",
        "hedging.enabled=false", "output.format=json", *fake.overrides(),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        cwd=str(conclave_env), env=env,
    )
    await asyncio.wait_for(judge_asked.wait(), timeout=60)
    process.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode == 130, err.decode()
    result = json.loads(out)
    assert result["status"] == "partial" and result["abort_reason"] == "interrupted by the user"
    assert set(result["artifacts"]["round_1"]) == set(AGENT_MODELS)
