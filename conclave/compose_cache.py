"""The composed configuration of a consultation, remembered so that running it again skips Hydra.

Importing Hydra and composing ``conclave.conf`` (defaults list, ~25 YAML files, overrides) is most of what a
``conclave "question"`` process does before its first provider request. The composition is a pure function of
the override list and the files on the search path, so a run that Hydra composed stores the result, unresolved,
in ``$CONCLAVE_HOME/cache/compose/``, and a later run with the same overrides (the question aside) reads it back
instead — when every input of the composition is provably the same:

- the key covers the overrides (without the question), the path, size and mtime of every file under the packaged
  config, the user's config dir (``$CONCLAVE_HOME/conf``) and Hydra's plugin packages, and the versions of Hydra,
  OmegaConf and conclave;
- only plain runs use it: no flag (``-m``, ``--cfg``, ``-cn`` …), no override of a ``hydra`` key or group, no user
  config file mentioning ``hydra``, no plugin config path (see :func:`eligible`);
- the question is the one value that differs between runs: it is left out of the stored config and set, as the
  exact text Hydra would have parsed back from its quoted override, after reading;
- interpolations are stored unresolved and resolved at every run as OmegaConf would; a config holding anything
  but whole-value ``${oc.env:NAME}`` / ``${oc.env:NAME,default}`` interpolations (a ``null`` or plain-word
  default), a missing (``???``) value other
  than the question, or non-string mapping keys is not stored (it always goes through Hydra);
- the logging configuration Hydra applies (``hydra.hydra_logging``, then ``hydra.job_logging``) is stored with it
  and applied the same way; a config with ``hydra.verbose``, ``hydra.job.env_set``, ``hydra.job.chdir`` or
  ``hydra.output_subdir`` set, callbacks, or a run dir other than ``.`` is not stored.

A damaged or unreadable cache file is a miss. At most :data:`MAX_ENTRIES` files are kept (oldest removed).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from conclave.startup_cache import digest, write_entry

#: bumped whenever what is stored, or how it is read, changes
FORMAT = 1
MAX_ENTRIES = 32

#: a whole value ``${oc.env:NAME}``, ``${oc.env:NAME,null}`` or ``${oc.env:NAME,default}`` with a default OmegaConf's
#: grammar reads as that very string (letters first; no quotes, spaces, escapes, nesting; not a bool/float word)
_ENV_ONLY = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,(null|(?!(?i:true|false|null|inf|nan)\})"
                       r"[A-Za-z_][A-Za-z0-9_:/.\-]*))?\}")


def eligible(flags: Iterable[str], overrides: Iterable[str]) -> bool:
    """Whether a run with these Hydra ``flags`` and ``overrides`` may use (and fill) the cache. Plugin config paths
    and user config files that mention ``hydra`` are checked by :func:`load` and :func:`store` themselves."""
    if list(flags):
        return False
    return not any(o.lstrip("+~").startswith("hydra") for o in overrides)


def cache_dir(home: Path) -> Path:
    return home / "cache" / "compose"


def _files_under(root: Path) -> list[tuple[str, int, int]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append((path, st.st_mtime_ns, st.st_size))
    return out


def _package_dirs(name: str) -> list[str]:
    import importlib.util

    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    return sorted(spec.submodule_search_locations or ([os.path.dirname(spec.origin)] if spec.origin else []))


def _version_stamp(package: str) -> list[Any]:
    """Stat of the package's ``__init__.py`` (an upgrade replaces it) — no import, no metadata scan."""
    stamps: list[Any] = []
    for directory in _package_dirs(package):
        init = os.path.join(directory, "__init__.py")
        try:
            st = os.stat(init)
        except OSError:
            stamps.append([init, None])
            continue
        stamps.append([init, st.st_mtime_ns, st.st_size])
    return stamps


def user_config_mentions_hydra(home: Path) -> bool:
    """True when a file in the user's config dir mentions ``hydra`` (it may set Hydra's own keys)."""
    user_dir = home / "conf"
    if not user_dir.is_dir():
        return False
    for path in user_dir.rglob("*.y*ml"):
        try:
            if "hydra" in path.read_text(encoding="utf-8", errors="replace"):
                return True
        except OSError:
            return True
    return False


