"""The ``@hydra.main`` task and Hydra set-up. Imported only for consultations, never by ``import conclave``."""

from __future__ import annotations

import sys
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig

from conclave.cli.task import name_user_settings as name_given
from conclave.cli.task import record_exit, report_error, run_task, worst_exit  # where the CLI and eval find them
from conclave.compose import CONFIG_MODULE, prepare_hydra, user_config_dir
from conclave.config.settings import settings_from_dictconfig


@hydra.main(config_path=CONFIG_MODULE, config_name="config", version_base="1.3")
def hydra_entry(cfg: DictConfig) -> Any:
    """One consultation per Hydra job. Sync on purpose: Hydra silently skips an ``async def`` task."""
    return run_task(lambda: settings_from_dictconfig(cfg), _task_overrides, sweep_overrides)


def _task_overrides() -> list[str]:
    return [str(o) for o in HydraConfig.get().overrides.task]


def name_user_settings(problems: list[str]) -> list[str]:
    """:func:`conclave.cli.task.name_user_settings` with the overrides of the running Hydra job."""
    return name_given(problems, _task_overrides)


def sweep_overrides() -> dict[str, str]:
    """The values this job of a ``-m`` sweep runs with, for the keys the sweep varies (``{"rounds": "2"}``);
    empty outside a sweep."""
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
