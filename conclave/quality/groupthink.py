"""Groupthink detection: two detectors over the agents' answers, run after every agents' round.

- **Early convergence** (on an agents' round numbered ≤ ``by_round``): at least ``high_confidence_ratio`` of the
  agents are at confidence ≥ ``confidence`` *and* the diversity gate fails — fewer than ``min_sources`` distinct
  sources across the answers, premise overlap above ``max_premise_overlap``, or fewer than ``min_clusters``
  semantic clusters of positions.
- **Stagnation**: each agents' round is compared with the one before; it is *low-activity* when new FACT claims
  per answering agent < ``new_facts_per_agent``, the mean |confidence change| < ``confidence_change`` and the
  standard deviation of the agents' stances < ``stance_std``. ``consecutive_rounds`` low-activity rounds in a
  row fire it (then the count starts again).

Definitions (all offline, :mod:`conclave.quality.similarity`):

- a *source* is a reference of an answer (structured or inline), the same url — else the same title — once;
- an agent's *premises* are its key points and its claims' texts (its position when it has neither);
- an agent's *position* is its position (``position``/``revised_position``/``refined_position``) plus key points;
- a claim is *new* when no earlier claim, position or key point of the consultation reaches
  ``novelty_similarity`` against it;
- an agent's *stance* is its confidence, signed + when its position is in the panel's largest semantic cluster
  and − otherwise: a panel that agrees at equal confidence has stance deviation 0, a split panel a large one;
- an agent whose answer states no confidence keeps its last stated one (its confidence did not change).

Each check returns a :class:`Check` (fired or not, with its figures), which the engine journals whatever the
stage; what happens when one fires is :mod:`conclave.quality.objection`'s business.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import fmean, pstdev
from typing import Any

from conclave.config.settings import GroupthinkSettings
from conclave.quality.claims import claims_of
from conclave.quality.similarity import best_match, best_matches, clusters, premise_overlap

STAGNATION = "stagnation"
EARLY_CONVERGENCE = "early_convergence"
DETECTORS = (STAGNATION, EARLY_CONVERGENCE)
_POSITION_FIELDS = ("position", "revised_position", "refined_position")


@dataclass
class Check:
    """One detector's look at one round: whether it fired, its figures and the thresholds they were held to."""

    detector: str
    round_number: int
    fired: bool
    figures: dict[str, Any]
    thresholds: dict[str, Any]
    why: str = ""  # one line: what fired it, or why it did not

    def as_dict(self) -> dict[str, Any]:
        return {"detector": self.detector, "round_number": self.round_number, "fired": self.fired,
                "figures": self.figures, "thresholds": self.thresholds, "why": self.why}


# ------------------------------------------------------------------------------------------------ reading answers


def position_text(artifact: Mapping[str, Any]) -> str:
    head = next((str(artifact[f]) for f in _POSITION_FIELDS if isinstance(artifact.get(f), str)), "")
    points = [str(p) for p in artifact.get("key_points") or [] if isinstance(p, str)]
    return " ".join([head, *points]).strip()


def premises(artifact: Mapping[str, Any]) -> list[str]:
    claims, _, _ = claims_of(artifact)
    out = [str(p) for p in artifact.get("key_points") or [] if isinstance(p, str) and p.strip()]
    out += [str(c.get("text")) for c in claims if str(c.get("text") or "").strip()]
    if not out and position_text(artifact):
        out.append(position_text(artifact))
    return out


