"""The result holds every step of the debate in play order (``rounds``), repeats included; ``artifacts.round_1…
round_4`` stay as the latest of each standard round; a result written before ``rounds`` still loads, its rounds read
from its artifacts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from test_engine_support import BASE_OVERRIDES, QUESTION, run_consultation, script_panel

from conclave.api import compose_settings
from conclave.engine.result import ConsultationResult
from conclave.engine.rounds import CROSS_EXAM, CROSS_EXAM_REPLIES
from conclave.engine.run import Consultation
from conclave.testing.fake_server import FakeProviderServer

FIXTURES = Path(__file__).parent / "fixtures" / "results"


async def test_rounds_list_every_step_in_play_order_and_artifacts_stay_the_latest(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    fake = fake_provider_server
    script_panel(fake)
    result = (await run_consultation(fake)).result
    assert result.status == "complete", result.abort_reason
    data = result.as_dict()
    assert [(r["number"], r["round_type"]) for r in data["rounds"]] == [
        (1, "independent"), (2, "synthesis"), (3, "cross_exam_replies"), (3, "cross_exam"), (4, "verdict")]
    first, second, replies, cross, verdict = data["rounds"]
    artifacts = data["artifacts"]
    assert first["agents"] == artifacts["round_1"] and first["judge"] is None
    assert list(first["agents"]) == list(artifacts["round_1"])  # the panel's order, as before
    assert second["judge"] == artifacts["round_2"] and not second["agents"]
    assert replies["agents"] == artifacts["round_3_replies"] and cross["judge"] == artifacts["round_3"]
    assert verdict["judge"] == artifacts["round_4"] == data["verdict"]


async def test_a_repeated_cross_examination_is_two_entries(fake_provider_server: FakeProviderServer,
                                                           conclave_env: Any) -> None:
    fake = fake_provider_server
    script_panel(fake)
    settings = compose_settings(QUESTION, [*fake.overrides(), *BASE_OVERRIDES, "mode=explore"])
    consultation = Consultation(settings)

    def repeat_once(session: Any, steps: list[Any], restored: set[int]) -> None:
        if steps[-1].type.name == "cross_exam" and steps[0].number == 3:
            session.plan.insert_next([CROSS_EXAM_REPLIES.with_schema("cross_exam_reply_explore"), CROSS_EXAM],
                                     "once more")

    consultation.controllers.append(repeat_once)
    result = await consultation.run()
    assert result.status == "complete", result.abort_reason
    assert [(r.number, r.round_type) for r in result.rounds] == [
        (1, "independent"), (2, "synthesis"), (3, "cross_exam_replies"), (3, "cross_exam"),
        (4, "cross_exam_replies"), (4, "cross_exam"), (5, "verdict")]
    assert result.rounds[3].judge is not None and result.rounds[5].judge == result.artifacts.round_3  # the latest


def test_a_result_from_before_rounds_loads_with_rounds_read_from_its_artifacts() -> None:
    old = json.loads((FIXTURES / "converge_complete.json").read_text())
    assert "rounds" not in old
    result = ConsultationResult.model_validate(old)
    assert [(r.number, r.round_type) for r in result.rounds] == [
        (1, "independent"), (2, "synthesis"), (3, "cross_exam_replies"), (3, "cross_exam"), (4, "verdict")]
    assert result.rounds[0].agents == old["artifacts"]["round_1"]
    assert result.rounds[4].judge == old["artifacts"]["round_4"]
    assert result.as_dict()["artifacts"] == old["artifacts"]
