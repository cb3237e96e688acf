"""The exit controller: each exit condition on hand-made rounds, then whole consultations on the fake server — a
BLOCKER keeps cross-examination going to the cap, a plateau exits with convergence, consensus exits at once, the
override and the terminal prompt, fixed ``rounds=N``, the estimate of the cap, and a resume in the middle of a
repeat."""

from __future__ import annotations

import asyncio
import functools
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_engine_support import (
    AGENT_MODELS,
    JUDGE_MODEL,
    QUESTION,
    answering,
    by_schema,
    independent,
    requests_with,
    schema_of,
    synthesis,
)

from conclave.api import compose_settings
from conclave.config.settings import ExitSettings
from conclave.engine.interaction import Interaction
from conclave.engine.rounds import STANDARD_PLAN, Plan
from conclave.engine.run import Consultation
from conclave.engine.strategy import Strategy
from conclave.events import ROUND_ARTIFACT, Event
from conclave.quality.exit import ExitLimits, Standing, change, consensus, max_plan, plateau, position_change
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.store.resume_points import load_resume_point
from conclave.testing.fake_server import FakeProviderServer, Fault, RecordedRequest, Reply

BASE = ("cost.auto_approve=true", f"judge.model={JUDGE_MODEL}")  # rounds left to the exit controller
DEFAULTS = ExitSettings()
NAMES = list(AGENT_MODELS)


# ------------------------------------------------------------------------------------------------ the conditions


def _s(vote: str | None, confidence: float = 0.8, position: str = "adopt event sourcing") -> Standing:
    return Standing(position, confidence, vote)


def test_consensus_needs_80_percent_accept_or_minor() -> None:
    agents = ["a", "b", "c", "d", "e"]
    four = {a: _s("ACCEPT") for a in agents[:4]} | {"e": _s(None)}  # e gave no reply: counts as not agreeing
    confidences = dict.fromkeys(agents, 0.8)
    assert consensus(four, agents, confidences, DEFAULTS)["met"]  # 4 of 5 = 0.80
    three = {a: _s("MINOR") for a in agents[:3]} | {"d": _s(None), "e": _s(None)}
    found = consensus(three, agents, confidences, DEFAULTS)
    assert found["share"] == 0.6 and not found["met"]


def test_one_blocker_prevents_consensus() -> None:
    agents = ["a", "b", "c", "d", "e"]
    votes = {a: _s("ACCEPT") for a in agents[:4]} | {"e": _s("BLOCKER")}
    found = consensus(votes, agents, dict.fromkeys(agents, 0.9), DEFAULTS)
    assert found["share"] == 0.8 and found["blockers"] == ["e"] and not found["met"]


def test_consensus_needs_every_agent_at_least_70_percent_confident() -> None:
    agents = ["a", "b", "c"]
    votes = {a: _s("ACCEPT") for a in agents}
    found = consensus(votes, agents, {"a": 0.9, "b": 0.9, "c": 0.69}, DEFAULTS)
    assert found["low_confidence"] == ["c"] and not found["met"]
    assert consensus(votes, agents, {"a": 0.9, "b": 0.9, "c": 0.7}, DEFAULTS)["met"]


def test_change_is_the_largest_move_of_confidence_position_or_vote() -> None:
    assert change({"a": _s("ACCEPT", 0.6)}, {"a": _s("ACCEPT", 0.8)}) == pytest.approx(0.2)
    assert change({"a": _s("ACCEPT")}, {"a": _s("BLOCKER")}) == 1.0  # two steps
    assert change({"a": _s("ACCEPT")}, {"a": _s("MINOR")}) == 0.5
    assert position_change("keep the monolith", "keep the monolith") == 0.0
    assert change({"a": _s("ACCEPT", position="keep the monolith for now")},
                  {"a": _s("ACCEPT", position="split billing out next quarter")}) == 1.0
    assert change({"a": _s("ACCEPT")}, {"b": _s("ACCEPT")}) is None  # nobody answered both


def test_a_plateau_needs_plateau_rounds_flat_rounds_without_a_new_fact() -> None:
    two = ExitSettings(plateau_rounds=2)
    assert not plateau([0.05], [0], two)  # one flat round is not a plateau of two
    assert plateau([0.4, 0.05, 0.02], [3, 0, 0], two)
    assert not plateau([0.05, 0.02], [0, 1], two)  # a new FACT claim is movement
    assert not plateau([0.05, 0.10], [0, 0], two)  # 10% is not less than 10%
    # by default one flat round is enough: cross-examination repeats only while the panel moves
    assert plateau([0.05], [0], DEFAULTS) and not plateau([0.4], [0], DEFAULTS)


