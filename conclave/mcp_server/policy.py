"""What an MCP client may ask for: which overrides it may pass, and which files it may put in the context.

The server's operator fixes provider endpoints, key handling, the data home and scrubbing on ``conclave mcp``'s
command line; a tool call cannot change them, because a client could otherwise send the API keys to a host of its
choosing or write outside ``CONCLAVE_HOME``. File context is limited to the allowed roots (the server's working
directory and every ``--allow-dir``); a path whose real location (after symlinks) leaves them is refused.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conclave.errors import ConfigError

#: override keys (or key prefixes) a tool call may not set, with the reason given to the client
FORBIDDEN_KEYS: tuple[tuple[str, str], ...] = (
    ("home", "the data home is the server's CONCLAVE_HOME"),
    ("hydra", "Hydra's own settings belong to the server"),
    ("scrub", "secret scrubbing cannot be turned off over MCP"),
    ("question", "pass the question as the question argument"),
    ("providers", "provider endpoints and keys are set on the server's command line (conclave mcp providers....)"),
)

_KEY = re.compile(r"^(?:\+\+|\+|~)?([A-Za-z_][\w.@/:\[\]-]*)")


def override_key(override: str) -> str:
    """The config key an override sets (``+a.b=1`` → ``a.b``; ``persona@personas.x=y`` → ``personas.x``)."""
    match = _KEY.match(override.strip())
    key = match.group(1) if match else override.strip()
    group, at, package = key.partition("@")
    return package if at else group


def check_overrides(overrides: Iterable[str]) -> None:
    """Raise ``ConfigError`` (one line per refused override) for keys a client may not set."""
    problems = []
    for override in overrides:
        key = override_key(override)
        if "${" in override:
            problems.append(f"{key}: interpolations (${{...}}) are not accepted from an MCP client: they can read "
                            "the server's environment")
            continue
        for forbidden, why in FORBIDDEN_KEYS:
            if key == forbidden or key.startswith(forbidden + "."):
                problems.append(f"{key}: cannot be overridden by an MCP client: {why}")
                break
    if problems:
        raise ConfigError(problems)


@dataclass(frozen=True)
class Roots:
    """The directories file context may come from (real paths)."""

    dirs: tuple[Path, ...]
    cwd: Path = field(default_factory=Path.cwd)

    @classmethod
    def of(cls, allow_dirs: Sequence[str | Path] = (), cwd: Path | None = None) -> Roots:
        here = (cwd or Path.cwd()).resolve()
        dirs = [here]
        for name in allow_dirs:
            path = Path(name).expanduser()
            path = path if path.is_absolute() else here / path
            if not path.is_dir():
                raise ConfigError([f"--allow-dir: not a directory: {name}"])
            dirs.append(path.resolve())
        return cls(tuple(dict.fromkeys(dirs)), here)

    def absolute(self, name: str) -> Path:
        path = Path(name).expanduser()
        return path if path.is_absolute() else self.cwd / path

    def check(self, key: str, name: str) -> Path:
        """The absolute path of ``name`` if its real location is under a root; ``ConfigError`` naming it if not."""
        path = self.absolute(name)
        real = Path(os.path.realpath(path))
        if any(real.is_relative_to(root) for root in self.dirs):
            return path
        lexical = Path(os.path.normpath(path))
        if any(lexical.is_relative_to(root) for root in self.dirs):
            raise ConfigError([f"{key}: {name} is a symlink that resolves to {real}, outside the allowed roots "
                               f"({self.describe()})"])
        raise ConfigError([f"{key}: {name} is outside the allowed roots ({self.describe()}); "
                           "start the server with --allow-dir to add one"])

    def describe(self) -> str:
        return ", ".join(str(d) for d in self.dirs)


def check_settings_paths(settings: Any, roots: Roots) -> None:
    """Every ``context`` file and the ``project`` directory of composed settings must lie under ``roots``."""
    problems = []
    for name in settings.context:
        try:
            roots.check("context", name)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if settings.project is not None:
        try:
            roots.check("project", settings.project)
        except ConfigError as exc:
            problems.extend(exc.problems)
    if problems:
        raise ConfigError(problems)


def split_context(items: Sequence[str], roots: Roots) -> tuple[list[str], str | None]:
    """Context items → (absolute file paths under the roots, inline text or None).

    An item with a line break is inline text. A one-line item naming an existing path is a file (it must be under
    the roots); a one-line item that looks like a path (contains ``/`` or starts with ``.`` or ``~``) but does not
    exist is refused as a missing file rather than sent as text. Anything else is inline text.
    """
    files: list[str] = []
    texts: list[str] = []
    for item in items:
        if not item.strip():
            continue
        if "\n" in item:
            texts.append(item)
            continue
        candidate = item.strip()
        path = roots.absolute(candidate)
        if os.path.lexists(path):
            files.append(str(roots.check("context", candidate)))
        elif "/" in candidate or candidate.startswith((".", "~")):
            raise ConfigError([f"context: file not found: {candidate}"])
        else:
            texts.append(item)
    return files, ("\n\n".join(texts) if texts else None)
