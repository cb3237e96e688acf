"""Anonymous peers: in cross-examination every agent sees the others under neutral labels of its own, in an order
shuffled for it, never by agent, persona, model or provider name; the journal and the report map the labels back."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from test_engine_support import AGENT_MODELS, JUDGE_MODEL, by_schema, requests_with, run_consultation

from conclave.cli.commands.show_prompt import render
from conclave.engine.labels import JudgeLabels
from conclave.events import CONSULTATION_STARTED
from conclave.render.markdown import render_markdown
from conclave.store.recorder import Recorder
from conclave.testing.fake_server import FakeProviderServer, RecordedRequest

PROVIDERS = {"security": "anthropic", "architect": "openai", "pragmatist": "gemini", "skeptic": "openai"}
#: a fourth agent: four agents' own shuffles all coinciding is a 1-in-13,824 chance, not a flaky test
MODELS = {**AGENT_MODELS, "skeptic": "gpt-4o-mini"}
FOURTH = ("+agents.skeptic.persona=skeptic", "+agents.skeptic.provider=openai", "+agents.skeptic.model=gpt-4o-mini")
#: cross-examination repeats once (rounds 3 and 4), so the second replies' prompts show everyone's replies
REPEAT = ("cost.auto_approve=true", f"judge.model={JUDGE_MODEL}", "exit.override=continue", "exit.round_cap=5",
          "early_termination.threshold=1.0")


def _synthesis(request: RecordedRequest) -> dict[str, Any]:
    """A synthesis naming every agent (the judge writes labels), so the replies' prompts show all of them."""
    labels = re.findall(r"Agent [A-D]", json.dumps(request.json))
    a, b, c = sorted(set(labels))[:3]
    return {
        "consensus_points": [{"point": f"{a} and {b} agree the change is reversible.", "supporting_agents": [a, b],
                              "confidence": 0.5, "claim_ids": []}],
        "tensions": [{"topic": "timing", "claim_ids": [], "viewpoints": [
            {"agent": a, "viewpoint": "now"}, {"agent": b, "viewpoint": "later"}, {"agent": c, "viewpoint": "never"}]}],
        "priority_order": ["timing"],
    }


def _user_text(request: RecordedRequest) -> str:
    """What an agent was shown of the debate: its messages but the system prompt (its own persona)."""
    body = request.json or {}
    messages = body.get("messages") or body.get("contents") or []
    return json.dumps([m for m in messages if m.get("role") not in ("system", "developer")])


