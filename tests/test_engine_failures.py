"""What the engine does when models misbehave or providers fail: re-ask, absent agents, judge fallback,
partial and aborted results, and cancellation."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import clean_env
from test_engine_support import (
    AGENT_MODELS,
    JUDGE_MODEL,
    independent,
    requests_with,
    run_consultation,
    script_panel,
    texts,
)

from conclave.api import compose_settings
from conclave.engine.extraction import extract, header_for
from conclave.engine.run import Consultation
from conclave.errors import ConfigError
from conclave.render.markdown import render_markdown
from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest, Reply
from conclave.testing.pytest_plugin import FAKE_KEYS
from conclave.testing.schema_instances import instance_for

ONE_ATTEMPT = [f"providers.{p}.max_attempts=1" for p in ("openai", "anthropic", "gemini")]


def _first_then_valid(first: Reply) -> Any:
    """A script answering ``first`` once, then a valid instance of whatever schema is asked."""
    calls = itertools.count()

    def reply(request: RecordedRequest) -> Reply:
        return first if next(calls) == 0 else Reply(json=instance_for(request.schema))

    return reply


def _user_turns(request: RecordedRequest) -> list[str]:
    return [m["content"] for m in request.json["messages"] if m["role"] == "user"]


async def test_malformed_output_is_reasked_once_and_recovers(fake_provider_server: FakeProviderServer,
                                                             conclave_env: Any) -> None:
    fake = fake_provider_server
    fake.script(AGENT_MODELS["architect"], _first_then_valid(Reply(text="I think yes {but not as JSON")))
    run = await run_consultation(fake, "rounds=1")
    assert run.result.status == "complete"
    first, second = fake.requests_for(AGENT_MODELS["architect"])
    reask = _user_turns(second)
    assert len(reask) == 2 and reask[0] == _user_turns(first)[0]
    assert "(root)" in reask[1] and "not a JSON object" in reask[1]
    assert second.json["messages"][-2] == {"role": "assistant", "content": "I think yes {but not as JSON"}
    statuses = {e["agent"]: e["status"] for e in run.of("consultation:round_artifact")}
    assert statuses["architect"] == "reasked" and statuses["security"] == "valid"


async def test_schema_invalid_output_is_reasked_quoting_the_error_path(fake_provider_server: FakeProviderServer,
                                                                       conclave_env: Any) -> None:
    fake = fake_provider_server
    bad = independent("too sure", confidence=3.5)
    fake.script(AGENT_MODELS["architect"], _first_then_valid(Reply(json=bad)))
    run = await run_consultation(fake, "rounds=1")
    assert run.result.artifacts.round_1["architect"]["confidence"] <= 1
    second = fake.requests_for(AGENT_MODELS["architect"])[1]
    assert "$.confidence: 3.5 is greater than the maximum of 1" in _user_turns(second)[1]


async def test_an_agent_failing_round_1_is_absent_and_the_judge_is_told(fake_provider_server: FakeProviderServer,
                                                                        conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    fake.script(AGENT_MODELS["security"], Reply(text="I would rather write prose."))  # invalid, twice
    run = await run_consultation(fake, "rounds=2")
    result = run.result
    assert result.status == "completed_degraded" and result.absent_agents == ["security"]
    security = next(a for a in result.agents if a.name == "security")
    assert security.absent and security.raw_text == "I would rather write prose."
    assert security.error is not None and "round 1: invalid answer after one re-ask" in security.error
    assert "security" not in result.artifacts.round_1
    (synthesis_request,) = requests_with(fake, "synthesis", JUDGE_MODEL)
    label = result.judge_labels["security"]
    assert f"Absent: {label} gave no valid answer in round 1" in texts(synthesis_request)
    failed = [e for e in run.of("agent:completed") if not e["ok"]]
    assert failed[0]["agent"] == "security" and failed[0]["raw_text"] == "I would rather write prose."


async def test_a_failing_judge_is_replaced_by_one_on_another_provider(fake_provider_server: FakeProviderServer,
                                                                      conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    fake.script(JUDGE_MODEL, Fault.server_error(500))
    run = await run_consultation(fake, *ONE_ATTEMPT)
    result = run.result
    assert result.status == "completed_degraded" and result.completed_rounds == 4
    assert result.judge.fallback_used and result.judge.provider == "openai"
    assert result.judge.actual_provider != "openai"
    replacement = result.judge.actual_model
    assert len(fake.requests_for(JUDGE_MODEL)) == 1  # the failed judge is not asked again in later rounds
    assert [schema for schema in ("synthesis", "cross_exam", "verdict") if requests_with(fake, schema, replacement)]\
        == ["synthesis", "cross_exam", "verdict"]
    (fallback,) = [s for s in result.substitutions if s.get("judge_fallback")]
    assert fallback["round_number"] == 2 and fallback["substitute_model"] == replacement
    assert run.of("consultation:round_artifact")[3]["status"] == "fallback"


async def test_when_the_replacement_judge_fails_too_the_result_is_partial(fake_provider_server: FakeProviderServer,
                                                                          conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    fake.script(JUDGE_MODEL, Fault.server_error(500))
    probe = compose_settings("q", [*fake.overrides(), "judge.model=gpt-4.1"])
    from conclave.plugin_manager import get_plugins
    from conclave.providers.pool import ProviderPool

    async with ProviderPool(probe, get_plugins()) as pool:
        backup = pool.backup_for("openai", JUDGE_MODEL)
    assert backup is not None
    fake.script(backup[1], Fault.server_error(503))
    run = await run_consultation(fake, *ONE_ATTEMPT)
    result = run.result
    assert result.status == "partial" and result.completed_rounds == 1
    assert run.states()[-2:] == ["SYNTHESIS", "ABORTED"]
    assert set(result.artifacts.round_1) == set(AGENT_MODELS) and result.artifacts.round_2 is None
    assert result.abort_reason is not None and result.abort_reason.startswith("the judge failed in round 2")
    assert result.verdict is None and result.recommendation is None


async def test_when_every_provider_rejects_the_consultation_aborts_with_nothing_spent(conclave_env: Any) -> None:
    async with FakeProviderServer(keys={"openai": "x", "anthropic": "x", "gemini": "x"}) as fake:
        run = await run_consultation(fake)
    result = run.result
    assert result.status == "aborted" and result.completed_rounds == 0
    assert run.states()[-2:] == ["INDEPENDENT", "ABORTED"]
    assert result.absent_agents == sorted(AGENT_MODELS, key=list(AGENT_MODELS).index)
    assert "only 0 of 3 agents" in (result.abort_reason or "")
    assert all(r.model in AGENT_MODELS.values() for r in fake.requests)  # no judge was ever asked
    assert all("AuthError" in (a.error or "") for a in result.agents)


async def test_one_valid_answer_cannot_be_debated_and_is_kept_as_partial(fake_provider_server: FakeProviderServer,
                                                                        conclave_env: Any) -> None:
    fake = fake_provider_server
    fake.script(AGENT_MODELS["security"], Fault.auth_rejected())
    fake.script(AGENT_MODELS["pragmatist"], Fault.auth_rejected())
    run = await run_consultation(fake)
    assert run.result.status == "partial" and list(run.result.artifacts.round_1) == ["architect"]
    assert not fake.requests_for(JUDGE_MODEL)


async def test_cancelling_stops_in_flight_calls_and_keeps_a_partial_result(fake_provider_server: FakeProviderServer,
                                                                           conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    judge_asked = asyncio.Event()

    def hang(request: RecordedRequest) -> Fault:
        judge_asked.set()
        return Fault.hang()

    fake.script(JUDGE_MODEL, hang)
    settings = compose_settings("q", [*fake.overrides(), "cost.auto_approve=true", f"judge.model={JUDGE_MODEL}",
                                      "hedging.enabled=false"])
    events: list[Any] = []
    consultation = Consultation(settings, subscribers=[events.append])
    task = asyncio.create_task(consultation.run())
    await asyncio.wait_for(judge_asked.wait(), timeout=30)
    task.cancel()
    try:
        await task
        raise AssertionError("the cancellation must propagate")
    except asyncio.CancelledError:
        pass
    result = consultation.result
    assert result is not None and result.status == "partial" and result.abort_reason == "interrupted by the user"
    assert set(result.artifacts.round_1) == set(AGENT_MODELS)
    assert events[-1].type == "consultation:completed"
    for _ in range(100):  # the server notices the closed connection shortly after
        if fake.requests_for(JUDGE_MODEL)[0].disconnected:
            break
        await asyncio.sleep(0.01)
    assert fake.requests_for(JUDGE_MODEL)[0].disconnected
    assert json.dumps(result.as_dict())


async def test_a_missing_api_key_stops_before_anything_is_sent(fake_provider_server: FakeProviderServer,
                                                               conclave_env: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    # the real endpoint needs a key (a local one, like the fake, may not); agents=default: a panel picked by name
    # is kept when a key is missing (the zero-config panel would leave anthropic out)
    with pytest.raises(ConfigError) as caught:
        await run_consultation(fake_provider_server, "agents=default",
                               "providers.anthropic.base_url=https://api.anthropic.com")
    assert caught.value.problems == [
        "agents.security.provider: provider 'anthropic' has no API key; set ANTHROPIC_API_KEY"
    ]
    assert fake_provider_server.requests == []


async def test_strict_models_never_seats_a_replacement_judge(fake_provider_server: FakeProviderServer,
                                                            conclave_env: Any) -> None:
    """strict_models=true: a dead judge ends the consultation partial; no other model reads the answers."""
    fake = fake_provider_server
    script_panel(fake)
    fake.script(JUDGE_MODEL, Fault.server_error(500))
    run = await run_consultation(fake, *ONE_ATTEMPT, "strict_models=true")
    result = run.result
    assert result.status == "partial" and not result.judge.fallback_used
    assert result.abort_reason is not None and "strict_models=true: no replacement judge was asked" in result.abort_reason
    judge_calls = [r for r in fake.requests if r.model not in AGENT_MODELS.values()]
    assert [r.model for r in judge_calls] == [JUDGE_MODEL]  # only the configured judge was ever asked
    assert not run.of("consultation:provider_substituted")


async def test_a_judge_fallback_is_kept_when_the_consultation_is_resumed(fake_provider_server: FakeProviderServer,
                                                                        conclave_env: Any) -> None:
    """The replacement judge that took over in an earlier run judges the resumed rounds too."""
    fake = fake_provider_server
    script_panel(fake)
    fake.script(JUDGE_MODEL, Fault.server_error(500))
    first = await run_consultation(fake, *ONE_ATTEMPT, "rounds=2")
    (fallback,) = [s for s in first.result.substitutions if s.get("judge_fallback")]
    fake.reset()
    script_panel(fake)
    fake.script(JUDGE_MODEL, Fault.server_error(500))
    resume_from = {"round_1": first.result.artifacts.round_1, "round_2": first.result.artifacts.round_2,
                   "shuffle_seed": first.result.shuffle_seed, "labels": first.result.judge_labels,
                   "judge_fallback": fallback}
    run = await run_consultation(fake, *ONE_ATTEMPT, resume_from=resume_from)
    assert run.result.status == "completed_degraded" and run.result.completed_rounds == 4
    assert not fake.requests_for(JUDGE_MODEL)  # the dead judge is not tried again
    assert requests_with(fake, "verdict", fallback["substitute_model"])


async def test_agents_named_like_labels_keep_their_own_replies(fake_provider_server: FakeProviderServer,
                                                              conclave_env: Any) -> None:
    """Agents called agent_a, agent_b, agent_c: each one's answers stay its own, whatever label it got."""
    fake = fake_provider_server
    models = {"agent_a": "claude-sonnet-4-5", "agent_b": "gpt-4o", "agent_c": "gemini-2.5-pro"}
    providers = {"claude-sonnet-4-5": "anthropic", "gpt-4o": "openai", "gemini-2.5-pro": "gemini"}
    panel = []
    for name, model in models.items():
        panel += [f"+agents.{name}.provider={providers[model]}", f"+agents.{name}.model={model}",
                  f"+agents.{name}.persona=architecture"]

        def answer(request: RecordedRequest, model: str = model) -> Reply:
            body = instance_for(request.schema)
            for field in ("position", "revised_position"):
                if field in body:
                    body[field] = f"said by {model}"
            return Reply(json=body)

        fake.script(model, answer)

    def judge(request: RecordedRequest) -> Reply:
        body = instance_for(request.schema)
        if "rebuttals" in body:  # the cross-examination: file each reply under the label it came with
            text = _user_turns(request)[0]
            replies, _ = json.JSONDecoder().raw_decode(text, text.index("{", text.index("keyed by label")))
            body["rebuttals"] = [{"agent": label, "rebuttal": reply["revised_position"]}
                                 for label, reply in replies.items()]
        return Reply(json=body)

    fake.script(JUDGE_MODEL, judge)
    run = await run_consultation(fake, "~agents", *panel, "judge.provider=openai")
    result = run.result
    assert result.status == "complete", result.abort_reason
    assert {n: a["position"] for n, a in result.artifacts.round_1.items()} == \
        {n: f"said by {m}" for n, m in models.items()}
    assert {n: a["agent_id"] for n, a in result.artifacts.round_1.items()} == {n: n for n in models}
    assert {n: r["revised_position"] for n, r in result.artifacts.round_3_replies.items()} == \
        {n: f"said by {m}" for n, m in models.items()}
    # the judge's record of round 3 files each reply under the agent that wrote it
    assert {r["agent"]: r["rebuttal"] for r in result.artifacts.round_3["rebuttals"]} == \
        {n: f"said by {m}" for n, m in models.items()}
    # no prompt names an agent: the judge and the agents only ever see labels
    assert not [r for r in fake.requests if re.search(r"\bagent_[abc]\b", json.dumps(r.json))]


