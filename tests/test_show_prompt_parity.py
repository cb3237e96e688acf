"""``conclave show-prompt`` renders through the engine's own call spec: for every seat of every round, its system
prompt and user message are byte for byte what the fake provider server received for the same configuration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cli_helpers import run_conclave
from test_engine_support import AGENT_MODELS, JUDGE_MODEL, run_consultation, schema_of, script_panel

from conclave.cli.commands.show_prompt import render
from conclave.store.recorder import Recorder
from conclave.testing.fake_server import FakeProviderServer, RecordedRequest


def _text(content: Any) -> str:
    """A message's text, whether a plain string or a list of text blocks/parts (cache hints split it)."""
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content or [])


def sent(request: RecordedRequest) -> tuple[str, str]:
    """The system prompt and the user message of a recorded request, whatever the wire format."""
    body = request.json
    if "contents" in body:  # Gemini generateContent
        return (_text((body.get("systemInstruction") or {}).get("parts")),
                _text(body["contents"][-1]["parts"]))
    messages = body["messages"]
    users = [m for m in messages if m["role"] == "user"]
    if "system" in body:  # Anthropic messages: the system prompt is a top-level field
        return _text(body["system"]), _text(users[-1]["content"])
    systems = [m for m in messages if m["role"] == "system"]  # OpenAI chat completions
    return _text(systems[0]["content"] if systems else ""), _text(users[-1]["content"])


async def test_show_prompt_equals_what_every_seat_of_every_round_was_sent(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    fake = fake_provider_server
    script_panel(fake)
    recorder = Recorder(conclave_env, index=False)
    run = await run_consultation(fake, recorder=recorder)  # the four rounds
    recorder.close()
    assert run.consultation is not None and run.result.status == "complete", run.result.abort_reason
    compared = 0
    for number in ("1", "2", "3", "4"):
        for call in render(number, [], source=run.consultation.id):
            (request,) = [r for r in fake.requests if schema_of(r) == call["schema"] and r.model == call["model"]]
            assert (call["system"], call["user"]) == sent(request), (call["round_type"], call["who"])
            compared += 1
    # 3 agents in rounds 1 and 3, the judge in rounds 2, 3 and 4: every request the debate made
    assert compared == len(fake.requests) == 3 + 1 + 3 + 1 + 1
    assert {r.model for r in fake.requests} == {*AGENT_MODELS.values(), JUDGE_MODEL}


def test_show_prompt_round_3_for_one_agent_shows_its_cross_examination_reply(tmp_path: Path) -> None:
    """Round 3 ends with a judge step; ``--agent`` picks the agent's own step instead of refusing."""
    proc = run_conclave("show-prompt", "3", "Should we shard the users table?", "agents=default",
                        "--agent", "architect", "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (call,) = json.loads(proc.stdout)
    assert (call["round_type"], call["round_number"], call["who"]) == ("cross_exam_replies", 3, "architect")
    assert "<own_position: this agent's own independent answer, in full>" in call["user"]


def test_show_prompt_agent_on_a_judge_round_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_conclave("show-prompt", "2", "Q?", "agents=default", "--agent", "architect", home=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "--agent: this round is played by the judge" in proc.stderr
