"""Restoring completed rounds into a new run (``conclave resume``): no provider is called for them.

``resume_from`` carries what the journal stored: ``round_1`` {agent: artifact}, ``round_2``, ``round_3`` and
``round_3_replies`` (names, not labels), plus ``labels`` and ``shuffle_seed`` so the judge keeps seeing the
same neutral labels. A round is restored only when every round before it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conclave.engine.session import Session


def restore_rounds(session: Session, source: Mapping[str, Any]) -> set[int]:
    """Load the completed rounds of ``source`` into ``session.record``; return their numbers."""
    record, restored = session.record, set[int]()
    if not source.get("round_1"):
        return restored
    record.round_1 = {name: dict(a) for name, a in source["round_1"].items() if name in session.agents}
    for name, state in session.agents.items():
        state.absent = name not in record.round_1
    restored.add(1)
    if not source.get("round_2"):
        return restored
    record.round_2 = dict(source["round_2"])
    restored.add(2)
    if not source.get("round_3"):
        return restored
    record.round_3 = dict(source["round_3"])
    record.round_3_replies = {name: dict(r) for name, r in (source.get("round_3_replies") or {}).items()}
    record.missing_replies = [name for name in session.present() if name not in record.round_3_replies]
    restored.add(3)
    return restored


def resumed_rounds(source: Mapping[str, Any]) -> list[str]:
    return [key for key in ("round_1", "round_2", "round_3") if source.get(key)]
