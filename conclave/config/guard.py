"""The one guard every value from outside the terminal passes: MCP clients, the web form, HTTP API callers.

The person at the terminal chooses endpoints, keys, the data home, scrubbing and approval, on the command line that
starts a door (``conclave mcp …``, ``conclave serve …``). A caller at a door chooses what a person would choose on a
page: the question, the panel, the mode, rounds, filters, the judge's model, and context files under the allowed
roots. Concretely, for every override from outside:

- no ``${…}`` anywhere (an interpolation can read the server's environment) and no sweeps;
- a config group (``agents``, ``mode``, ``persona@…``) takes only the names of its registered options, never a path;
- a package (``@…``) only as ``persona@personas.NAME``;
- no key under ``home``, ``hydra``, ``scrub``, ``question``, ``providers``, ``user``, ``cost``, ``hedging``,
  ``live``, ``quality.safety``; no key or dict field named like an endpoint or key setting (``base_url``, …);
- after composition, the providers, home, scrubbing, spending limits, approval, hedging and the safety evaluator
  equal those of the door's own configuration, and every file or directory named lies under the allowed roots
  (real path, after symlinks), and none is a secret file by name (``.env``, private keys, credential stores:
  :func:`conclave.engine.context.is_secret_file`, of the name given or of the file it links to).

Refusals are :class:`~conclave.errors.ConfigError` lines that name the key and never echo a value.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException

from conclave.compose import compose_settings, config_groups
from conclave.config.home import default_home
from conclave.config.settings import Settings
from conclave.engine.context import is_secret_file
from conclave.engine.cost.consent import round_up_to_cent
from conclave.errors import ConfigError

#: keys (and their sub-keys) a caller at a door may not set, with the reason given to the caller
FORBIDDEN_KEYS: tuple[tuple[str, str], ...] = (
    ("home", "the data home is the server's CONCLAVE_HOME"),
    ("hydra", "Hydra's own settings belong to the server"),
    ("scrub", "secret scrubbing cannot be turned off from outside"),
    ("question", "pass the question as the question itself"),
    ("providers", "provider endpoints and keys are set on the command line that starts the server"),
    ("user", "the user's settings file belongs to the server"),
    ("cost", "spending limits and approval are the server's; approval is asked the door's own way"),
    ("hedging", "extra calls are the server's to allow"),
    ("live", "the live view is started from the terminal"),
    ("live_port", "the live view is started from the terminal"),
    ("quality.safety", "the safety evaluator is the server's to configure"),
)
#: field names that name an endpoint, a key or a model file wherever they appear
FORBIDDEN_FIELDS = frozenset({"base_url", "send_key", "api_key_env", "api_key", "model_path", "searchpath"})

#: the config groups a caller may choose options of; any other group is the server's
CHOOSABLE_GROUPS = frozenset({"agents", "mode", "persona"})
#: the one package a caller may place an option at: a persona of the panel
PERSONA_PACKAGE = re.compile(r"personas\.[A-Za-z_][\w-]*")

GroupOptions = Mapping[str, Sequence[str]]


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
            if is_secret_file(path.name) or is_secret_file(real.name):
                # the user names such a file at the terminal; a caller at a door is not the user, and the
                # scrubber redacts only the values it recognises (the project summary skips them the same way)
                raise ConfigError([f"{key}: {name} is a secret file (.env, private keys, credential stores); "
                                   "a caller cannot send it"])
            return path
        lexical = Path(os.path.normpath(path))
        if any(lexical.is_relative_to(root) for root in self.dirs):
            raise ConfigError([f"{key}: {name} is a symlink that leads outside the allowed roots ({self.describe()})"])
        raise ConfigError([f"{key}: {name} is outside the allowed roots ({self.describe()}); "
                           "start the server with --allow-dir to add one"])

    def describe(self) -> str:
        return ", ".join(str(d) for d in self.dirs)


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
        looks_like_path = "/" in candidate or candidate.startswith((".", "~"))
        if looks_like_path or os.path.lexists(roots.absolute(candidate)):
            # the roots first: whether a file outside them exists is none of the caller's business
            path = roots.check("context", candidate)
            if not os.path.lexists(path):
                raise ConfigError([f"context: file not found: {candidate}"])
            files.append(str(path))
        else:
            texts.append(item)
    return files, ("\n\n".join(texts) if texts else None)


def check_outside_overrides(overrides: Sequence[str], groups: GroupOptions, door: str) -> None:
    """Raise ``ConfigError`` (one line per refused override, naming its key, never its value) for anything in
    ``overrides`` a caller at ``door`` may not set; ``groups`` maps each config group to its registered options."""
    problems: list[str] = []
    parser = OverridesParser.create()
    for number, text in enumerate(overrides, 1):
        problems.extend(_override_problems(parser, number, text, groups, door))
    if problems:
        raise ConfigError(problems)


def _override_problems(parser: OverridesParser, number: int, text: str, groups: GroupOptions,
                       door: str) -> list[str]:
    if "${" in text:
        return [f"override {number}: interpolations (${{...}}) are not accepted from {door}: they can read the "
                "server's environment"]
    try:
        override = parser.parse_override(text)
    except HydraException:
        return [f"override {number}: not a key=value override"]
    key = override.key_or_group
    name = key if override.package is None else f"{key}@{override.package}"
    if override.is_sweep_override():
        return [f"{name}: sweeps are not accepted from {door}"]
    if override.type in (OverrideType.DEL, OverrideType.FORCE_ADD):
        return [f"{name}: only key=value and +key=value are accepted from {door}"]
    if override.package is not None and not (key == "persona" and PERSONA_PACKAGE.fullmatch(override.package)):
        return [f"{name}: a package (@…) is accepted from {door} only as persona@personas.NAME"]
    value = override.value()
    for path in _paths(key, value):
        why = _forbidden(path)
        if why:
            return [f"{name}: cannot be set from {door}: {why}"]
    if _has_interpolation(value):
        return [f"{name}: interpolations (${{...}}) are not accepted from {door}"]
    if key in groups or "/" in key:
        return _group_problems(override, name, groups, door)
    return []


def _forbidden(path: str) -> str | None:
    """The reason ``path`` (a dotted key or a ``/`` group path) is refused, or None."""
    dotted = path.replace("/", ".")
    for forbidden, why in FORBIDDEN_KEYS:
        if dotted == forbidden or dotted.startswith(forbidden + "."):
            return why
    if FORBIDDEN_FIELDS & set(dotted.split(".")):
        return "endpoints and keys are the server's"
    return None


def _group_problems(override: Override, name: str, groups: GroupOptions, door: str) -> list[str]:
    group = override.key_or_group
    if group not in CHOOSABLE_GROUPS or group not in groups:
        choosable = ", ".join(sorted(CHOOSABLE_GROUPS & set(groups)))
        return [f"{name}: not a config group {door} may choose (one of: {choosable})"]
    value = override.value()
    chosen = value if isinstance(value, list) else [value]
    allowed = groups[group]
    wrong = [option for option in chosen if not (isinstance(option, str) and option in allowed)]
    if not wrong:
        return []
    # the caller's own literal (no interpolation reaches here), as the command line reports it
    return [f"{name}: {wrong[0]!r} is not one of: {', '.join(allowed)}"]


def _has_interpolation(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, Mapping):
        return any(_has_interpolation(k) or _has_interpolation(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_has_interpolation(v) for v in value)
    return False


def _paths(key: str, value: Any) -> Iterable[str]:
    """``key`` and the dotted path of every field a dict value sets under it (``cost={auto_approve: true}`` sets
    ``cost.auto_approve``)."""
    if key:
        yield key
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _paths(f"{key}.{k}" if key else str(k), v)
    elif isinstance(value, list | tuple):
        for v in value:
            if isinstance(v, Mapping):
                yield from _paths(key, v)


def check_composed(settings: Settings, baseline: Settings, roots: Roots, door: str) -> None:
    """What composition made of outside overrides: the server's providers, home, scrubbing and approval unchanged
    (``baseline`` is the door's own configuration), and every context file and project directory under ``roots``."""
    problems = [f"{key}: cannot be changed from {door}"
                for key, mine, theirs in _protected(settings, baseline) if mine != theirs]
    problems.extend(_path_problems(settings, roots))
    if problems:
        raise ConfigError(problems)


def _path_problems(settings: Settings, roots: Roots) -> list[str]:
    named = [("context", name) for name in settings.context]
    if settings.project is not None:
        named.append(("project", settings.project))
    problems: list[str] = []
    for key, name in named:
        try:
            roots.check(key, name)
        except ConfigError as exc:
            problems.extend(exc.problems)
    return problems


def _protected(settings: Settings, baseline: Settings, *, cost: bool = True) -> Iterable[tuple[str, Any, Any]]:
    yield "providers", settings.providers, baseline.providers
    yield "home", settings.home, baseline.home
    yield "scrub", settings.scrub, baseline.scrub
    yield "hedging", settings.hedging, baseline.hedging
    yield "quality.safety", settings.quality.safety, baseline.quality.safety
    yield "live", settings.live, baseline.live
    if cost:
        yield "cost", settings.cost, baseline.cost


def _stamp(path: Path) -> str:
    try:
        return str(path.stat().st_mtime_ns)
    except OSError:
        return "none"


def approval_for(estimate: float | None) -> list[str]:
    """The trusted override a door adds once the user approved the estimate it showed: spending up to that figure
    (rounded up to the cent), not an open cheque."""
    if estimate is None:
        return ["cost.auto_approve=true"]
    return [f"cost.always_allow_under={round_up_to_cent(estimate):.2f}"]


@dataclass(frozen=True)
class Door:
    """A door onto the engine for callers other than the person at the terminal.

    ``operator`` are the overrides given on the command line that started the door (trusted); ``roots`` the
    directories file context may come from. :meth:`compose` is the one way such a door turns a caller's request
    into settings. The registered options and the door's own configuration are read once (a request composes once).
    """

    name: str
    roots: Roots
    operator: tuple[str, ...] = ()
    _baselines: dict[tuple[str, ...], Settings] = field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property
    def groups(self) -> dict[str, list[str]]:
        return config_groups()

    def baseline(self, trusted: Sequence[str] = ()) -> Settings:
        """The door's own configuration (with ``trusted``), which outside overrides may not change; composed again
        when the user's settings file changes (choosing "Always" at a terminal's cost prompt writes it)."""
        key = (*trusted, _stamp(default_home() / "conf" / "user" / "settings.yaml"))
        if key not in self._baselines:
            self._baselines.clear()
            self._baselines[key] = compose_settings("the door's own configuration", [*self.operator, *trusted])
        return self._baselines[key]

    def compose(self, question: str, outside: Sequence[str], trusted: Sequence[str] = ()) -> Settings:
        """Settings for ``question`` with the caller's ``outside`` overrides, after every check above.

        ``trusted`` are overrides the door itself adds after asking the user its own way (approval).
        """
        check_outside_overrides(outside, self.groups, self.name)
        settings = compose_settings(question, [*self.operator, *outside, *trusted])
        check_composed(settings, self.baseline(trusted), self.roots, self.name)
        return settings

    def check_recorded(self, settings: Settings) -> None:
        """A recorded consultation a caller asks to resume: its files under the roots, and the providers, home,
        scrubbing, hedging and safety it would run with the door's own (its spending was approved when it started)."""
        problems = [f"{key}: the recorded consultation's differs from this server's; resume it from the terminal "
                    "(conclave resume ID)" for key, mine, theirs in _protected(settings, self.baseline(), cost=False)
                    if mine != theirs]
        problems.extend(_path_problems(settings, self.roots))
        if problems:
            raise ConfigError(problems)
