"""Pre-flight limits: refuse, before anything is journaled, loaded or billed, a prompt its model cannot take.

A question (with its context) goes into every round's prompt, so the round-1 prompt of each agent and the
judge's synthesis prompt without the artifacts it will carry are lower bounds of what each model must read. When
one is over the context window its provider declares (:meth:`Provider.context_window`), the run could only fail
later, after loading a model or paying for other calls; the CLI prints one line and exits 2 instead. A provider
that declares no window is not checked.
"""

from __future__ import annotations

from conclave.engine.budgets import MESSAGE_OVERHEAD_TOKENS
from conclave.engine.independent import independent_spec
from conclave.engine.session import Session
from conclave.engine.synthesis import synthesis_spec
from conclave.errors import ConfigError


def check_context_windows(session: Session) -> None:
    """Raise :class:`ConfigError` naming the seat, its model and both sizes when a fixed prompt cannot fit."""
    from conclave.tokens import count_tokens

    specs = [(f"agents.{name}", independent_spec(session, name)) for name in session.settings.agents]
    if session.settings.planned_rounds >= 2:
        specs.append(("judge", synthesis_spec(session, "")))
    problems = []
    for seat, spec in specs:
        window = session.pool.provider(spec.provider).context_window(spec.model)
        if window is None:
            continue
        needed = count_tokens(f"{spec.system}\n{spec.user}", spec.model) + MESSAGE_OVERHEAD_TOKENS
        if needed >= window:
            problems.append(
                f"question: too long for {seat} ({spec.provider}/{spec.model}): its prompt is about {needed:,} "
                f"tokens and the model's context window is {window:,}; shorten the question or context, or "
                "choose a model with a larger window"
            )
    if problems:
        raise ConfigError(problems[:1])  # the same cause for every seat on that model: one line says it
