"""The library API: ``conclave.consult("question", overrides=[...])`` → :class:`ConsultationResult`.

The configuration is composed exactly as the CLI composes it (Hydra compose API, the same overrides, the
user's ``$CONCLAVE_HOME/conf`` settings), the question is quoted so it is never interpolated, and the engine
runs non-interactively: nothing is ever asked, so an estimate over ``cost.always_allow_under`` is refused
(status ``aborted``) unless ``cost.auto_approve=true`` is among the overrides.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

from conclave.compose import compose_settings, config_groups
from conclave.engine.interaction import Interaction
from conclave.engine.result import ConsultationResult
from conclave.engine.run import Consultation
from conclave.events import Subscriber
from conclave.plugin_manager import get_plugins
from conclave.store.recorder import Recorder

__all__ = ["ConsultationResult", "compose_settings", "config_groups", "consult", "consult_async"]


async def consult_async(
    question: str,
    overrides: Sequence[str] = (),
    *,
    subscribers: Iterable[Subscriber] = (),
    plugins: Any = None,
) -> ConsultationResult:
    """Run one consultation in the running event loop; ``subscribers`` receive its events."""
    plugins = plugins if plugins is not None else get_plugins()
    settings = compose_settings(question, overrides, plugins)

    recorder = Recorder(settings.home)  # library runs are journaled and indexed like CLI runs
    try:
        consultation = Consultation(
            settings, plugins=plugins, interaction=Interaction.non_interactive(), subscribers=subscribers,
            recorder=recorder,
        )
        return await consultation.run()
    finally:
        recorder.close()


def consult(
    question: str,
    overrides: Sequence[str] = (),
    *,
    subscribers: Iterable[Subscriber] = (),
    plugins: Any = None,
) -> ConsultationResult:
    """Run one consultation to its end and return the result (blocking; use :func:`consult_async` in a loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(consult_async(question, overrides, subscribers=subscribers, plugins=plugins))
    raise RuntimeError("conclave.consult() cannot run inside an event loop; await conclave.consult_async() instead")
