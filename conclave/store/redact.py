"""Defence in depth: no provider API key value (nor the journal's HMAC key) ever reaches the journal, whatever a
caller put in an event."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

KEY_ENV_VARS = (
    "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "XAI_API_KEY", "MISTRAL_API_KEY",
    "CONCLAVE_JOURNAL_KEY",  # keyed heads (store/heads.py): a journal holding it could forge its own heads
)
REDACTED = "[REDACTED]"
# Shorter values are not real keys, and redacting them would shred ordinary words in questions and answers.
MIN_SECRET_LENGTH = 8


class Redactor:
    """Replaces the values of the provider key variables that are set with ``[REDACTED]``."""

    def __init__(self, secrets: list[str]) -> None:
        self.secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        # How each secret looks inside serialised JSON (quotes, backslashes and control characters escaped).
        self._encoded = [json.dumps(s, ensure_ascii=False)[1:-1] for s in self.secrets]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Redactor:
        env = os.environ if env is None else env
        return cls([env[name] for name in KEY_ENV_VARS if env.get(name)])

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
