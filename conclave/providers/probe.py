"""Active checks of one provider: key present (never its value), endpoint reachable, models known, and (when asked,
or free) one tiny structured-output call per model.

Used by ``conclave doctor`` and by :meth:`ProviderPool.probe`; nothing probes during a consultation unless asked.
The test call asks for :data:`TEST_SCHEMA` the way a consultation asks for an artifact (structured output negotiated
per endpoint), so "ready" means a consultation call would get a valid object back.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from conclave.providers.base import AuthError, CompletionRequest, Message, MissingKeyError, Provider, ProviderError

#: what the test call asks for: small, with the constraint keywords artifacts use
TEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "minLength": 1, "maxLength": 200},
        "confidence": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}
TEST_PROMPT = "Is 17 a prime number? Answer in a few words, with your confidence between 0 and 1."
TEST_MAX_TOKENS = 80


def test_request(model: str, timeout_s: float) -> CompletionRequest:
    return CompletionRequest(model=model, messages=(Message("user", TEST_PROMPT),), json_schema=TEST_SCHEMA,
                             schema_name="doctor_check", max_tokens=TEST_MAX_TOKENS, timeout_s=timeout_s)


@dataclass
class CallCheck:
    """The structured-output test call for one model: made (``tested``) or only priced (``estimated_cost``)."""

    tested: bool
    ok: bool | None = None
    form: str | None = None  # the structured-output form that worked
    latency_s: float | None = None
    cost: float | None = None
    estimated_cost: float | None = None
    error: str | None = None


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
    free: bool = False  # calls cost nothing (a local server or model): the test call is made without --probe
    calls: dict[str, CallCheck] = field(default_factory=dict)  # model -> structured-output test call

    @property
    def usable(self) -> bool:
        """Calls can work: a key when one is needed, not rejected, reachable, no model known to be missing, and
        every structured-output test call that was made returned a valid object."""
        if self.key_required and not self.key_present:
            return False
        if self.key_rejected or self.reachable is False:
            return False
        if any(check.tested and not check.ok for check in self.calls.values()):
            return False
        return all(known is not False for known in self.models.values())

    @property
    def call_tested(self) -> bool:
        """Every model's test call was made (so "ready" is proven, not inferred)."""
        return bool(self.calls) and all(check.tested for check in self.calls.values())

    def problems(self) -> list[str]:
        found: list[str] = []
        if self.key_required and not self.key_present:
            found.append(f"no key: set {' or '.join(self.key_env)}")
        if self.error:
            found.append(self.error)
        found += [f"model {m!r} is not in the endpoint's models list" for m, ok in self.models.items() if ok is False]
        found += [f"test call to {m} failed: {c.error}" for m, c in self.calls.items() if c.tested and not c.ok]
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
