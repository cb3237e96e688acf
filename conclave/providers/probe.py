"""Active checks of one provider: key present (never its value), endpoint reachable, models known.

Used by ``conclave doctor`` and by :meth:`ProviderPool.probe`; nothing probes during a consultation unless asked.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from conclave.providers.base import AuthError, MissingKeyError, Provider, ProviderError


@dataclass
class ProbeResult:
    provider: str
    api: str
    endpoint: str | None
    key_env: list[str]
    key_required: bool
    key_present: bool
    key_source: str | None = None
    reachable: bool | None = None  # None: not checked (no key, or no models list to ask)
    key_rejected: bool = False
    models_listed: int | None = None  # how many models the endpoint lists; None without a list
    models: dict[str, bool | None] = field(default_factory=dict)  # model -> listed? (None: cannot tell)
    latency_s: float | None = None
    error: str | None = None

    @property
    def usable(self) -> bool:
        """Calls can work: a key when one is needed, not rejected, reachable, and no model known to be missing."""
        if self.key_required and not self.key_present:
            return False
        if self.key_rejected or self.reachable is False:
            return False
        return all(known is not False for known in self.models.values())

    def problems(self) -> list[str]:
        found: list[str] = []
        if self.key_required and not self.key_present:
            found.append(f"no key: set {' or '.join(self.key_env)}")
        if self.error:
            found.append(self.error)
        found += [f"model {m!r} is not in the endpoint's models list" for m, ok in self.models.items() if ok is False]
        return found

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "usable": self.usable, "problems": self.problems()}


_SUFFIX = r"(-\d{8}|-\d{4}-\d{2}-\d{2}|-latest)?"


def model_known(model: str, listed: Iterable[str]) -> bool:
    """Whether ``model`` or a dated snapshot/``-latest`` form of it is listed (APIs list snapshots, users name
    aliases)."""
    pattern = re.compile(re.escape(model.removeprefix("models/")) + _SUFFIX + "$")
    return any(pattern.match(item) for item in listed)


async def probe(provider: Provider, api: str, models: Iterable[str], *, timeout_s: float = 10.0) -> ProbeResult:
    """Check ``provider`` without spending tokens: only its models list is requested."""
    wanted = sorted(set(models))
    result = ProbeResult(
        provider=provider.name,
        api=api,
        endpoint=provider.endpoint(),
        key_env=provider.key_env(),
        key_required=provider.requires_key(),
        key_present=provider.api_key() is not None,
        key_source=provider.key_source(),
        models={m: None for m in wanted},
    )
    if result.key_required and not result.key_present:
        return result  # asking without a key only proves the endpoint says 401
    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            listed = await provider.list_models()
    except TimeoutError:
        result.reachable, result.error = False, f"no answer within {timeout_s:g}s from {result.endpoint}"
        return result
    except (AuthError, MissingKeyError) as exc:
        result.reachable, result.key_rejected, result.error = True, True, str(exc)
        return result
    except ProviderError as exc:
        # an HTTP status proves the endpoint answered; a 404 there usually means "no models list"
        result.reachable = exc.status is not None
        if exc.status != 404:
            result.error = str(exc)
        return result
    finally:
        result.latency_s = time.perf_counter() - started
    if listed is None:
        return result
    result.reachable = True
    result.models_listed = len(listed)
    result.models = {m: model_known(m, listed) for m in wanted}
    return result
