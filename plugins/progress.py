"""Built-in terminal progress: one line per round on stderr, e.g.

    ▸ Round 1 · Independent   security ✓ 3.1s   architect ✓ 2.7s   pragmatist ✗ (timeout)

On a terminal the current round's line is live: every agent still thinking has a spinner and its elapsed time,
redrawn ten times a second, and turns into its result as it answers. Otherwise (piped, or
``output.progress=plain``) each round's line is appended once the round ends, so logs stay readable. Notices
(substitutions, early termination, explore mode, filtering off, cost aborts) get their own lines, and a summary
line closes the run; an interrupted run ends with the command that resumes it. ``output.progress=quiet`` (or
``CONCLAVE_PROGRESS=0``) turns the view off. Unknown event types are ignored, so new events never break it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from math import fsum  # statistics.fmean's sum, without importing statistics (decimal, fractions)
from typing import Any, TextIO

from conclave import events as ev
from conclave.artifacts.artifact_filter import FILTERING_OFF_NOTICE
from conclave.hookspecs import hookimpl

ROUND_LABELS = {
    "independent": "Independent",
    "synthesis": "Synthesis",
    "cross_exam": "Cross-exam",
    "verdict": "Verdict",
    "objection": "Objection",
}
_CLEAR_LINE = "\r\x1b[K"
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
TICK_S = 0.1
#: who answers each round type: every present agent, the judge, or both (the judge after the agents)
_PLAYERS = {"independent": ("agents",), "synthesis": ("judge",), "cross_exam": ("agents", "judge"),
            "verdict": ("judge",), "objection": ("agents",)}


def short_error(error: Any) -> str:
    """A few words for a failed call: ``timeout``, ``rate limited``, else the error's first clause."""
    text = str(error or "failed")
    lowered = text.lower()
    for needle, words in (("timeout", "timeout"), ("timed out", "timeout"), ("429", "rate limited"),
                          ("rate limit", "rate limited"), ("invalid answer", "invalid answer")):
        if needle in lowered:
            return words
    first = text.split(":", 1)[-1].strip() if ":" in text else text
    return first if len(first) <= 40 else first[:39] + "…"


def _pct(value: Any) -> str:
    return f"{round(float(value) * 100)}%" if isinstance(value, int | float) else "n/a"


