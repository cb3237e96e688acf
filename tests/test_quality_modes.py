"""The adversarial and devils_advocate built-in strategies on the fake server: their own round-3 reply schemas,
their own verification questions, and the devil's advocate's assigned stance."""

from __future__ import annotations

from typing import Any

import pytest
from test_engine_support import AGENT_MODELS, JUDGE_MODEL, requests_with, run_consultation, script_panel, texts

from conclave.artifacts import schema_registry as artifacts
from conclave.testing.fake_server import FakeProviderServer


async def test_adversarial_agents_steelman_and_the_judge_asks_adv1_adv2(fake_provider_server: FakeProviderServer,
                                                                       conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    run = await run_consultation(fake, "mode=adversarial")
    assert run.result.status == "complete"
    replies = run.result.artifacts.round_3_replies
    assert set(replies) == set(AGENT_MODELS)
    for reply in replies.values():
        artifacts.check("cross_exam_reply_adversarial", reply)
    shown = texts(requests_with(fake, "cross_exam_reply_adversarial", AGENT_MODELS["architect"])[0])
    assert "steelman:" in shown and "=== DEBATE STATE ===" in shown
    judge_prompt = texts(requests_with(fake, "synthesis", JUDGE_MODEL)[0])
    assert "- ADV1: Opponent position steel-manned?" in judge_prompt
    assert "- ADV2: Strongest counter-argument provided?" in judge_prompt
    assert run.result.prompt_versions["round_3"].startswith("adversarial/round3_agent@v4")


async def test_the_devils_advocate_holds_an_assigned_stance(fake_provider_server: FakeProviderServer,
                                                           conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    run = await run_consultation(fake, "mode=devils_advocate", "+mode.options.advocate=pragmatist")
    assert run.result.status == "complete"
    for reply in run.result.artifacts.round_3_replies.values():
        artifacts.check("cross_exam_reply_devils_advocate", reply)
    for name, model in AGENT_MODELS.items():
        system = texts(requests_with(fake, "independent", model)[0])
        assert ("=== YOUR ASSIGNED STANCE ===" in system) == (name == "pragmatist")
    judge_prompt = texts(requests_with(fake, "synthesis", JUDGE_MODEL)[0])
    assert "- DA1: Assigned stance maintained throughout?" in judge_prompt
    assert "- DA2: Consensus actively challenged?" in judge_prompt


async def test_by_default_the_first_agent_is_the_devils_advocate(fake_provider_server: FakeProviderServer,
                                                                conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    await run_consultation(fake, "mode=devils_advocate", "rounds=1")
    first = next(iter(AGENT_MODELS))
    assert "=== YOUR ASSIGNED STANCE ===" in texts(requests_with(fake, "independent", AGENT_MODELS[first])[0])


def test_an_advocate_who_is_not_on_the_panel_is_one_line_exit_2(tmp_path: Any) -> None:
    from cli_helpers import run_conclave

    proc = run_conclave("Q?", "mode=devils_advocate", "+mode.options.advocate=nobody", "agents=default",
                        home=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("conclave: mode.options.advocate: 'nobody' is not on the panel; allowed: "
                                   "security, architect, pragmatist")


async def test_the_explore_verdict_ties_its_evidence_to_claim_ids_and_is_checked_for_grounding(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    from test_engine_support import by_schema, independent

    fake = fake_provider_server
    claim = [{"id": "1", "text": "An outbox keeps writes atomic.", "label": "INFER", "citations": []}]
    for model in AGENT_MODELS.values():
        fake.script(model, by_schema(independent=independent("outbox first", claims=claim)))
    menu = _example("verdict_explore.valid.json")
    menu["evidence"] = ["Outbox writes stay atomic", "Quantum ledgers beat blockchains"]
    menu["evidence_claims"] = [{"evidence": "Outbox writes stay atomic", "claim_ids": ["C1"]}]
    fake.script(JUDGE_MODEL, by_schema(verdict_explore=menu))
    run = await run_consultation(fake, "mode=explore")
    assert run.result.status == "complete"
    assert run.result.verdict is not None and run.result.verdict["evidence_claims"][0]["claim_ids"] == ["C1"]
    quality = run.result.quality
    assert quality is not None
    grounding = {s["where"]: s for s in quality["grounding"]["4"]}
    assert grounding["evidence[0]"]["grounded"] and grounding["evidence[0]"]["claim_ids"] == ["C1"]
    assert not grounding["evidence[1]"]["grounded"]
    assert "evidence_claims:" in texts(requests_with(fake, "verdict_explore", JUDGE_MODEL)[0])


def _example(name: str) -> dict[str, Any]:
    """A fixture artifact's body (the engine sets the header fields)."""
    import json
    from pathlib import Path

    data = json.loads((Path(__file__).parent / "fixtures" / "artifacts" / name).read_text())
    return {k: v for k, v in data.items() if k not in ("artifact_type", "schema_version", "round_number", "created_at")}


BUILT_IN = ("converge", "explore", "adversarial", "devils_advocate", "answer")


@pytest.mark.parametrize("mode", BUILT_IN)
def test_every_built_in_mode_is_in_the_quality_layer(mode: str) -> None:
    """Agents' artifacts require claims and references, agents get the labelling rules, round 3 sees the DEBATE
    STATE, the synthesis accounts for claims, the verdict ties evidence to them, two questions of its own."""
    from conclave.engine.rounds import VERDICT_ROUND
    from conclave.plugin_manager import get_plugins
    from conclave.quality.verification import UNIVERSAL

    strategy = get_plugins().strategies.get(mode)(None)
    for step in strategy.plan:
        required = artifacts.get_schema(step.schema).get("required", [])
        if step.seat == "agents":
            assert {"claims", "references"} <= set(required), step.schema
        elif "consensus_points" in required:
            assert {"partial_coverage", "unique_insights", "blind_spots"} <= set(required), step.schema
        elif step.name == VERDICT_ROUND:
            assert "evidence_claims" in required, step.schema
    system = strategy.template("agent_system").text
    assert all(word in system for word in ("FACT", "INFER", "ASSUME", "[1][2]")), mode
    assert "claims" in strategy.template("round1").text
    assert "$debate_state" in strategy.template("round3_agent").text
    assert "$verification_questions" in strategy.template("round2").text
    assert len(strategy.verification_questions) == 2
    assert set(strategy.not_applicable_questions) <= {q.id for q in UNIVERSAL}
