"""The library API: ``conclave.consult`` / ``consult_async`` compose the config like the CLI, run without a
terminal, and return the typed result whose ``as_dict()`` is the result JSON."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import conclave
from conclave.engine.result import ConsultationResult
from conclave.errors import ConfigError
from conclave.testing.fake_server import FakeProviderServer

RESULT_KEYS = {
    "consultation_id", "schema_version", "question", "mode", "strategy", "status", "created_at", "completed_at",
    "duration_s", "planned_rounds", "completed_rounds", "agents", "judge", "rounds", "artifacts", "verdict",
    "recommendation",
    "confidence", "dissent", "concerns", "early_termination", "cost", "tokens", "token_efficiency_stats",
    "substitutions", "scrub_report", "context_sources", "prompt_versions", "judge_labels", "shuffle_seed",
    "absent_agents", "abort_reason", "config_hash", "transitions", "quality", "safety", "exit", "context", "escalated",
    "peer_labels", "anti_conformity", "vote_gate", "final_aggregate", "parent",
}


async def test_consult_async_returns_the_typed_result(fake_provider_server: FakeProviderServer,
                                                      conclave_env: Any) -> None:
    question = "Is ${oc.env:HOME} interpolated?"
    seen: list[Any] = []
    result = await conclave.consult_async(question, [*fake_provider_server.overrides(), "cost.auto_approve=true"],
                                          subscribers=[seen.append])
    assert isinstance(result, ConsultationResult) and result.ok and result.question == question
    data = result.as_dict()
    assert set(data) == RESULT_KEYS
    assert set(data["artifacts"]) == {"round_1", "round_2", "round_3_replies", "round_3", "round_4"}
    assert set(data["judge"]) == {"provider", "model", "actual_provider", "actual_model", "fallback_used"}
    assert set(data["cost"]) == {"estimated", "actual", "unknown_prices", "by_provider"}
    assert set(data["tokens"]) == {"input", "output", "cached_input", "total"}
    assert set(data["transitions"][0]) == {"from", "to", "reason", "at"}
    assert {"name", "persona", "provider", "model", "label", "actual_provider", "actual_model", "substituted",
            "absent", "error"} <= set(data["agents"][0])
    assert data["consultation_id"].startswith("c-") and len(data["consultation_id"]) == 14
    assert data["schema_version"] == "1.0" and len(data["config_hash"]) == 64
    assert seen and seen[-1].type == "consultation:completed"


async def test_consult_blocks_outside_an_event_loop(fake_provider_server: FakeProviderServer,
                                                    conclave_env: Any) -> None:
    overrides = [*fake_provider_server.overrides(), "cost.auto_approve=true", "rounds=1"]
    result = await asyncio.to_thread(conclave.consult, "Quick check?", overrides)
    assert result.status == "complete" and result.completed_rounds == 1
    with pytest.raises(RuntimeError, match="consult_async"):
        conclave.consult("inside a loop", overrides)


async def test_the_library_never_asks_and_refuses_an_unapproved_cost(fake_provider_server: FakeProviderServer,
                                                                     conclave_env: Any) -> None:
    result = await conclave.consult_async("Costly?", [*fake_provider_server.overrides(),
                                                      "cost.always_allow_under=0"])
    assert result.status == "aborted" and result.abort_reason is not None
    assert "cost.auto_approve=true" in result.abort_reason and fake_provider_server.requests == []


def test_an_invalid_configuration_raises_a_config_error(conclave_env: Any) -> None:
    with pytest.raises(ConfigError, match="rounds"):
        asyncio.run(conclave.consult_async("q", ["rounds=7"]))


def test_ids_sort_by_creation_time() -> None:
    import time

    from conclave.engine.ids import new_consultation_id

    first = new_consultation_id()
    time.sleep(0.002)
    assert new_consultation_id() > first
