"""conclave: put a question to a panel of LLMs and run a structured, auditable debate to a verdict.

Importing this package is cheap on purpose; heavy modules (Hydra, aiohttp, jsonschema) load when used.
"""

from __future__ import annotations

from typing import Any

from conclave.hookspecs import hookimpl
from conclave.version import __version__

__all__ = ["__version__", "hookimpl"]


def __getattr__(name: str) -> Any:
    # The library API lives in conclave.api; expose it lazily so `import conclave` stays fast.
    if name in ("consult", "consult_async"):
        from conclave import api

        return getattr(api, name)
    raise AttributeError(f"module 'conclave' has no attribute {name!r}")
