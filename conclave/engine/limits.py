"""Pre-flight limits: refuse, before anything is journaled, loaded or billed, a prompt its model cannot take.

A question (with its context) goes into every round's prompt, so the round-1 prompt of each agent and the
judge's synthesis prompt without the artifacts it will carry are lower bounds of what each model must read. When
one is over the context window its provider declares (:meth:`Provider.context_window`), the run could only fail
later, after loading a model or paying for other calls; the CLI prints one line and exits 2 instead. A provider
that declares no window is not checked.
"""

from __future__ import annotations

from conclave.engine.cost import MESSAGE_OVERHEAD_TOKENS, empty_values
from conclave.engine.play import call_spec
from conclave.engine.session import Session
from conclave.errors import ConfigError


def check_context_windows(session: Session) -> None:
    """Raise :class:`ConfigError` naming the seat, its model and both sizes when a fixed prompt cannot fit.

    The prompts are the plan's first round (every agent) and its synthesis without the artifacts it will carry.
    A prompt whose UTF-8 size is under the window fits whatever the tokenizer says, so only a prompt that might
    not fit is counted exactly (no tokenizer is loaded for an ordinary question)."""
    from conclave.tokens import count_tokens, utf8_upper_bound

    plan, labels = session.plan, session.labels
    first = plan.types[0]
    specs = []
    if first.seat == "agents":
        values = empty_values(session, first)
        specs += [(f"agents.{name}", call_spec(session, first, 1, {**values, "label": labels.label(name)}, name))
                  for name in session.settings.agents]
    synthesis = plan.find("synthesis")
    if synthesis is not None:
        specs.append(("judge", call_spec(session, synthesis, 2, empty_values(session, synthesis))))
    problems = []
    for seat, spec in specs:
        window = session.pool.provider(spec.provider).context_window(spec.model)
        if window is None:
            continue
        text = f"{spec.system}\n{spec.user}"
        if utf8_upper_bound(text) + MESSAGE_OVERHEAD_TOKENS < window:
            continue
        needed = count_tokens(text, spec.model) + MESSAGE_OVERHEAD_TOKENS
        if needed >= window:
            problems.append(
                f"question: too long for {seat} ({spec.provider}/{spec.model}): its prompt is about {needed:,} "
                f"tokens and the model's context window is {window:,}; shorten the question or context, or "
                "choose a model with a larger window"
            )
    if problems:
        raise ConfigError(problems[:1])  # the same cause for every seat on that model: one line says it
