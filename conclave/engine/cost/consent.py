"""The cost gate: whether a consultation may spend its estimate, and the "Always" threshold it can store.

Under ``cost.always_allow_under`` it goes ahead; ``cost.auto_approve`` never asks; otherwise a terminal user is
asked, and without a terminal the consultation is refused with a message that says how to approve it. An
unknown estimate (a model without a price) counts as over the threshold.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

import yaml

from conclave.config.settings import Settings
from conclave.engine.cost.estimate import CostEstimate
from conclave.engine.interaction import Interaction

USER_SETTINGS = Path("conf") / "user" / "settings.yaml"


@dataclass(frozen=True)
class Consent:
    approved: bool
    auto_approved: bool
    reason: str
    new_threshold: float | None = None  # set when the user answered "always"


def decide_consent(
    estimate: CostEstimate, settings: Settings, interaction: Interaction, *, upper_bound: bool = False,
    may_stop_after_round_1: bool = False,
) -> Consent:
    """Approve, ask or refuse ``estimate``; ``upper_bound``: it is a bound of the real estimate (the wording);
    ``may_stop_after_round_1``: the vote gate is on, so the question also says what round 1 alone costs."""
    total, threshold = estimate.total, settings.cost.always_allow_under
    if settings.cost.auto_approve:
        return Consent(True, True, "cost.auto_approve=true")
    if total is not None and total <= threshold:
        what = "at most " if upper_bound else ""
        return Consent(True, True, f"estimate {what}${total:.4f} is within cost.always_allow_under=${threshold:.2f}")
    if not interaction.interactive:
        return Consent(False, False, refusal_message(estimate, settings))
    return _ask(estimate, interaction, may_stop_after_round_1)


def _ask(estimate: CostEstimate, interaction: Interaction, may_stop_after_round_1: bool = False) -> Consent:
    total = estimate.total
    if total is None:
        answer = interaction.ask(
            f"Estimated cost: unknown (no price for {', '.join(estimate.unknown_prices)}). Continue? [y]es / [n]o"
        )
        choice = answer.strip().lower()[:1]
        return Consent(choice == "y", False, "approved by the user" if choice == "y" else "declined by the user")
    cached = estimate.cached_input_tokens
    share = (f" ({cached:,} of {estimate.input_tokens:,} input tokens expected from prompt caches)"
             if cached else "")
    rounds = len({c.round_number for c in estimate.calls if c.round_number > 0})  # round 0: the safety check
    # past four rounds the estimate is a ceiling: it covers every cross-examination repeat up to the cap
    ceiling = f" for up to {rounds} rounds (cross-examination may repeat)" if rounds > 4 else ""
    first = estimate.only([1]).total if may_stop_after_round_1 else None
    gate = (f"; if the panel agrees after round 1 the vote decides there, for about ${first:.4f}"
            if first is not None else "")
    answer = interaction.ask(f"Estimated cost: ${total:.4f}{ceiling}{share}{gate}. Continue? [y]es / [n]o / "
                             "[a]lways")
    choice = answer.strip().lower()[:1]
    if choice == "a":
        threshold = round_up_to_cent(total)
        return Consent(True, False, f"approved by the user; always allow under ${threshold:.2f}", threshold)
    if choice == "y":
        return Consent(True, False, "approved by the user")
    return Consent(False, False, "declined by the user")


def refusal_message(estimate: CostEstimate, settings: Settings) -> str:
    total, threshold = estimate.total, settings.cost.always_allow_under
    if total is None:
        what = f"the cost cannot be estimated: no price is known for {', '.join(estimate.unknown_prices)}"
        raise_to = ""
    else:
        what = f"the estimated cost ${total:.4f} is over cost.always_allow_under=${threshold:.2f}"
        raise_to = f" (e.g. cost.always_allow_under={round_up_to_cent(total):.2f})"
    return (
        f"{what}, and there is no terminal to ask for approval. Approve with cost.auto_approve=true, or raise "
        f"cost.always_allow_under{raise_to}."
    )


def round_up_to_cent(amount: float) -> float:
    return float(Decimal(str(amount)).quantize(Decimal("0.01"), rounding=ROUND_CEILING))


def store_always_allow(home: Path, threshold: float) -> Path:
    """Merge ``cost.always_allow_under: threshold`` into ``$CONCLAVE_HOME/conf/user/settings.yaml`` (atomically)."""
    path = home / USER_SETTINGS
    data: dict[str, Any] = {}
    if path.exists():
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        if isinstance(loaded, dict):
            data = loaded
    existing = data.get("cost")
    cost: dict[str, Any] = existing if isinstance(existing, dict) else {}
    data["cost"] = {**cost, "always_allow_under": threshold}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".settings-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            yaml.safe_dump(data, handle, sort_keys=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
