"""How many worker processes a whole-home pass (``index rebuild``, ``logs verify``) starts by default."""

from __future__ import annotations

import os

# Past this many, more workers only queue for the disk and the index's write lock, each holding a page cache.
MAX_DEFAULT_WORKERS = 4


def default_workers() -> int:
    """One per CPU this process may run on, at most :data:`MAX_DEFAULT_WORKERS`."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_DEFAULT_WORKERS))
