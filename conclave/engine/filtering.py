"""Applying the configured artifact filter to what rounds 3 and 4 are shown, and counting what it saved.

The filter (a plugin) only drops array items and re-validates; this module decides when it runs (never with
``verbose=true``), emits ``filter:applied`` with real token counts of the JSON shown, and totals the savings
for ``token_efficiency_stats``: of the input actually sent in the rounds that filtered something (every call
of those rounds, counted with the real tokenizer on the prompts as sent), the share filtering removed. The
unfiltered input is what was sent plus what was removed from each filtered artifact, times the calls that
received it — the same prompts, only with the artifacts whole.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from conclave.config import Settings
from conclave.events import FILTER_APPLIED, EventBus

if TYPE_CHECKING:
    from conclave.plugins import Plugins

log = logging.getLogger(__name__)


class ArtifactFiltering:
    def __init__(self, settings: Settings, plugins: Plugins, bus: EventBus) -> None:
        self.enabled = not settings.verbose
        self._settings = settings
        self._plugins = plugins
        self._bus = bus
        self.saved_tokens = 0
        self.filtered_rounds: list[int] = []
        self.sent_tokens = 0  # input of every call of the filtered rounds, as sent

    def limits(self, section: str, artifact: dict[str, Any]) -> dict[str, int]:
        """The limits of ``filtering.<section>`` that apply to ``artifact``."""
        from conclave.artifact_filter import limits_for

        return limits_for(artifact, getattr(self._settings.filtering, section).model_dump())

    def apply(
        self,
        artifact: dict[str, Any],
        section: str,
        round_number: int,
        *,
        view: Callable[[dict[str, Any]], Any],
        recipients: int = 1,
    ) -> dict[str, Any]:
        """The copy of ``artifact`` filtered with the ``filtering.<section>`` limits for round ``round_number``
        (the artifact itself when filtering is disabled).

        ``view`` turns an artifact into what is actually shown (labels, no header) so token counts measure what
        is sent; ``recipients`` is how many calls receive it (round 3 sends the synthesis to every agent).
        """
        if not self.enabled:
            return artifact
        from conclave.tokens import count_tokens

        artifact_type = str(artifact.get("artifact_type", ""))
        limits = self.limits(section, artifact)
        name = self._settings.filtering.filter
        error = None
        try:
            filtered: dict[str, Any] = self._plugins.filters.get(name)().filter(artifact, limits)
        except Exception as exc:
            # Sending the unfiltered artifact is still correct (only dearer); say so instead of failing the run.
            log.warning("filter %r failed on the round-%d %s: %s", name, round_number, artifact_type, exc)
            filtered, error = artifact, f"{type(exc).__name__}: {exc}"
        from conclave.engine.session import prompt_json  # the JSON exactly as prompts show it

        before = count_tokens(prompt_json(view(artifact)))
        after = count_tokens(prompt_json(view(filtered)))
        self.saved_tokens += max(0, before - after) * recipients
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
            error=error,
        )
        return filtered

    def count_sent(self, round_number: int, prompt: str) -> None:
        """Count one call's prompt (system, user and schema instruction as sent) when its round filtered."""
        if self.enabled and round_number in self.filtered_rounds:
            from conclave.tokens import count_tokens

            self.sent_tokens += count_tokens(prompt)

    def stats(self) -> dict[str, Any] | None:
        """``token_efficiency_stats``, or None when nothing was filtered (verbose, or no round 3 ran)."""
        if not self.filtered_rounds:
            return None
        from conclave.artifact_filter import token_efficiency_stats

        return token_efficiency_stats(self.sent_tokens + self.saved_tokens, self.sent_tokens, self.filtered_rounds)
