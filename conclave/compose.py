"""Hydra composition of ``conclave.conf`` as every door does it — the search path (the user's config dir, the
plugins' config paths), the question quoted so it is never interpolated — and Hydra's errors in one line."""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import re
import string
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import hydra
import yaml
from hydra import compose, initialize_config_module
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.global_hydra import GlobalHydra
from hydra.core.plugins import Plugins as HydraPlugins
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from hydra.plugins.search_path_plugin import SearchPathPlugin
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from conclave.cli.panel import offline_panel_blocked, zero_config_overrides
from conclave.config.home import default_home
from conclave.config.settings import Settings, check_against_plugins, settings_from_dictconfig
from conclave.engine.followup import with_parent
from conclave.errors import ConfigError
from conclave.plugin_manager import get_plugins
from conclave.quoting import SHELL_COMPLETION_HINT, hydra_quote

CONFIG_MODULE = "pkg://conclave.conf"


def user_config_dir() -> Path:
    """``$CONCLAVE_HOME/conf``: the user's own panels, modes and settings (``user/settings.yaml``)."""
    return default_home() / "conf"


class ConclavePluginSearchPath(SearchPathPlugin):
    """Adds the user's config dir and every ``register_config_paths`` path to Hydra's search path.

    Done here rather than with ``hydra.searchpath`` in config.yaml because Hydra honours that key only in the
    primary config, which would break ``-cn`` with a config that extends ours.
    """

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        user_dir = user_config_dir()
        if user_dir.is_dir():
            search_path.append(provider="conclave-user", path=f"file://{user_dir}")
        for path in get_plugins().config_paths:
            search_path.append(provider="conclave-plugin", path=path)


@functools.cache
def prepare_hydra() -> None:
    """Register conclave's search-path plugin with Hydra and the ``conclave_home`` resolver (once per process)."""
    HydraPlugins.instance().register(ConclavePluginSearchPath)
    if not OmegaConf.has_resolver("conclave_home"):
        # ${conclave_home:} in config.yaml: where a sweep's output goes unless hydra.sweep.dir says otherwise
        OmegaConf.register_new_resolver("conclave_home", lambda: str(default_home()))



@contextlib.contextmanager
def conclave_hydra() -> Iterator[Any]:
    """Hydra initialised on ``conclave.conf`` (our search path included) in a clean global instance, restored after:
    another Hydra app (or a test) may own the global one. Yields Hydra's config loader."""
    prepare_hydra()
    backup = get_gh_backup()
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="conclave.conf", version_base="1.3"):
            yield GlobalHydra.instance().config_loader()
    finally:
        restore_gh_from_backup(backup)


def config_groups() -> dict[str, list[str]]:
    """Every config group (``agents``, ``mode``, ``hydra/launcher``, …) and the names of its registered options:
    the packaged ones, the user's ``$CONCLAVE_HOME/conf`` and every plugin's config path."""
    with conclave_hydra() as loader:
        groups: dict[str, list[str]] = {}
        parents = [""]
        while parents:
            parent = parents.pop()
            for name in loader.list_groups(parent):
                path = f"{parent}/{name}" if parent else name
                groups[path] = list(loader.get_group_options(path))
                parents.append(path)
    return groups


def help_text(overrides: Sequence[str]) -> str:
    """``conclave --help``: the ``hydra.help`` template (conf/hydra/help/conclave.yaml) with ``$APP_CONFIG_GROUPS``
    filled in, composed with ``overrides`` (a bad one fails as it would in a run).

    Hydra's own app help lists the groups through a fresh copy of its config repository for every group and
    option kind, its own ``hydra/`` groups included, and renders the whole config it then does not show: about
    0.3 s of CPU. Here each group the help shows is listed once.
    """
    with conclave_hydra() as loader:
        cfg = compose("config", overrides=list(overrides), return_hydra_config=True)
        groups: list[str] = []
        parents = [""]
        while parents:
            parent = parents.pop()
            for name in loader.list_groups(parent):
                path = f"{parent}/{name}" if parent else name
                if path == "hydra":
                    continue
                if options := loader.get_group_options(path):
                    groups.append(f"{path}: {', '.join(sorted(options))}")
                parents.append(path)
    template = string.Template(str(cfg.hydra.help.template))
    return template.safe_substitute(APP_CONFIG_GROUPS="".join(f"{line}\n" for line in sorted(groups)))


def compose_settings(question: str, overrides: Sequence[str] = (), plugins: Any = None) -> Settings:
    """Compose ``conclave.conf`` with ``overrides`` and the question, validate, and check plugin names.

    Raises :class:`conclave.errors.ConfigError` (one line per problem) for an invalid configuration.
    """
    plugins = plugins if plugins is not None else get_plugins()
    panel = zero_config_overrides(list(overrides), os.environ, default_home())
    everything = [*panel, *overrides, "question=" + hydra_quote(question)]
    if missing := offline_panel_blocked(everything):
        raise ConfigError([missing])  # before anything runs: every door stops as the command line does
    try:
        with conclave_hydra():
            cfg = compose("config", overrides=everything)
    except Exception as exc:  # Hydra's composition and override errors: the CLI's one-line form
        message = hydra_error_message(exc)
        if message is None:
            raise
        raise ConfigError([message]) from exc
    settings = with_parent(settings_from_dictconfig(cfg), overrides)
    check_against_plugins(settings, plugins)
    return settings



