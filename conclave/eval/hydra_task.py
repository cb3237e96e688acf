"""The ``@hydra.main`` task of ``conclave eval``: one evaluation run per Hydra job (a sweep runs one per value).

Sync on purpose (Hydra silently skips an ``async def`` task). Importable by reference, so Hydra's joblib, Ray and
submitit launchers can run it in their own worker processes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from conclave.cli.hydra_app import record_exit, report_error
from conclave.compose import CONFIG_MODULE
from conclave.config.settings import check_against_plugins, settings_from_dictconfig
from conclave.engine.interaction import Interaction
from conclave.errors import ConclaveError
from conclave.eval import evaluate as runner
from conclave.plugin_manager import get_plugins

#: what the jobs of a sweep's estimating pass found, in job order: (settings, estimate, items to run); the pass runs
#: its jobs in this process (the basic launcher), so the parent reads them here
ESTIMATES: list[tuple[Any, Any, int]] = []


@hydra.main(config_path=CONFIG_MODULE, config_name="config", version_base="1.3")
def eval_entry(cfg: DictConfig) -> Any:
    try:
        # resolved while the eval section is still there, so e.g. home=…/${eval.sweep_id}/job-${hydra:job.num} works
        OmegaConf.resolve(cfg)
        with open_dict(cfg):
            section = cfg.pop("eval", None)
        data: dict[str, Any] = {}
        if section is not None:
            data = {str(k): v for k, v in OmegaConf.to_container(section, resolve=True).items()}  # type: ignore[union-attr]
        overrides = [str(o) for o in HydraConfig.get().overrides.task]
        options = runner.options_from({**data, "overrides": overrides})
        plugins = get_plugins()
        settings = settings_from_dictconfig(cfg)
        check_against_plugins(settings, plugins)
        evaluation = runner.prepare(settings, options, plugins)
        if options.estimate_only:
            estimate = asyncio.run(runner.estimate_run(evaluation.settings, evaluation.items, plugins, evaluation))
            ESTIMATES.append((evaluation.settings, estimate, len(evaluation.items)))
            record_exit(0)
            return 0
        interaction = Interaction.from_terminal() if options.sweep_id is None else Interaction.non_interactive()
        code = runner.run(evaluation, plugins, interaction, quiet=options.sweep_id is not None)
    except ConclaveError as exc:
        report_error(exc)
        code = exc.exit_code
        evaluation = None
    record_exit(code)
    if evaluation is not None and evaluation.options.objective and evaluation.summary is not None:
        return runner.objective(evaluation)  # what a sweeper such as optuna maximises
    return code
