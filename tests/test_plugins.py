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
from conclave.plugin_manager import get_plugins, load_plugins

BUILTIN_ENTRY_POINTS = {"openai", "anthropic", "gemini", "strategies", "filters", "aggregators", "progress"}


def _plugin(**hooks: object) -> types.ModuleType:
    """A plugin module holding the given hook implementations (plugins are modules or other hashable objects)."""
    module = types.ModuleType("inline_plugin")
    for name, fn in hooks.items():
        setattr(module, name, hookimpl(fn))
    return module


def test_hookspecs_are_the_documented_register_hooks() -> None:
    assert all_hook_names() == [
        "register_providers", "register_strategies", "register_filters", "register_aggregators",
        "register_event_subscribers", "register_config_paths", "register_schemas", "register_schema_dialects",
        "register_price_sheets",
    ]


def test_builtins_load_through_the_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONCLAVE_PLUGINS", raising=False)
    names = {info.name for info in load_plugins().info()}
    assert BUILTIN_ENTRY_POINTS <= names


def test_the_process_wide_plugins_follow_conclave_plugins_whoever_asks_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller that asks first under a restricted CONCLAVE_PLUGINS (a test fixture, a provider's error path
    reading key variables) does not leave the restricted set for every later caller."""
    monkeypatch.setenv("CONCLAVE_PLUGINS", "anthropic")
    assert get_plugins().providers.names() == ["anthropic"]
    monkeypatch.delenv("CONCLAVE_PLUGINS")
    assert {"answer", "converge"} <= set(get_plugins().strategies.names())
    assert "openai" in get_plugins().providers.names()


def test_provider_plugins_declare_their_key_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Core knows a key variable only because a provider plugin declares it (``Provider.KEY_VARIABLES``)."""
    class AcmeProvider:
        KEY_VARIABLES = ("ACME_API_KEY",)

    monkeypatch.setenv("CONCLAVE_PLUGINS", "anthropic")
    plugins = load_plugins([("acme", _plugin(register_providers=lambda register: register("acme", AcmeProvider)))])
    assert sorted(plugins.key_variables()) == ["ACME_API_KEY", "ANTHROPIC_API_KEY"]
    monkeypatch.delenv("CONCLAVE_PLUGINS")
    assert {"OPENAI_API_KEY", "XAI_API_KEY", "MISTRAL_API_KEY", "GEMINI_API_KEY",
            "GOOGLE_API_KEY"} <= set(load_plugins().key_variables())


def test_extra_plugin_registers_into_each_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "")
    plugin = _plugin(
        register_providers=lambda register: register("inline-provider", object),
        register_strategies=lambda register: register("inline-strategy", object),
        register_filters=lambda register: register("inline-filter", object),
        register_aggregators=lambda register: register("inline-aggregator", object),
        register_event_subscribers=lambda register: register("inline-sink", lambda settings: None),
        register_config_paths=lambda register: register("pkg://inline.conf"),
        register_schemas=lambda register: register("inline_artifact", {"type": "object"}),
        register_price_sheets=lambda register: register("inline-provider", "inline.yaml"),
        register_schema_dialects=lambda register: register("inline-dialect", dict),
    )
    plugins = load_plugins([("inline", plugin)])
    assert plugins.schema_dialects.names() == ["inline-dialect"]
    assert plugins.providers.names() == ["inline-provider"]
    assert plugins.strategies.names() == ["inline-strategy"]
    assert plugins.filters.names() == ["inline-filter"]
    assert plugins.aggregators.names() == ["inline-aggregator"]
    assert plugins.event_subscribers.names() == ["inline-sink"]
    assert plugins.config_paths == ["pkg://inline.conf"]
    assert plugins.schemas.names() == ["inline_artifact"]
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


def test_a_hook_that_raises_is_reported_naming_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONCLAVE_PLUGINS", "")

    def broken(register: object) -> None:
        raise RuntimeError("cannot reach the licence server")

    with pytest.raises(PluginError) as caught:
        load_plugins([("fine", _plugin(register_filters=lambda register: register("ok", object))),
                      ("shaky", _plugin(register_providers=broken))])
    assert str(caught.value) == ("plugin 'shaky' failed in its register_providers hook: "
                                 "RuntimeError: cannot reach the licence server")


def test_registration_goes_through_pluggy_so_hook_monitoring_sees_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hooks are called through ``pm.hook`` (tracing and monitoring work), one plugin at a time."""
    import pluggy

    from conclave.plugin_manager import Plugins, build_plugin_manager

    monkeypatch.setenv("CONCLAVE_PLUGINS", "")
    pm, dists = build_plugin_manager([("one", _plugin(register_providers=lambda register: register("p1", object))),
                                      ("two", _plugin(register_providers=lambda register: register("p2", object)))])
    seen: list[tuple[str, list[str]]] = []
    pm.add_hookcall_monitoring(lambda name, impls, kwargs: seen.append((name, [i.plugin_name for i in impls])),
                               lambda outcome, name, impls, kwargs: None)
    assert isinstance(pm, pluggy.PluginManager)
    plugins = Plugins(pm, dists)
    assert plugins.providers.names() == ["p1", "p2"] and plugins.providers.owner("p2") == "two"
    assert ("register_providers", ["one"]) in seen and ("register_providers", ["two"]) in seen


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
    assert listed["openai"]["distribution"] == "conclave-council"
    assert listed["openai"]["version"]
    assert "register_providers" in listed["openai"]["hooks"]
    text = run_conclave("plugins", home=tmp_path)
    assert text.returncode == 0
    assert "openai " in text.stdout and "hooks: register_price_sheets, register_providers" in text.stdout


def test_plugins_command_with_none_loaded(tmp_path: Path) -> None:
    proc = run_conclave("plugins", home=tmp_path, env={"CONCLAVE_PLUGINS": ""})
    assert proc.returncode == 0
    assert "no plugins loaded" in proc.stdout


def test_a_plugin_that_fails_to_import_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an installed distribution whose conclave entry point raises on import: the error says which plugin it is
    site = tmp_path / "site"
    info = site / "conclave_broken-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: conclave-broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[conclave]\nbroken = conclave_broken_plugin\n")
    (site / "conclave_broken_plugin.py").write_text("raise RuntimeError('no config here')\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delenv("CONCLAVE_PLUGINS", raising=False)
    with pytest.raises(PluginError, match=r"plugin 'broken' \(conclave_broken_plugin\) failed to load: no config"):
        load_plugins()
    monkeypatch.setenv("CONCLAVE_PLUGINS", "openai")  # blocked by CONCLAVE_PLUGINS: never imported
    assert [info.name for info in load_plugins().info()] == ["openai"]