async def test_explore_ending_before_its_verdict_round_on_an_empty_synthesis_still_completes(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    fake = fake_provider_server
    script_panel(fake, synthesis={"consensus_points": [], "tensions": [], "priority_order": []})
    run = await run_consultation(fake, "mode=explore", "quick=true")
    result = run.result
    assert result.status == "complete", result.abort_reason
    assert result.verdict is not None and result.verdict["recommendations"][0]["option"]


def _closed_port() -> int:
    """A port on 127.0.0.1 nothing listens on: connections to it are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# (the seat, the fault its model gives on every call, overrides): dead (5xx through the retries, a refused
# connection), hanging (to its deadline), out of quota
DEAD_PRIMARIES = {
    "5xx": ("security", Fault.server_error(500), ["providers.anthropic.max_attempts=2"]),
    # the defaults: 3 attempts with backoff, hedging on (the backup may win while the primary is between retries)
    "5xx-defaults": ("security", Fault.server_error(500), []),
    "refused": ("security", None, ["providers.anthropic.max_attempts=2"]),
    "hang": ("security", Fault.hang(), ["providers.anthropic.timeout_s=0.4", "providers.anthropic.max_attempts=1",
                                        "hedging.enabled=false"]),
    "quota": ("architect", Fault.insufficient_quota(), []),
    "402": ("security", Fault.http(402, "Your credit balance is too low"), []),
}


@pytest.mark.parametrize("case", list(DEAD_PRIMARIES))
async def test_a_dead_primary_is_not_asked_again_after_its_first_failed_round(
    fake_provider_server: FakeProviderServer, conclave_env: Any, case: str
) -> None:
    """The model failed for good in round 1: in round 3 its seat goes straight to the substitute, and the journal
    says why (reason ``unavailable``, with the round and the failure)."""
    fake = fake_provider_server
    agent, fault, overrides = DEAD_PRIMARIES[case]
    model = AGENT_MODELS[agent]
    provider = {"security": "anthropic", "architect": "openai"}[agent]
    script_panel(fake)
    if fault is not None:
        fake.script(model, fault)
    else:
        overrides = [*overrides, f"providers.anthropic.base_url=http://127.0.0.1:{_closed_port()}/anthropic"]
    run = await run_consultation(fake, *overrides)
    result = run.result
    assert result.status == "completed_degraded" and result.completed_rounds == 4, result.abort_reason
    dead = [a for a in run.of("provider:attempt") if (a["provider"], a["model"]) == (provider, model)]
    assert dead and {a["round_number"] for a in dead} == {1}  # never asked after round 1
    if fault is not None:
        assert len(fake.requests_for(model)) == len(dead)  # what the dead endpoint received
    subs = [s for s in run.of("consultation:provider_substituted") if s["agent"] == agent]
    assert [(s["round_number"], s["reason"]) for s in subs] == [(1, "failure"), (3, "unavailable")]
    assert f"{provider}/" in subs[1]["detail"] and "failed in round 1" in subs[1]["detail"]
    assert result.substitutions[-1]["detail"] == subs[1]["detail"]  # the result keeps it
    assert f"substituted for {provider}/{model} (failure, not asked again from round 3)" in \
        render_markdown(result.as_dict())


async def test_a_rate_limited_primary_is_asked_again_in_later_rounds(fake_provider_server: FakeProviderServer,
                                                                     conclave_env: Any) -> None:
    """A 429 is transient: the seat's own model is tried again in round 3, and round 1's substitution is
    recorded as ``rate_limited``."""
    fake = fake_provider_server
    script_panel(fake)
    fake.script(AGENT_MODELS["security"], Fault.rate_limited(retry_after=0.01))
    run = await run_consultation(fake, "providers.anthropic.max_attempts=2")
    asked = {a["round_number"] for a in run.of("provider:attempt") if a["model"] == AGENT_MODELS["security"]}
    assert asked == {1, 3}
    subs = [s for s in run.of("consultation:provider_substituted") if s["agent"] == "security"]
    assert [(s["round_number"], s["reason"]) for s in subs] == [(1, "rate_limited"), (3, "rate_limited")]


async def test_strict_models_stops_the_run_when_an_agents_model_cannot_answer(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    """strict_models=true: an agent its configured model cannot answer is neither substituted nor left absent; the
    consultation stops (partial), naming the seat, its model and the cause in one line."""
    fake = fake_provider_server
    script_panel(fake)
    fake.script(AGENT_MODELS["security"], Fault.server_error(500))
    run = await run_consultation(fake, *ONE_ATTEMPT, "strict_models=true")
    result = run.result
    assert result.status == "partial" and not result.ok
    reason = result.abort_reason or ""
    assert reason.startswith("strict_models=true: agent 'security' got no answer from its configured model "
                             "anthropic/claude-sonnet-4-5 in round 1: ") and "HTTP 500" in reason
    assert "\n" not in reason
    assert not run.of("consultation:provider_substituted")
    assert not fake.requests_for(JUDGE_MODEL)  # nothing was debated without the seat
    assert {r.model for r in fake.requests} == set(AGENT_MODELS.values())  # no other model was asked


async def _conclave(home: Path, *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "conclave", *args, env=clean_env(home, FAKE_KEYS), cwd=home,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_strict_models_failure_exits_1_in_one_line_and_resumes(tmp_path: Path) -> None:
    """The CLI: exit 1 with one line naming the seat and the cause, the journal intact; once the provider is back,
    ``conclave resume`` asks only the seat that had no answer and completes the consultation."""
    home = tmp_path / "home"
    home.mkdir()
    async with FakeProviderServer() as fake:
        fake.script("claude-sonnet-4-5", Fault.server_error(500))
        code, _, err = await _conclave(home, "Should we shard the database?", *fake.overrides(),
                                       "cost.auto_approve=true", "rounds=2", "strict_models=true",
                                       "providers.anthropic.max_attempts=1")
        assert code == 1, err
        assert "Traceback" not in err
        (line,) = [line for line in err.splitlines() if line.startswith("conclave:")]
        assert line.startswith("conclave: consultation partial: strict_models=true: agent ") and "HTTP 500" in line
        assert "anthropic/claude-sonnet-4-5" in line
        asked_before = len(fake.requests)
        code, out, err = await _conclave(home, "logs", "verify")
        assert code == 0 and out.startswith("OK: 1 journal(s)"), out + err

        fake.reset()  # the provider answers again
        code, _, err = await _conclave(home, "resume")
        assert code == 0, err
        round_1 = [r.model for r in fake.requests if "Round 1" in str((r.schema or {}).get("title", ""))]
    assert asked_before > 0 and round_1 == ["claude-sonnet-4-5"]  # the answers already paid for are reused


def _cites_zero(request: RecordedRequest) -> Reply:
    """What llama-cpp-python's server grammar lets a small model write: ``minimum`` on an integer inside an array
    is not enforced, so every claim cites reference 0 (there is none)."""
    body = instance_for(request.schema)
    if "claims" in (request.schema or {}).get("properties", {}):
        body["claims"] = [{"id": "1", "text": "SQLite needs no server.", "label": "FACT", "citations": [0]},
                          {"id": "2", "text": "Postgres scales further.", "label": "INFER", "citations": [0, 0]}]
        body["references"] = []
    return Reply(json=body)


async def test_the_readme_llama_cpp_server_line_completes_when_the_grammar_writes_citation_0(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    """The llama.cpp-server line of docs/providers-and-local-servers.md (a keyless OpenAI-compatible server on
    127.0.0.1, grammar_lengths=fit),
    three runs, against the fake scripted to answer the way that server's grammar does: a citation number 0 is
    dropped as a repair, not re-asked (the same grammar would write it again), and every run completes."""
    fake = fake_provider_server
    readme_line = ["agents=openai_only", f"providers.openai.base_url={fake.base_url('openai')}",
                   "providers.openai.grammar_lengths=fit", "providers.openai.timeout_s=900", "cost.auto_approve=true"]
    for _ in range(3):
        fake.reset()
        fake.script("gpt-4o", _cites_zero)
        run = await run_consultation(fake, *readme_line, base=())
        result = run.result
        assert result.status == "complete", result.abort_reason
        assert not [r for r in fake.requests if any(m["role"] == "assistant" for m in r.json["messages"])]  # no re-ask
        agents = [a for a in run.of("consultation:round_artifact") if a["agent"] is not None]
        assert agents and {a["status"] for a in agents} == {"repaired"}
        assert all(c["citations"] == [] for a in agents for c in a["artifact"]["claims"])
        assert all(json.loads(a["raw_text"])["claims"][0]["citations"] == [0] for a in agents)  # as written
    # and the grammar the server compiles lists the reference numbers it may write, from 1
    (first,) = [r for r in fake.requests if "claims" in (r.schema or {}).get("properties", {})][:1]
    claim = first.schema["properties"]["claims"]["items"]["properties"]
    assert claim["citations"]["items"]["enum"] == list(range(1, 13))


def test_only_citation_numbers_below_1_are_dropped_every_other_error_still_fails() -> None:
    header = header_for("independent", 1, "security")
    body = {**independent("SQLite"), "references": [{"id": 1, "title": "SQLite docs"}],
            "claims": [{"id": "1", "text": "SQLite needs no server.", "label": "FACT", "citations": [0, 1, -2]}]}
    repaired = extract(json.dumps(body), None, "independent", header)
    assert repaired.status == "repaired" and repaired.artifact is not None
    assert repaired.artifact["claims"][0]["citations"] == [1]
    for broken, error in ((dict(body, references=[{"id": 0, "title": "x"}]), "$.references[0].id"),
                          (dict(body, claims=[{**body["claims"][0], "citations": ["1"]}]), "$.claims[0].citations[0]"),
                          (dict(body, confidence=3.5), "$.confidence")):
        failed = extract(json.dumps(broken), None, "independent", header)
        assert failed.artifact is None and any(e.startswith(error) for e in failed.errors), failed.errors


async def test_a_judge_on_a_model_that_died_in_round_1_is_replaced_without_asking_it(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    """The judge shares the architect's model, which failed for good in round 1: round 2 seats a replacement judge
    at once, without sending the dead model a single request."""
    fake = fake_provider_server
    script_panel(fake)
    fake.script(AGENT_MODELS["architect"], Fault.server_error(500))
    run = await run_consultation(fake, f"judge.model={AGENT_MODELS['architect']}", "providers.openai.max_attempts=2")
    result = run.result
    assert result.status == "completed_degraded" and result.completed_rounds == 4, result.abort_reason
    asked = [a for a in run.of("provider:attempt") if a["model"] == AGENT_MODELS["architect"]]
    assert {a["round_number"] for a in asked} == {1} and len(fake.requests_for(AGENT_MODELS["architect"])) == 2
    assert result.judge.fallback_used
    (fallback,) = [s for s in result.substitutions if s.get("judge_fallback")]
    assert fallback["round_number"] == 2 and "not asked again" in fallback["error"]
