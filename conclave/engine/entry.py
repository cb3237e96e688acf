"""Bridge from the Hydra task to the engine: run one consultation, print its result, return the exit code.

Exit codes: 0 complete or completed_degraded, 1 partial / aborted / cost refused, 130 interrupted (the partial
result is still printed). stdout carries the result only; messages go to stderr.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterable
from typing import Any

from conclave.config.settings import Settings
from conclave.doors.web.serving import run_watched
from conclave.engine.interaction import Interaction
from conclave.engine.run import Consultation
from conclave.events import Subscriber
from conclave.plugin_manager import get_plugins
from conclave.render.console import print_result
from conclave.signals import termination_as_interrupt
from conclave.store.recorder import Recorder

EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 130


def subscribers_for(settings: Settings, plugins: Any) -> list[Subscriber]:
    """Instantiate every registered event-subscriber factory for this consultation (``None`` opts out)."""
    subscribers = []
    for _, factory in plugins.event_subscribers.items():
        subscriber = factory(settings)
        if subscriber is not None:
            subscribers.append(subscriber)
    return subscribers


def run_from_cli(settings: Settings, *, recorder: Any = None, verb: str = "started",
                 subscribers: Iterable[Subscriber] = (), **resume: Any) -> int:
    """Run one consultation, journaled, print its result and return the exit code.

    ``recorder`` defaults to a :class:`~conclave.store.recorder.Recorder` on ``settings.home`` (closed here);
    ``subscribers`` receive the events before the plugins' subscribers do; ``resume`` carries ``resume_from``,
    ``consultation_id`` and ``first_seq`` for ``conclave resume``.
    """
    plugins = get_plugins()
    owned = recorder is None
    # the index is written once round 1 is under way: SQLite is no part of the path to the first request
    recorder = Recorder(settings.home, defer_index=True) if owned else recorder
    consultation = Consultation(
        settings,
        plugins=plugins,
        interaction=Interaction.from_terminal(),
        subscribers=[*subscribers, *subscribers_for(settings, plugins)],
        recorder=recorder,
        stream=settings.live,
        **resume,
    )
    try:
        with termination_as_interrupt():  # SIGTERM and SIGHUP end it as Ctrl-C does
            if settings.live:
                result = asyncio.run(run_watched(consultation, settings.home, settings.live_port))
            else:
                result = asyncio.run(consultation.run())
    except KeyboardInterrupt:
        print("conclave: interrupted", file=sys.stderr)
        if consultation.result is not None:
            print_result(consultation.result.as_dict(), settings.output.format, sys.stdout)
        return EXIT_INTERRUPTED
    finally:
        if owned:
            recorder.close()
    if consultation.refusal is not None:
        print(f"conclave: consultation not {verb}: {consultation.refusal}", file=sys.stderr)
        return EXIT_FAILED
    print_result(result.as_dict(), settings.output.format, sys.stdout)
    if not result.ok:
        print(f"conclave: consultation {result.status}: {result.abort_reason}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
