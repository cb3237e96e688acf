"""The cost gate before round 1 (estimate from the real prompts, consent, Always) and the abort in flight, which
on a resumed consultation counts what its earlier runs spent."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from test_engine_support import (
    AGENT_MODELS,
    JUDGE_MODEL,
    QUESTION,
    answering,
    by_schema,
    requests_with,
    run_consultation,
    script_panel,
)

from conclave.api import compose_settings
from conclave.engine.interaction import Interaction
from conclave.engine.rounds import STANDARD_PLAN
from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.tokens import count_tokens

MAX_OUTPUT_TOKENS = {t.schema: t.max_tokens for t in STANDARD_PLAN}  # each round type's declared budget

NO_AUTO = (f"judge.model={JUDGE_MODEL}",)  # the engine tests' base overrides, minus cost.auto_approve


async def test_under_the_threshold_it_goes_ahead_without_asking(fake_provider_server: FakeProviderServer,
                                                                conclave_env: Any) -> None:
    run = await run_consultation(fake_provider_server, "cost.always_allow_under=100", "rounds=1", base=NO_AUTO)
    (consent,) = run.of("consultation:user_consent")
    assert consent["approved"] and consent["auto_approved"] and "within cost.always_allow_under" in consent["reason"]
    assert run.result.status == "complete"


async def test_the_estimate_counts_the_real_prompts_of_every_planned_call(fake_provider_server: FakeProviderServer,
                                                                          conclave_env: Any, tmp_path: Any) -> None:
    context = tmp_path / "notes.md"
    context.write_text("Our invoices table has 40 million rows. " * 200)
    short = await run_consultation(fake_provider_server, "rounds=1", base=(*NO_AUTO[:1], "cost.auto_approve=true"))
    # (with prompt caching, OpenAI and Anthropic also send their tool lists before a cached context, and the estimate
    # counts them: tests/test_prompt_caching_openai.py; here only the context itself is added)
    long = await run_consultation(fake_provider_server, "rounds=1", f"context=[{context}]",
                                  "providers.openai.prompt_cache=off", "providers.anthropic.prompt_cache=off",
                                  base=(*NO_AUTO[:1], "cost.auto_approve=true"))
    (small,), (big,) = short.of("consultation:cost_estimated"), long.of("consultation:cost_estimated")
    added = count_tokens(context.read_text())
    # the context goes into each of the three round-1 system prompts
    assert 3 * added <= big["input_tokens"] - small["input_tokens"] <= 3 * added + 300
    assert small["output_tokens"] == 3 * MAX_OUTPUT_TOKENS["independent"]
    full = await run_consultation(fake_provider_server, "rounds=4", base=(*NO_AUTO[:1], "cost.auto_approve=true"))
    (estimate,) = full.of("consultation:cost_estimated")
    cross_exam = MAX_OUTPUT_TOKENS["cross_exam"] + 3 * MAX_OUTPUT_TOKENS["cross_exam_reply"]
    assert estimate["output_tokens"] == sum(MAX_OUTPUT_TOKENS[k] for k in ("synthesis", "verdict")) \
        + 3 * MAX_OUTPUT_TOKENS["independent"] + cross_exam
    # left to the exit controller, the estimate covers the cap: 6 rounds, two more cross-examination rounds
    repeating = await run_consultation(fake_provider_server, base=(*NO_AUTO[:1], "cost.auto_approve=true"))
    (ceiling,) = repeating.of("consultation:cost_estimated")
    assert ceiling["output_tokens"] == estimate["output_tokens"] + 2 * cross_exam
    assert ceiling["rounds"] == [1, 2, 3, 4, 5, 6] and repeating.result.exit is not None
    assert repeating.result.exit["estimated_rounds"] == 6
    assert full.result.cost.estimated == estimate["estimated_cost"] > short.result.cost.estimated


async def test_over_the_threshold_auto_approve_skips_the_question(fake_provider_server: FakeProviderServer,
                                                                  conclave_env: Any) -> None:
    run = await run_consultation(
        fake_provider_server, "cost.always_allow_under=0", "cost.auto_approve=true", "rounds=1", base=NO_AUTO,
        interaction=Interaction(True, ask=lambda prompt: "n"),  # would decline, if it were asked
    )
    (consent,) = run.of("consultation:user_consent")
    assert consent == consent | {"approved": True, "auto_approved": True, "reason": "cost.auto_approve=true"}
    assert run.result.status == "complete"


async def test_over_the_threshold_without_a_terminal_it_refuses_and_spends_nothing(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    run = await run_consultation(fake_provider_server, "cost.always_allow_under=0.01", base=NO_AUTO)
    result = run.result
    assert result.status == "aborted" and fake_provider_server.requests == []
    assert run.states() == ["IDLE", "ESTIMATING", "AWAITING_CONSENT", "ABORTED"]
    refusal = run.consultation.refusal if run.consultation else None
    assert refusal is not None and "cost.auto_approve=true" in refusal and "cost.always_allow_under" in refusal
    assert f"${result.cost.estimated:.4f}" in refusal
    assert result.cost.actual == 0 and result.tokens.total == 0


async def test_an_unknown_price_counts_as_over_the_threshold(fake_provider_server: FakeProviderServer,
                                                             conclave_env: Any) -> None:
    run = await run_consultation(fake_provider_server, "agents.architect.model=house-model-7",
                                 "cost.always_allow_under=1000", base=NO_AUTO)
    assert run.result.status == "aborted" and run.result.cost.estimated is None
    assert run.result.cost.unknown_prices == ["openai/house-model-7"]
    refusal = run.consultation.refusal if run.consultation else ""
    assert "no price is known for openai/house-model-7" in (refusal or "")


async def test_a_terminal_user_may_decline(fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    asked: list[str] = []
    run = await run_consultation(fake_provider_server, "cost.always_allow_under=0", base=NO_AUTO,
                                 interaction=Interaction(True, ask=answering(asked, "n")))
    assert len(asked) == 1 and run.result.status == "aborted" and fake_provider_server.requests == []


async def test_always_approves_and_stores_the_rounded_up_threshold(fake_provider_server: FakeProviderServer,
                                                                   conclave_env: Any) -> None:
    settings_file = conclave_env / "conf" / "user" / "settings.yaml"
    settings_file.parent.mkdir(parents=True)
    settings_file.write_text("hedging:\n  floor_s: 3.0\n")
    asked: list[str] = []
    run = await run_consultation(fake_provider_server, "cost.always_allow_under=0", "rounds=1", base=NO_AUTO,
                                 interaction=Interaction(True, ask=answering(asked, "a")))
    estimate = run.result.cost.estimated
    assert estimate is not None and asked == [f"Estimated cost: ${estimate:.4f}. Continue? [y]es / [n]o / [a]lways"]
    assert run.result.status == "complete"
    stored = yaml.safe_load(settings_file.read_text())
    threshold = stored["cost"]["always_allow_under"]
    assert stored["hedging"] == {"floor_s": 3.0}
    assert estimate <= threshold < estimate + 0.01 and round(threshold, 2) == threshold
    # Hydra picks the stored threshold up on the next composition
    assert compose_settings(QUESTION).cost.always_allow_under == threshold


async def test_actual_cost_far_over_the_estimate_aborts_before_the_next_round(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    fake = fake_provider_server
    script_panel(fake)
    fake.script(AGENT_MODELS["architect"], Reply(json={"position": "expensive", "key_points": ["k"], "rationale": "r",
                                                       "confidence": 0.5, "prose_excerpt": ""},
                                                 usage=(2_000_000, 400_000, 0)))
    run = await run_consultation(fake)
    result = run.result
    assert result.status == "partial" and run.states()[-2:] == ["INDEPENDENT", "ABORTED"]
    (gate,) = run.of("cost:gate_triggered")
    assert gate["phase"] == "round 1" and gate["actual_cost"] > gate["abort_ratio"] * gate["estimated_cost"]
    assert result.abort_reason is not None and result.abort_reason.startswith("cost_exceeded")
    assert not fake.requests_for(JUDGE_MODEL) and set(result.artifacts.round_1) == set(AGENT_MODELS)
    assert result.cost.actual == gate["actual_cost"]


async def _round_1(fake: FakeProviderServer) -> dict[str, Any]:
    """A resume point after round 1 (what ``conclave resume`` restores), from a real one-round run."""
    script_panel(fake)
    first = (await run_consultation(fake, "rounds=1")).result
    fake.reset()
    script_panel(fake)
    return {"round_1": first.artifacts.round_1, "shuffle_seed": first.shuffle_seed}


async def test_what_earlier_runs_spent_counts_against_the_abort_ratio(fake_provider_server: FakeProviderServer,
                                                                      conclave_env: Any) -> None:
    """Resumed after round 1: the continuation alone stays under the limit, but with what the first run was
    billed it goes over after round 2 and stops before round 3 spends anything."""
    fake = fake_provider_server
    resume_from = await _round_1(fake)
    alone = await run_consultation(fake, resume_from=resume_from)
    assert alone.result.status == "complete" and not alone.of("cost:gate_triggered")
    budget, ratio = alone.result.cost.estimated, 1.5
    assert budget is not None
    (round_2,) = [e["cost"] for e in alone.of("round:completed") if e["round_number"] == 2]
    assert round_2 > 0
    earlier = ratio * budget - round_2 / 2  # under the limit by itself; round 2 takes it over

    fake.reset()
    script_panel(fake)
    run = await run_consultation(fake, resume_from={**resume_from, "spent": {"cost": earlier}})
    result = run.result
    (gate,) = run.of("cost:gate_triggered")
    assert gate["phase"] == "round 2" and gate["estimated_cost"] == budget and gate["abort_ratio"] == ratio
    assert gate["actual_cost"] == pytest.approx(earlier + round_2, abs=1e-6)
    assert result.status == "partial" and result.abort_reason is not None
    assert result.abort_reason.startswith("cost_exceeded") and result.cost.actual == gate["actual_cost"]
    assert requests_with(fake, "synthesis") and not requests_with(fake, "cross_exam_reply")


async def test_a_resume_whose_earlier_runs_already_overspent_stops_before_calling_anyone(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    fake = fake_provider_server
    resume_from = await _round_1(fake)
    run = await run_consultation(fake, resume_from={**resume_from, "spent": {"cost": 100.0}})
    (gate,) = run.of("cost:gate_triggered")
    assert gate["phase"] == "the earlier runs" and gate["actual_cost"] == 100.0
    assert run.result.status == "partial" and (run.result.abort_reason or "").startswith("cost_exceeded")
    assert fake.requests == [] and run.result.cost.actual == 100.0


async def test_the_gate_between_the_round_3_replies_and_the_judge_leaves_round_3_unfinished(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    """Stopped inside round 3, the round is journaled as interrupted (so a resume runs it again), not completed."""
    fake = fake_provider_server
    expensive_reply = Reply(json={"critique": "c", "defense": "d", "revised_position": "r"}, usage=(2_000_000, 400_000, 0))
    fake.script(AGENT_MODELS["architect"], by_schema(cross_exam_reply=expensive_reply))
    for name in ("security", "pragmatist"):
        fake.script(AGENT_MODELS[name], by_schema())
    fake.script(JUDGE_MODEL, by_schema())
    run = await run_consultation(fake)
    (gate,) = run.of("cost:gate_triggered")
    assert gate["phase"] == "round 3 replies" and run.result.status == "partial"
    assert [e["round_number"] for e in run.of("round:completed")] == [1, 2]
    (interrupted,) = run.of("round:interrupted")
    assert interrupted["round_number"] == 3 and interrupted["reason"] == "stopped"
    assert interrupted["detail"].startswith("cost_exceeded") and interrupted["cost"] > 0
    assert not requests_with(fake, "cross_exam")


async def test_an_approved_bound_starts_round_1_before_any_exact_count(fake_provider_server: FakeProviderServer,
                                                                       conclave_env: Any) -> None:
    """Approved on its upper bound (auto-approve here), the consultation sends round 1 first; the exact estimate
    is counted while those calls are in flight and recorded as soon as it is known, never above the bound (the
    gate before round 2 waits for it only when the spend is not clearly under every possible estimate)."""
    fake = fake_provider_server
    script_panel(fake)
    run = await run_consultation(fake)
    kinds = [e.type for e in run.events]
    consent, first_round = kinds.index("consultation:user_consent"), kinds.index("round:started")
    estimated = kinds.index("consultation:cost_estimated")
    assert consent < first_round < estimated < kinds.index("consultation:completed")
    (exact,) = run.of("consultation:cost_estimated")
    assert exact["estimated_cost"] == run.result.cost.estimated and exact["estimated_cost"] > 0
    transitions = {t.to: t.reason for t in run.result.transitions}
    assert transitions["AWAITING_CONSENT"] == "upper bound of the estimate ready"


async def test_a_bound_over_the_threshold_is_decided_on_the_exact_estimate(fake_provider_server: FakeProviderServer,
                                                                          conclave_env: Any) -> None:
    """A bound over cost.always_allow_under is not a refusal by itself: the exact estimate decides, before
    anything is sent."""
    fake = fake_provider_server
    script_panel(fake)
    probe = await run_consultation(fake, "rounds=1")
    exact = probe.result.cost.estimated
    assert exact is not None
    fake.reset()
    script_panel(fake)
    # a threshold between the exact estimate and its bound: approved only because the exact figure is counted
    run = await run_consultation(fake, "rounds=1", f"cost.always_allow_under={exact * 1.001:.6f}", base=NO_AUTO)
    assert run.result.status == "complete"
    kinds = [e.type for e in run.events]
    assert kinds.index("consultation:cost_estimated") < kinds.index("consultation:user_consent")
    assert run.of("consultation:user_consent")[0]["reason"].startswith(f"estimate ${run.result.cost.estimated:.4f}")


async def test_round_2_waits_for_the_exact_count_only_when_the_spend_could_reach_the_limit(
    fake_provider_server: FakeProviderServer, conclave_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the exact estimate is still being counted, a spend within abort_ratio × the output caps alone (a
    lower bound of any estimate) lets round 2 go ahead; a spend past that bound waits for the exact estimate,
    which then stops the consultation before round 2 spends anything."""
    import time

    from conclave.engine import run as runner

    fake = fake_provider_server
    exact = runner.price_calls
    hold: list[Any] = []  # what the exact count waits for

    def slow_exact(pool: Any, planned: Any, count: Any = None) -> Any:
        if count is None:  # the exact count (the upper bound passes a tokenizer-free count)
            deadline = time.monotonic() + 5
            while not hold[0]() and time.monotonic() < deadline:
                time.sleep(0.01)
        return exact(pool, planned, count)

    monkeypatch.setattr(runner, "price_calls", slow_exact)
    hold[:] = [lambda: bool(fake.requests_for(JUDGE_MODEL))]  # counted only once round 2 has asked the judge
    script_panel(fake)
    run = await run_consultation(fake, "rounds=2")
    kinds = [e.type for e in run.events]
    second_round = kinds.index("round:started", kinds.index("round:started") + 1)
    assert second_round < kinds.index("consultation:cost_estimated")  # round 2 did not wait for the count
    assert run.result.status == "complete" and run.result.cost.estimated == run.of(
        "consultation:cost_estimated")[0]["estimated_cost"]

    fake.reset()
    script_panel(fake)
    fake.script(AGENT_MODELS["architect"], Reply(json={"position": "expensive", "key_points": ["k"], "rationale": "r",
                                                       "confidence": 0.5, "prose_excerpt": ""},
                                                 usage=(2_000_000, 400_000, 0)))
    started = time.monotonic()
    hold[:] = [lambda: time.monotonic() > started + 0.3]
    run = await run_consultation(fake, "rounds=2")
    kinds = [e.type for e in run.events]
    assert kinds.index("consultation:cost_estimated") < kinds.index("cost:gate_triggered")
    assert run.result.status == "partial" and not fake.requests_for(JUDGE_MODEL)
