"""Anti-conformity: an answer changed in cross-examination counts for the aggregate only when the reply cites an
accepted claim or evidence id, or one it introduced; otherwise the earlier answer stands, and the switch is shown."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cli_helpers import clean_env, run_conclave
from eval_helpers import evaluate

import conclave
from conclave.engine.conformity import effective_answers
from conclave.eval import run_store as store
from conclave.events import CONSULTATION_COMPLETED
from conclave.quality.debate_state import DebateState
from conclave.render.markdown import render_markdown
from conclave.testing.answer_panel import AnswerPanel, arithmetic_truth
from conclave.testing.fake_server import FakeProviderServer
from conclave.testing.pytest_plugin import FAKE_KEYS

PANEL = ["agents.security.provider=openai", "agents.security.model=gpt-4o",
         "agents.architect.provider=openai", "agents.architect.model=gpt-4o",
         "agents.pragmatist.provider=openai", "agents.pragmatist.model=gpt-4o", "judge.model=gpt-4.1",
         "cost.auto_approve=true", "mode=answer", "rounds=4"]
QUESTION = "What is the result of 3+4*5+6-7*8? Give the final answer as a single integer."


async def _conformist_run(fake: FakeProviderServer, *overrides: str) -> tuple[Any, dict[str, Any]]:
    # the security expert alone is right; in round 3 everyone adopts the synthesis' (majority) answer, citing nothing
    AnswerPanel({"Security Expert": 1.0, "Systems Architect": 0.0, "Pragmatic Engineer": 0.0},
                conformity=True).install(fake)
    events: list[Any] = []
    result = await conclave.consult_async(QUESTION, [*fake.overrides(), *PANEL, *overrides],
                                          subscribers=[events.append])
    (completed,) = [e.data for e in events if e.type == CONSULTATION_COMPLETED]
    return result, completed["result"]


async def test_a_right_minority_that_flips_without_support_keeps_its_round_1_answer(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    truth = arithmetic_truth(QUESTION)
    result, journaled = await _conformist_run(fake_provider_server)
    assert result.status == "complete"
    assert result.artifacts.round_1["security"]["final_answer"] == truth
    assert result.artifacts.round_3_replies["security"]["final_answer"] != truth  # the flip is shown as given
    record = result.anti_conformity
    assert record is not None and record["enabled"] is True  # on by default in answer mode
    assert record["effective_answers"]["security"] == truth  # ... but its round-1 answer counts
    assert record["last_answers"]["security"] != truth
    (switch,) = record["switches"]
    # in cross-examination (round 3, or 4 after an objection round the confident panel triggers)
    assert (switch["agent"], switch["before"], switch["supported"]) == ("security", truth, False)
    assert switch["round_number"] >= 3 and switch["after"] == record["last_answers"]["security"]
    assert record["unsupported_switches"] == 1
    assert journaled["anti_conformity"] == record  # the journal's result carries it
    report = render_markdown(result.as_dict())
    assert "Answer changes in cross-examination" in report and "unsupported switch" in report
    assert f"no: {truth} stands" in report


async def test_switched_off_every_changed_answer_counts_and_is_still_reported(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    truth = arithmetic_truth(QUESTION)
    result, _ = await _conformist_run(fake_provider_server, "anti_conformity=false")
    record = result.anti_conformity
    assert record is not None and record["enabled"] is False
    assert record["effective_answers"]["security"] != truth
    assert record["unsupported_switches"] == 1
    assert "anti-conformity off" in render_markdown(result.as_dict())


def _state() -> DebateState:
    state = DebateState("q", ["a", "b", "c"])
    state.absorb(1, "b", {"claims": [{"id": "1", "text": "4*5 is 20", "label": "FACT", "citations": [1]}],
                          "references": [{"id": 1, "title": "Order of operations", "url": "https://e.x/ops"}]})
    state.absorb(1, "c", {"claims": [{"id": "1", "text": "3+20 is 23", "label": "INFER", "citations": []}],
                          "references": []})
    state.absorb(1, "a", {"claims": [{"id": "1", "text": "agrees", "label": "INFER", "supports": ["C1"]}],
                          "references": []})
    return state


def test_support_is_an_accepted_id_or_new_sourced_support_of_the_reply() -> None:
    state = _state()
    assert state.claims["C1"].status == "accepted" and state.claims["C2"].status == "open"
    first = {"a": "1", "b": "2", "c": "2"}
    replies = {"a": {"final_answer": "2", "defense": "C1 settles it"},  # cites a claim b made and a backs
               "b": {"final_answer": "1", "defense": "C2 says so"},  # cites an open claim only
               "c": {"final_answer": "1", "defense": "E1 backs C1"}}  # evidence backing an accepted claim
    effective, switches = effective_answers(first, [(3, replies)], state)
    assert {s.agent: s.supported for s in switches} == {"a": False, "b": False, "c": True}
    # a's own backing made C1 accepted: that is no support for a's own switch
    assert effective == {"a": "1", "b": "2", "c": "1"}
    assert [s.accepted_ids for s in switches if s.agent == "c"] == [("C1", "E1")]
    # once another agent restates C1 too, it is shared ground that supports a's switch
    state.absorb(3, "c", {"claims": [{"id": "C1", "text": "4*5 is 20", "label": "FACT"}], "references": []})
    assert effective_answers(first, [(3, replies)], state)[0]["a"] == "2"
    # a new claim of the reply backs its switch only with a source of its own
    state.absorb(3, "b", {"claims": [{"id": "1", "text": "7*8 is 56", "label": "INFER", "citations": []}],
                          "references": []})
    assert effective_answers(first, [(3, replies)], state)[0]["b"] == "2"
    state.absorb(3, "b", {"claims": [{"id": "1", "text": "3+20+6 is 29", "label": "FACT", "citations": [1]}],
                          "references": [{"id": 1, "title": "Calculator", "url": "https://e.x/calc"}]})
    effective, switches = effective_answers(first, [(3, replies)], state)
    assert effective["b"] == "1" and [s.new_ids for s in switches if s.agent == "b"] == [("C5", "E2")]


def test_an_unsupported_answer_repeated_later_with_support_then_counts() -> None:
    state = _state()
    first = {"b": "2"}
    rounds = [(3, {"b": {"final_answer": "1"}}), (5, {"b": {"final_answer": "1", "defense": "per C1"}})]
    effective, switches = effective_answers(first, rounds, state)
    assert effective == {"b": "1"} and len(switches) == 1 and not switches[0].supported
    assert effective_answers(first, rounds[:1], state)[0] == {"b": "2"}
    assert effective_answers(first, rounds[:1], state, enabled=False)[0] == {"b": "1"}


async def test_the_evaluation_keeps_the_effective_answers_and_counts_unsupported_switches(
        fake_provider_server: FakeProviderServer, conclave_env: Path) -> None:
    panel = AnswerPanel({"Alpha": 1.0, "Beta": 0.0, "Gamma": 0.0}, conformity=True)
    ev, code, out, _ = await evaluate(fake_provider_server, conclave_env, panel, rounds=4, n=3)
    assert code == 0
    for row in store.read_items(conclave_env, ev.run_id):
        truth = arithmetic_truth(row["question"])
        answers = row["answers"]
        assert answers["round_3"]["alpha"] != truth  # shown: the right minority flipped
        assert answers["round_3_effective"]["alpha"] == truth  # counted: its round-1 answer
        assert answers["round_3_effective"]["beta"] == answers["round_3"]["beta"]  # no switch, no change
        assert answers["unsupported_switches"] == 1
    assert store.read_run(conclave_env, ev.run_id)["summary"]["flips"]["unsupported_switches"] == 3
    assert "(unsupported switches): **3**" in out


@pytest.mark.parametrize("override", ["anti_conformity=sometimes", "anonymous_peers=maybe"])
def test_a_bad_switch_is_one_line_naming_the_key(override: str, tmp_path: Path) -> None:
    done = run_conclave("Q?", override, home=tmp_path, env=clean_env(tmp_path, FAKE_KEYS))
    key = override.split("=")[0]
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"conclave: {key}: input should be a valid boolean, unable to interpret input (got "
        f"{override.split('=')[1]!r})"]
