"""The provider key values conclave holds (and the journal's HMAC key), kept out of everything it writes and sends.

The journal redacts them from every record (defence in depth: whatever a caller put in an event), and the
scrubber (:mod:`conclave.scrub`) removes them from the question and context before anything reaches a provider,
whatever their shape: a prefix-less key pasted into a context file is found by its value.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from conclave.plugin_manager import get_plugins

#: keyed heads (store/heads.py): a journal holding it could forge its own heads
JOURNAL_KEY_VAR = "CONCLAVE_JOURNAL_KEY"
REDACTED = "[REDACTED]"
# Shorter values are not real keys, and redacting them would shred ordinary words in questions and answers.
MIN_SECRET_LENGTH = 8


def key_variables(settings: Any = None) -> list[str]:
    """The environment variables that hold keys: those the loaded provider plugins declare
    (``Provider.KEY_VARIABLES``), the journal's HMAC key and, given ``settings``, every
    ``providers.<name>.api_key_env`` configured there."""
    configured = [name for endpoint in getattr(settings, "providers", {}).values() for name in endpoint.api_key_env]
    return list(dict.fromkeys([*get_plugins().key_variables(), JOURNAL_KEY_VAR, *configured]))


def key_values(env: Mapping[str, str] | None = None, names: Iterable[str] | None = None) -> list[str]:
    """The values of ``names`` (by default :func:`key_variables`) set in ``env`` (the process environment by
    default) that are long enough to be keys (:data:`MIN_SECRET_LENGTH`), longest first."""
    env = os.environ if env is None else env
    names = key_variables() if names is None else names
    values = {value for name in names if len(value := env.get(name) or "") >= MIN_SECRET_LENGTH}
    return sorted(values, key=len, reverse=True)


class Redactor:
    """Replaces the values of the provider key variables that are set with ``[REDACTED]``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        # How each secret looks inside serialised JSON (quotes, backslashes and control characters escaped).
        self._encoded = [json.dumps(s, ensure_ascii=False)[1:-1] for s in self.secrets]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, names: Iterable[str] | None = None) -> Redactor:
        return cls(key_values(env, names))

    def leaks(self, serialised: str) -> bool:
        """Cheap pre-check on the serialised record; the common case (no key present) costs one scan per key."""
        return any(encoded in serialised for encoded in self._encoded)

    def scrub(self, value: Any) -> Any:
        """A copy of ``value`` with every secret replaced inside every string (keys included)."""
        if isinstance(value, str):
            for secret in self.secrets:
                value = value.replace(secret, REDACTED)
            return value
        if isinstance(value, dict):
            return {self.scrub(k): self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(v) for v in value]
        return value