class ProgressView:
    """Renders consultation events as progress lines on ``stream`` (stderr in real use)."""

    def __init__(self, stream: TextIO, *, tty: bool, verbose: bool = False, live: bool = False) -> None:
        self.stream = stream
        self.tty = tty
        self.verbose = verbose
        self.live = live and tty  # spinners and elapsed times, redrawn by a ticker thread
        self._round: tuple[int, str] | None = None
        self._entries: list[str] = []
        self._tail = ""  # what follows the entries, e.g. "confidence 78%"
        self._agents: list[str] = []  # the panel, from consultation:started
        self._present: set[str] | None = None  # agents that answered round 1 (they play round 3)
        self._thinking: dict[str, float] = {}  # who the current round still waits for → when it started
        self._consultation_id = ""
        self._lock = threading.RLock()
        self._ticker: threading.Thread | None = None
        self._stop = threading.Event()
        self._frame = 0
        self._queued: list[str] = []  # agents of this round waiting for a free slot of their endpoint
        self._provider_of: dict[str, str] = {}  # agent (or "judge") -> its provider, to know whose slot freed up
        self._queue_noticed: set[str] = set()  # providers whose queueing was already explained (not a terminal)
        self._handlers: dict[str, Callable[[Mapping[str, Any]], None]] = {
            ev.CONSULTATION_STARTED: self._started,
            ev.COST_ESTIMATED: self._cost_estimated,
            ev.ROUND_STARTED: self._round_started,
            ev.AGENT_COMPLETED: self._agent_completed,
            ev.PROVIDER_QUEUED: self._queued_call,
            ev.PROVIDER_SUBSTITUTED: self._substituted,
            ev.ROUND_ARTIFACT: self._artifact,
            ev.FILTER_APPLIED: self._filter_applied,
            ev.ROUND_COMPLETED: self._round_completed,
            ev.EARLY_TERMINATION: self._early_termination,
            ev.GROUPTHINK_CHECK: self._groupthink,
            ev.OBJECTION_OUTCOME: self._objection,
            ev.COST_GATE_TRIGGERED: self._cost_gate,
            ev.CONSULTATION_COMPLETED: self._completed,
        }

    def __call__(self, event: ev.Event) -> None:
        handler = self._handlers.get(event.type)
        if handler is not None:
            self._consultation_id = event.consultation_id or self._consultation_id
            with self._lock:
                handler(event.data or {})

    # ------------------------------------------------------------------------------------------ output

    def _line(self) -> str:
        if self._round is None:
            return ""
        number, label = self._round
        now = time.monotonic()
        spinner = _SPINNER[self._frame % len(_SPINNER)]
        waiting = [f"{name} {spinner} {now - since:.1f}s" for name, since in self._thinking.items()
                   if name not in self._queued]  # a queued call is not running yet: it shows under "queued" only
        parts = [f"  ▸ Round {number} · {label:<11}", *self._entries, *waiting]
        if self._queued:
            parts.append(f"queued: {', '.join(self._queued)}")
        if self._tail:
            parts.append(self._tail)
        return "   ".join(parts).rstrip()

    def _redraw(self) -> None:
        if self.tty and self._round is not None:
            self._write(_CLEAR_LINE + self._line())

    def _notice(self, text: str) -> None:
        """A line of its own; on a terminal it goes above the round line being drawn."""
        if self.tty and self._round is not None:
            self._write(f"{_CLEAR_LINE}  {text}\n{self._line()}")
        else:
            self._write(f"  {text}\n")

    def _write(self, text: str) -> None:
        with self._lock:
            self.stream.write(text)
            self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            with self._lock:
                if self._round is None or not self._thinking:
                    continue
                self._frame += 1
                self._redraw()

    def _start_ticker(self) -> None:
        if self.live and self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="conclave-progress", daemon=True)
            self._ticker.start()

    def close(self) -> None:
        """Stop the ticker (the consultation is over); it exits at its next tick without drawing again."""
        self._stop.set()
        self._ticker = None

    # ------------------------------------------------------------------------------------------ handlers

    def _started(self, data: Mapping[str, Any]) -> None:
        self._agents = [str(a.get("name")) for a in data.get("agents") or [] if isinstance(a, Mapping)]
        seats = [a for a in data.get("agents") or [] if isinstance(a, Mapping)]
        self._provider_of = {str(a.get("name")): str(a.get("provider")) for a in seats}
        judge = data.get("judge")
        if isinstance(judge, Mapping):
            self._provider_of["judge"] = str(judge.get("provider"))
        if data.get("filtering") is False:
            self._notice(FILTERING_OFF_NOTICE)
        resumed = data.get("resumed_rounds")
        if resumed:
            self._notice(f"↺ Resumed: {', '.join(str(r).replace('_', ' ') for r in resumed)} restored from the journal")

    def _cost_estimated(self, data: Mapping[str, Any]) -> None:
        if not self.verbose:
            return
        cost = data.get("estimated_cost")
        text = f"Estimated cost ${cost:.4f}" if isinstance(cost, int | float) else "Estimated cost unknown"
        unknown = data.get("unknown_prices") or []
        text += f" (no price for: {', '.join(map(str, unknown))})" if unknown else ""
        first = data.get("round_1_cost")
        if data.get("may_stop_after_round") == 1 and isinstance(first, int | float):
            text += f"; the vote may decide after round 1 (${first:.4f})"
        self._notice(text)

    def _round_started(self, data: Mapping[str, Any]) -> None:
        if self._round is not None:  # a round that never reported completion: close its line first
            self._round_completed({})
        round_type = str(data.get("round_type", ""))
        self._round = (int(data.get("round_number") or 0), ROUND_LABELS.get(round_type, round_type))
        self._entries, self._tail, self._queued = [], "", []
        if self.live:
            now = time.monotonic()
            players: list[str] = []
            for role in _PLAYERS.get(round_type, ()):
                if role == "judge":
                    players.append("judge")
                else:
                    present = self._present
                    players += [a for a in self._agents if present is None or a in present]
            self._thinking = dict.fromkeys(players, now)
            self._start_ticker()
        self._redraw()

    def _queued_call(self, data: Mapping[str, Any]) -> None:
        name, provider = str(data.get("agent") or "?"), str(data.get("provider") or "?")
        self._provider_of.setdefault(name, provider)
        if self.tty:
            if name not in self._queued:
                self._queued.append(name)
            self._redraw()
        elif provider not in self._queue_noticed:
            self._queue_noticed.add(provider)
            self._notice(f"⧗ {provider} takes {data.get('max_concurrency')} call(s) at a time: the others are queued "
                         f"(providers.{provider}.max_concurrency)")

    def _agent_completed(self, data: Mapping[str, Any]) -> None:
        name = data.get("agent") or "?"
        self._thinking.pop(str(name), None)
        if data.get("round_number") == 1 and data.get("ok"):
            self._present = (self._present or set()) | {str(name)}
        if name in self._queued:
            self._queued.remove(name)
        # its slot is free: the first call queued for the same provider starts now (its time runs from here)
        freed = self._provider_of.get(str(name))
        starting = next((q for q in self._queued if freed is not None and self._provider_of.get(q) == freed), None)
        if starting is not None:
            self._queued.remove(starting)
            if self.live:
                self._thinking[starting] = time.monotonic()
        if data.get("ok"):
            duration = data.get("duration_s")
            entry = f"{name} ✓ {duration:.1f}s" if isinstance(duration, int | float) else f"{name} ✓"
        else:
            entry = f"{name} ✗ ({short_error(data.get('error'))})"
        self._entries.append(entry)
        self._redraw()

    def _substituted(self, data: Mapping[str, Any]) -> None:
        original = f"{data.get('original_provider')}/{data.get('original_model')}"
        substitute = f"{data.get('substitute_provider')}/{data.get('substitute_model')}"
        reason = f" ({data['reason']})" if data.get("reason") else ""
        self._notice(f"↻ {data.get('agent')}: {original} → {substitute}{reason}")

    def _artifact(self, data: Mapping[str, Any]) -> None:
        artifact = data.get("artifact")
        if not isinstance(artifact, Mapping):
            return
        if data.get("artifact_type") == "synthesis":
            points = [p.get("confidence") for p in artifact.get("consensus_points") or [] if isinstance(p, Mapping)]
            numbers = [float(c) for c in points if isinstance(c, int | float)]
            self._tail = f"confidence {_pct(fsum(numbers) / len(numbers))}" if numbers else ""
        elif data.get("artifact_type") == "verdict":
            self._tail = f"confidence {_pct(artifact.get('confidence'))}"
        self._redraw()

    def _filter_applied(self, data: Mapping[str, Any]) -> None:
        if not self.verbose:
            return
        before, after = data.get("tokens_before"), data.get("tokens_after")
        text = f"filter {data.get('filter')}: round-{data.get('round_number')} view of the {data.get('artifact_type')}"
        if isinstance(before, int) and isinstance(after, int):
            text += f" {before:,} → {after:,} tokens"
        if data.get("error"):
            text += f" (failed, sent unfiltered: {data['error']})"
        self._notice(text)

    def _round_completed(self, data: Mapping[str, Any]) -> None:
        if self._round is None:
            return
        if not data:  # closed by the end of the run or the next round: whoever was still thinking was stopped
            self._entries += [f"{name} ✗ (stopped)" for name in self._thinking]
        self._thinking = {}
        line = self._line()
        self._round, self._entries, self._tail = None, [], ""
        self._write(f"{_CLEAR_LINE}{line}\n" if self.tty else f"{line}\n")

    def _early_termination(self, data: Mapping[str, Any]) -> None:
        if data.get("notice"):
            self._notice(str(data["notice"]))
        if not data.get("offered"):
            return
        why = f"consensus {_pct(data.get('confidence'))} ≥ threshold {_pct(data.get('threshold'))}"
        if data.get("accepted"):
            skipped = data.get("rounds_skipped") or 0
            self._notice(f"⏹ Early termination: {why}; skipping {skipped} round{'s' if skipped != 1 else ''}")
        else:
            self._notice(f"Early termination offered ({why}) and declined: continuing")

    def _groupthink(self, data: Mapping[str, Any]) -> None:
        if not data.get("fired"):
            return
        detector = str(data.get("detector", "")).replace("_", " ")
        what = ("a critical objection round runs next" if data.get("acted")
                else f"no objection round ({data.get('not_acted_because')})")
        self._notice(f"⚑ Groupthink: {detector} after round {data.get('round_number')}: {what}")

    def _objection(self, data: Mapping[str, Any]) -> None:
        if data.get("escalated"):
            self._notice("⚑ The objection round produced nothing new: escalated, a human should look at the result")
        else:
            self._notice(f"Objection round: {len(data.get('new_claims') or [])} new claim(s), "
                         f"{len(data.get('status_changes') or [])} status change(s)")

    def _cost_gate(self, data: Mapping[str, Any]) -> None:
        actual, estimate = data.get("actual_cost"), data.get("estimated_cost")
        if isinstance(actual, int | float) and isinstance(estimate, int | float):
            self._notice(f"✖ Cost ${actual:.4f} exceeded {data.get('abort_ratio')} × the estimate ${estimate:.4f}: "
                         "stopping")
        else:
            self._notice("✖ Cost limit exceeded: stopping")

    def _completed(self, data: Mapping[str, Any]) -> None:
        from conclave.render.markdown import summary_line

        if self._round is not None:
            self._round_completed({})
        raw = data.get("result")
        result: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        status = str(data.get("status") or result.get("status") or "complete")
        mark = {"complete": "✓", "completed_degraded": "⚠", "blocked": "⛔"}.get(status, "✖")
        text = f"{mark} {status.replace('_', ' ')}"
        if status == "blocked" and result.get("abort_reason"):
            text = f"{mark} {result['abort_reason']}"  # the reason starts "blocked by the safety evaluator"
        elif status in ("partial", "aborted") and result.get("abort_reason"):
            text += f" ({result['abort_reason']})"
        summary = summary_line(result)
        self._write(f"  {text} · {summary}\n" if summary else f"  {text}\n")
        cid = result.get("consultation_id") or self._consultation_id
        if status in ("partial", "aborted") and "interrupted" in str(result.get("abort_reason") or "") and cid:
            self._write(f"  Resume it with: conclave resume {cid}\n")
        self.close()


def progress_factory(settings: Any) -> ProgressView | None:
    """The ``progress`` subscriber for one consultation, writing to stderr: live on a terminal, plain lines
    otherwise or with ``output.progress=plain``; None with ``output.progress=quiet`` or CONCLAVE_PROGRESS=0."""
    mode = getattr(getattr(settings, "output", None), "progress", "auto")
    if mode == "quiet" or os.environ.get("CONCLAVE_PROGRESS", "").strip() == "0":
        return None
    stream = sys.stderr
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if mode == "plain":
        tty = False
    return ProgressView(stream, tty=tty, verbose=bool(getattr(settings, "verbose", False)), live=tty)


@hookimpl
def register_event_subscribers(register: Any) -> None:
    register("progress", progress_factory)
