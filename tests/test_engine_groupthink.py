"""Groupthink in a running consultation on the fake provider server: a panel scripted to agree blindly triggers a
critical objection round before the synthesis; what it produces decides escalation; shadow only records."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from test_engine_support import (
    AGENT_MODELS,
    JUDGE_MODEL,
    answering,
    by_schema,
    requests_with,
    run_consultation,
    schema_of,
    texts,
)

from conclave.engine.interaction import Interaction
from conclave.quality.objection import CONTINUE_PROMPT
from conclave.render.markdown import render_markdown
from conclave.store.paths import StoreLayout
from conclave.store.recorder import Recorder
from conclave.testing.fake_server import FakeProviderServer

# Three agents who say the same thing in nearly the same words, all very sure, citing nothing.
BLIND = {
    "security": ("Move billing to event sourcing next quarter",
                 "Event sourcing gives a full audit trail of billing changes"),
    "architect": ("Yes, adopt event sourcing for billing next quarter",
                  "An audit trail of every billing change comes with event sourcing"),
    "pragmatist": ("Billing should move to event sourcing next quarter",
                   "Event sourcing records every billing change for audit"),
}


def blind_answer(name: str) -> dict[str, Any]:
    position, point = BLIND[name]
    return {"position": position, "key_points": [point], "rationale": point, "confidence": 0.95,
            "prose_excerpt": "", "claims": [{"id": "1", "text": point, "label": "INFER", "citations": []}]}


def productive_objection(name: str) -> dict[str, Any]:
    return {
        "counterargument": {"text": f"Upcasting years of stored events makes every schema change costly ({name})",
                            "opposes": ["C1"]},
        "alternative_hypothesis": {"text": "An append-only audit table on the current ledger may satisfy auditors"},
        "challenged_assumption": {"assumption": "The team can operate projections",
                                  "challenge": "Nobody on the team has rebuilt a projection under load",
                                  "opposes": []},
        "revised_position": "Adopt event sourcing for invoices only, after a rebuild drill", "confidence": 0.7,
    }


def rubber_stamp_objection(name: str) -> dict[str, Any]:
    position, point = BLIND[name]
    return {"counterargument": {"text": point, "opposes": []},
            "alternative_hypothesis": {"text": position},
            "challenged_assumption": {"assumption": point, "challenge": point, "opposes": []},
            "revised_position": position, "confidence": 0.95}


def script(fake: FakeProviderServer, objection: Any) -> None:
    for name, model in AGENT_MODELS.items():
        fake.script(model, by_schema(independent=blind_answer(name), objection=objection(name)))
    fake.script(JUDGE_MODEL, by_schema())


def groupthink(run: Any) -> dict[str, Any]:
    return run.result.quality["groupthink"]  # type: ignore[no-any-return]


async def test_a_blindly_agreeing_panel_must_object_before_the_synthesis(fake_provider_server: FakeProviderServer,
                                                                       conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake, productive_objection)
    run = await run_consultation(fake, "rounds=3")
    order = [schema_of(r) for r in fake.requests]
    objections = requests_with(fake, "objection")
    assert len(objections) == 3 and order.index("synthesis") > max(i for i, s in enumerate(order) if s == "objection")
    prompt = texts(objections[0])
    assert "Groupthink detected: early-convergence after round 1" in prompt
    for duty in ("at least ONE counterargument", "ONE alternative hypothesis", "Challenge ONE assumption"):
        assert duty in prompt
    synthesis = texts(requests_with(fake, "synthesis")[0])
    assert "=== CRITICAL OBJECTION ROUND (round 2) ===" in synthesis and "Upcasting years of stored events" in synthesis
    (change,) = run.of("plan:changed")
    assert change["round_types"] == ["objection"] and change["plan"][:3] == ["independent", "objection", "synthesis"]
    (check,) = [c for c in run.of("groupthink:check") if c["fired"]]
    assert check["detector"] == "early_convergence" and check["acted"] and check["action"] == "objection_round"
    (outcome,) = run.of("groupthink:objection")
    assert outcome["produced_new"] and not outcome["escalated"] and len(outcome["new_claims"]) >= 3
    assert {"claim_id": "C1", "from": "open", "to": "contested"} in outcome["status_changes"]
    figures = groupthink(run)["figures"]
    assert figures["firings"] == {"stagnation": 0, "early_convergence": 1}
    assert figures["objection_rounds"] == figures["objection_rounds_changed_status"] == 1
    assert not run.result.escalated and run.result.status == "complete"


async def test_an_objection_round_that_brings_nothing_new_escalates_with_a_banner(
        fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path) -> None:
    fake = fake_provider_server
    script(fake, rubber_stamp_objection)
    recorder = Recorder(tmp_path)
    run = await run_consultation(fake, "rounds=3", recorder=recorder)
    recorder.close()
    (outcome,) = run.of("groupthink:objection")
    assert outcome["new_claims"] == [] and outcome["status_changes"] == [] and outcome["escalated"]
    assert outcome["continued"] is None  # no terminal: nobody was asked, the debate went on
    assert run.result.escalated and run.result.verdict is not None
    report = render_markdown(run.result.as_dict())
    assert report.index("Escalated.") < report.index("Question:")
    assert "A human should look at this result" in report
    cid = run.result.consultation_id
    with sqlite3.connect(StoreLayout(tmp_path).index_path) as db:
        row = db.execute("select quality_stage, groupthink_firings, objection_rounds, escalated from consultations "
                         "where id = ?", (cid,)).fetchone()
        objection = db.execute("select new_claims, status_changes, escalated from objection_rounds "
                               "where consultation_id = ?", (cid,)).fetchall()
    assert row == ("on", 1, 1, 1) and objection == [(0, 0, 1)]
    import sqlite_utils

    from conclave.store.period_stats import Period, compute_stats, render_text

    stats = compute_stats(sqlite_utils.Database(StoreLayout(tmp_path).index_path), Period("all time"))
    assert stats["groupthink"] == {"firings": {"early_convergence": 1, "stagnation": 0}, "acted": 1,
                                   "objection_rounds": 1, "objection_rounds_changed_status": 0,
                                   "objection_rounds_new_claims": 0, "escalations": 1, "shadow_consultations": 0}
    assert "groupthink         fired 1 early convergence" in render_text(stats)


async def test_on_a_terminal_the_user_may_stop_after_a_fruitless_objection_round(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake, rubber_stamp_objection)
    asked: list[str] = []
    run = await run_consultation(fake, interaction=Interaction(True, ask=answering(asked, "n")))
    assert asked == [CONTINUE_PROMPT]
    assert not requests_with(fake, "cross_exam_reply")  # stopped: only the synthesis still ran
    assert len(requests_with(fake, "synthesis")) == 1 and run.result.verdict is not None
    assert groupthink(run)["escalation"]["continued"] is False
    assert "the user chose to stop it there" in render_markdown(run.result.as_dict())


async def test_shadow_stage_records_what_it_would_do_and_changes_nothing(fake_provider_server: FakeProviderServer,
                                                                          conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake, productive_objection)
    run = await run_consultation(fake, "rounds=2", "quality.stage=shadow")
    assert not requests_with(fake, "objection") and not run.of("plan:changed")
    (check,) = run.of("groupthink:check")
    assert check["fired"] and check["stage"] == "shadow" and check["action"] == "objection_round"
    assert not check["acted"] and check["not_acted_because"] == "shadow"
    assert run.result.completed_rounds == 2 and not run.result.escalated


async def test_a_short_run_records_the_firing_and_adds_no_round(fake_provider_server: FakeProviderServer,
                                                                conclave_env: Any) -> None:
    fake = fake_provider_server
    script(fake, productive_objection)
    run = await run_consultation(fake, "quick=true")  # rounds=N and quick keep their meaning
    (check,) = run.of("groupthink:check")
    assert check["fired"] and not check["acted"] and check["not_acted_because"] == "rounds"
    assert not requests_with(fake, "objection") and run.result.completed_rounds == 2
    assert "no objection round: a short run (rounds 1-2 or quick)" in render_markdown(run.result.as_dict())


async def test_a_panel_that_disagrees_runs_no_objection_round(fake_provider_server: FakeProviderServer,
                                                             conclave_env: Any) -> None:
    fake = fake_provider_server
    for model in AGENT_MODELS.values():  # schema-generated answers: confidence 0.5
        fake.script(model, by_schema())
    fake.script(JUDGE_MODEL, by_schema())
    run = await run_consultation(fake, "rounds=2")
    (check,) = run.of("groupthink:check")
    assert not check["fired"] and check["why"].startswith("only 0 of 3 agents")
    assert not requests_with(fake, "objection") and run.result.completed_rounds == 2


async def test_a_resumed_run_restores_the_objection_round_instead_of_paying_again(
        fake_provider_server: FakeProviderServer, conclave_env: Any, tmp_path: Path) -> None:
    from conclave.store.resume_points import load_resume_point

    fake = fake_provider_server
    script(fake, productive_objection)
    recorder = Recorder(tmp_path, index=False)
    first = await run_consultation(fake, "rounds=3", recorder=recorder)  # 1 independent, 2 objection, 3, 4
    recorder.close()
    assert first.result.completed_rounds == 4
    fake.reset()
    script(fake, productive_objection)
    point = load_resume_point(StoreLayout(tmp_path), first.result.consultation_id, resumable=False)
    again = await run_consultation(fake, resume_from=point.resume_from)
    assert [schema_of(r) for r in fake.requests] == ["verdict"]  # only the round the first run did not play
    # the recorded plan is restored (objection round in place); no new objection round is inserted
    assert again.result.completed_rounds == 5
    assert [c["action"] for c in again.of("plan:changed")] == ["restore"]
    assert groupthink(again)["objection_rounds"] == groupthink(first)["objection_rounds"]
    assert [c["acted"] for c in groupthink(again)["checks"] if c["fired"]] == [True]


async def test_a_debate_that_stops_moving_stagnates_and_must_object_before_the_verdict(
        fake_provider_server: FakeProviderServer, conclave_env: Any) -> None:
    """Cross-examination repeated (as an exit controller would) with replies that add nothing: stagnation fires
    after the second low-activity round and the objection round runs before the verdict."""
    from test_engine_support import BASE_OVERRIDES, QUESTION

    from conclave.api import compose_settings
    from conclave.engine.rounds import CROSS_EXAM, CROSS_EXAM_REPLIES
    from conclave.engine.run import Consultation

    fake = fake_provider_server
    for name, model in AGENT_MODELS.items():
        position = BLIND[name][0]
        fake.script(model, by_schema(
            independent={**blind_answer(name), "confidence": 0.6, "claims": []},  # too unsure for early convergence
            cross_exam_reply={"critique": "", "challenges": [], "defense": "", "revised_position": position,
                              "vote": "MINOR", "confidence": 0.6},
            objection=productive_objection(name)))
    fake.script(JUDGE_MODEL, by_schema())
    settings = compose_settings(QUESTION, [*fake.overrides(), *BASE_OVERRIDES])
    events: list[Any] = []
    consultation = Consultation(settings, subscribers=[events.append])

    def repeat_once(session: Any, steps: list[Any], restored: set[int]) -> None:
        if steps[-1].type.name == "cross_exam" and steps[0].number == 3:
            session.plan.insert_next([CROSS_EXAM_REPLIES, CROSS_EXAM], "repeat cross-examination")

    consultation.controllers.append(repeat_once)
    result = await consultation.run()
    started = [(e.data["round_number"], e.data["round_type"]) for e in events if e.type == "round:started"]
    assert started == [(1, "independent"), (2, "synthesis"), (3, "cross_exam"), (4, "cross_exam"),
                       (5, "objection"), (6, "verdict")]
    checks = [e.data for e in events if e.type == "groupthink:check" and e.data["detector"] == "stagnation"]
    assert [(c["round_number"], c["fired"]) for c in checks] == [(3, False), (4, True)]
    assert checks[1]["figures"]["new_facts_per_agent"] == 0 and checks[1]["figures"]["stance_std"] == 0
    verdict = texts(requests_with(fake, "verdict")[0])
    assert "=== CRITICAL OBJECTION ROUND (round 5) ===" in verdict and "stagnation after round 4" in verdict
    assert result.status == "complete" and not result.escalated


def test_show_prompt_shows_the_objection_round_where_a_firing_after_round_1_puts_it(conclave_env: Path) -> None:
    from conclave.cli.commands.show_prompt import render

    calls = render("objection", ["Should we shard the users table?", "agents=default"], agent="architect")
    (call,) = calls
    assert call["round_type"] == "objection" and call["round_number"] == 2 and call["schema"] == "objection"
    assert "=== CRITICAL OBJECTION ROUND ===" in call["user"] and "Should we shard the users table?" in call["user"]
    assert "<what the detector found" in call["user"] and "Challenge ONE assumption" in call["user"]
