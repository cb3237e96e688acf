"""Identifiers of a consultation: its time-sortable id and the hash of the configuration it ran with."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from typing import Any

_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(value: int, width: int) -> str:
    digits = []
    for _ in range(width):
        value, digit = divmod(value, 36)
        digits.append(_BASE36[digit])
    return "".join(reversed(digits))


def new_consultation_id() -> str:
    """``c-`` + 8 base36 chars of epoch milliseconds (sortable until 2059) + 4 random base36 chars."""
    return "c-" + _base36(time.time_ns() // 1_000_000, 8) + "".join(secrets.choice(_BASE36) for _ in range(4))


def config_snapshot(settings: Any, question: str) -> dict[str, Any]:
    """The settings as JSON, with the question as actually sent (scrubbed). Holds no secrets: keys come from
    the environment and only the variable names are configured."""
    data: dict[str, Any] = settings.model_dump(mode="json")
    data["question"] = question
    return data


def config_hash(snapshot: dict[str, Any]) -> str:
    """sha256 of the canonical configuration JSON, without the question and the machine-specific home, so
    consultations that ran with the same configuration share a hash."""
    relevant = {k: v for k, v in snapshot.items() if k not in ("question", "home")}
    canonical = json.dumps(relevant, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
