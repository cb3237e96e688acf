"""What the consultation is about, made safe to send: the question and the context, scrubbed of secrets.

Nothing reaches a provider before this has run. The scrubber redacts what it recognises and, whatever their shape,
the values of the provider keys conclave holds (``conclave.store.redact.key_variables``). ``scrub=false`` sends both
as they are, with a warning. A context cut to its size limits is announced here, one line per cut.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from conclave.config.settings import Settings
from conclave.engine.context import cut_notices, load_context
from conclave.engine.followup import parent_block
from conclave.engine.interaction import Interaction
from conclave.providers.base import ImagePart
from conclave.scrub import scrub
from conclave.store.redact import key_values, key_variables


@dataclass(frozen=True)
class Inputs:
    question: str  # as sent (scrubbed)
    context: str  # as sent (scrubbed); goes into the system prompts
    scrub_report: dict[str, Any]  # {total, by_type}, question and context together
    context_sources: list[dict[str, Any]]
    images: tuple[ImagePart, ...] = ()  # attached images (sent as they are: the scrubber reads text only)


def prepare_inputs(settings: Settings, interaction: Interaction, stdin_text: str | None = None,
                   environ: Mapping[str, str] | None = None) -> Inputs:
    """Load the context (raises ``ConfigError`` for a bad file) and scrub question and context of secrets and of
    the provider key values set in ``environ`` (the process environment by default). A follow-up's parent block
    (:func:`conclave.engine.followup.parent_block`) leads the context, listed as a source of kind ``parent``."""
    bundle = load_context(settings, stdin_text)
    for notice in cut_notices(bundle.sources):
        interaction.warn(notice)
    question, context = settings.question, bundle.text or ""
    sources = [dict(s) for s in bundle.sources]
    earlier = parent_block(settings)  # a follow-up: the parent's verdict and debate state lead the context
    if earlier:
        context = f"{earlier}\n\n{context}" if context else earlier
        size = len(earlier.encode("utf-8"))
        sources.insert(0, {"path": f"consultation {settings.parent}", "bytes": size, "sent": size,
                           "truncated": False, "kind": "parent", "omitted": None})
    if not settings.scrub:
        interaction.warn("scrub=false: the question and context are sent to the providers unscrubbed")
        return Inputs(question, context, {"total": 0, "by_type": {}}, sources, bundle.images)

    keys = key_values(environ, key_variables(settings))
    question, report = scrub(question, keys)
    if context:
        context, context_report = scrub(context, keys)
        report = report.merge(context_report)
    return Inputs(question, context, report.as_dict(), sources, bundle.images)
