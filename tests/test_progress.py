"""The terminal progress subscriber: one line per round on stderr, notices, a summary; never crashes."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conclave_plugins.progress import ProgressView, progress_factory, short_error

from conclave import events as ev
from conclave.events import EventBus
from conclave.plugin_manager import load_plugins

RESULT = json.loads((Path(__file__).parent / "fixtures" / "results" / "converge_complete.json").read_text())


def converge_run(bus: EventBus) -> None:
    """The events of a 4-round run with one substitution and one failed reply."""
    bus.emit(ev.CONSULTATION_STARTED, question="q", verbose=False, resumed_rounds=[])
    bus.emit(ev.ROUND_STARTED, round_number=1, round_type="independent")
    bus.emit(ev.AGENT_COMPLETED, round_number=1, agent="security", ok=True, duration_s=3.14, error=None)
    bus.emit(ev.PROVIDER_SUBSTITUTED, round_number=1, agent="pragmatist", original_provider="gemini",
             original_model="gemini-2.5-pro", substitute_provider="gemini", substitute_model="gemini-2.5-flash",
             reason="timeout")
    bus.emit(ev.AGENT_COMPLETED, round_number=1, agent="architect", ok=True, duration_s=2.7, error=None)
    bus.emit(ev.AGENT_COMPLETED, round_number=1, agent="pragmatist", ok=True, duration_s=4.0, error=None)
    bus.emit(ev.ROUND_COMPLETED, round_number=1, round_type="independent", duration_s=4.1)
    bus.emit(ev.ROUND_STARTED, round_number=2, round_type="synthesis")
    bus.emit(ev.AGENT_COMPLETED, round_number=2, agent="judge", ok=True, duration_s=2.2, error=None)
    bus.emit(ev.ROUND_ARTIFACT, round_number=2, artifact_type="synthesis", agent=None,
             artifact={"consensus_points": [{"confidence": 0.9}, {"confidence": 0.66}]})
    bus.emit(ev.ROUND_COMPLETED, round_number=2, round_type="synthesis")
    bus.emit(ev.EARLY_TERMINATION, offered=False, accepted=False, confidence=0.78, threshold=0.9,
             reason="below_threshold", rounds_skipped=0)
    bus.emit(ev.ROUND_STARTED, round_number=3, round_type="cross_exam")
    bus.emit(ev.FILTER_APPLIED, round_number=3, artifact_type="synthesis", filter="top_n",
             limits={"consensus_points": 3}, tokens_before=900, tokens_after=610, error=None)
    bus.emit(ev.AGENT_COMPLETED, round_number=3, agent="security", ok=True, duration_s=1.0, error=None)
    bus.emit(ev.AGENT_COMPLETED, round_number=3, agent="pragmatist", ok=False, duration_s=120.0,
             error="ProviderTimeout: no answer within 120 s")
    bus.emit(ev.AGENT_COMPLETED, round_number=3, agent="judge", ok=True, duration_s=3.3, error=None)
    bus.emit(ev.ROUND_COMPLETED, round_number=3, round_type="cross_exam")
    bus.emit(ev.ROUND_STARTED, round_number=4, round_type="verdict")
    bus.emit(ev.AGENT_COMPLETED, round_number=4, agent="judge", ok=True, duration_s=3.6, error=None)
    bus.emit(ev.ROUND_ARTIFACT, round_number=4, artifact_type="verdict", agent=None, artifact={"confidence": 0.84})
    bus.emit(ev.ROUND_COMPLETED, round_number=4, round_type="verdict")
    bus.emit(ev.CONSULTATION_COMPLETED, status="complete", result=RESULT)


EXPECTED = [
    "  ↻ pragmatist: gemini/gemini-2.5-pro → gemini/gemini-2.5-flash (timeout)",
    "  ▸ Round 1 · Independent   security ✓ 3.1s   architect ✓ 2.7s   pragmatist ✓ 4.0s",
    "  ▸ Round 2 · Synthesis     judge ✓ 2.2s   confidence 78%",
    "  ▸ Round 3 · Cross-exam    security ✓ 1.0s   pragmatist ✗ (timeout)   judge ✓ 3.3s",
    "  ▸ Round 4 · Verdict       judge ✓ 3.6s   confidence 84%",
    "  ✓ complete · cost $0.0412 · 18,305 tokens (4,096 read from prompt caches) · 16.4 s · saved 4,210 tokens (31%)",
]


def run(view: ProgressView, scenario: Any = converge_run) -> None:
    bus = EventBus("c-test")
    bus.subscribe(view, critical=True)  # critical: a crash in the view fails the test instead of being logged
    scenario(bus)


def screen(raw: str) -> list[str]:
    """What a terminal shows after ``raw``: carriage return + erase-line rewrite the current line."""
    lines, current = [], ""
    for chunk in re.split(r"(\r\x1b\[K|\n)", raw):
        if chunk == "\r\x1b[K":
            current = ""
        elif chunk == "\n":
            lines.append(current)
            current = ""
        else:
            current += chunk
    return [*lines, current] if current else lines


def test_appended_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    run(ProgressView(out, tty=False))
    assert out.getvalue().splitlines() == EXPECTED
    assert "\r" not in out.getvalue()


def test_lines_are_rewritten_in_place_on_a_terminal() -> None:
    out = io.StringIO()
    run(ProgressView(out, tty=True))
    raw = out.getvalue()
    assert raw.count("\r\x1b[K") > len(EXPECTED)  # redrawn as each answer arrived
    assert screen(raw) == EXPECTED


def test_a_round_line_shows_each_answer_as_it_arrives_on_a_terminal() -> None:
    out = io.StringIO()
    view = ProgressView(out, tty=True)
    bus = EventBus("c-test")
    bus.subscribe(view, critical=True)
    bus.emit(ev.ROUND_STARTED, round_number=1, round_type="independent")
    bus.emit(ev.AGENT_COMPLETED, round_number=1, agent="security", ok=True, duration_s=3.1)
    assert screen(out.getvalue()) == ["  ▸ Round 1 · Independent   security ✓ 3.1s"]


def test_verbose_mode_shows_filter_details_and_filtering_off_its_own_notice() -> None:
    out = io.StringIO()
    run(ProgressView(out, tty=False, verbose=True))
    lines = out.getvalue().splitlines()
    assert "  filter top_n: round-3 view of the synthesis 900 → 610 tokens" in lines
    assert "Filtering off" not in out.getvalue()  # verbose is display only: the run still filters
    out = io.StringIO()
    run(ProgressView(out, tty=False), lambda bus: bus.emit(ev.CONSULTATION_STARTED, question="q", verbose=False,
                                                            filtering=False, resumed_rounds=[]))
    assert out.getvalue().splitlines()[0] == "  🔍 Filtering off: using full debate artifacts (higher token cost)"


def test_early_termination_and_explore_notices() -> None:
    def scenario(bus: EventBus) -> None:
        bus.emit(ev.EARLY_TERMINATION, offered=False, accepted=False, reason="strategy_runs_all_rounds",
                 notice="Explore mode: all rounds will execute")
        bus.emit(ev.EARLY_TERMINATION, offered=True, accepted=True, confidence=0.93, threshold=0.9, rounds_skipped=2)
        bus.emit(ev.EARLY_TERMINATION, offered=True, accepted=False, confidence=0.91, threshold=0.9)

    out = io.StringIO()
    run(ProgressView(out, tty=False), scenario)
    assert out.getvalue().splitlines() == [
        "  Explore mode: all rounds will execute",
        "  ⏹ Early termination: consensus 93% ≥ threshold 90%; skipping 2 rounds",
        "  Early termination offered (consensus 91% ≥ threshold 90%) and declined: continuing",
    ]


def test_an_aborted_run_ends_with_its_reason() -> None:
    def scenario(bus: EventBus) -> None:
        bus.emit(ev.ROUND_STARTED, round_number=3, round_type="cross_exam")
        bus.emit(ev.COST_GATE_TRIGGERED, estimated_cost=0.05, actual_cost=0.09, abort_ratio=1.5, phase="round 3")
        result = {**RESULT, "status": "aborted", "abort_reason": "cost_exceeded", "token_efficiency_stats": None}
        bus.emit(ev.CONSULTATION_COMPLETED, status="aborted", result=result)

    out = io.StringIO()
    run(ProgressView(out, tty=False), scenario)
    assert out.getvalue().splitlines() == [
        "  ✖ Cost $0.0900 exceeded 1.5 × the estimate $0.0500: stopping",
        "  ▸ Round 3 · Cross-exam",
        "  ✖ aborted (cost_exceeded) · cost $0.0412 · 18,305 tokens (4,096 read from prompt caches) · 16.4 s",
    ]


def test_unknown_events_and_missing_fields_never_crash() -> None:
    def scenario(bus: EventBus) -> None:
        bus.emit("plugin:custom_event", anything=1)
        bus.emit(ev.ROUND_COMPLETED)
        bus.emit(ev.ROUND_STARTED)
        bus.emit(ev.AGENT_COMPLETED)
        bus.emit(ev.ROUND_ARTIFACT, artifact_type="synthesis", artifact={"consensus_points": None})
        bus.emit(ev.PROVIDER_SUBSTITUTED)
        bus.emit(ev.CONSULTATION_COMPLETED, result=None)

    out = io.StringIO()
    run(ProgressView(out, tty=True), scenario)
    assert screen(out.getvalue())[-1] == "  ✓ complete · cost unknown"


@pytest.mark.parametrize(("error", "words"), [
    ("ProviderTimeout: no answer within 120 s", "timeout"),
    ("HTTP 429: Too Many Requests", "rate limited"),
    ("invalid answer after one re-ask: $.confidence: 'high' is not of type 'number'", "invalid answer"),
    ("ProviderError: connection reset by peer", "connection reset by peer"),
    (None, "failed"),
])
def test_short_error(error: str | None, words: str) -> None:
    assert short_error(error) == words


def test_factory_writes_to_stderr_only(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("CONCLAVE_PROGRESS", raising=False)
    view = progress_factory(SimpleNamespace(verbose=True))
    assert view is not None
    run(view)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "▸ Round 4 · Verdict" in captured.err


def test_factory_opts_out_with_conclave_progress_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCLAVE_PROGRESS", "0")
    assert progress_factory(SimpleNamespace(verbose=False)) is None


def test_progress_is_registered_through_the_entry_point() -> None:
    assert load_plugins().event_subscribers.get("progress") is progress_factory


def test_calls_waiting_for_a_single_slot_server_show_as_queued() -> None:
    out = io.StringIO()
    bus = EventBus("c-test")
    bus.subscribe(ProgressView(out, tty=True), critical=True)
    bus.emit(ev.ROUND_STARTED, round_number=1, round_type="independent")
    for agent in ("architect", "pragmatist"):
        bus.emit(ev.PROVIDER_QUEUED, round_number=1, agent=agent, provider="openai", model="m", max_concurrency=1,
                 hedge=False)
    assert screen(out.getvalue()) == ["  ▸ Round 1 · Independent   queued: architect, pragmatist"]
    bus.emit(ev.AGENT_COMPLETED, round_number=1, agent="architect", ok=True, duration_s=3.1)
    # architect's slot went to pragmatist, the next call queued for the same provider: it is no longer queued
    assert screen(out.getvalue()) == ["  ▸ Round 1 · Independent   architect ✓ 3.1s"]

    plain = io.StringIO()
    view = ProgressView(plain, tty=False)
    for agent in ("architect", "pragmatist"):
        view(ev.Event(ev.PROVIDER_QUEUED, "c", 0, 0.0, {"agent": agent, "provider": "openai", "max_concurrency": 1}))
    assert plain.getvalue().splitlines() == [
        "  ⧗ openai takes 1 call(s) at a time: the others are queued (providers.openai.max_concurrency)"]


def test_a_queued_call_shows_once_as_queued_and_starts_its_clock_when_a_slot_of_its_provider_frees() -> None:
    # the offline panel: one local model answers one call at a time (it used to show "pragmatist ⠏ 40.4s" beside
    # "queued: pragmatist", timing a call that had not started)
    out = io.StringIO()
    bus = EventBus("c-test")
    view = ProgressView(out, tty=True, live=True)
    bus.subscribe(view, critical=True)
    bus.emit(ev.CONSULTATION_STARTED, question="q", agents=[
        {"name": "security", "provider": "local"}, {"name": "pragmatist", "provider": "local"},
        {"name": "architect", "provider": "openai"}], judge={"provider": "local"})
    bus.emit(ev.ROUND_STARTED, round_number=1, round_type="independent")
    bus.emit(ev.PROVIDER_QUEUED, round_number=1, agent="pragmatist", provider="local", model="m", max_concurrency=1,
             hedge=False)
    view.close()
    line = screen(out.getvalue())[-1]
    assert re.fullmatch(r"  ▸ Round 1 · Independent   security \S \d+\.\ds   architect \S \d+\.\ds   "
                        r"queued: pragmatist", line), line
    bus.emit(ev.AGENT_COMPLETED, round_number=1, agent="architect", ok=True, duration_s=2.0)
    assert screen(out.getvalue())[-1].endswith("queued: pragmatist")  # another provider's slot freed: still waits
    bus.emit(ev.AGENT_COMPLETED, round_number=1, agent="security", ok=True, duration_s=3.0)
    line = screen(out.getvalue())[-1]
    assert re.fullmatch(r"  ▸ Round 1 · Independent   architect ✓ 2\.0s   security ✓ 3\.0s   pragmatist \S 0\.\ds",
                        line), line


def test_a_groupthink_firing_and_an_escalation_are_announced() -> None:
    def scenario(bus: EventBus) -> None:
        bus.emit(ev.GROUPTHINK_CHECK, detector="early_convergence", round_number=1, fired=True, acted=True)
        bus.emit(ev.ROUND_STARTED, round_number=2, round_type="objection")
        bus.emit(ev.AGENT_COMPLETED, round_number=2, agent="security", ok=True, duration_s=1.2, error=None)
        bus.emit(ev.ROUND_COMPLETED, round_number=2, round_type="objection")
        bus.emit(ev.OBJECTION_OUTCOME, round_number=2, new_claims=[], status_changes=[], escalated=True)

    out = io.StringIO()
    run(ProgressView(out, tty=False), scenario)
    assert out.getvalue().splitlines() == [
        "  ⚑ Groupthink: early convergence after round 1: a critical objection round runs next",
        "  ▸ Round 2 · Objection     security ✓ 1.2s",
        "  ⚑ The objection round produced nothing new: escalated, a human should look at the result",
    ]