def hydra_error_message(exc: BaseException) -> str | None:
    """One line for Hydra's composition and override errors, or None when ``exc`` is not one of them."""
    if isinstance(exc, UnicodeDecodeError):  # Hydra reading a config file: it names no file
        return _undecodable_config_message(exc)
    if isinstance(exc, yaml.YAMLError):
        mark = getattr(exc, "problem_mark", None)
        where = f' in "{mark.name}", line {mark.line + 1}, column {mark.column + 1}' if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        return f"invalid YAML{where}: {problem}"

    if isinstance(exc, MissingConfigException):
        text = str(exc)
        match = re.search(r"Could not find '([^/']+)/([^']+)'", text)
        options = sorted(exc.options or [])
        if match:
            group, value = match.groups()
            allowed = ", ".join(options) if options else "(none found)"
            return f"{group}: {value!r} is not one of: {allowed}"
        return text.splitlines()[0]
    if isinstance(exc, OverrideParseException):
        return (f"cannot parse override: {str(exc).splitlines()[0]} "
                "(if this argument is your question, put -- before it)")
    if isinstance(exc, ConfigCompositionException):
        text = str(exc)
        loading = re.match(r"In '([^']+)': \w+ raised while composing config:\n(.*)", text)
        if loading:
            return _config_file_message(*loading.groups())
        match = re.search(r"Could not override '([^']+)'", text) or re.search(
            r"Could not append to config\. An item is already at '([^']+)'", text
        )
        cause = exc.__cause__
        if match:
            key = match.group(1)
            if cause is not None and "not in struct" in str(cause):
                return _unknown_key_message(key, cause)
            detail = str(cause).splitlines()[0] if cause is not None else text.splitlines()[0]
            return f"{key}: {detail}"
        first = text.splitlines()[0]
        if first.startswith(("Ambiguous value for argument", "Sweep parameters")):
            return (f"{first}: a comma makes a list or a sweep — quote the value (key='a,b'), sweep with -m, "
                    "or, if this argument is your question, put -- before it")
        if cause is not None:
            first += f" ({str(cause).splitlines()[0]})"
        return first
    if isinstance(exc, ValueError) and _raised_by_hydra(exc):
        # Hydra's own checks of its flags (-m with --cfg, --shell-completion without a shell, …)
        first = str(exc).splitlines()[0]
        if first.startswith("Only one of"):
            return f"{first}; drop -m to print the configuration of one job"
        if "Expecting one subcommand" in first:
            return SHELL_COMPLETION_HINT
        return first
    if isinstance(exc, OmegaConfBaseException):
        key = getattr(exc, "full_key", None)
        first = str(exc).splitlines()[0]
        return f"{key}: {first}" if key else first
    return None


def _undecodable_config_message(exc: UnicodeDecodeError) -> str | None:
    """One line naming the user's config file that is not UTF-8 text (Hydra's error names no file); None when none
    of theirs is (the error came from elsewhere)."""
    root = user_config_dir()
    for path in sorted(root.rglob("*.yaml")) if root.is_dir() else []:
        try:
            path.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            byte = exc.object[exc.start:exc.start + 1].hex()
            return f"{path}: not UTF-8 text (byte 0x{byte} at offset {exc.start}); save it as UTF-8"
        except OSError:
            continue
    return None


def _config_file_message(name: str, detail: str) -> str:
    """One line for a config file that loaded but cannot be merged, naming the file on disk when it is the user's."""
    path = user_config_dir() / f"{name}.yaml"
    where = str(path) if path.is_file() else f"config {name!r}"
    if "Cannot merge DictConfig with ListConfig" in detail:
        return f"{where}: the file must hold a mapping (key: value lines), not a list"
    return f"{where}: {detail.strip()}"


def _raised_by_hydra(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.startswith(str(Path(hydra.__file__).parent))


#: config nodes that are open mappings: a new entry under them is added with "+" (every other node is closed,
#: and "+" there only moves the same error from Hydra to the validator)
_OPEN_NODES = {
    "agents": "+agents.{name}={{persona: …, provider: …, model: …}}",
    "personas": "+personas.{name}={{name: …, focus: …}}",
    "providers": "+providers.{name}={{api: …, base_url: …}}",
    "mode.options": "+mode.options.{name}=VALUE (if the strategy takes that option)",
}


def _unknown_key_message(key: str, cause: BaseException) -> str:
    """``KEY: unknown key; known keys under PARENT: …`` with the closest known key, or — under an open mapping
    (agents, personas, providers, mode.options) — how to add a new entry."""
    missing = str(getattr(cause, "full_key", "") or key)
    parent, _, name = missing.rpartition(".")
    known = _known_children(cause)
    message = f"{key}: unknown key"
    if known:
        message += f"; known keys{' under ' + parent if parent else ''}: {', '.join(known)}"
    if parent in _OPEN_NODES:
        return message + "; to add one: " + _OPEN_NODES[parent].format(name=name)
    close = difflib.get_close_matches(name, known, n=1)
    return message + (f"; did you mean {'.'.join(filter(None, (parent, close[0])))}?" if close else "")


def _known_children(cause: BaseException) -> list[str]:
    node: Any = getattr(cause, "parent_node", None)
    try:
        return sorted(str(k) for k in node) if node is not None else []
    except Exception:
        return []
