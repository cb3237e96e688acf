"""The plugin manager: entry points, registries, clashes, CONCLAVE_PLUGINS, and `conclave plugins`."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from cli_helpers import run_conclave

from conclave import hookimpl
from conclave.errors import PluginError
from conclave.hookspecs import all_hook_names
from conclave.plugins import load_plugins

BUILTIN_ENTRY_POINTS = {"openai", "anthropic", "gemini", "strategies", "filters", "progress"}


def _plugin(**hooks: object) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{name: hookimpl(fn) for name, fn in hooks.items()})


def test_hookspecs_are_the_documented_register_hooks() -> None:
    assert all_hook_names() == [
        "register_providers", "register_strategies", "register_filters",
        "register_event_subscribers", "register_config_paths",
    ]


def test_builtins_load_through_the_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONCLAVE_PLUGINS", raising=False)
    names = {info.name for info in load_plugins().info()}
    assert BUILTIN_ENTRY_POINTS <= names


def test_extra_plugin_registers_into_each_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "")
    plugin = _plugin(
        register_providers=lambda register: register("inline-provider", object),
        register_strategies=lambda register: register("inline-strategy", object),
        register_filters=lambda register: register("inline-filter", object),
        register_event_subscribers=lambda register: register("inline-sink", lambda settings: None),
        register_config_paths=lambda register: register("pkg://inline.conf"),
    )
    plugins = load_plugins([("inline", plugin)])
    assert plugins.providers.names() == ["inline-provider"]
    assert plugins.strategies.names() == ["inline-strategy"]
    assert plugins.filters.names() == ["inline-filter"]
    assert plugins.event_subscribers.names() == ["inline-sink"]
    assert plugins.config_paths == ["pkg://inline.conf"]
    [info] = plugins.info()
    assert info.name == "inline"
    assert info.hooks == sorted(all_hook_names())
    assert info.registered["providers"] == ["inline-provider"]


def test_name_clash_names_both_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "")
    first = _plugin(register_providers=lambda register: register("dup", object))
    second = _plugin(register_providers=lambda register: register("dup", object))
    with pytest.raises(PluginError, match="'dup' is registered by both plugin 'first' and plugin 'second'"):
        load_plugins([("first", first), ("second", second)])


def test_unknown_hook_is_rejected_naming_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "")
    typo = _plugin(register_provider=lambda register: None)
    with pytest.raises(PluginError, match="plugin 'typo' implements an unknown hook"):
        load_plugins([("typo", typo)])


def test_conclave_plugins_env_restricts_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "filters, progress")
    assert {info.name for info in load_plugins().info()} == {"filters", "progress"}
    monkeypatch.setenv("CONCLAVE_PLUGINS", "")
    assert load_plugins().info() == []


def test_plugins_command_lists_versions_and_hooks(tmp_path: Path) -> None:
    proc = run_conclave("plugins", "--json", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    listed = {p["name"]: p for p in json.loads(proc.stdout)}
    assert BUILTIN_ENTRY_POINTS <= set(listed)
    assert listed["openai"]["distribution"] == "conclave"
    assert listed["openai"]["version"]
    assert "register_providers" in listed["openai"]["hooks"]
    text = run_conclave("plugins", home=tmp_path)
    assert text.returncode == 0
    assert "openai " in text.stdout and "hooks: register_providers" in text.stdout


def test_plugins_command_with_none_loaded(tmp_path: Path) -> None:
    proc = run_conclave("plugins", home=tmp_path, env={"CONCLAVE_PLUGINS": ""})
    assert proc.returncode == 0
    assert "no plugins loaded" in proc.stdout