def sources(answers: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """Distinct sources cited across ``answers``: by url, else by title (case-insensitive)."""
    seen: set[str] = set()
    for artifact in answers.values():
        for ref in claims_of(artifact)[1]:
            url = str(ref.get("url") or "").strip()
            title = str(ref.get("title") or "").strip().lower()
            if url or title:
                seen.add(url or f"title:{title}")
    return seen


def confidence_of(artifact: Mapping[str, Any]) -> float | None:
    value = artifact.get("confidence")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def is_new(text: str, earlier: Sequence[str], settings: GroupthinkSettings) -> bool:
    return best_match(text, earlier) < settings.novelty_similarity


def new_ones(texts: Sequence[str], earlier: Sequence[str], settings: GroupthinkSettings) -> list[bool]:
    """:func:`is_new` for each of ``texts`` at once."""
    return [score < settings.novelty_similarity for score in best_matches(texts, earlier)]


# ------------------------------------------------------------------------------------------------ early convergence


def check_early_convergence(number: int, answers: Mapping[str, Mapping[str, Any]],
                            settings: GroupthinkSettings) -> Check:
    cfg = settings.early_convergence
    names = sorted(answers)
    confident = [n for n in names if (confidence_of(answers[n]) or 0.0) >= cfg.confidence]
    ratio = len(confident) / len(names) if names else 0.0
    distinct = len(sources(answers))
    overlap = premise_overlap([premises(answers[n]) for n in names], settings.match_similarity)
    groups = clusters([position_text(answers[n]) for n in names], settings.cluster_similarity)
    figures = {"agents": len(names), "high_confidence_ratio": round(ratio, 4), "sources": distinct,
               "premise_overlap": round(overlap, 4), "semantic_clusters": len(groups),
               "clusters": [[names[i] for i in g] for g in groups]}
    thresholds = cfg.model_dump()
    gate = []
    if distinct < cfg.min_sources:
        gate.append(f"{distinct} distinct source(s) < {cfg.min_sources}")
    if overlap > cfg.max_premise_overlap:
        gate.append(f"premise overlap {overlap:.2f} > {cfg.max_premise_overlap:.2f}")
    if len(groups) < cfg.min_clusters:
        gate.append(f"{len(groups)} semantic cluster(s) < {cfg.min_clusters}")
    confident_enough = len(names) >= 2 and ratio >= cfg.high_confidence_ratio
    fired = confident_enough and bool(gate)
    head = f"{len(confident)} of {len(names)} agents at confidence ≥ {cfg.confidence:.2f}"
    if fired:
        why = f"{head}; diversity gate failed: {'; '.join(gate)}"
    elif not confident_enough:
        why = f"only {head} (needs {cfg.high_confidence_ratio:.0%})"
    else:
        why = f"{head}, but the panel is diverse (sources, premises and clusters pass)"
    figures["diversity_gate_failed"] = gate
    return Check(EARLY_CONVERGENCE, number, fired, figures, thresholds, why)


# ------------------------------------------------------------------------------------------------ stagnation


@dataclass
class RoundSnapshot:
    """What stagnation compares: each answering agent's (carried) confidence and stance, and new FACT claims."""

    number: int
    confidences: dict[str, float]
    stances: dict[str, float]
    stated: set[str] = field(default_factory=set)  # agents whose answer stated a confidence
    new_facts: int = 0


@dataclass
class StagnationDetector:
    settings: GroupthinkSettings
    previous: RoundSnapshot | None = None
    streak: int = 0

    def snapshot(self, number: int, answers: Mapping[str, Mapping[str, Any]], new_facts: int) -> RoundSnapshot:
        names = sorted(answers)
        known = dict(self.previous.confidences) if self.previous else {}
        stated = set()
        for n in names:
            c = confidence_of(answers[n])
            if c is not None:
                known[n] = c
                stated.add(n)
        confidences = {n: known.get(n, 0.0) for n in names}
        groups = clusters([position_text(answers[n]) for n in names], self.settings.cluster_similarity)
        sizes = [len(g) for g in groups]
        largest = set(groups[sizes.index(max(sizes))]) if groups else set()
        stances = {n: (1.0 if i in largest else -1.0) * confidences[n] for i, n in enumerate(names)}
        return RoundSnapshot(number, confidences, stances, stated, new_facts)

    def observe(self, number: int, answers: Mapping[str, Mapping[str, Any]], new_facts: int) -> Check | None:
        """Compare this agents' round with the previous one; None for the first (nothing to compare)."""
        cfg = self.settings.stagnation
        now = self.snapshot(number, answers, new_facts)
        before, self.previous = self.previous, now
        if before is None or not now.confidences:
            return None
        facts_per_agent = now.new_facts / len(now.confidences)
        changes = [abs(now.confidences[n] - before.confidences[n]) for n in now.confidences if n in before.confidences]
        change = fmean(changes) if changes else 0.0
        spread = pstdev(now.stances.values()) if len(now.stances) > 1 else 0.0
        low = facts_per_agent < cfg.new_facts_per_agent and change < cfg.confidence_change and spread < cfg.stance_std
        self.streak = self.streak + 1 if low else 0
        fired = self.streak >= cfg.consecutive_rounds
        figures = {"new_facts_per_agent": round(facts_per_agent, 4), "mean_confidence_change": round(change, 4),
                   "stance_std": round(spread, 4), "consecutive_rounds": self.streak,
                   "confidence_stated_by": sorted(now.stated)}
        if fired:
            why = (f"{self.streak} low-activity rounds in a row: {facts_per_agent:.2f} new FACT claims per agent, "
                   f"mean confidence change {change:.2f}, stance deviation {spread:.2f}")
            self.streak = 0
        elif low:
            why = f"low activity ({self.streak} of {cfg.consecutive_rounds} rounds in a row)"
        else:
            why = "the debate moved: " + ", ".join(part for part, hit in (
                (f"{facts_per_agent:.2f} new FACT claims per agent", facts_per_agent >= cfg.new_facts_per_agent),
                (f"confidence changed {change:.2f} on average", change >= cfg.confidence_change),
                (f"stance deviation {spread:.2f}", spread >= cfg.stance_std)) if hit)
        return Check(STAGNATION, number, fired, figures, cfg.model_dump(), why)

    def reset(self) -> None:
        """After an objection round the count starts again (the panel was just made to move)."""
        self.streak = 0
