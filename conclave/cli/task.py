"""One consultation from a composed configuration: what the Hydra task does, without importing Hydra.

Called by Hydra's task (:func:`conclave.cli.hydra_app.hydra_entry`) with the composed configuration.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from conclave.cli.panel import LOCAL_PANEL_NOTICE
from conclave.config.home import default_home
from conclave.config.settings import check_against_plugins
from conclave.engine.followup import with_parent
from conclave.errors import ConclaveError, ConfigError
from conclave.events import CONSULTATION_STARTED
from conclave.plugin_manager import get_plugins

_worst_exit = 0

#: set by the CLI when it chose the offline panel for lack of keys; the notice waits for a valid config
offline_notice_pending = False


def run_task(make_settings: Callable[[], Any], given_overrides: Callable[[], Sequence[str]],
             sweep: Callable[[], dict[str, str]] = dict) -> int:
    """Validate the configuration ``make_settings`` builds, run the consultation, return its exit code.

    A configuration error names the user's settings file when the key comes from it and not from
    ``given_overrides`` (the command line). A :class:`~conclave.errors.ConclaveError` is reported here in one
    line and ends the process with its exit code (``SystemExit``: it passes through Hydra, so a bad value stops a
    sweep at once)."""
    try:
        try:
            settings = make_settings()
        except ConfigError as exc:
            raise ConfigError(name_user_settings(exc.problems, given_overrides)) from None
        settings = with_parent(settings, given_overrides())  # a follow-up keeps its parent's panel and mode
        try:
            check_against_plugins(settings, get_plugins())
        except ConfigError as exc:
            raise ConfigError(name_user_settings(exc.problems, given_overrides)) from None
        from conclave.engine.entry import run_from_cli
        from conclave.render.console import set_report_context

        set_report_context(settings.home, sweep())

        code = run_from_cli(settings, subscribers=_offline_notice(settings))
    except ConclaveError as exc:
        # Report here: an exception leaving Hydra's task makes Hydra print "Error executing job ..." first.
        report_error(exc)
        raise SystemExit(exc.exit_code) from None
    record_exit(code)
    return int(code or 0)


def name_user_settings(problems: list[str], given_overrides: Callable[[], Sequence[str]]) -> list[str]:
    """Add ``(set in PATH)`` to each problem whose key comes from ``user/settings.yaml`` and not from the command
    line, so a bad value in that file does not look like a bad default."""
    path = default_home() / "conf" / "user" / "settings.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        given = {o.lstrip("+~").partition("=")[0] for o in given_overrides()}
    except (OSError, ValueError, yaml.YAMLError):
        return problems
    if data is not None and not isinstance(data, dict):
        # a lone value ("just a string") is read as a key of that name: not a problem with the key, but the file's
        return [f"{path}: the file must hold a mapping (key: value lines), not a single value"] + [
            line for line in problems if line.partition(":")[0] in given]
    named = []
    for line in problems:
        key = line.partition(":")[0]
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        inherited = node is not None and key not in given
        named.append(f"{line} (set in {path})" if inherited else line)
    return named


def _offline_notice(settings: Any) -> list[Any]:
    """A subscriber printing the offline-panel notice once the consultation starts, so a run refused before it
    starts (a seat moved to a provider without a key, a question too long for the model) stays one line."""
    global offline_notice_pending
    if not offline_notice_pending:
        return []
    offline_notice_pending = False

    def notice(event: Any) -> None:
        if event.type == CONSULTATION_STARTED:
            print(LOCAL_PANEL_NOTICE, file=sys.stderr)

    return [notice]


def record_exit(code: int) -> None:
    """Remember the worst exit code of the jobs run in this process (multirun runs several)."""
    global _worst_exit
    _worst_exit = max(_worst_exit, int(code or 0))


def worst_exit() -> int:
    return _worst_exit


def report_error(exc: BaseException) -> None:
    for line in str(exc).splitlines() or [type(exc).__name__]:
        print(f"conclave: {line}", file=sys.stderr)
