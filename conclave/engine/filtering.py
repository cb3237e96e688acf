"""Applying the configured artifact filter to what later rounds are shown, and counting what it saved.

The filter (a plugin) only drops array items and :func:`checked_filter` re-validates what it returns; this module
decides when it runs (never with ``filtering.enabled=false``), emits ``filter:applied`` with real token counts of
the JSON shown, and totals the savings for ``token_efficiency_stats``.

The savings are counted per call, on the prompts themselves: every call made once the consultation has an
artifact that later rounds filter (every call after the synthesis) is rendered a second time exactly as it would
have been with filtering off — the same template, labels, debate state, summaries and budget cuts, only the
artifacts whole — and both prompts (system and user message as sent, the JSON instruction included) are counted
with the real tokenizer of the call's model. ``tokens_used`` is what those calls sent; ``tokens_saved_via_filtering``
is what the unfiltered prompts would have added. A filtered artifact that a later prompt no longer shows
(summarized, or merged into the debate state) therefore saves nothing there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from conclave.artifacts.artifact_filter import ArtifactFilter, limits_for, token_efficiency_stats
from conclave.artifacts.schema_registry import check, declared_properties, fill_added_lists
from conclave.config.settings import Settings
from conclave.engine.record import prompt_json
from conclave.events import FILTER_APPLIED, EventBus
from conclave.tokens import count_tokens

if TYPE_CHECKING:
    from conclave.plugin_manager import Plugins

log = logging.getLogger(__name__)


def checked_filter(filter_: ArtifactFilter, artifact: dict[str, Any], limits: dict[str, int]) -> dict[str, Any]:
    """``filter_.filter(artifact, limits)``, the result checked against its artifact type's schema.

    Raises what the filter raises (``ValueError`` for a bad limit) and
    ``conclave.artifacts.schema_registry.ArtifactValidationError`` if the result does not match its schema.
    """
    filtered = filter_.filter(artifact, limits)
    artifact_type = str(filtered["artifact_type"])
    # A strategy's own schema may add fields to the artifact type (answer mode's final_answer), and a stored
    # artifact may predate the debate-quality lists; filtering touches neither, so the result is checked
    # against the fields the artifact type's schema declares, absent quality lists read as empty.
    declared = declared_properties(artifact_type)
    check(artifact_type, fill_added_lists(artifact_type, {k: v for k, v in filtered.items() if k in declared}))
    return filtered


class ArtifactFiltering:
    def __init__(self, settings: Settings, plugins: Plugins, bus: EventBus) -> None:
        self.enabled = settings.filtering.enabled
        self._settings = settings
        self._plugins = plugins
        self._bus = bus
        self._bypass = False  # rendering the unfiltered counterpart of a call: filter nothing, record nothing
        self._unrecorded = False  # rendering a prompt that is never sent: filter, record nothing
        self.filtered_rounds: list[int] = []
        self.sent_tokens = 0  # input of every counted call, as sent
        self.unfiltered_tokens = 0  # the same calls' input had nothing been filtered
        #: (artifact id, round, section) -> (the artifact, kept alive so its id stays its own; its filtered copy)
        self._later: dict[tuple[int, int, str], tuple[dict[str, Any], dict[str, Any]]] = {}
        #: (artifact id, filter, limits) -> (the artifact, its filtered copy, the filter's error)
        self._filtered: dict[tuple[int, str, tuple[tuple[str, int], ...]], tuple[dict[str, Any], dict[str, Any],
                                                                                  str | None]] = {}
        #: reply id -> (the reply, kept alive; its typed copy): one copy per reply, so :meth:`apply` filters a reply
        #: shown to several seats (and to never-sent renderings) once
        self._typed: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    def limits(self, section: str, artifact: dict[str, Any]) -> dict[str, int]:
        """The limits of ``filtering.<section>`` that apply to ``artifact``."""
        return limits_for(artifact, self._settings.filtering.section(section))

    def apply(
        self,
        artifact: dict[str, Any],
        section: str,
        round_number: int,
        *,
        view: Callable[[dict[str, Any]], Any],
        recipients: int = 1,
        agent: str | None = None,
    ) -> dict[str, Any]:
        """The copy of ``artifact`` filtered with the ``filtering.<section>`` limits for round ``round_number``
        (the artifact itself when filtering is disabled, or while the unfiltered counterpart of a call is
        rendered).

        ``view`` turns an artifact into what is actually shown (labels, the fields the seat sees) so the event's
        token counts measure the JSON sent; ``recipients`` is how many calls receive it; ``agent``: the author of
        an agent's artifact (None for the judge's).
        """
        if not self.enabled or self._bypass:
            return artifact

        artifact_type = str(artifact.get("artifact_type", ""))
        limits = self.limits(section, artifact)
        name = self._settings.filtering.filter
        # The same artifact under the same limits (the synthesis shown to the round-3 agents and to their judge)
        # is filtered and checked once; every showing is still recorded.
        key = (id(artifact), name, tuple(sorted(limits.items())))
        done = self._filtered.get(key)
        if done is not None and done[0] is artifact:
            filtered, error = done[1], done[2]
        else:
            error = None
            try:
                filtered = checked_filter(self._plugins.filters.get(name)(), artifact, limits)
            except Exception as exc:
                # Sending the unfiltered artifact is still correct (only dearer); say so instead of failing the run.
                log.warning("filter %r failed on the round-%d %s: %s", name, round_number, artifact_type, exc)
                filtered, error = artifact, f"{type(exc).__name__}: {exc}"
            self._filtered[key] = (artifact, filtered, error)  # the artifact kept alive, so its id stays its own
        if self._unrecorded:
            return filtered

        before = count_tokens(prompt_json(view(artifact)))
        after = count_tokens(prompt_json(view(filtered)))
        if round_number not in self.filtered_rounds:
            self.filtered_rounds.append(round_number)
        self._bus.emit(
            FILTER_APPLIED,
            round_number=round_number,
            artifact_type=artifact_type,
            filter=name,
            limits=limits,
            tokens_before=before,
            tokens_after=after,
            recipients=recipients,
            agent=agent,
            error=error,
        )
        return filtered

    def later(self, artifact: dict[str, Any] | None, round_number: int, *, view: Callable[[dict[str, Any]], Any],
              seat: str = "judge", recipients: int = 1) -> dict[str, Any] | None:
        """A judge's artifact shown again in a later round outside the round types' declared inputs (the objection
        round's consensus, a superseded cross-examination in ``$earlier_rounds``), filtered with the limits the
        declared inputs use for it: the synthesis shown to agents with ``filtering.round3``, anything else with
        ``filtering.round4``. Agents' answers are never passed here: they are always shown whole."""
        if artifact is None or "artifact_type" not in artifact:
            return artifact
        section = "round3" if seat == "agents" and artifact.get("artifact_type") == "synthesis" else "round4"
        if not self.enabled or self._bypass or not self.limits(section, artifact):
            return artifact
        key = (id(artifact), round_number, section)  # every call of a round shows the same copy: filtered once
        if key not in self._later:
            filtered = self.apply(artifact, section, round_number, view=view, recipients=recipients)
            if self._unrecorded:
                return filtered
            self._later[key] = (artifact, filtered)
        return self._later[key][1]

    def reply(self, reply: dict[str, Any], schema: str, round_number: int, *, view: Callable[[dict[str, Any]], Any],
              seat: str, agent: str, recipients: int = 1) -> dict[str, Any]:
        """An agent's reply of an earlier round (artifact schema ``schema``) shown again in round ``round_number``
        to others than its author — the agents and the judge of a repeated cross-examination, the verdict's
        history — with the ``filtering.replies`` limits (its most severe challenges). Its author and the judge
        recording the round it belongs to always see it whole: callers pass only what others are shown again.
        Reply shapes without the limited lists (adversarial, explore, objections) are returned whole."""
        if not self.enabled or self._bypass:
            return reply
        entry = self._typed.get(id(reply))
        if entry is None or entry[0] is not reply or entry[1]["artifact_type"] != schema:
            # replies carry no header; the filter needs their type
            entry = self._typed[id(reply)] = (reply, {**reply, "artifact_type": schema})
        typed = entry[1]
        if not self.limits("replies", typed):
            return reply
        key = (id(reply), round_number, f"replies:{seat}")  # every call of a seat in a round: filtered once
        if key not in self._later:

            def untyped(artifact: dict[str, Any]) -> dict[str, Any]:
                return {k: v for k, v in artifact.items() if k != "artifact_type"}

            filtered = untyped(self.apply(typed, "replies", round_number, view=lambda a: view(untyped(a)),
                                          recipients=recipients, agent=agent))
            if self._unrecorded:
                return filtered
            self._later[key] = (reply, filtered)
        return self._later[key][1]

    @property
    def filtering(self) -> bool:
        """Whether artifacts are filtered right now (on, and not rendering an unfiltered counterpart)."""
        return self.enabled and not self._bypass

    @contextmanager
    def bypassed(self) -> Iterator[None]:
        """Within: :meth:`apply` returns every artifact whole and records nothing (the unfiltered counterpart of
        a call being rendered)."""
        previous, self._bypass = self._bypass, True
        try:
            yield
        finally:
            self._bypass = previous

    @contextmanager
    def unrecorded(self) -> Iterator[None]:
        """Within: artifacts are filtered as usual but nothing is recorded — no ``filter:applied`` event, no
        filtered round — for a rendering that is never sent (a long debate's prompt without summarization, whose
        size is measured beside the one sent)."""
        previous, self._unrecorded = self._unrecorded, True
        try:
            yield
        finally:
            self._unrecorded = previous

    def count_call(self, sent: str, unfiltered: str, model: str | None = None) -> None:
        """Count one call: ``sent`` is its prompt as sent, ``unfiltered`` the same call rendered with filtering
        off (both: system prompt, newline, user message with its JSON instruction), with ``model``'s tokenizer."""
        used = count_tokens(sent, model)
        whole = used if unfiltered == sent else count_tokens(unfiltered, model)
        self.sent_tokens += used
        self.unfiltered_tokens += whole

    def stats(self) -> dict[str, Any] | None:
        """``token_efficiency_stats``, or None when nothing was filtered (filtering off, or no later round ran)."""
        if not self.filtered_rounds:
            return None

        return token_efficiency_stats(self.unfiltered_tokens, self.sent_tokens, self.filtered_rounds)
