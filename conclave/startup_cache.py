"""Small facts a ``conclave`` process needs before its first provider request, remembered between runs.

Reading them afresh costs more than the rest of the start-up path: the ``conclave`` entry points
(``importlib.metadata`` imports the ``email`` package and reads the metadata of every installed distribution),
and the provider and price YAML files (PyYAML). Each fact is stored as JSON under
``$CONCLAVE_HOME/cache/startup/`` keyed by a digest of everything it was read from, so a changed input is a
miss, never a stale answer:

- entry points: ``sys.path`` (the working directory for ``''``), the ``*.dist-info`` / ``*.egg-info``
  directories in each directory on it and the mtime and size of each one's ``entry_points.txt`` (installing,
  upgrading, removing or editing a distribution changes them; ~1 ms of ``stat`` calls instead of a 10–35 ms scan);
- a file's parsed contents: its path, mtime and size (:func:`parsed_file`); all of them in one file.

A damaged or unreadable entry is a miss; a home that cannot be written is read afresh every time (a failed write
leaves nothing behind). At most :data:`MAX_ENTRIES` listings and :data:`MAX_FILES` parsed files are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

#: bumped whenever what is stored, or how it is read, changes
FORMAT = 1
#: entry-point listings kept (one file each, per ``sys.path``)
MAX_ENTRIES = 16
#: parsed files kept (all in one file, ``files-all.json``: a few dozen KB)
MAX_FILES = 64

#: what ``importlib.metadata`` accepts as an entry point's value: ``module[:attr[.attr]] [extras]``
_VALUE = re.compile(r"(?P<module>[\w.]+)\s*(?::\s*(?P<attr>[\w.]+)\s*)?(?:\[.*\]\s*)?$")


class EntryPoint(NamedTuple):
    """One entry point of a group, with the distribution that declares it (what ``conclave plugins`` shows)."""

    name: str
    value: str
    distribution: str | None
    version: str | None

    def load(self) -> Any:
        """Import the module and follow the attribute path, as ``importlib.metadata.EntryPoint.load`` does."""
        import importlib

        match = _VALUE.match(self.value)
        if match is None:
            raise ValueError(f"not an entry point value: {self.value!r}")
        obj: Any = importlib.import_module(match["module"])
        for attr in filter(None, (match["attr"] or "").split(".")):
            obj = getattr(obj, attr)
        return obj


def _cache_dir() -> Path:
    from conclave.home import default_home

    return default_home() / "cache" / "startup"


def _stat(path: str) -> list[Any]:
    try:
        st = os.stat(path)
    except OSError:
        return [path, None]
    return [path, st.st_mtime_ns, st.st_size]


def digest(inputs: Any) -> str:
    """The cache key of JSON-able ``inputs`` (the compose cache's too)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


def _encode(value: Any) -> Any:
    """JSON for a date (YAML reads ``2025-06-01`` as one); anything else is not stored."""
    import datetime as dt

    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return {"$date": value.isoformat()}
    raise TypeError(f"cannot store {type(value).__name__}")


def _decode(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and isinstance(obj.get("$date"), str):
        import datetime as dt

        return dt.date.fromisoformat(obj["$date"])
    return obj


def token_count(text: str, encoding: str, count: Callable[[str], int]) -> int:
    """``count(text)``, the exact number of ``encoding`` tokens in ``text``, remembered by the text's digest: the
    pre-flight check counts a seat's schema or tool list (the same few texts in every consultation) without
    loading a tokenizer once a run has counted them."""
    from conclave import __version__  # a change to how conclave counts is a new key

    key = digest(["tokens", encoding, __version__, hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()])
    found = _read("tokens", key)
    if isinstance(found, int) and not isinstance(found, bool):
        return found
    counted = count(text)
    _write("tokens", key, counted)
    return counted


def _read(kind: str, key: str) -> Any:
    try:
        data = json.loads((_cache_dir() / f"{kind}-{key}.json").read_text(encoding="utf-8"), object_hook=_decode)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    return data.get("value")


def _write(kind: str, key: str, value: Any) -> None:
    """Store ``value`` as ``KIND-KEY.json`` and keep the newest :data:`MAX_ENTRIES` of that kind."""
    write_entry(_cache_dir(), f"{kind}-{key}.json", {"format": FORMAT, "value": value}, f"{kind}-*.json",
                MAX_ENTRIES, default=_encode)


def write_entry(directory: Path, name: str, payload: Any, family: str, keep: int,
                default: Callable[[Any], Any] | None = None) -> bool:
    """Write ``payload`` as JSON to ``directory/name`` atomically (nothing is left behind when the disk refuses
    it), then keep only the newest ``keep`` files matching ``family``; False when the disk refused it."""
    tmp = directory / f".{name}.{os.getpid()}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(payload, default=default), encoding="utf-8")
        os.replace(tmp, directory / name)
        entries = sorted(directory.glob(family), key=lambda p: p.stat().st_mtime)
        for old in entries[:-keep]:
            old.unlink(missing_ok=True)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        return False
    return True


def _path_key() -> list[Any]:
    """What ``importlib.metadata`` would read on ``sys.path``: for each directory on it, its distributions'
    metadata directories (``*.dist-info``, ``*.egg-info``) with the mtime and size of their ``entry_points.txt``,
    so installing, upgrading, removing or editing a distribution changes the key, and nothing else does (the
    directory's own mtime would change with every file created in it: ``python -m`` puts the working directory
    on the path); a zip on the path by its stat."""
    key: list[Any] = []
    for entry in sys.path:
        entry = entry or os.getcwd()
        try:
            names = sorted(n for n in os.listdir(entry) if n.lower().endswith((".dist-info", ".egg-info")))
        except NotADirectoryError:
            key.append(_stat(entry))
            continue
        except OSError:
            key.append([entry, None])
            continue
        key.append([entry, [[*_stat(os.path.join(entry, name, "entry_points.txt"))[1:], name] for name in names]])
    return key


#: the entry-point groups remembered (one scan lists them all): conclave's plugins, and pydantic's, which pydantic
#: looks for when it builds its first model (see :func:`skip_pydantic_plugin_scan`)
GROUPS = ("conclave", "pydantic")

_listing: dict[str, list[EntryPoint]] | None = None
#: this process's copy of ``files-all.json``
_files: dict[str, Any] | None = None


def entry_points(group: str) -> list[EntryPoint]:
    """The entry points of ``group`` (one of :data:`GROUPS`) on ``sys.path``, in ``importlib.metadata``'s order,
    remembered (see the module doc)."""
    global _listing
    if _listing is None:
        _listing = _entry_point_listing()
    return list(_listing[group])


def _entry_point_listing() -> dict[str, list[EntryPoint]]:
    index_key = digest(["entry-points", GROUPS, sys.version, _path_key()])
    found = _read("entry-points", index_key)
    if isinstance(found, dict):
        try:
            return {group: [EntryPoint(*row) for row in found["groups"][group]] for group in GROUPS}
        except (TypeError, KeyError):
            pass
    listing = _scan()
    _write("entry-points", index_key, {"groups": {g: [list(p) for p in points] for g, points in listing.items()}})
    return listing


def _scan() -> dict[str, list[EntryPoint]]:
    import importlib.metadata

    everything = importlib.metadata.entry_points()
    listing: dict[str, list[EntryPoint]] = {}
    for group in GROUPS:
        listing[group] = []
        for ep in everything.select(group=group):
            dist = ep.dist
            listing[group].append(EntryPoint(ep.name, ep.value, dist.metadata["Name"] if dist is not None else None,
                                             dist.version if dist is not None else None))
    return listing


def skip_pydantic_plugin_scan() -> None:
    """Spare pydantic its plugin scan when there is nothing to find.

    pydantic looks for plugins of its own (entry-point group ``pydantic``) when it builds its first model, reading
    the metadata of every installed distribution (~10 ms before a consultation's first request), with a loader
    whose import alone imports ``importlib.metadata`` and the email package (~15 ms). When the remembered listing
    has no such entry point, the loader is the stand-in that scan would leave (:func:`_empty_pydantic_loader`), or
    its registry is set empty when it is imported already. ``PYDANTIC_DISABLE_PLUGINS`` is left to pydantic."""
    if os.environ.get("PYDANTIC_DISABLE_PLUGINS") is not None or entry_points("pydantic"):
        return
    loaded = sys.modules.get(PYDANTIC_LOADER)
    if loaded is None:  # importing it would import importlib.metadata (and the email package): ~15 ms
        sys.modules[PYDANTIC_LOADER] = _empty_pydantic_loader()
    elif getattr(loaded, "_plugins", ()) is None:
        loaded.__dict__["_plugins"] = {}


#: the module holding pydantic's plugin registry (``get_plugins``)
PYDANTIC_LOADER = "pydantic.plugin._loader"


def _empty_pydantic_loader() -> types.ModuleType:
    """pydantic's plugin loader as its scan leaves it when no distribution declares a ``pydantic`` entry point:
    ``get_plugins()`` gives no plugin. Any other name is read from the real module, imported at first use."""
    module = types.ModuleType(PYDANTIC_LOADER)
    real: list[types.ModuleType] = []

    def get_plugins() -> tuple[()]:
        return ()

    def __getattr__(name: str) -> Any:  # PEP 562: what this stand-in does not define
        if name.startswith("__"):  # the import system asks for __path__ and the like: a plain module has none
            raise AttributeError(name)
        if not real:
            import importlib.machinery
            import importlib.util

            import pydantic.plugin

            spec = importlib.machinery.PathFinder.find_spec("_loader", list(pydantic.plugin.__path__))
            if spec is None or spec.loader is None:
                raise AttributeError(name)
            loaded = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded)
            loaded.__dict__["_plugins"] = {}
            real.append(loaded)
        return getattr(real[0], name)

    module.__dict__.update(get_plugins=get_plugins, _plugins={}, _loading_plugins=False, __getattr__=__getattr__,
                           PYDANTIC_ENTRY_POINT_GROUP="pydantic")
    return module


def parsed_file(entry: Any, parse: Callable[[str], Any]) -> Any:
    """``parse(text of entry)``, remembered while the file's path, mtime and size are unchanged. ``entry`` is a
    path or an ``importlib.resources`` Traversable (one inside a zip is parsed at every call: no file to key on).
    Only a value that reads back equal is stored (mappings with string keys, lists, strings, numbers, booleans,
    None, dates); anything else is parsed at every call."""
    try:
        path = os.fspath(entry)
    except TypeError:
        return parse(entry.read_text(encoding="utf-8"))
    stat = _stat(path)
    if stat[1] is None:  # unreadable: let the parser meet the error
        return parse(Path(path).read_text(encoding="utf-8"))
    key = digest([stat, getattr(parse, "__qualname__", repr(parse)), getattr(parse, "__module__", "")])
    global _files
    if _files is None:
        _files = _read_files()
    found = _files.get(key)
    if isinstance(found, dict) and "parsed" in found:
        return found["parsed"]
    value = parse(Path(path).read_text(encoding="utf-8"))
    try:  # stored only when it reads back equal: not e.g. integer keys, which JSON would turn into strings
        if json.loads(json.dumps(value, default=_encode), object_hook=_decode) != value:
            return value
    except (TypeError, ValueError):  # e.g. a timestamp
        return value
    # merged into what is on disk now (another process may have added entries); the oldest entries go first
    entries = {**_read_files(), key: {"path": path, "parsed": value}}
    _files = dict(list(entries.items())[-MAX_FILES:])
    _write("files", "all", _files)
    return value


def _read_files() -> dict[str, Any]:
    found = _read("files", "all")
    return dict(found) if isinstance(found, dict) else {}
