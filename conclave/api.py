"""The library API: ``conclave.consult("question", overrides=[...])`` → :class:`ConsultationResult`.

The configuration is composed exactly as the CLI composes it (Hydra compose API, the same overrides, the
user's ``$CONCLAVE_HOME/conf`` settings), the question is quoted so it is never interpolated, and the engine
runs non-interactively: nothing is ever asked, so an estimate over ``cost.always_allow_under`` is refused
(status ``aborted``) unless ``cost.auto_approve=true`` is among the overrides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from conclave.config import Settings
from conclave.engine.result import ConsultationResult
from conclave.events import Subscriber

__all__ = ["ConsultationResult", "compose_settings", "consult", "consult_async"]


@contextlib.contextmanager
def _conclave_hydra() -> Iterator[Any]:
    """Hydra initialised on ``conclave.conf`` (our search path included) in a clean global instance, restored after:
    another Hydra app (or a test) may own the global one. Yields Hydra's config loader."""
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    from conclave.hydra_app import prepare_hydra

    prepare_hydra()
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="conclave.conf", version_base="1.3"):
            yield GlobalHydra.instance().config_loader()
    finally:
        restore_gh_from_backup(backup)


def config_groups() -> dict[str, list[str]]:
    """Every config group (``agents``, ``mode``, ``hydra/launcher``, …) and the names of its registered options:
    the packaged ones, the user's ``$CONCLAVE_HOME/conf`` and every plugin's config path."""
    with _conclave_hydra() as loader:
        groups: dict[str, list[str]] = {}
        parents = [""]
        while parents:
            parent = parents.pop()
            for name in loader.list_groups(parent):
                path = f"{parent}/{name}" if parent else name
                groups[path] = list(loader.get_group_options(path))
                parents.append(path)
    return groups


def compose_settings(question: str, overrides: Sequence[str] = (), plugins: Any = None) -> Settings:
    """Compose ``conclave.conf`` with ``overrides`` and the question, validate, and check plugin names.

    Raises :class:`conclave.errors.ConfigError` (one line per problem) for an invalid configuration.
    """
    from hydra import compose

    from conclave.cli import _hydra_error_message, hydra_quote
    from conclave.config import check_against_plugins, settings_from_dictconfig
    from conclave.errors import ConfigError
    from conclave.home import default_home
    from conclave.panel import offline_panel_blocked, zero_config_overrides
    from conclave.plugins import get_plugins

    plugins = plugins if plugins is not None else get_plugins()
    panel = zero_config_overrides(list(overrides), os.environ, default_home())
    everything = [*panel, *overrides, "question=" + hydra_quote(question)]
    if missing := offline_panel_blocked(everything):
        raise ConfigError([missing])  # before anything runs: every door stops as the command line does
    try:
        with _conclave_hydra():
            cfg = compose("config", overrides=everything)
    except Exception as exc:  # Hydra's composition and override errors: the CLI's one-line form
        message = _hydra_error_message(exc)
        if message is None:
            raise
        raise ConfigError([message]) from exc
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
