"""The ``@hydra.main`` task and Hydra set-up. Imported only for consultations, never by ``import conclave``."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.plugins import Plugins as HydraPlugins
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import DictConfig

CONFIG_MODULE = "pkg://conclave.conf"


def user_config_dir() -> Path:
    """``$CONCLAVE_HOME/conf``: the user's own panels, modes and settings (``user/settings.yaml``)."""
    from conclave.home import default_home

    return default_home() / "conf"


class ConclavePluginSearchPath(SearchPathPlugin):
    """Adds the user's config dir and every ``register_config_paths`` path to Hydra's search path.

    Done here rather than with ``hydra.searchpath`` in config.yaml because Hydra honours that key only in the
    primary config, which would break ``-cn`` with a config that extends ours.
    """

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from conclave.plugins import get_plugins

        user_dir = user_config_dir()
        if user_dir.is_dir():
            search_path.append(provider="conclave-user", path=f"file://{user_dir}")
        for path in get_plugins().config_paths:
            search_path.append(provider="conclave-plugin", path=path)


@functools.cache
def prepare_hydra() -> None:
    """Register conclave's search-path plugin with Hydra and the ``conclave_home`` resolver (once per process)."""
    from omegaconf import OmegaConf

    from conclave.home import default_home

    HydraPlugins.instance().register(ConclavePluginSearchPath)
    _skip_the_mode_probe()
    if not OmegaConf.has_resolver("conclave_home"):
        # ${conclave_home:} in config.yaml: where a sweep's output goes unless hydra.sweep.dir says otherwise
        OmegaConf.register_new_resolver("conclave_home", lambda: str(default_home()))


def _skip_the_mode_probe() -> None:
    """Spare Hydra's first composition of the config, which it makes only to read ``hydra.mode``.

    Before running, Hydra composes the whole configuration once to read ``hydra.mode`` and then again to run.
    When nothing can set ``hydra.mode`` — no ``hydra.mode`` override, no other primary config (``-cn``/``-cp``/
    ``-cd``), no user or plugin config file that mentions ``hydra`` (the packaged files never set it) — the probe
    can only answer None, so it is answered without composing; otherwise Hydra's own probe runs.
    """
    from hydra._internal.hydra import Hydra

    probe = Hydra.get_mode
    if getattr(probe, "_conclave", False):
        return

    def get_mode(self: Hydra, config_name: str | None, overrides: list[str]) -> Any:
        if _mode_may_be_set(overrides):
            return probe(self, config_name, overrides)
        return None

    get_mode._conclave = True  # type: ignore[attr-defined]
    Hydra.get_mode = get_mode  # type: ignore[method-assign]


_OTHER_CONFIG_FLAGS = ("-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir")


def _mode_may_be_set(overrides: list[str]) -> bool:
    import sys

    from conclave.plugins import get_plugins

    if any(o.lstrip("+~").startswith("hydra.mode") or o.lstrip("+~").startswith("hydra=") for o in overrides):
        return True
    if any(a in _OTHER_CONFIG_FLAGS or a.startswith(tuple(f + "=" for f in _OTHER_CONFIG_FLAGS))
           for a in sys.argv[1:]):
        return True
    if get_plugins().config_paths:
        return True
    user_dir = user_config_dir()
    if user_dir.is_dir():
        for path in user_dir.rglob("*.y*ml"):
            try:
                if "hydra" in path.read_text(encoding="utf-8", errors="replace"):
                    return True
            except OSError:
                return True
    return False


@hydra.main(config_path=CONFIG_MODULE, config_name="config", version_base="1.3")
def hydra_entry(cfg: DictConfig) -> Any:
    """One consultation per Hydra job. Sync on purpose: Hydra silently skips an ``async def`` task."""
    from conclave.config import check_against_plugins, settings_from_dictconfig
    from conclave.errors import ConclaveError, ConfigError
    from conclave.plugins import get_plugins

    try:
        try:
            settings = settings_from_dictconfig(cfg)
            check_against_plugins(settings, get_plugins())
        except ConfigError as exc:
            raise ConfigError(name_user_settings(exc.problems)) from None
        from conclave.engine.entry import run_from_cli
        from conclave.render.console import set_report_context

        set_report_context(settings.home, sweep_overrides())

        code = run_from_cli(settings, subscribers=_offline_notice(settings))
    except ConclaveError as exc:
        # Report here: an exception leaving the task makes Hydra print "Error executing job ..." first.
        # SystemExit passes through Hydra, so a bad value stops a sweep at once with our exit code.
        report_error(exc)
        raise SystemExit(exc.exit_code) from None
    record_exit(code)
    return code


def name_user_settings(problems: list[str]) -> list[str]:
    """Add ``(set in PATH)`` to each problem whose key comes from ``user/settings.yaml`` and not from the command
    line, so a bad value in that file does not look like a bad default."""
    import yaml
    from hydra.core.hydra_config import HydraConfig

    path = user_config_dir() / "user" / "settings.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        given = {o.lstrip("+~").partition("=")[0] for o in HydraConfig.get().overrides.task}
    except (OSError, ValueError, yaml.YAMLError):
        return problems
    named = []
    for line in problems:
        key = line.partition(":")[0]
        node: Any = data
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        inherited = node is not None and key not in given
        named.append(f"{line} (set in {path})" if inherited else line)
    return named


def sweep_overrides() -> dict[str, str]:
    """The values this job of a ``-m`` sweep runs with, for the keys the sweep varies (``{"rounds": "2"}``);
    empty outside a sweep."""
    import sys

    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return {}
    pairs = [o.split("=", 1) for o in HydraConfig.get().overrides.task if "=" in o]
    values = {k.lstrip("+~"): v for k, v in pairs if k.lstrip("+~") != "question"}
    try:
        given = OverridesParser.create().parse_overrides([a for a in sys.argv[1:] if "=" in a])
        swept = {o.key_or_group.lstrip("+~") for o in given if o.is_sweep_override()}
    except Exception:  # an argument the parser rejects: label with every override rather than none
        return values
    return {k: v for k, v in values.items() if k in swept}


_worst_exit = 0

#: set by the CLI when it chose the offline panel for lack of keys; the notice waits for a valid config
offline_notice_pending = False


def _offline_notice(settings: Any) -> list[Any]:
    """A subscriber printing the offline-panel notice once the consultation starts, so a run refused before it
    starts (a seat moved to a provider without a key, a question too long for the model) stays one line."""
    global offline_notice_pending
    if not offline_notice_pending:
        return []
    offline_notice_pending = False

    def notice(event: Any) -> None:
        from conclave.events import CONSULTATION_STARTED

        if event.type == CONSULTATION_STARTED:
            import sys

            from conclave.panel import LOCAL_PANEL_NOTICE

            print(LOCAL_PANEL_NOTICE, file=sys.stderr)

    return [notice]


def record_exit(code: int) -> None:
    """Remember the worst exit code of the jobs run in this process (multirun runs several)."""
    global _worst_exit
    _worst_exit = max(_worst_exit, int(code or 0))


def worst_exit() -> int:
    return _worst_exit


def report_error(exc: BaseException) -> None:
    import sys

    for line in str(exc).splitlines() or [type(exc).__name__]:
        print(f"conclave: {line}", file=sys.stderr)