def cache_key(home: Path, overrides: list[str]) -> str:
    """A digest of everything composition reads: overrides, search-path files, Hydra plugins, versions."""
    from conclave import __version__

    inputs: dict[str, Any] = {
        "format": FORMAT,
        "python": sys.version,
        "conclave": __version__,
        "overrides": overrides,
        "conf": [_files_under(Path(d)) for d in _package_dirs("conclave.conf")],
        "user": _files_under(home / "conf") if (home / "conf").is_dir() else None,
        "hydra_plugins": [_files_under(Path(d)) for d in _package_dirs("hydra_plugins")],
        "hydra": _version_stamp("hydra"),
        "omegaconf": _version_stamp("omegaconf"),
    }
    return digest(inputs)


def _cacheable_values(node: Any, path: str = "") -> bool:
    if isinstance(node, dict):
        return all(isinstance(k, str) and _cacheable_values(v, f"{path}.{k}" if path else k) for k, v in node.items())
    if isinstance(node, list):
        return all(_cacheable_values(v, path) for v in node)
    if isinstance(node, str):
        if node == "???":
            return False
        if "${" in node:
            return _ENV_ONLY.fullmatch(node) is not None
        return True
    return node is None or isinstance(node, bool | int | float)


def _resolve(node: Any, environ: Mapping[str, str]) -> Any:
    """Resolve the interpolations :func:`_cacheable_values` allows, exactly as OmegaConf's ``oc.env`` does: the
    variable's value when it is set (even empty), else the default (``null`` -> None); no default -> KeyError."""
    if isinstance(node, dict):
        return {k: _resolve(v, environ) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, environ) for v in node]
    if isinstance(node, str):
        match = _ENV_ONLY.fullmatch(node)
        if match:
            name, default = match.groups()
            if name in environ:
                return environ[name]
            if default is None:
                raise KeyError(name)
            return None if default == "null" else default
    return node


def store(home: Path, key: str, task_cfg: Any, hydra_cfg: Any) -> bool:
    """Remember Hydra's composition (``task_cfg`` without its question, and the logging ``hydra_cfg`` sets up)
    under ``key``; False when the config is not one the cache can reproduce exactly (see the module doc)."""
    from omegaconf import OmegaConf

    if user_config_mentions_hydra(home):
        return False

    def value(key: str) -> Any:
        node = OmegaConf.select(hydra_cfg, key)
        return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node

    if (value("verbose") or value("job.env_set") or value("job.chdir") or value("output_subdir") is not None
            or value("callbacks") or str(value("run.dir")) != "."):
        return False
    task = OmegaConf.to_container(task_cfg, resolve=False)
    assert isinstance(task, dict)
    if "question" not in task:
        return False
    task["question"] = None  # set at every run (the key keeps its place: mappings keep their order)
    question_free = {k: v for k, v in task.items() if k != "question"}
    logging = [value("hydra_logging"), value("job_logging")]
    if not (_cacheable_values(question_free) and _cacheable_values(logging)):
        return False
    return write_entry(cache_dir(home), f"{key}.json", {"format": FORMAT, "config": task, "logging": logging},
                       "*.json", MAX_ENTRIES)


def load(home: Path, key: str, question: str,
         environ: Mapping[str, str] | None = None) -> tuple[dict[str, Any], list[Any]] | None:
    """The resolved configuration container (with ``question``) and the logging configs to apply, or None on a
    miss (no entry, damaged entry, an interpolation that cannot resolve)."""
    path = cache_dir(home) / f"{key}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("format") != FORMAT or user_config_mentions_hydra(home):
            return None
        config = _resolve(data["config"], os.environ if environ is None else environ)
        logging = data["logging"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(config, dict) or "question" not in config or not isinstance(logging, list):
        return None
    config["question"] = question
    return config, logging


def configure_logging(configs: list[Any]) -> None:
    """Apply the logging configs as Hydra's ``configure_log`` does (a config whose ``root`` is null is skipped)."""
    import logging.config

    for config in configs:
        if config is not None and config.get("root") is not None:
            logging.config.dictConfig(config)