@functools.cache
def _settings() -> Any:
    return compose_settings("q", ["agents=local", "rounds=null"])  # the local panel alone plays 4 rounds


def _session(**changes: Any) -> Any:
    settings = type(_settings()).model_validate({**_settings().model_dump(), **changes})  # quick=true → rounds=2
    plan = Plan(STANDARD_PLAN)
    plan.cut_to_stage(settings.planned_rounds)
    return SimpleNamespace(plan=plan, limits=ExitLimits.of(settings, Strategy().default_round_cap))  # cap 6


@pytest.mark.parametrize(("changes", "rounds"), [
    ({}, 6), ({"exit": ExitSettings(round_cap=8)}, 8), ({"exit": ExitSettings(round_cap=4)}, 4), ({"rounds": 4}, 4),
    ({"rounds": 3}, 3), ({"quick": True}, 2)])
def test_the_longest_plan_repeats_cross_examination_up_to_the_cap(changes: dict[str, Any], rounds: int) -> None:
    session = _session(**changes)
    longest = Plan(max_plan(session.plan.types, session.limits))
    assert len(longest.numbers()) == rounds
    if rounds > 4:
        assert [t.name for t in longest][-1] == "verdict"
        assert [t.name for t in longest].count("cross_exam_replies") == rounds - 3


# ------------------------------------------------------------------------------------------------ on the fake server


def script_votes(fake: FakeProviderServer, vote: Callable[[str, int], str],
                 confidence: Callable[[str, int], float] = lambda name, k: 0.8, claims: bool = False) -> None:
    """Round 1 at confidence 0.8; agent ``name``'s k-th cross-examination reply votes ``vote(name, k)`` at
    ``confidence(name, k)``, with the same position as round 1 (so only votes and confidence move)."""
    for name, model in AGENT_MODELS.items():
        position = f"position of {name} via {model}"
        asked = Counter[str]()

        def reply(request: RecordedRequest, name: str = name, position: str = position,
                  asked: Counter[str] = asked) -> dict[str, Any]:
            k = asked["reply"]
            asked["reply"] += 1
            extra: dict[str, Any] = {}
            if claims:
                extra = {"claims": [{"id": "1", "text": f"{name} measured {k + 1}0k events a day in round {k}",
                                     "label": "FACT", "citations": [1]}],
                         "references": [{"id": 1, "title": f"Dashboard {name} {k}", "url": f"https://x.test/{name}/{k}"}]}
            return {"critique": "", "challenges": [], "defense": "", "revised_position": position,
                    "vote": vote(name, k), "vote_reason": f"{name} says so", "confidence": confidence(name, k),
                    **extra}

        fake.script(model, by_schema(independent=independent(position, 0.8), cross_exam_reply=reply))
    fake.script(JUDGE_MODEL, by_schema())


@functools.cache
def _composed(overrides: tuple[str, ...]) -> Any:
    return compose_settings(QUESTION, [*BASE, *overrides])


def settings_on(fake: FakeProviderServer, *overrides: str) -> Any:
    """The settings ``conclave`` composes for ``overrides`` (composed once per set: Hydra takes a second), with
    every provider pointed at ``fake`` as ``fake.overrides()`` would."""
    settings = _composed(overrides)
    providers = {name: spec.model_copy(update={k: v for k, v in fake.providers_config()[name].items()
                                               if k in ("base_url", "send_key", "max_concurrency")})
                 if name in fake.providers_config() else spec for name, spec in settings.providers.items()}
    return settings.model_copy(update={"providers": providers})


async def run_fast(fake: FakeProviderServer, *overrides: str, interaction: Interaction | None = None,
                   recorder: Any = None) -> Any:
    """``run_consultation`` with the composition cached (see :func:`settings_on`)."""
    from test_engine_support import Run

    run = Run(result=None)  # type: ignore[arg-type]
    consultation = Consultation(settings_on(fake, *overrides), interaction=interaction,
                                subscribers=[run.events.append], recorder=recorder)
    run.consultation = consultation
    run.result = await consultation.run()
    return run


def _blocker(name: str, k: int) -> str:
    return "BLOCKER" if name == "security" else "ACCEPT"


def _swinging(name: str, k: int) -> float:
    return 0.9 if k % 2 == 0 else 0.5  # moves by 0.4 every round: never a plateau


def _rounds(run: Any) -> list[tuple[int, str]]:
    return [(e["round_number"], e["round_type"]) for e in run.of("round:started")]


