"""The YAML loader for the data files conclave ships (price sheets, tiers, provider declarations)."""

from __future__ import annotations

from typing import Any


def packaged_yaml_loader() -> Any:
    """libyaml's safe loader when PyYAML was built with it — the same constructors as ``yaml.safe_load``, so the
    same documents, parsed ~5× faster (the price sheets are read before every consultation's first request) —
    else the pure-Python safe loader."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_packaged(entry: Any) -> Any:
    """The YAML document in ``entry`` (a packaged data file: a path, or an ``importlib.resources`` Traversable),
    parsed with :func:`packaged_yaml_loader` once per version of the file: the result is remembered by
    :func:`conclave.startup_cache.parsed_file`, so a run whose files are unchanged imports no YAML parser."""

    def parse(text: str) -> Any:
        import yaml

        return yaml.load(text, Loader=packaged_yaml_loader())

    from conclave.startup_cache import parsed_file

    return parsed_file(entry, parse)


def parse_toml(text: str) -> dict[str, Any]:
    """``text`` parsed as TOML (tomllib imported only when a file is parsed)."""
    import tomllib

    return tomllib.loads(text)


def load_packaged_toml(entry: Any) -> dict[str, Any]:
    """The TOML document in ``entry`` (a packaged data file), parsed once per version of the file like
    :func:`load_packaged`."""
    from conclave.startup_cache import parsed_file

    result: dict[str, Any] = parsed_file(entry, parse_toml)
    return result
