"""The ``quality`` protocol: the same debate with the quality layer on, forked from the item's own round 1.

The arm's configuration is the run's own plus ``eval.quality`` — a mapping of dotted keys to values (any key of
the configuration: ``quality.*``, ``exit.*``, ``rounds``…), validated like the rest of the configuration, so the
protocol picks up whatever those keys switch on:

- ``auto`` (the default): every switch in :data:`SWITCHES` this install's configuration has (``quality.stage``:
  the base debate runs with the layer in ``shadow``, recording what it would have done, and the arm with it
  ``on``).
- ``off``: no quality protocol.
- ``{quality.stage: on, exit.max_rounds: 6}``: exactly these keys.

Round 1 is reused — restored into the arm's consultation from the base consultation, not paid again — when the
arm's round-1 calls are exactly the base's (same model, same system and user prompt, same schema); otherwise
(e.g. ``quality.anchors`` changes the agents' system prompts) the arm pays its own round 1, and the report says
so. Quality-layer figures (claims, citation-rule violations, ungrounded judge statements, and any other number the
layer reports) are read per protocol from the rounds each protocol uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from conclave.config.settings import Settings, settings_from_container
from conclave.engine.cost.estimate import planned_texts
from conclave.engine.quality import metrics
from conclave.errors import ConfigError

#: switches that turn the acting part of the quality layer on: key -> (value for the arm, value for the base)
SWITCHES: dict[str, tuple[Any, Any]] = {"quality.stage": ("on", "shadow")}


def has_key(settings: Settings, dotted: str) -> bool:
    """Whether ``dotted`` names a field of the configuration model (``quality.stage``)."""
    node: Any = type(settings)
    for part in dotted.split("."):
        fields = getattr(node, "model_fields", None)
        if not fields or part not in fields:
            return False
        node = fields[part].annotation
    return True


def resolve(spec: Any, base: Settings, user_overrides: Iterable[str]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """``eval.quality`` → (the arm's overrides, the base's overrides, why the protocol is off or "").

    ``auto`` sets a switch on the base too (its "off" value) unless the user's own overrides set that key."""
    if spec in (None, "off", False):
        return {}, {}, "eval.quality=off"
    if spec == "auto":
        present = {k: v for k, v in SWITCHES.items() if has_key(base, k)}
        given = {o.lstrip("+~").partition("=")[0] for o in user_overrides}
        return ({k: arm for k, (arm, _) in present.items()},
                {k: off for k, (_, off) in present.items() if k not in given}, "")
    if isinstance(spec, Mapping) and spec:
        return {str(k): v for k, v in spec.items()}, {}, ""
    raise ConfigError([f"eval.quality: must be auto, off or a mapping {{key: value, …}} of configuration keys "
                       f"(got {spec!r})"])


def apply(settings: Settings, overrides: Mapping[str, Any], where: str) -> Settings:
    """``settings`` with the dotted ``overrides`` set, validated; a bad key or value is one line naming
    ``where.<key>``."""
    if not overrides:
        return settings
    data = settings.model_dump(mode="python")
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                raise ConfigError([f"{where}.{dotted}: unknown key (check the spelling; `conclave --cfg job` "
                                   "shows every key)"])
            node = node[part]
        if leaf not in node and not has_key(settings, dotted):
            raise ConfigError([f"{where}.{dotted}: unknown key (check the spelling; `conclave --cfg job` shows "
                               "every key)"])
        node[leaf] = value
    try:
        return settings_from_container(data)
    except ConfigError as exc:
        raise ConfigError([f"{where}: {line}" for line in exc.problems]) from None


def round_one_calls(session: Any) -> list[tuple[str, str, str, str]]:
    """What round 1 sends, call by call: (provider, model, schema, prompt)."""
    first = session.plan.numbers()[0]
    return [(t.spec.provider, t.spec.model, str(t.spec.schema_name), t.text) for t in planned_texts(session, [first])]


def resume_point(result: Mapping[str, Any], capture: Any, first_round_type: str) -> dict[str, Any] | None:
    """What the arm's consultation starts from: the base's round-1 answers, given as answers already paid for (so
    its round 1 is played without asking anyone, and its own journal records them, status ``restored``), and the
    same judge labels. None: the base has no round-1 answer to continue from."""
    round_1 = (result.get("artifacts") or {}).get("round_1") or {}
    if not round_1 or int(result.get("completed_rounds") or 0) < 1:
        return None
    labels = {a["name"]: a["label"] for a in result.get("agents") or [] if a.get("label")}
    return {"interrupted": {"round_number": 1, "artifacts": [
                {"agent": name, "artifact": artifact, "round_type": first_round_type}
                for name, artifact in round_1.items()]},
            "labels": labels, "shuffle_seed": capture.shuffle_seed}


# ------------------------------------------------------------------------------------------------ figures

def figures(result: Mapping[str, Any] | None, rounds: Iterable[int] | None = None,
            agents: Iterable[str] | None = None) -> dict[str, Any] | None:
    """The quality layer's figures over ``rounds`` (None: all) and ``agents`` (None: all) of one consultation:
    claims labelled, citation-rule violations, judge statements checked and ungrounded; with every rounds, also
    every other number the layer's own metrics carry. None when the result has no quality record."""
    quality = (result or {}).get("quality")
    if not isinstance(quality, Mapping):
        return None

    wanted = None if rounds is None else {str(n) for n in rounds}
    who = None if agents is None else set(agents)
    checks = {int(n): {a: e for a, e in by_agent.items() if who is None or a in who}
              for n, by_agent in (quality.get("checks") or {}).items() if wanted is None or n in wanted}
    found = metrics(checks)
    statements = [s for n, group in (quality.get("grounding") or {}).items() if wanted is None or n in wanted
                  for s in group]
    out: dict[str, Any] = {
        "claims": found["claims"],
        "violations": sum(found["rule_violations"].values()),
        "statements": len(statements),
        "ungrounded": sum(1 for s in statements if not s.get("grounded")),
    }
    if rounds is None and agents is None:
        for key, value in _numbers(quality.get("metrics") or {}).items():
            out.setdefault(key, value)
    return out


def _numbers(data: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a metrics mapping, flattened with dots (booleans and lists left out)."""
    out: dict[str, float] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float):
            out[name] = value
        elif isinstance(value, Mapping):
            out.update(_numbers(value, name + "."))
    return out


def total(rows: Iterable[Mapping[str, Any]], protocol: str) -> dict[str, Any] | None:
    """A protocol's quality figures over a run: counts summed, rates (fractions) averaged over the items that
    have them. None when no item has any."""
    sums: dict[str, float] = {}
    seen: dict[str, int] = {}
    for row in rows:
        found = (row.get("quality_layer") or {}).get(protocol)
        if not isinstance(found, Mapping):
            continue
        for key, value in found.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                sums[key] = sums.get(key, 0) + value
                seen[key] = seen.get(key, 0) + 1
    if not sums:
        return None
    out: dict[str, Any] = {}
    for key, value in sums.items():
        if _rate(key):
            out[key] = round(value / seen[key], 4)
        else:
            out[key] = int(value) if float(value).is_integer() else round(value, 4)
    return out


def _rate(key: str) -> bool:
    return any(word in key for word in ("adoption", "compliance", "rate", "share"))
