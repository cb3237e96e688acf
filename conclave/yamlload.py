"""The YAML loader for the data files conclave ships (price sheets, tiers, provider declarations)."""

from __future__ import annotations

from typing import Any


def packaged_yaml_loader() -> Any:
    """libyaml's safe loader when PyYAML was built with it — the same constructors as ``yaml.safe_load``, so the
    same documents, parsed ~5× faster (the price sheets are read before every consultation's first request) —
    else the pure-Python safe loader."""
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)
