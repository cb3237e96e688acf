"""``conclave doctor [--json] [--probe] [--timeout S] [overrides…]``: would a consultation call succeed?

Per provider: key present (never its value), endpoint reachable, the panel's models known (from the API's models
list). Then, per model the panel uses, one tiny structured-output call asked exactly as a consultation asks for an
artifact, which reports the structured-output form the endpoint accepts: made without asking for free endpoints (a
server on this machine or the local network that gets no key, the in-process ``local`` model), and for paid ones
only with ``--probe`` (the table says what it would cost). Takes the same Hydra overrides as a consultation, e.g.
``providers.openai.base_url=http://localhost:11434/v1`` or ``agents=local``. The panel checked is the one a
consultation with the same overrides would run, chosen from the keys present as on the CLI (no key at all: the
offline ``local`` panel). Exit 0 when every provider that panel (agents and judge) uses is usable, 1 when one is not,
2 on a configuration error. A provider the panel does not use and that has no key is reported as "not configured",
never as a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from hydra import compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from conclave.cli.commands.arguments import CommandParser, positive_seconds
from conclave.cli.panel import zero_config_overrides
from conclave.cli.task import name_user_settings
from conclave.compose import hydra_error_message, prepare_hydra
from conclave.config.home import default_home
from conclave.config.settings import Settings, check_against_plugins, settings_from_dictconfig
from conclave.errors import ConfigError
from conclave.plugin_manager import Plugins, get_plugins
from conclave.providers.pool import ProviderPool
from conclave.providers.probe import CallCheck, ProbeResult

CONFIG_MODULE = "conclave.conf"


def run(argv: list[str]) -> int:
    parser = CommandParser(prog="conclave doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout", type=positive_seconds, default=10.0, metavar="S",
                        help="seconds to wait for each endpoint's models list (default 10)")
    parser.add_argument("--probe", action="store_true",
                        help="also make the structured-output test call on paid endpoints (it is billed)")
    parser.add_argument("--call-timeout", type=positive_seconds, default=None, metavar="S",
                        help="seconds for each test call (default: the provider's timeout_s)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for a consultation")
    args = parser.parse_args(argv)
    settings = compose_settings(args.overrides)
    plugins = get_plugins()
    check_against_plugins(settings, plugins)
    used = panel_models(settings)
    results = asyncio.run(probe_all(settings, plugins, used, args.timeout, paid_calls=args.probe,
                                    call_timeout_s=args.call_timeout))
    ok = all(r.usable for r in results if r.provider in used)
    if args.json:
        report = {
            "ok": ok,
            "used": sorted(used),
            "call_tested": all(r.call_tested for r in results if r.provider in used),
            "providers": [{**r.as_dict(), "used": r.provider in used, "status": status(r, used)} for r in results],
        }
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(results, used, ok)
    return 0 if ok else 1


def compose_settings(overrides: list[str]) -> Settings:
    """Compose ``config`` with Hydra's compose API (plugins' config paths included) and validate it.

    The question is irrelevant here, so ``question=doctor`` is supplied unless an override sets one.
    """
    prepare_hydra()
    # the panel a consultation would run: picked from the keys present when the overrides pick none
    overrides = [*zero_config_overrides(overrides, os.environ, default_home()), *overrides]
    if not any(o.lstrip("+~").partition("=")[0] == "question" for o in overrides):
        overrides = [*overrides, "question=doctor"]
    try:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
            cfg = compose("config", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError([hydra_error_message(exc) or str(exc).splitlines()[0]]) from None
    except Exception as exc:  # a user config file that does not load (not UTF-8, not YAML)
        message = hydra_error_message(exc)
        if message is None:
            raise
        raise ConfigError([message]) from None
    try:
        return settings_from_dictconfig(cfg)
    except ConfigError as exc:  # a bad value from the user's settings file says it comes from there
        raise ConfigError(name_user_settings(exc.problems, lambda: overrides)) from None


def panel_models(settings: Settings) -> dict[str, set[str]]:
    """Provider -> the models the agents and the judge use on it."""
    used: dict[str, set[str]] = {}
    for agent in settings.agents.values():
        used.setdefault(agent.provider, set()).add(agent.model)
    used.setdefault(settings.judge.provider, set()).add(settings.judge.model)
    return used


async def probe_all(settings: Settings, plugins: Plugins, used: dict[str, set[str]], timeout_s: float, *,
                    paid_calls: bool = False, call_timeout_s: float | None = None) -> list[ProbeResult]:
    """Probe every configured provider (and bare registered ones the panel names) concurrently; then make the
    structured-output test call for each model the panel uses (free endpoints always, paid ones if
    ``paid_calls``), or price it."""
    names = sorted(set(settings.providers) | set(used))
    async with ProviderPool(settings, plugins) as pool:
        results = list(await asyncio.gather(
            *(pool.probe(name, sorted(used.get(name, ())), timeout_s=timeout_s) for name in names)
        ))

        async def check(result: ProbeResult, model: str) -> None:
            if not result.usable or result.models.get(model) is False:
                return  # the cheap checks already failed: a call would only fail the same way
            if result.free or paid_calls:
                budget = call_timeout_s or pool.provider(result.provider).settings.timeout_s
                result.calls[model] = await pool.test_call(result.provider, model, timeout_s=budget)
            else:
                result.calls[model] = CallCheck(tested=False,
                                                estimated_cost=pool.test_call_estimate(result.provider, model))

        await asyncio.gather(*(check(r, m) for r in results for m in sorted(used.get(r.provider, ()))))
        return results


def status(result: ProbeResult, used: dict[str, set[str]]) -> str:
    """``ok``, ``FAIL`` (used by the panel and not usable), ``warn`` (not used, configured, not usable) or
    ``not configured`` (not used and without the key it needs: nothing to check, nothing wrong)."""
    if result.usable:
        return "ok"
    if result.provider in used:
        return "FAIL"
    return "not configured" if result.key_required and not result.key_present else "warn"


def print_table(results: list[ProbeResult], used: dict[str, set[str]], ok: bool) -> None:
    rows = [("", "provider", "used", "key", "endpoint", "reachable", "models", "structured output")]
    notes: dict[int, list[str]] = {}
    for result in results:
        in_use = result.provider in used
        mark = status(result, used)
        if mark == "not configured":
            rows.append(("-", result.provider, "no", "not configured", result.endpoint or "-", "-", "-", "-"))
            continue
        rows.append((mark, result.provider, "yes" if in_use else "no", _key_cell(result), result.endpoint or "-",
                     _reach_cell(result), _models_cell(result), _calls_cell(result)))
        if result.problems():
            notes[len(rows) - 1] = result.problems()
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for index, row in enumerate(rows):
        print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        for note in notes.get(index, []):
            print(f"{'':{widths[0]}}    {note}")
    failing = sorted(r.provider for r in results if r.provider in used and not r.usable)
    untested = sorted(r.provider for r in results if r.provider in used and r.usable and not r.call_tested)
    if ok and not untested:
        print("\nevery provider the panel uses is ready: a test call returned a valid structured answer")
    elif ok:
        print(f"\nthe panel's providers passed every free check; not call-tested: {', '.join(untested)} "
              "(run conclave doctor --probe to make the test call, at the cost shown)")
    else:
        print(f"\nnot usable but used by the panel: {', '.join(failing)}")


def _key_cell(result: ProbeResult) -> str:
    if result.key_source:
        return result.key_source
    if result.key_required:
        return f"missing ({' or '.join(result.key_env)})"
    return "not needed"


def _reach_cell(result: ProbeResult) -> str:
    if result.reachable is None:
        return "not checked"
    if not result.reachable:
        return "no"
    return f"yes ({result.latency_s * 1000:.0f} ms)" if result.latency_s is not None else "yes"


def _models_cell(result: ProbeResult) -> str:
    marks: dict[Any, str] = {True: "✓", False: "✗ unknown", None: "?"}
    cells = [f"{model} {marks[known]}" for model, known in result.models.items()]
    if result.models_listed is not None:
        cells.append(f"({result.models_listed} listed)")
    return ", ".join(cells) or "-"


def _calls_cell(result: ProbeResult) -> str:
    cells = []
    for model, check in sorted(result.calls.items()):
        if not check.tested:
            cost = f"≈ ${check.estimated_cost:.5f}" if check.estimated_cost is not None else "cost unknown"
            cells.append(f"{model}: not tested (--probe, {cost})")
        elif check.ok:
            cells.append(f"{model}: {check.form or 'ok'} ✓ ({(check.latency_s or 0):.1f}s)")
        else:
            cells.append(f"{model}: ✗")
    return ", ".join(cells) or "-"
