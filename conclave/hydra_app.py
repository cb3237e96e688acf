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

from conclave.task import record_exit, report_error, worst_exit  # where the CLI and eval find them

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
    if not OmegaConf.has_resolver("conclave_home"):
        # ${conclave_home:} in config.yaml: where a sweep's output goes unless hydra.sweep.dir says otherwise
        OmegaConf.register_new_resolver("conclave_home", lambda: str(default_home()))


@hydra.main(config_path=CONFIG_MODULE, config_name="config", version_base="1.3")
def hydra_entry(cfg: DictConfig) -> Any:
    """One consultation per Hydra job. Sync on purpose: Hydra silently skips an ``async def`` task."""
    from conclave.config import settings_from_dictconfig
    from conclave.task import run_task

    return run_task(lambda: settings_from_dictconfig(cfg), _task_overrides, sweep_overrides)


def _task_overrides() -> list[str]:
    from hydra.core.hydra_config import HydraConfig

    return [str(o) for o in HydraConfig.get().overrides.task]


def name_user_settings(problems: list[str]) -> list[str]:
    """:func:`conclave.task.name_user_settings` with the overrides of the running Hydra job."""
    from conclave.task import name_user_settings as name

    return name(problems, _task_overrides)


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


__all__ = ["CONFIG_MODULE", "hydra_entry", "prepare_hydra", "record_exit", "report_error", "sweep_overrides",
           "user_config_dir", "worst_exit"]
