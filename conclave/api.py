"""The library API: ``conclave.consult("question", overrides=[...])`` → :class:`ConsultationResult`.

The configuration is composed exactly as the CLI composes it (Hydra compose API, the same overrides, the
user's ``$CONCLAVE_HOME/conf`` settings), the question is quoted so it is never interpolated, and the engine
runs non-interactively: nothing is ever asked, so an estimate over ``cost.always_allow_under`` is refused
(status ``aborted``) unless ``cost.auto_approve=true`` is among the overrides.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable, Sequence
from typing import Any

from conclave.config import Settings
from conclave.engine.result import ConsultationResult
from conclave.events import Subscriber

__all__ = ["ConsultationResult", "compose_settings", "consult", "consult_async"]


def compose_settings(question: str, overrides: Sequence[str] = (), plugins: Any = None) -> Settings:
    """Compose ``conclave.conf`` with ``overrides`` and the question, validate, and check plugin names.

    Raises :class:`conclave.errors.ConfigError` (one line per problem) for an invalid configuration.
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from conclave.cli import hydra_quote
    from conclave.config import check_against_plugins, settings_from_dictconfig
    from conclave.hydra_app import prepare_hydra
    from conclave.plugins import get_plugins

    plugins = plugins if plugins is not None else get_plugins()
    prepare_hydra()
    from conclave.home import default_home
    from conclave.panel import zero_config_overrides

    panel = zero_config_overrides(list(overrides), os.environ, default_home())
    everything = [*panel, *overrides, "question=" + hydra_quote(question)]
    # Another Hydra app (or a test) may own the global instance; compose in a clean one and restore it after.
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="conclave.conf", version_base="1.3"):
            cfg = compose("config", overrides=everything)
    except Exception as exc:  # Hydra's composition and override errors: the CLI's one-line form
        from conclave.cli import _hydra_error_message
        from conclave.errors import ConfigError

        message = _hydra_error_message(exc)
        if message is None:
            raise
        raise ConfigError([message]) from exc
    finally:
        restore_gh_from_backup(backup)
    settings = settings_from_dictconfig(cfg)
    check_against_plugins(settings, plugins)
    return settings


async def consult_async(
    question: str,
    overrides: Sequence[str] = (),
    *,
    subscribers: Iterable[Subscriber] = (),
    plugins: Any = None,
) -> ConsultationResult:
    """Run one consultation in the running event loop; ``subscribers`` receive its events."""
    from conclave.engine.interaction import Interaction
    from conclave.engine.runner import Consultation
    from conclave.plugins import get_plugins

    plugins = plugins if plugins is not None else get_plugins()
    settings = compose_settings(question, overrides, plugins)
    from conclave.store.recorder import Recorder

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
