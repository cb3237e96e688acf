"""Hook implementations: everything this plugin contributes to conclave."""

from __future__ import annotations

from importlib import resources

from conclave import hookimpl
from conclave_example_plugin.filters import KeepAllFilter
from conclave_example_plugin.provider import EchoProvider
from conclave_example_plugin.strategy import DevilsAdvocateStrategy, GauntletStrategy


@hookimpl
def register_providers(register):
    register("echo", EchoProvider)


@hookimpl
def register_strategies(register):
    register("devil", DevilsAdvocateStrategy)
    register("gauntlet", GauntletStrategy)


@hookimpl
def register_price_sheets(register):
    register("echo", resources.files("conclave_example_plugin").joinpath("pricing", "echo.yaml"))


@hookimpl
def register_filters(register):
    register("keep_all", KeepAllFilter)


@hookimpl
def register_config_paths(register):
    # conf/mode/devil.yaml -> `mode=devil`; conf/agents/echo_panel.yaml -> `agents=echo_panel`
    register("pkg://conclave_example_plugin.conf")
