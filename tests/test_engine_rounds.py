"""Rounds as data: round types, plans (numbering, cuts, changes while playing), the state machine that follows a
plan, a controller extending a running consultation, and ``conclave show-prompt``."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cli_helpers import run_conclave
from test_engine_support import (
    AGENT_MODELS,
    BASE_OVERRIDES,
    JUDGE_MODEL,
    QUESTION,
    requests_with,
    run_consultation,
    script_panel,
    texts,
)

from conclave.engine.rounds import (
    CROSS_EXAM,
    CROSS_EXAM_REPLIES,
    INDEPENDENT,
    STANDARD_PLAN,
    SYNTHESIS,
    VERDICT,
    Plan,
    catalogue_of,
)
from conclave.engine.state import ConsultState, InvalidTransitionError, StateMachine
from conclave.testing.fake_server import FakeProviderServer

S = ConsultState


def test_the_standard_plan_numbers_four_rounds_with_cross_examination_as_one() -> None:
    plan = Plan(STANDARD_PLAN)
    assert [(s.number, s.type.name) for s in plan.steps()] == [
        (1, "independent"), (2, "synthesis"), (3, "cross_exam_replies"), (3, "cross_exam"), (4, "verdict")]
    assert plan.numbers() == [1, 2, 3, 4]
    assert plan.states() == ["INDEPENDENT", "SYNTHESIS", "CROSS_EXAM", "VERDICT"]


@pytest.mark.parametrize(("stage", "names"), [
    (1, ["independent"]), (2, ["independent", "synthesis"]),
    (3, ["independent", "synthesis", "cross_exam_replies", "cross_exam"]), (4, [t.name for t in STANDARD_PLAN])])
def test_rounds_n_cuts_the_plan_to_stages_up_to_n(stage: int, names: list[str]) -> None:
    plan = Plan(STANDARD_PLAN)
    plan.cut_to_stage(stage)
    assert [t.name for t in plan] == names


def test_a_controller_inserts_rounds_after_the_current_one_and_later_rounds_are_renumbered() -> None:
    changes: list[Any] = []
    plan = Plan(STANDARD_PLAN, on_change=changes.append)
    assert [s.type.name for s in plan.next_round() or []] == ["independent"]
    assert [s.type.name for s in plan.next_round() or []] == ["synthesis"]
    plan.insert_next([CROSS_EXAM_REPLIES, CROSS_EXAM], "repeat cross-examination")
    rounds = [(g[0].number, [s.type.name for s in g]) for g in plan.rounds()]
    assert rounds == [(1, ["independent"]), (2, ["synthesis"]), (3, ["cross_exam_replies", "cross_exam"]),
                      (4, ["cross_exam_replies", "cross_exam"]), (5, ["verdict"])]
    assert changes[0].action == "insert" and changes[0].after == 2 and changes[0].reason == "repeat cross-examination"
    with pytest.raises(ValueError, match="cannot start an inserted round"):
        plan.insert_next([CROSS_EXAM], "a judgement alone is not a round")


def test_ending_the_plan_drops_what_is_still_to_come() -> None:
    plan = Plan(STANDARD_PLAN)
    plan.next_round()
    plan.next_round()
    plan.end_here("early termination accepted")
    assert plan.finished and plan.next_round() is None
    assert plan.changes[-1].round_types == ["cross_exam_replies", "cross_exam", "verdict"]


def test_inputs_size_the_estimate_from_their_producers_budgets() -> None:
    catalogue = catalogue_of(STANDARD_PLAN)
    # the verdict carries every round-1 answer, the synthesis and the cross-examination, each at its cap
    assert VERDICT.carried_tokens(catalogue, agents=3) == 3 * INDEPENDENT.max_tokens + SYNTHESIS.max_tokens \
        + CROSS_EXAM.max_tokens
    assert CROSS_EXAM_REPLIES.carried_tokens(catalogue, agents=3) == INDEPENDENT.max_tokens + SYNTHESIS.max_tokens
    with pytest.raises(KeyError, match="'objection' is an input of the plan but is not in it"):
        catalogue("objection")


def test_the_state_machine_follows_a_plan_with_a_round_of_its_own() -> None:
    plan = Plan((INDEPENDENT, SYNTHESIS, replace(CROSS_EXAM_REPLIES, name="objection", state="OBJECTION"), VERDICT))
    machine = StateMachine(round_states=plan.states())
    for state in ["ESTIMATING", "AWAITING_CONSENT", "INDEPENDENT", "SYNTHESIS", "OBJECTION", "VERDICT", "COMPLETE"]:
        machine.transition(state, "")
    assert machine.state is S.COMPLETE
    other = StateMachine(round_states=plan.states())
    for state in ["ESTIMATING", "AWAITING_CONSENT", "INDEPENDENT", "SYNTHESIS"]:
        other.transition(state, "")
    with pytest.raises(InvalidTransitionError, match="to CROSS_EXAM"):
        other.transition(S.CROSS_EXAM, "not in this plan")
    other.follow(["CROSS_EXAM", "VERDICT"])  # a controller inserted a cross-examination
    other.transition(S.CROSS_EXAM, "inserted")
    assert other.state is S.CROSS_EXAM


async def test_a_controller_repeats_cross_examination_in_a_running_consultation(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    """The documented call: a controller inserts a second cross-examination; it is played, journaled as
    ``plan:changed``, numbered 4, and the verdict moves to round 5."""
    from conclave.api import compose_settings
    from conclave.engine.run import Consultation

    fake = fake_provider_server
    script_panel(fake)
    settings = compose_settings(QUESTION, [*fake.overrides(), *BASE_OVERRIDES, "mode=explore"])
    events: list[Any] = []
    consultation = Consultation(settings, subscribers=[events.append])

    def repeat_once(session: Any, steps: list[Any], restored: set[int]) -> None:
        if steps[-1].type.name == "cross_exam" and steps[0].number == 3:
            session.plan.insert_next([CROSS_EXAM_REPLIES.with_schema("cross_exam_reply_explore"), CROSS_EXAM],
                                     "the panel is still split")

    consultation.controllers.append(repeat_once)
    result = await consultation.run()
    assert result.status == "complete" and result.completed_rounds == 5, result.abort_reason
    started = [(e.data["round_number"], e.data["round_type"]) for e in events if e.type == "round:started"]
    assert started == [(1, "independent"), (2, "synthesis"), (3, "cross_exam"), (4, "cross_exam"), (5, "verdict")]
    (change,) = [e.data for e in events if e.type == "plan:changed"]
    assert change["action"] == "insert" and change["reason"] == "the panel is still split"
    assert change["plan"][-1] == "verdict" and change["plan"].count("cross_exam") == 2
    assert len(requests_with(fake, "cross_exam_reply_explore", AGENT_MODELS["architect"])) == 2
    assert len(requests_with(fake, "cross_exam", JUDGE_MODEL)) == 2
    assert [t.to for t in result.transitions][-4:] == ["CROSS_EXAM", "CROSS_EXAM", "VERDICT", "COMPLETE"]


def _show(*args: str, home: Path) -> Any:
    return run_conclave("show-prompt", *args, home=home)


def test_show_prompt_prints_exactly_what_round_1_sends(tmp_path: Path) -> None:
    proc = _show("independent", "Should we shard the users table?", "mode=converge", "agents=default", "--agent", "architect",
                 "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (call,) = json.loads(proc.stdout)
    assert call["round_type"] == "independent" and call["who"] == "architect" and call["schema"] == "independent"
    assert call["template"] == "conclave_plugins/prompts/converge/round1.md"
    assert "Should we shard the users table?" in call["user"]
    from conclave.engine.extraction import json_instruction

    assert call["user"].endswith("\n\n" + json_instruction("independent", True))  # as the call appends it
    assert call["system"].startswith("You are Systems Architect, one member of an expert panel")


def test_show_prompt_describes_inputs_it_does_not_have_and_a_round_number_shows_every_step(tmp_path: Path) -> None:
    proc = _show("3", "Should we shard the users table?", "agents=default", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.count("# cross_exam_replies · round 3") == 3 and out.count("# cross_exam · round 3 · judge") == 1
    assert "<synthesis: the judge's synthesis artifact, filtered with filtering.round3>" in out
    assert "<own_position: this agent's own independent answer, in full>" in out


def test_show_prompt_names_the_rounds_it_knows(tmp_path: Path) -> None:
    proc = _show("rebuttal", "Q?", home=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "no round 'rebuttal' in the converge plan; one of: independent (1), synthesis (2)" in proc.stderr


async def test_show_prompt_from_a_journal_shows_the_exact_verdict_messages(
    fake_provider_server: FakeProviderServer, conclave_env: Any
) -> None:
    """With ``--from``, a past consultation's inputs fill the template: what its verdict round was sent."""
    from conclave.cli.commands.show_prompt import render
    from conclave.store.recorder import Recorder

    fake = fake_provider_server
    script_panel(fake)
    recorder = Recorder(conclave_env, index=False)
    run = await run_consultation(fake, "rounds=3", recorder=recorder)
    recorder.close()
    assert run.consultation is not None
    (call,) = render("verdict", [], source=run.consultation.id)
    user = call["user"]
    assert f"position of architect via {AGENT_MODELS['architect']}" in user  # round 1, from the journal
    assert not [p for p in ("<independents:", "<synthesis:", "<cross_exam:") if p in user]  # every input filled
    assert not any(f'"{name}"' in user for name in AGENT_MODELS)  # labels only, never names
    (cross_exam,) = requests_with(fake, "cross_exam", JUDGE_MODEL)
    assert call["system"] in texts(cross_exam)  # the judge's system prompt, as the journaled run sent it
