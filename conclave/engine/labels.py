"""Fair judging: agents reach the judge under neutral labels (Agent A, B, …) in a shuffled, seeded order.

Artifacts are stored with real names. :meth:`JudgeLabels.to_names` translates what the judge wrote: fields that
name an agent get the name, and a label in free text becomes ``name (Agent B)``, so the report names agents and
still shows which label the judge saw. :meth:`JudgeLabels.to_labels` is its exact inverse, which lets a resumed
consultation rebuild the judge's view from stored artifacts without ever showing the judge a name.

Agents are anonymous to each other too (``anonymous_peers``): :meth:`JudgeLabels.for_agent` is one agent's own
view of the panel, every agent under a neutral label in an order shuffled for that agent (seeded by the
consultation's seed and the agent's name, so a resumed run shows the same). Stored text keeps the judge's form
(``name (Agent B)``) whoever wrote it, so every view reads it. With ``anonymous_peers=false`` an agent sees its
peers by persona name (:meth:`JudgeLabels.named_view`), the condition the switch is ablated against.
"""

from __future__ import annotations

import random
import re
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

#: artifact keys whose string value (or list of strings) is an agent reference
AGENT_FIELDS = frozenset({"agent_id", "agent", "challenger", "target_agent", "supporting_agents", "championed_by"})

#: header keys the judge does not need to see (the engine fills them; they only cost tokens)
HEADER_FIELDS = ("artifact_type", "schema_version", "round_number", "created_at")

#: top-level artifact keys the engine fills in (never translated)
ENGINE_FIELDS = (*HEADER_FIELDS, "agent_id")

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def new_seed() -> int:
    return secrets.randbits(32)


class JudgeLabels:
    """The agent → label mapping of one consultation, derived from its seed and the panel."""

    def __init__(self, agents: Iterable[str], seed: int, labels: Mapping[str, str] | None = None, *,
                 stored: Mapping[str, str] | None = None, shuffle: str = "") -> None:
        """``stored``: the labels stored text names agents by (``name (label)``; default: these labels);
        ``shuffle``: added to the seed of the shuffle (an agent's own view)."""
        names = list(agents)
        self.seed = seed
        if labels is None:
            # an agent's own shuffle starts from a fixed order, so it never depends on how the panel was listed
            order = sorted(names) if shuffle else names[:]
            random.Random(f"{seed}/{shuffle}" if shuffle else seed).shuffle(order)
            labels = {name: f"Agent {_LETTERS[i]}" for i, name in enumerate(order)}
        missing = [n for n in names if n not in labels]
        if missing:
            raise ValueError(f"no judge label for agent(s) {', '.join(missing)}")
        self.by_name: dict[str, str] = dict(labels)
        self.by_label: dict[str, str] = {label: name for name, label in self.by_name.items()}
        self.stored: dict[str, str] = dict(stored) if stored is not None else dict(self.by_name)
        self._label_in_text = re.compile(
            r"(?<!\w)(" + "|".join(re.escape(label) for label in sorted(self.by_label, key=len, reverse=True))
            + r")(?!\w)"
        )
        #: ``name (stored label)`` as stored text has it -> the label this view shows
        self._named: dict[str, str] = {f"{name} ({self.stored[name]})": label for name, label in self.by_name.items()}
        self._named_in_text = re.compile("|".join(re.escape(s) for s in sorted(self._named, key=len, reverse=True)))

    def for_agent(self, agent: str) -> JudgeLabels:
        """How ``agent`` sees the panel: everyone (itself included) under ``Agent A…`` labels in an order of its own,
        seeded by this consultation's seed and its name; stored text is read and written in the judge's form."""
        return JudgeLabels(self.by_name, self.seed, shuffle=agent, stored=self.by_name)

    def named_view(self, names: Mapping[str, str]) -> JudgeLabels:
        """The panel shown by ``names`` (agent -> display name, e.g. its persona's): agents are not anonymous."""
        return JudgeLabels(self.by_name, self.seed, names, stored=self.by_name)

    def order(self) -> list[str]:
        """Agent names in the order the judge sees them (label order: A, B, C…)."""
        return sorted(self.by_name, key=lambda name: self.by_name[name])

    def label(self, name: str) -> str:
        return self.by_name[name]

    def panel(self) -> str:
        return ", ".join(self.by_name[name] for name in self.order())

    # ------------------------------------------------------------------------------------------ translation

    def to_names(self, obj: Any) -> Any:
        """A copy of ``obj`` (what the judge or an agent wrote) with labels replaced by names.

        The header fields of an artifact (``agent_id`` included) are the engine's, never the model's: they are
        kept as they are (an agent whose name looks like a label, ``agent_a``, keeps its own ``agent_id``)."""
        translated = _walk(obj, self._field_to_name, self._text_to_names)
        if isinstance(obj, Mapping) and isinstance(translated, dict):
            translated.update({k: obj[k] for k in ENGINE_FIELDS if k in obj})
        return translated

    def to_labels(self, obj: Any) -> Any:
        """A copy of a stored ``obj`` with names replaced by labels: the inverse of :meth:`to_names`."""
        return _walk(obj, self._field_to_label, self._text_to_labels)

    def judge_view(self, artifact: Mapping[str, Any]) -> dict[str, Any]:
        """What the judge is shown of a stored artifact: labels for names, header fields dropped."""
        labelled = self.to_labels(artifact)
        return {k: v for k, v in labelled.items() if k not in HEADER_FIELDS}

    def _field_to_name(self, value: str) -> str:
        if value.strip() in self.by_label:
            return self.by_label[value.strip()]
        match = re.fullmatch(r"\s*agent[\s_-]*([A-Za-z])\s*", value, flags=re.IGNORECASE)
        if match:
            return self.by_label.get(f"Agent {match.group(1).upper()}", value)
        return value

    def _field_to_label(self, value: str) -> str:
        return self.by_name.get(value, value)

    def _text_to_names(self, text: str) -> str:
        def named(m: re.Match[str]) -> str:
            name = self.by_label[m.group(1)]
            return f"{name} ({self.stored[name]})"

        return self._label_in_text.sub(named, text)

    def _text_to_labels(self, text: str) -> str:
        return self._named_in_text.sub(lambda m: self._named[m.group(0)], text)


def _walk(obj: Any, field: Any, text: Any, key: str | None = None) -> Any:
    if isinstance(obj, Mapping):
        return {k: _walk(v, field, text, k) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, field, text, key) for v in obj]
    if isinstance(obj, str):
        return field(obj) if key in AGENT_FIELDS else text(obj)
    return obj
