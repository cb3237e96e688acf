"""token_efficiency_stats against what the provider really received: the same debate run with filtering on and
with it off (``filtering.enabled=false``), counted with the same tokenizer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from test_engine_support import by_schema, independent, schema_of

from conclave.api import compose_settings
from conclave.engine.result import ConsultationResult
from conclave.engine.run import Consultation
from conclave.events import Event
from conclave.testing.fake_server import FakeProviderServer, RecordedRequest, Reply
from conclave.testing.schema_instances import instance_for
from conclave.tokens import count_tokens

AGENTS = {"security": "security", "architect": "architecture", "pragmatist": "pragmatic"}
JUDGE = "judge-model"
LABELS = ["Agent A", "Agent B", "Agent C"]

# More consensus points, tensions, challenges and rebuttals than the default limits keep (3, 2, 5, 5), and the
# synthesis fields only the judge's seat is shown.
SYNTHESIS = {
    "consensus_points": [{"point": f"Consensus point {i}: replaying events bounds the audit gap by {i}0%.",
                          "supporting_agents": LABELS[: 1 + i % 3], "confidence": round(0.5 + i / 20, 2)}
                         for i in range(7)],
    "tensions": [{"topic": f"Tension {i} over the migration window",
                  "viewpoints": [{"agent": a, "viewpoint": f"{a} holds view {i} on snapshots and replay cost."}
                                 for a in LABELS[: 2 + i % 2]]} for i in range(5)],
    "priority_order": ["auditability", "delivery risk"],
    "partial_coverage": [{"point": "Only two agents priced the storage growth.", "agents": LABELS[:2]}],
    "unique_insights": [{"agent": "Agent C", "insight": "Regulators ask for seven years of history."}],
    "blind_spots": ["Nobody costed the on-call load."],
}
CROSS_EXAM = {
    "challenges": [{"challenger": LABELS[i % 3], "target_agent": LABELS[(i + 1) % 3],
                    "challenge": f"Challenge {i}: the projection rebuild time is a serious gap under peak load.",
                    "evidence": [f"load test {i}"]} for i in range(9)],
    "rebuttals": [{"agent": LABELS[i % 3], "rebuttal": f"Rebuttal {i}: the data shows snapshots cap replays."}
                  for i in range(8)],
    "unresolved": ["How long to keep raw events."],
}


def _replying(name: str) -> Any:
    """``name``'s cross-examination replies: three challenges each, the second the most severe (a severity keyword,
    two evidence items), every one saying whose it is and in which of its replies."""
    replies = 0

    def reply(request: RecordedRequest) -> Reply:
        nonlocal replies
        replies += 1
        challenges = [{"target_agent": "consensus", "challenge": f"{name} challenge {i} in reply {replies}: "
                       + ("a serious gap in the replay budget." if i == 1 else "snapshots need an owner."),
                       "evidence": ["load test", "incident log"] if i == 1 else []} for i in range(3)]
        return Reply(json={**instance_for(request.schema), "challenges": challenges})

    return reply


def _panel(fake: FakeProviderServer, latency: float = 0.0) -> list[str]:
    overrides = ["~agents", "judge.provider=openai", f"judge.model={JUDGE}", "hedging.enabled=false"]

    def after(script: Callable[[RecordedRequest], Reply]) -> Callable[[RecordedRequest], Reply]:
        return lambda request: replace(script(request), latency=latency)

    for name, persona in AGENTS.items():
        fake.script(f"m-{name}", after(by_schema(independent=independent(f"{name} would adopt event sourcing for "
                                                                         "invoices only, with snapshots.", 0.7),
                                                 cross_exam_reply=_replying(name))))
        overrides += [f"+agents.{name}.provider=openai", f"+agents.{name}.model=m-{name}",
                      f"+agents.{name}.persona={persona}"]
    fake.script(JUDGE, after(by_schema(synthesis=SYNTHESIS, cross_exam=CROSS_EXAM)))
    return overrides


async def _run(fake: FakeProviderServer, overrides: list[str], events: list[Event] | None = None
               ) -> ConsultationResult:
    """The debate with a fixed id and label shuffle, so two runs differ only in what ``overrides`` change (the id
    is quoted in summarized prompts)."""
    settings = compose_settings("Should billing move to event sourcing?", [*fake.overrides(), *overrides])
    subscribers = [events.append] if events is not None else []
    return await Consultation(settings, consultation_id="c-0000000000ab", resume_from={"shuffle_seed": 7},
                              subscribers=subscribers).run()


def _later_input(requests: list[RecordedRequest]) -> int:
    """System and user messages of every request after the synthesis, as the engine counts them."""
    return sum(count_tokens("\n".join(m["content"] for m in r.json["messages"] if m["role"] in ("system", "user")))
               for r in requests if schema_of(r) not in (None, "independent", "synthesis"))


async def test_saved_tokens_equal_what_an_unfiltered_run_sends_more(fake_provider_server: FakeProviderServer,
                                                                     conclave_env: Any) -> None:
    fake = fake_provider_server
    # rounds left to the exit controller: cross-examination repeats and later prompts are summarized
    base = ["cost.auto_approve=true", "exit.round_cap=5", *_panel(fake)]
    filtered = await _run(fake, base)
    sent = list(fake.requests)
    fake.requests.clear()
    whole = await _run(fake, [*base, "filtering.enabled=false"])
    unfiltered = list(fake.requests)
    assert filtered.completed_rounds == whole.completed_rounds > 4  # the same debate, repeats included

    stats = filtered.token_efficiency_stats
    assert stats is not None
    assert stats["tokens_used"] == _later_input(sent)
    assert stats["tokens_saved_via_filtering"] == _later_input(unfiltered) - _later_input(sent) > 0


async def test_judge_artifacts_shown_again_later_are_filtered_like_the_declared_inputs(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    result = await _run(fake, ["cost.auto_approve=true", *_panel(fake)])
    plays = [schema_of(r) for r in fake.requests]
    assert plays.count("cross_exam") >= 3 and "objection" in plays  # repeats, summaries and an objection round

    def shown(schema: str) -> list[str]:
        return ["\n".join(m["content"] for m in r.json["messages"]) for r in fake.requests if schema_of(r) == schema]

    # the earlier cross-examination in a repeated round, and the objection round's consensus: top 5 challenges
    later = shown("cross_exam_reply")[3:] + shown("objection")
    assert all("Challenge 4:" in text and "Challenge 8:" not in text for text in later)
    # a summarized synthesis names its most confident consensus points, not its first ones
    summarized = [t for t in shown("cross_exam_reply") if "Round 2 · Synthesis (summary)" in t]
    assert summarized and all("Consensus point 6" in t and "Consensus point 0" not in t for t in summarized)
    assert result.token_efficiency_stats is not None


def _prompt(request: RecordedRequest) -> str:
    return "\n".join(m["content"] for m in request.json["messages"] if m["role"] in ("system", "user"))


def _who(request: RecordedRequest) -> str:
    model = request.json["model"]
    return "judge" if model == JUDGE else model.removeprefix("m-")


async def test_replies_shown_again_keep_their_most_severe_challenges_except_for_their_author(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    events: list[Event] = []
    result = await _run(fake, ["cost.auto_approve=true", "exit.round_cap=5", *_panel(fake)], events)
    assert result.completed_rounds == 5  # cross-examination played twice, then the verdict

    def prompt(request: RecordedRequest) -> str:
        return "\n".join(m["content"] for m in request.json["messages"])

    repeat = [r for r in fake.requests if schema_of(r) == "cross_exam_reply"][3:]
    assert len(repeat) == 3
    for request in repeat:
        author = request.model.removeprefix("m-")
        text = prompt(request)
        assert "(Cross-exam, since repeated), lists cut to top items, your reply whole," in text
        # its own first reply whole; the others' with their most severe challenge only
        assert all(f"{author} challenge {i} in reply 1:" in text for i in range(3))
        for other in set(AGENTS) - {author}:
            assert f"{other} challenge 1 in reply 1:" in text
            assert f"{other} challenge 0 in reply 1:" not in text and f"{other} challenge 2 in reply 1:" not in text
    # the judge recording the repeat sees the replies it records whole, the earlier ones filtered
    judge = prompt([r for r in fake.requests if schema_of(r) == "cross_exam"][1])
    assert "(Cross-exam, since repeated), lists cut to top items, as JSON:" in judge
    for name in AGENTS:
        assert all(f"{name} challenge {i} in reply 2:" in judge for i in range(3))
        assert f"{name} challenge 1 in reply 1:" in judge and f"{name} challenge 0 in reply 1:" not in judge

    applied = [e.data for e in events if e.type == "filter:applied" and e.data["artifact_type"] == "cross_exam_reply"]
    # each reply once for the agents who see it again (two of them) and once for the judge
    assert sorted((a["agent"], a["recipients"]) for a in applied) == sorted(
        (name, n) for name in AGENTS for n in (1, 2))
    assert all(a["round_number"] == 4 and a["limits"] == {"challenges": 1} and a["error"] is None
               and a["tokens_after"] < a["tokens_before"] for a in applied)
