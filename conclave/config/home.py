"""Where conclave keeps its data: ``$CONCLAVE_HOME``, else ``~/.conclave`` (journal, index, models, user config).

A module of its own so the light subcommands (logs, stats, browse, index) can find the home without importing the
configuration models.
"""

from __future__ import annotations

import os
from pathlib import Path


def default_home() -> Path:
    """``$CONCLAVE_HOME``, else ``~/.conclave``: journal, index and user settings live here."""
    return Path(os.environ.get("CONCLAVE_HOME") or Path.home() / ".conclave").expanduser()
