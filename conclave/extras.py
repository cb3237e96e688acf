"""How to add an optional extra (``mcp``, ``local``, ``eval``, …) to the conclave that is running.

conclave is installed from its source tree, not from the package index: ``pip install 'conclave[mcp]'`` would fetch an
unrelated project of that name. A hint therefore names this installation's own source directory.
"""

from __future__ import annotations

import json
import shlex
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

#: the distribution's name (``conclave`` on the package index is an unrelated project)
DISTRIBUTION = "conclave-council"
#: the project's own directory when this package runs from a checkout (an editable install, or no install at all)
_CHECKOUT = Path(__file__).resolve().parent.parent


def install_hint(extra: str) -> str:
    """The pip command that installs ``extra`` for the conclave that is running, e.g.
    ``pip install -e '/home/me/conclave[mcp]'``."""
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "conclave" / "__init__.py").is_file():
        return f"pip install -e {shlex.quote(f'{_CHECKOUT}[{extra}]')}"
    source = _installed_from()
    if source is not None:
        return f"pip install {shlex.quote(f'{source}[{extra}]')}"
    return f"from your conclave source directory: pip install '.[{extra}]'"


def _installed_from() -> Path | None:
    """The local directory pip installed conclave from (PEP 610's ``direct_url.json``), if it still exists."""
    try:
        text = metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        url = urlparse(str(json.loads(text).get("url", "")))
    except (ValueError, AttributeError):
        return None
    path = Path(unquote(url.path))
    return path if url.scheme == "file" and path.is_dir() else None


__all__ = ["install_hint"]