async def test_round_3_agents_see_peers_only_under_their_own_shuffled_labels(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    for model in MODELS.values():
        fake.script(model, by_schema())
    fake.script(JUDGE_MODEL, by_schema(synthesis=_synthesis))
    run = await run_consultation(fake, *FOURTH, base=REPEAT)
    result = run.result
    assert result.status in ("complete", "completed_degraded") and result.completed_rounds == 5
    settings = run.consultation.settings  # type: ignore[union-attr]
    identity = {name: {name, spec.model, spec.provider, settings.personas[spec.persona].name}
                for name, spec in settings.agents.items()}
    assert identity["security"] >= {"anthropic", "claude-sonnet-4-5", "security"}

    views = result.peer_labels or {}
    assert set(views) == set(MODELS)
    seen: dict[str, list[str]] = {}  # agent -> the labels it was shown the judge's viewpoints under
    replies_order: dict[str, list[str]] = {}  # agent -> the agents whose repeated-round replies it read, in order
    for agent, model in MODELS.items():
        first, repeat = requests_with(fake, "cross_exam_reply", model)
        back = {label: name for name, label in views[agent].items()}
        for request in (first, repeat):
            shown = _user_text(request)
            for other in set(MODELS) - {agent}:
                for word in identity[other] | {PROVIDERS[other]}:
                    if word not in identity[agent]:  # two agents may share a provider
                        assert word not in shown, (agent, word)
        shown = _user_text(first).replace('\\"', '"')
        labels = re.findall(r'"agent": "(Agent [A-D])"', shown)
        assert len(labels) == 3, (agent, labels)
        seen[agent] = labels
        # the labels map back to the agents the judge named, whoever reads them
        assert [back[label] for label in labels] == _viewpoint_agents(result)
        # the repeated round lists everyone's replies in the order of this agent's own labels
        listed = re.findall(r'"(Agent [A-D])": \{"critique"', _user_text(repeat).replace('\\"', '"'))
        assert sorted(listed) == listed and len(listed) == 4, (agent, listed)
        replies_order[agent] = [back[label] for label in listed]
    # each agent has its own labels and its own order
    assert len({tuple(v) for v in seen.values()}) > 1
    assert len({tuple(v) for v in replies_order.values()}) > 1

    # the judge still sees its own labels only; the stored synthesis names the agents
    assert all(v in MODELS for v in _viewpoint_agents(result))
    report = render_markdown(result.as_dict())
    peers_line = next(line for line in report.splitlines() if "Peers:" in line)
    for agent in MODELS:
        assert f"{agent} saw" in peers_line
    (started,) = run.of(CONSULTATION_STARTED)  # what the journal records
    assert started["peer_labels"] == views


def _viewpoint_agents(result: Any) -> list[str]:
    return [v["agent"] for v in result.artifacts.round_2["tensions"][0]["viewpoints"]]


async def test_named_peers_when_anonymity_is_switched_off(fake_provider_server: FakeProviderServer,
                                                         conclave_env: Path) -> None:
    fake = fake_provider_server
    for model in AGENT_MODELS.values():
        fake.script(model, by_schema())
    fake.script(JUDGE_MODEL, by_schema(synthesis=_synthesis))
    run = await run_consultation(fake, "early_termination.threshold=1.0", "anonymous_peers=false")
    settings = run.consultation.settings  # type: ignore[union-attr]
    (request,) = requests_with(fake, "cross_exam_reply", AGENT_MODELS["security"])
    shown = _user_text(request)
    for other in ("architect", "pragmatist"):
        assert settings.personas[settings.agents[other].persona].name in shown
    (judge,) = requests_with(fake, "synthesis")
    assert "Agent A" in _user_text(judge)  # the judge stays blind
    for name, spec in settings.agents.items():
        assert settings.personas[spec.persona].name not in _user_text(judge), name


def test_an_agents_labels_are_reproducible_from_the_seed() -> None:
    judge = JudgeLabels(["a", "b", "c", "d"], 1234)
    views = {agent: judge.for_agent(agent).by_name for agent in "abcd"}
    again = JudgeLabels(["a", "b", "c", "d"], 1234, judge.by_name)  # a resumed run: the journaled judge labels
    assert {agent: again.for_agent(agent).by_name for agent in "abcd"} == views
    assert len({tuple(sorted(v.items())) for v in views.values()}) > 1
    # what an agent writes under its labels is stored in the judge's form, which every view reads back
    view = judge.for_agent("a")
    stored = view.to_names({"target_agent": view.label("b"), "text": f"{view.label('c')} is wrong"})
    assert stored == {"target_agent": "b", "text": f"c ({judge.label('c')}) is wrong"}
    assert judge.to_labels(stored)["text"] == f"{judge.label('c')} is wrong"
    assert judge.for_agent("d").to_labels(stored)["text"] == f"{judge.for_agent('d').label('c')} is wrong"


async def test_show_prompt_shows_an_agent_its_own_view_as_the_engine_sent_it(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    fake = fake_provider_server
    for model in AGENT_MODELS.values():
        fake.script(model, by_schema())
    fake.script(JUDGE_MODEL, by_schema(synthesis=_synthesis))
    recorder = Recorder(conclave_env, index=False)
    run = await run_consultation(fake, "rounds=3", "early_termination.threshold=1.0", recorder=recorder)
    recorder.close()
    assert run.consultation is not None
    for agent, model in AGENT_MODELS.items():
        (call,) = render("cross_exam_replies", [], source=run.consultation.id, agent=agent)
        (sent,) = requests_with(fake, "cross_exam_reply", model)
        own = (run.result.peer_labels or {})[agent][agent]
        assert f"you appear as {own}" in call["user"]
        # the same labels in the same places as the engine's call (how show-prompt renders stored artifacts
        # otherwise is not this test's business)
        synthesis = re.compile(r"The judge's synthesis.*?\n(.*?)\n")
        assert synthesis.findall(call["user"])[0].count(own) >= 1
        assert re.findall(r"Agent [A-C]", synthesis.findall(call["user"])[0]) == re.findall(
            r"Agent [A-C]", synthesis.findall(_user_text(sent).replace('\\n', '\n'))[0])
