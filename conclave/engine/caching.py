"""The consultation's prompt-cache hint: which leading part of every call's prompt is the same, and its key.

Every system prompt of a consultation opens with the same context block (:func:`conclave.engine.strategy.
context_block`); that block is the prefix every call shares, agents' and judge's, round after round. The hint
names its length, a key derived from it (the same context gives the same key, so a resumed or repeated
consultation on the same files finds its cache warm) and every artifact schema the plan asks for, in plan order.
Providers turn it into their API's caching hints (``providers.<name>.prompt_cache``).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from conclave.engine.extraction import request_schema
from conclave.engine.strategy import context_block
from conclave.providers.base import PromptCache

if TYPE_CHECKING:
    from conclave.engine.session import Session


def prompt_cache_for(session: Session) -> PromptCache | None:
    """The hint for ``session``'s calls; None without a context (nothing long and shared to cache)."""
    block = context_block(session.context_text)
    if not block:
        return None
    key = "conclave-" + hashlib.sha256(block.encode("utf-8")).hexdigest()[:32]
    names = dict.fromkeys(t.schema for t in session.plan.types)
    return PromptCache(key=key, stable_chars=len(block), schemas=tuple((n, request_schema(n)) for n in names))
