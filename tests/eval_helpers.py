"""Run `conclave eval` in process against the fake server with a scripted answer panel."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conclave.engine.interaction import Interaction
from conclave.eval.evaluate import EvalOptions, EvalRun, prepare, run_async
from conclave.plugin_manager import get_plugins
from conclave.testing.answer_panel import AnswerPanel
from conclave.testing.fake_server import FakeProviderServer

PERSONAS = {"alpha": "Alpha", "beta": "Beta", "gamma": "Gamma"}


def panel_settings(fake: FakeProviderServer, home: Path, *, rounds: int = 4, **extra: Any) -> Any:
    return fake.settings(
        question="eval",
        agents={key: {"persona": key, "provider": "openai", "model": "gpt-4o"} for key in PERSONAS},
        personas={key: {"name": name, "focus": "arithmetic"} for key, name in PERSONAS.items()},
        judge={"provider": "openai", "model": "gpt-4.1"},
        mode={"strategy": "answer"},
        rounds=rounds,
        home=str(home),
        hedging={"enabled": False},
        **extra,
    )


async def evaluate(fake: FakeProviderServer, home: Path, panel: AnswerPanel | None, *, rounds: int = 4,
                   settings_extra: dict[str, Any] | None = None, **options: Any) -> tuple[EvalRun, int, str, str]:
    """``panel`` is installed on ``fake`` first (None: the fake is already scripted)."""
    if panel is not None:
        panel.install(fake)
    settings = panel_settings(fake, home, rounds=rounds, **(settings_extra or {"cost": {"auto_approve": True}}))
    plugins = get_plugins()
    evaluation = prepare(settings, EvalOptions(**options), plugins)
    out, err = io.StringIO(), io.StringIO()
    code = await run_async(evaluation, plugins, Interaction.non_interactive(), out=out, err=err)
    return evaluation, code, out.getvalue(), err.getvalue()


@dataclass
class EvalRuns:
    home: Path
    sweep_id: str
    sweep_runs: list[str]
    lone_run: str


def record_eval_runs(home: Path) -> EvalRuns:
    """The runs of the ``eval_home`` fixture: the lone run first, then the sweep (the latest)."""
    import asyncio

    async def record() -> EvalRuns:
        async with FakeProviderServer() as fake:
            lone, _, _, _ = await evaluate(fake, home, AnswerPanel({n: 0.7 for n in PERSONAS.values()}), rounds=2,
                                           n=3, quality="off")
            runs = []
            for seed, p in ((1, 0.45), (2, 0.8)):
                ev, _, _, _ = await evaluate(fake, home, AnswerPanel({n: p for n in PERSONAS.values()}, seed=seed),
                                             n=5, seed=seed, sweep_id="sw-chart", overrides=[f"eval.seed={seed}"],
                                             quality={"quality.state_tokens": 500})
                runs.append(ev.run_id)
            return EvalRuns(home, "sw-chart", runs, lone.run_id)

    return asyncio.run(record())