async def test_an_unresolved_blocker_keeps_cross_examination_going_to_the_cap(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    script_votes(fake, _blocker, _swinging)
    run = await run_fast(fake)
    result = run.result
    assert result.status == "complete" and result.completed_rounds == 6
    assert _rounds(run) == [(1, "independent"), (2, "synthesis"), (3, "cross_exam"), (4, "cross_exam"),
                            (5, "cross_exam"), (6, "verdict")]
    assert len(requests_with(fake, "cross_exam_reply", AGENT_MODELS["security"])) == 3
    assert result.exit is not None and result.exit["reason"] == "round-cap"
    decisions = run.of("exit:evaluated")
    assert [(d["round_number"], d["action"], d["reason"]) for d in decisions] == [
        (3, "repeat", None), (4, "repeat", None), (5, "stop", "round-cap")]
    assert decisions[0]["consensus"]["blockers"] == ["security"]
    reasons = [c["reason"] for c in run.of("plan:changed")]
    assert reasons[0] == "cross-examination repeats: 1 BLOCKER vote(s), 67% ACCEPT or MINOR"
    assert reasons[1].endswith("3 agent(s) below the confidence floor") and len(reasons) == 2
    # a repeated round shows the round it repeats: round 4's replies carry round 3's judgement and replies
    round_4 = requests_with(fake, "cross_exam_reply", AGENT_MODELS["architect"])[1]
    assert "Round 3 (Cross-exam, since repeated), lists cut to top items" in str(round_4.json)


async def test_a_plateau_exits_with_convergence(fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    """Nothing moves (same positions, votes and confidence, no new FACT): the first flat cross-examination round
    ends it (no repeat without movement), then the verdict; with exit.plateau_rounds=2 it takes two."""
    fake = fake_provider_server
    script_votes(fake, _blocker)
    run = await run_fast(fake)
    assert run.result.completed_rounds == 4 and run.result.exit is not None
    assert run.result.exit["reason"] == "convergence"
    assert [(d["change"], d["plateau"], d["action"]) for d in run.of("exit:evaluated")] == [(0.0, True, "stop")]
    assert _rounds(run)[-1] == (4, "verdict")
    run = await run_fast(fake, "exit.plateau_rounds=2")
    assert run.result.completed_rounds == 5 and run.result.exit is not None
    assert [(d["change"], d["plateau"], d["action"]) for d in run.of("exit:evaluated")] == [(0.0, False, "repeat"),
                                                                                            (0.0, True, "stop")]


async def test_new_facts_are_movement_and_no_plateau(fake_provider_server: FakeProviderServer,
                                                     conclave_env: Any) -> None:
    fake = fake_provider_server
    script_votes(fake, _blocker, claims=True)  # flat votes and confidence, but a new FACT claim every round
    run = await run_fast(fake)
    assert run.result.exit is not None and run.result.exit["reason"] == "round-cap"
    assert all(d["new_facts"] == 3 and not d["plateau"] for d in run.of("exit:evaluated"))


async def test_consensus_exits_after_one_cross_examination(fake_provider_server: FakeProviderServer,
                                                           conclave_env: Any) -> None:
    fake = fake_provider_server
    script_votes(fake, lambda name, k: "MINOR" if name == "security" else "ACCEPT")
    run = await run_fast(fake)
    result = run.result
    assert result.completed_rounds == 4 and result.exit is not None and result.exit["reason"] == "consensus"
    assert result.exit["rounds_played"] == 4 and result.exit["estimated_rounds"] == 6
    (decision,) = run.of("exit:evaluated")
    assert decision["consensus"]["share"] == 1.0 and decision["can_repeat"] and not run.of("plan:changed")
    assert result.verdict is not None and result.artifacts.round_4 is not None


async def test_the_override_continues_to_the_cap(fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    script_votes(fake, lambda name, k: "ACCEPT")
    run = await run_fast(fake, "exit.override=continue")
    assert run.result.completed_rounds == 6 and run.result.exit is not None
    # at the cap the consensus is what the debate ended on
    assert run.result.exit["reason"] == "consensus" and run.result.exit["override"] == "continue"
    assert [(d["overridden"], d["action"]) for d in run.of("exit:evaluated")] == [
        (True, "repeat"), (True, "repeat"), (False, "stop")]


async def test_on_a_terminal_the_user_may_continue_past_consensus(fake_provider_server: FakeProviderServer,
                                                                  conclave_env: Any) -> None:
    fake = fake_provider_server
    script_votes(fake, lambda name, k: "ACCEPT")
    asked: list[str] = []
    run = await run_fast(fake, interaction=Interaction(True, answering(asked, "n")))
    assert asked[0].startswith("Consensus reached (100% ACCEPT or MINOR, no BLOCKER) after round 3. Go on to the "
                               "verdict?")
    assert len(asked) == 2  # rounds 3 and 4; after round 5 the cap decides
    assert run.result.completed_rounds == 6 and run.result.exit is not None
    assert [d["answer"] for d in run.of("exit:evaluated")] == ["n", "n", None]


async def test_on_a_terminal_the_user_may_stop_a_blocked_debate(fake_provider_server: FakeProviderServer,
                                                                conclave_env: Any) -> None:
    fake = fake_provider_server
    script_votes(fake, _blocker, _swinging)
    asked: list[str] = []
    run = await run_fast(fake, interaction=Interaction(True, answering(asked, "no")))
    assert asked == ["No consensus after round 3 (1 BLOCKER vote(s), 67% ACCEPT or MINOR). Run another "
                     "cross-examination round? (no: go on to the verdict) [Y/n]"]
    assert run.result.completed_rounds == 4 and run.result.exit is not None
    assert run.result.exit["reason"] == "user-stop"


@pytest.mark.parametrize(("rounds", "played"), [("rounds=4", 4), ("rounds=3", 3)])
async def test_fixed_rounds_never_repeat(fake_provider_server: FakeProviderServer, conclave_env: Any,
                                         rounds: str, played: int) -> None:
    fake = fake_provider_server
    script_votes(fake, _blocker, _swinging)
    run = await run_fast(fake, rounds)
    assert run.result.completed_rounds == played and not run.of("plan:changed")
    assert run.result.exit is not None and run.result.exit["reason"] == "round-cap"
    assert run.result.exit["round_cap"] == played and run.result.exit["estimated_rounds"] == played
    assert run.of("consultation:cost_estimated")[0]["rounds"] == list(range(1, played + 1))


async def test_quick_ends_with_round_cap_and_early_termination_is_its_own_reason(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    script_votes(fake, _blocker)
    quick = await run_fast(fake, "quick=true")
    assert quick.result.exit is not None and quick.result.exit["reason"] == "round-cap"
    assert quick.result.exit["cross_exam_rounds"] == 0
    strong = synthesis([("Adopt it for invoices", ["Agent A", "Agent B", "Agent C"], 0.95)],
                       [("Timing", [("Agent C", "Wait a quarter"), ("Agent A", "Now")])])
    fake.script(JUDGE_MODEL, by_schema(synthesis=strong))
    early = await run_fast(fake)
    assert early.result.completed_rounds == 2 and early.result.exit is not None
    assert early.result.exit["reason"] == "early-termination"


async def test_resume_in_the_middle_of_a_repeat(fake_provider_server: FakeProviderServer, conclave_env: Any,
                                                tmp_path: Path) -> None:
    """Cancelled inside round 4 (the first repeat) after the architect replied: the resumed run restores rounds
    1-3 and the repeat in its place, asks nobody of round 3 again nor the architect of round 4, and goes on to
    the cap."""
    fake = fake_provider_server
    script_votes(fake, _blocker, _swinging)
    hung: set[str] = set()
    for name in ("security", "pragmatist"):
        replies = Counter[str]()

        def maybe_hang(request: RecordedRequest, name: str = name, replies: Counter[str] = replies) -> Any:
            if schema_of(request) == "cross_exam_reply":
                replies["n"] += 1
                if replies["n"] == 2:
                    hung.add(name)
                    return Fault.hang()
                return Reply(json={"critique": "", "challenges": [], "defense": "", "revised_position": f"{name} holds",
                                   "vote": _blocker(name, 0), "confidence": 0.9})
            return Reply(json=independent(f"position of {name}", 0.8))

        fake.script(AGENT_MODELS[name], maybe_hang)
    settings = settings_on(fake, "hedging.enabled=false")
    events: list[Event] = []
    recorder = Recorder(tmp_path, index=False)
    consultation = Consultation(settings, subscribers=[events.append], recorder=recorder)
    task = asyncio.create_task(consultation.run())
    for _ in range(3000):
        if len(hung) == 2 and any(e.type == ROUND_ARTIFACT and e.data["round_number"] == 4 for e in events):
            break
        await asyncio.sleep(0.01)
    assert len(hung) == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    recorder.close()

    fake.reset()
    script_votes(fake, _blocker, _swinging)
    point = load_resume_point(StoreLayout(tmp_path), consultation.id)
    assert point.restored_rounds == [1, 2, 3]
    recorder = Recorder(tmp_path, index=False)
    resumed: list[Event] = []
    again = Consultation(point.settings, subscribers=[resumed.append], recorder=recorder,
                         resume_from=point.resume_from, consultation_id=consultation.id, first_seq=point.next_seq)
    result = await again.run()
    recorder.close()
    assert result.status == "complete" and result.completed_rounds == 6
    assert not requests_with(fake, "independent") and not requests_with(fake, "synthesis")
    assert len(requests_with(fake, "cross_exam_reply", AGENT_MODELS["architect"])) == 1  # round 5 only
    assert len(requests_with(fake, "cross_exam_reply", AGENT_MODELS["security"])) == 2  # rounds 4 and 5
    assert len(requests_with(fake, "cross_exam", JUDGE_MODEL)) == 2
    decisions = [e.data for e in resumed if e.type == "exit:evaluated"]
    assert [(d["round_number"], d["restored"]) for d in decisions] == [(3, True), (4, False), (5, False)]
    assert result.exit is not None and result.exit["reason"] == "round-cap"


async def test_the_index_and_stats_hold_exit_reasons_rounds_and_context_tokens(
        fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path) -> None:
    import sqlite3

    from conclave.store.period_stats import compute_stats, period_from_args, render_text
    from conclave.store.sqlite_index import connect

    fake = fake_provider_server
    script_votes(fake, _blocker, _swinging)
    recorder = Recorder(tmp_path)
    run = await run_fast(fake, recorder=recorder)
    recorder.close()
    cid = run.result.consultation_id
    with sqlite3.connect(StoreLayout(tmp_path).index_path) as db:
        row = db.execute("select exit_reason, cross_exam_rounds, round_cap, rounds_completed, context_tokens, "
                         "context_tokens_unsummarized from consultations where id = ?", (cid,)).fetchone()
        decisions = db.execute("select round_number, reason, action, blockers, overridden from exit_decisions "
                               "where consultation_id = ? order by round_number", (cid,)).fetchall()
        context = db.execute("select round_number, summarized from context_rounds where consultation_id = ? "
                             "order by round_number", (cid,)).fetchall()
    assert run.result.context is not None
    assert row == ("round-cap", 3, 6, 6, run.result.context["tokens"], run.result.context["tokens_unsummarized"])
    assert decisions == [(3, None, "repeat", 1, 0), (4, None, "repeat", 1, 0), (5, "round-cap", "stop", 1, 0)]
    assert context == [(1, 0), (2, 0), (3, 0), (4, 0), (5, 1), (6, 1)]
    index = connect(StoreLayout(tmp_path).index_path)
    figures = compute_stats(index, period_from_args(all_time=True))
    index.close()
    stats = figures["exit"]
    assert "exit               round-cap 1 · 6.0 rounds, 3.0 cross-examinations on average" in render_text(figures)
    assert stats["reasons"] == {"round-cap": 1} and stats["avg_rounds"] == 6.0
    assert stats["avg_cross_exam_rounds"] == 3.0 and 0 < stats["context_saved"] < 1


async def test_the_consent_prompt_says_the_estimate_covers_the_cap(fake_provider_server: FakeProviderServer,
                                                                   conclave_env: Any) -> None:
    fake = fake_provider_server
    script_votes(fake, lambda name, k: "ACCEPT")
    asked: list[str] = []
    run = await run_fast(fake, "cost.auto_approve=false", "cost.always_allow_under=0",
                         interaction=Interaction(True, answering(asked, "y")))
    assert asked[0].startswith("Estimated cost: $") and asked[0].endswith(
        " for up to 6 rounds (cross-examination may repeat). Continue? [y]es / [n]o / [a]lways")
    assert run.result.completed_rounds == 4 and run.result.cost.estimated is not None
    assert run.result.cost.actual < run.result.cost.estimated  # what ran, under the ceiling


async def test_in_shadow_stage_decisions_are_recorded_and_the_debate_keeps_four_rounds(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    script_votes(fake, _blocker, _swinging)
    settings = settings_on(fake)
    # quality.stage (shadow | on) belongs to the groupthink layer's settings; read here as it will be set
    shadow = settings.model_copy(update={"quality": settings.quality.model_copy(update={"stage": "shadow"})})
    events: list[Event] = []
    result = await Consultation(shadow, subscribers=[events.append]).run()
    assert result.completed_rounds == 4 and not [e for e in events if e.type == "plan:changed"]
    (decision,) = [e.data for e in events if e.type == "exit:evaluated"]
    assert decision["shadow"] and decision["action"] == "repeat" and decision["reason"] is None
    assert result.exit is not None and result.exit["reason"] == "round-cap" and result.exit["estimated_rounds"] == 4
