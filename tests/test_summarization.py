"""Progressive summarization on the fake server (a six-round debate): from round 5 on a prompt shows round N-1 in full, rounds N-2 and
N-3 as structured summaries of at most 300 tokens, older rounds through the debate state with their claim ids;
every such prompt stays under the token budget; a debate of four rounds is untouched; the figures are recorded."""

from __future__ import annotations

import re
from typing import Any

from test_engine_support import AGENT_MODELS, JUDGE_MODEL, requests_with
from test_exit_controller import _blocker, _swinging, run_fast, script_votes

from conclave.testing.fake_server import FakeProviderServer, RecordedRequest
from conclave.tokens import count_tokens

SUMMARY = re.compile(r"^Round (\d+) · [^\n]*\(summary\)\n(?:- [^\n]*\n?)*", re.MULTILINE)


def user_message(request: RecordedRequest) -> str:
    """The user message a request carried, in whichever of the three wire formats it came."""
    body = request.json
    if "contents" in body:  # Gemini
        return "".join(p.get("text", "") for p in body["contents"][-1]["parts"])
    content = body["messages"][-1]["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


async def _six_rounds(fake: FakeProviderServer, *overrides: str) -> Any:
    """Never settles: cross-examination repeats to the cap (rounds 3-5, verdict 6), three FACT claims a round."""
    script_votes(fake, _blocker, _swinging, claims=True)
    return await run_fast(fake, *overrides)


async def test_from_round_5_prompts_summarize_older_rounds_within_the_budget(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    run = await _six_rounds(fake)
    result = run.result
    assert result.completed_rounds == 6 and result.context is not None
    assert result.context["summarized_rounds"] == [5, 6]
    rows = {r["round_number"]: r for r in result.context["rounds"]}
    assert all(rows[n]["tokens"] == rows[n]["tokens_unsummarized"] for n in (1, 2, 3, 4))
    assert rows[6]["tokens"] < rows[6]["tokens_unsummarized"] and rows[5]["tokens"] < rows[5]["tokens_unsummarized"]
    assert result.context["saved"] > 0  # tiny scripted answers; bench/summarization.py measures real-sized ones
    (verdict,) = requests_with(fake, "verdict", JUDGE_MODEL)
    shown = user_message(verdict)
    # round 6: round 5 in full, rounds 4 and 3 summarized, rounds 2 and 1 merged into the debate state
    assert "Round 4 · Cross-exam (summary)" in shown and "Round 3 · Cross-exam (summary)" in shown
    assert "round 2 — Synthesis — is merged into the DEBATE STATE" in shown and "=== DEBATE STATE ===" in shown
    assert "round 1 — Independent — is merged into the DEBATE STATE" in shown
    # every claim id of the debate is still named: rounds 3-5 made three FACT claims each, C1…C9
    assert all(re.search(rf"\bC{i}\b", shown) for i in range(1, 10))
    for request in fake.requests:
        message = user_message(request)
        if "(summary)" in message:
            assert count_tokens(message) <= 8000
            for block in SUMMARY.finditer(message):
                assert count_tokens(block.group(0)) <= 300, block.group(0)


async def test_an_agent_sees_its_own_round_1_answer_as_one_line_from_round_5(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    await _six_rounds(fake)
    replies = requests_with(fake, "cross_exam_reply", AGENT_MODELS["architect"])
    assert len(replies) == 3  # rounds 3 to 5
    assert f'"position": "position of architect via {AGENT_MODELS["architect"]}"' in user_message(replies[1])
    assert ("(round 1, summarized) your position: \"position of architect via gpt-4o\"; confidence 0.80"
            in user_message(replies[2]))  # round 5


async def test_a_tight_budget_cuts_the_full_rounds_to_fit(fake_provider_server: FakeProviderServer,
                                                          conclave_env: Any) -> None:
    fake = fake_provider_server
    run = await _six_rounds(fake, "summarization.budget_tokens=2500", "quality.state_tokens=400")
    assert run.result.context is not None and run.result.context["over_budget_rounds"] == []
    summarized = [r for r in fake.requests if "(summary)" in user_message(r)]
    assert summarized and all(count_tokens(user_message(r)) <= 2500 for r in summarized)
    assert any(" …" in user_message(r) for r in summarized)  # strings were cut


async def test_summarization_off_or_a_four_round_debate_leaves_prompts_whole(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    run = await _six_rounds(fake, "summarization.enabled=false")
    assert run.result.context is not None and run.result.context["summarized_rounds"] == []
    assert run.result.context["tokens"] == run.result.context["tokens_unsummarized"]
    assert not any("(summary)" in user_message(r) for r in fake.requests)
    fake.reset()
    script_votes(fake, _blocker, _swinging)
    four = await run_fast(fake, "rounds=4")
    assert four.result.context is not None and four.result.context["saved"] is None
    assert not any("since repeated" in user_message(r) or "(summary)" in user_message(r) for r in fake.requests)
