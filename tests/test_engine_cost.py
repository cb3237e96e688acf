"""The cost gate before round 1 (estimate from the real prompts, consent, Always) and the abort in flight."""

from __future__ import annotations

from typing import Any

import yaml
from test_engine_support import AGENT_MODELS, JUDGE_MODEL, QUESTION, answering, run_consultation, script_panel

from conclave.api import compose_settings
from conclave.engine.budgets import MAX_OUTPUT_TOKENS
from conclave.engine.interaction import Interaction
from conclave.testing.fake_server import FakeProviderServer, Reply
from conclave.tokens import count_tokens

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
    long = await run_consultation(fake_provider_server, "rounds=1", f"context=[{context}]",
                                  base=(*NO_AUTO[:1], "cost.auto_approve=true"))
    (small,), (big,) = short.of("consultation:cost_estimated"), long.of("consultation:cost_estimated")
    added = count_tokens(context.read_text())
    # the context goes into each of the three round-1 system prompts
    assert 3 * added <= big["input_tokens"] - small["input_tokens"] <= 3 * added + 300
    assert small["output_tokens"] == 3 * MAX_OUTPUT_TOKENS["independent"]
    full = await run_consultation(fake_provider_server, base=(*NO_AUTO[:1], "cost.auto_approve=true"))
    (estimate,) = full.of("consultation:cost_estimated")
    assert estimate["output_tokens"] == sum(MAX_OUTPUT_TOKENS[k] for k in ("synthesis", "cross_exam", "verdict")) \
        + 3 * (MAX_OUTPUT_TOKENS["independent"] + MAX_OUTPUT_TOKENS["cross_exam_reply"])
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
