"""Aggregate figures of one evaluation run, from its item rows: accuracy with 95% intervals, every item accounted
for per protocol, cost (everything spent), paired tests with intervals, flips, oracle gap, agreement, calibration
and baselines. The result is plain JSON (stored in ``run.json`` and the index).

Accounting: each protocol on each item is ``completed`` (it gave its answer), ``failed`` (a call it needed failed)
or ``skipped`` (it was not run there, e.g. the matched vote stopped against a repeating endpoint). A paired
comparison is headlined on the items both protocols completed; the intent-to-treat figure (every item, a failure
counted wrong) stands beside it. Protocol accuracy (``accuracy``) is intent-to-treat; ``accuracy_completed`` is
over the completed items."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from conclave.eval import quality_arm
from conclave.eval.protocols import BASE_PROTOCOLS, PROTOCOLS
from conclave.eval.significance import (
    brier,
    clopper_pearson,
    detectable_pp,
    ece,
    holm,
    mcnemar_exact,
    newcombe_paired,
    reliability_table,
    wilson,
)

#: paired comparisons reported, (A, B): "B vs A"
PAIRS = (("vote", "debate"), ("single", "vote"), ("single", "debate"), ("vote", "judge"), ("judge", "debate"),
         ("debate", "quality"), ("vote", "quality"), ("vote_matched", "debate"), ("single_best", "debate"))
#: what each protocol's confidence means; protocols absent here state their own confidence, except those in
#: NO_CALIBRATION, whose number is not a probability that the answer is right
CONFIDENCE_MEANING = {
    "debate": "the verdict's stated confidence",
    "quality": "the verdict's stated confidence",
    "vote": "share of round-1 answers behind the vote",
    "vote_matched": "share of sampled answers behind the vote",
    "vote_weighted": "the aggregator's weight of the winning answer",
    "single": "the agent's stated confidence",
}
NO_CALIBRATION = {"judge": "the synthesis' consensus figure is not a probability that its answer is right"}
BINS = 10
FINISHED = ("complete", "completed_degraded")
STATUSES = ("completed", "failed", "skipped")


def protocols_in(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The protocols a run scored, generically: every ``<name>_correct`` column of its rows, the known ones in
    their table order first (the four every run has always listed)."""
    found = {key.removesuffix("_correct") for r in rows for key in r if key.endswith("_correct")}
    known = [p for p in PROTOCOLS if p in found and p not in BASE_PROTOCOLS]
    singles = sorted(p for p in found if p.startswith("single_"))
    others = sorted(found - set(PROTOCOLS) - set(singles))
    return [*BASE_PROTOCOLS, *known, *others, *singles]


def status_of(row: dict[str, Any], protocol: str) -> str:
    """A protocol's status on one item (rows written before statuses were stored: completed when the
    consultation finished or the protocol has an answer, else failed)."""
    stored = row.get(f"{protocol}_status")
    if stored in STATUSES:
        return str(stored)
    if row.get(f"{protocol}_correct") is None:
        return "skipped"
    return "completed" if row.get("status") in FINISHED or row.get(f"{protocol}_answer") else "failed"


def _correct(row: dict[str, Any], protocol: str) -> bool:
    return bool(row.get(f"{protocol}_correct"))


def summarise(rows: Sequence[dict[str, Any]], *, prices: str = "known") -> dict[str, Any]:
    """``prices``: known; free (every call went to a local model); unknown (a keyed model has no price: its
    calls were counted at $0, so no dollar figure is shown)."""
    n = len(rows)
    protocols: dict[str, Any] = {}
    names = protocols_in(rows)
    for name in names:
        protocols[name] = _protocol(rows, name, prices)
    singles = {name: p for name, p in protocols.items() if name.startswith("single_") and name != "single_best"}
    columns = {name: name for name in names}
    if singles:
        best = max(singles, key=lambda k: (singles[k]["correct"], -list(singles).index(k)))
        protocols["single_best"] = {**singles[best], "agent": best.removeprefix("single_"), "hindsight": True}
        columns["single_best"] = best
    comparisons: dict[str, Any] = {}
    for a, b in PAIRS:
        if a in protocols and b in protocols:
            comparisons[f"{b}_vs_{a}"] = compare(rows, a, b, columns[a], columns[b], protocols)
    calibration = {name: _calibration(rows, name) for name in names
                   if name not in NO_CALIBRATION and not name.startswith("single_")
                   and any(r.get(f"{name}_confidence") is not None for r in rows)}
    failed_ids = sorted({str(r.get("item_id")) for r in rows if r.get("status") not in FINISHED})
    summary: dict[str, Any] = {
        "items": n,
        "failed_items": len(failed_ids),
        "failed_item_ids": failed_ids,
        "with_failures": any(p["failed"] or p["skipped"] for p in protocols.values()),
        "prices": prices,
        "protocols": protocols,
        "comparisons": comparisons,
        "spent": spent(rows, prices),
        "flips": {
            "agent_right_to_wrong": sum(int(r.get("right_to_wrong") or 0) for r in rows),
            "agent_wrong_to_right": sum(int(r.get("wrong_to_right") or 0) for r in rows),
            "items_with_right_to_wrong": sum(1 for r in rows if r.get("right_to_wrong")),
            # anti-conformity: switches that cited no accepted (or new) claim or evidence id, whose earlier
            # answer still counts for aggregation when it is on
            "unsupported_switches": sum(int((r.get("answers") or {}).get("unsupported_switches") or 0) for r in rows),
            "vote_right_debate_wrong": comparisons["debate_vs_vote"]["itt"]["a_right_b_wrong"],
            "vote_wrong_debate_right": comparisons["debate_vs_vote"]["itt"]["a_wrong_b_right"],
        },
        "oracle": {
            "items_with_a_right_round_1_answer": sum(int(r.get("oracle") or 0) for r in rows),
            "oracle_gap": sum(int(r.get("oracle_gap") or 0) for r in rows),
            "oracle_accuracy": (sum(int(r.get("oracle") or 0) for r in rows) / n) if n else None,
        },
        "agreement": {
            "mean": (sum(float(r.get("agreement") or 0) for r in rows) / n) if n else None,
            "unanimous_items": sum(1 for r in rows if float(r.get("agreement") or 0) >= 1.0),
        },
        "early_terminated": sum(int(r.get("early_terminated") or 0) for r in rows),
        "calibration": calibration,
        "calibration_bins": f"{BINS} equal-width bins over [0, 1], the last closed",
        "calibration_left_out": dict(NO_CALIBRATION),
        "paired_round_1": sum(1 for r in rows if r.get("round_1_from")),
    }
    summary["verdict_line"] = verdict_line(protocols, comparisons["debate_vs_vote"], prices)
    if "quality_vs_debate" in comparisons:
        summary.update(quality_line=verdict_line(protocols, comparisons["quality_vs_debate"], prices),
                       quality_flips=sum(int(r.get("quality_right_to_wrong") or 0) for r in rows),
                       quality_oracle_gap=sum(1 for r in rows if r.get("oracle") and not r.get("quality_correct")),
                       quality_reused_round_1=sum(int(r.get("quality_reused_round_1") or 0) for r in rows))
    if "debate_vs_vote_matched" in comparisons:
        matched = comparisons["debate_vs_vote_matched"]
        tokens_matched, tokens_debate = protocols["vote_matched"]["tokens"], protocols["debate"]["tokens"]
        summary.update(
            matched_line=verdict_line(protocols, matched, prices).replace(
                "vs vote_matched:", "vs vote at the debate's budget:"),
            matched_samples=sum(int(r.get("vote_matched_samples") or 0) for r in rows),
            matched_token_ratio=tokens_matched / tokens_debate if tokens_debate else None)
    return summary


def _protocol(rows: Sequence[dict[str, Any]], name: str, prices: str) -> dict[str, Any]:
    n = len(rows)
    by_status: dict[str, list[str]] = {s: [] for s in STATUSES}
    for r in rows:
        by_status[status_of(r, name)].append(str(r.get("item_id")))
    hits = sum(1 for r in rows if _correct(r, name))
    done = [r for r in rows if status_of(r, name) == "completed"]
    hits_done = sum(1 for r in done if _correct(r, name))
    costs = [r.get(f"{name}_cost") for r in rows]
    known = None if prices == "unknown" or any(c is None for c in costs) else \
        round(math.fsum(float(c) for c in costs if c is not None), 6)  # fsum: the same whatever the row order
    low, high = wilson(hits, n)
    exact_low, exact_high = clopper_pearson(hits, n)
    done_low, done_high = wilson(hits_done, len(done))
    return {
        "correct": hits, "n": n, "accuracy": hits / n if n else None,
        "ci_low": low, "ci_high": high, "exact_ci_low": exact_low, "exact_ci_high": exact_high,
        "completed": len(by_status["completed"]), "failed": len(by_status["failed"]),
        "skipped": len(by_status["skipped"]),
        "failed_ids": sorted(by_status["failed"]), "skipped_ids": sorted(by_status["skipped"]),
        "correct_completed": hits_done,
        "accuracy_completed": hits_done / len(done) if done else None,
        "ci_low_completed": done_low, "ci_high_completed": done_high,
        "cost": known, "cost_per_item": None if known is None or not n else known / n,
        "tokens": sum(int(r.get(f"{name}_tokens") or 0) for r in rows),
        "wall_s": round(sum(float(r.get(f"{name}_wall_s") or 0.0) for r in rows), 3),
        "quality_layer": quality_arm.total(rows, name),
    }


def _paired(rows: Sequence[dict[str, Any]], col_a: str, col_b: str) -> dict[str, Any]:
    """McNemar's exact test, the Newcombe interval of the difference and the power line's figure over ``rows``."""
    a = [_correct(r, col_a) for r in rows]
    b = [_correct(r, col_b) for r in rows]
    n = len(rows)
    test = mcnemar_exact(a, b)
    both = sum(1 for x, y in zip(a, b, strict=True) if x and y)
    low, high = newcombe_paired(both, test.b, test.c, n - both - test.b - test.c)
    return {
        "n": n, "delta_pp": round(100 * (sum(b) - sum(a)) / n, 2) if n else None,
        "ci_low_pp": round(100 * low, 2), "ci_high_pp": round(100 * high, 2), "p": test.p,
        "a_right_b_wrong": test.b, "a_wrong_b_right": test.c,
        "detectable_pp": None if not n else round(detectable_pp(n, (test.b + test.c) / n if test.b + test.c
                                                                 else 0.25) or 0.0, 1),
    }


def compare(rows: Sequence[dict[str, Any]], a: str, b: str, col_a: str, col_b: str,
            protocols: dict[str, Any]) -> dict[str, Any]:
    """B against A: on the items both completed (the headline) and on every item (intent to treat)."""
    both_done = [r for r in rows if status_of(r, col_a) == "completed" and status_of(r, col_b) == "completed"]
    headline = _paired(both_done, col_a, col_b)
    itt = _paired(rows, col_a, col_b)
    cost_a, cost_b = protocols[a]["cost"], protocols[b]["cost"]
    tokens_a, tokens_b = protocols[a]["tokens"], protocols[b]["tokens"]
    return {
        "a": a, "b": b, **headline,
        f"{a}_right_{b}_wrong": headline["a_right_b_wrong"], f"{a}_wrong_{b}_right": headline["a_wrong_b_right"],
        "itt": itt,
        "p_corrected": headline["p"], "correction": "Holm over 1 point",
        "cost_ratio": cost_b / cost_a if cost_a and cost_b is not None else None,
        "token_ratio": tokens_b / tokens_a if tokens_a else None,
    }


def _calibration(rows: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    """Calibration of one protocol's confidence, in its one stated meaning; items without it (or, for the debate,
    early-stopped items, whose verdict is derived from the synthesis) are left out and counted."""
    pairs = []
    for r in rows:
        value = r.get(f"{name}_confidence")
        if value is None or status_of(r, name) != "completed" or (name == "debate" and r.get("early_terminated")):
            continue
        pairs.append((float(value), _correct(r, name)))
    conf, hits = [p[0] for p in pairs], [p[1] for p in pairs]
    values = sorted(conf)
    return {
        "meaning": CONFIDENCE_MEANING.get(name, "the protocol's stated confidence"),
        "n": len(pairs), "excluded": len(rows) - len(pairs),
        "brier": brier(conf, hits), "ece": ece(conf, hits, BINS),
        "mean_confidence": sum(conf) / len(conf) if conf else None,
        "min_confidence": values[0] if values else None,
        "sd_confidence": _sd(conf),
        "reliability": [
            {"bin": f"{b.lower:.1f}–{b.upper:.1f}", "lower": b.lower, "upper": b.upper, "count": b.count,
             "mean_confidence": b.mean_confidence, "accuracy": b.accuracy}
            for b in reliability_table(conf, hits, BINS) if b.count
        ],
    }


def spent(rows: Sequence[dict[str, Any]], prices: str = "known") -> dict[str, Any]:
    """Everything the run spent — every consultation it made, failed calls and retries included — split by the
    protocol that paid: ``debate`` is each item's own consultation (single, vote and judge are read from its
    rounds), ``quality`` the arm's own calls, ``vote_matched`` the extra samples."""
    costs: dict[str, list[float | None]] = {}
    tokens: dict[str, int] = {}
    for r in rows:
        for name, figures in (r.get("spent") or {}).items():
            costs.setdefault(name, []).append(None if figures.get("cost") is None else float(figures["cost"]))
            tokens[name] = tokens.get(name, 0) + int(figures.get("tokens") or 0)
    by = {name: {"cost": None if prices == "unknown" or any(c is None for c in found) else
                 round(math.fsum(c for c in found if c is not None), 6), "tokens": tokens[name]}
          for name, found in costs.items()}
    every = [c for found in costs.values() for c in found]
    total = None if prices == "unknown" or any(c is None for c in every) else \
        round(math.fsum(c for c in every if c is not None), 6)
    return {"cost": total, "tokens": sum(tokens.values()), "by_protocol": by}


def verdict_line(protocols: dict[str, Any], comparison: dict[str, Any], prices: str = "known") -> str:
    """The answer first: ``debate vs vote: +x pp [lo, hi], p = … (Holm …), at y× billed tokens, n items`` (on the
    items both completed; the intent-to-treat figure follows when failures make it differ)."""
    a, b = comparison["a"], comparison["b"]
    if comparison["delta_pp"] is None:
        return f"{b} vs {a}: no items both completed"
    tokens, ratio = comparison["token_ratio"], comparison["cost_ratio"]
    at = f"at {tokens:.2f}× billed tokens" if tokens is not None else "billed tokens unknown"
    if prices == "free":
        at += " (every call was free: a local model)"
    elif prices == "unknown" or ratio is None:
        at += " (cost unknown: a model has no price)"
    else:
        at += f" ({ratio:.2f}× the cost)"
    line = (f"{b} vs {a}: {comparison['delta_pp']:+.1f} pp [{comparison['ci_low_pp']:+.1f}, "
            f"{comparison['ci_high_pp']:+.1f}], p = {_p(comparison['p_corrected'])} ({comparison['correction']}), "
            f"{at}, {comparison['n']} items")
    itt = comparison["itt"]
    if itt["n"] != comparison["n"]:
        line += (f" both completed; intent to treat (failures wrong): {itt['delta_pp']:+.1f} pp, p = "
                 f"{_p(itt['p'])}, {itt['n']} items")
    return line


def _p(p: float) -> str:
    return "1" if p >= 0.9995 else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _sd(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def correct_across(summaries: Sequence[dict[str, Any]], key: str = "debate_vs_vote") -> list[float]:
    """Holm-correct one comparison across the points of a sweep (in place: ``p_corrected``, ``correction`` and
    the verdict line of each summary); the corrected p-values."""
    # summaries written before intervals were reported are left as they are
    summaries = [s for s in summaries if "ci_low_pp" in ((s.get("comparisons") or {}).get(key) or {})]
    found = [s["comparisons"][key] for s in summaries if s["comparisons"][key].get("delta_pp") is not None]
    adjusted = holm([c["p"] for c in found])
    for comparison, p in zip(found, adjusted, strict=True):
        comparison.update(p_corrected=p, correction=f"Holm over {len(found)} point{'' if len(found) == 1 else 's'}")
    for summary in summaries:
        if key == "debate_vs_vote" and key in (summary.get("comparisons") or {}):
            summary["verdict_line"] = verdict_line(summary["protocols"], summary["comparisons"][key],
                                                   summary.get("prices", "known"))
    return adjusted


def run_columns(summary: dict[str, Any]) -> dict[str, Any]:
    """The flat ``eval_runs`` columns a summary fills."""
    cols: dict[str, Any] = {}
    for name, p in summary["protocols"].items():
        cols.update({f"{name}_accuracy": p["accuracy"], f"{name}_ci_low": p["ci_low"],
                     f"{name}_ci_high": p["ci_high"], f"{name}_cost": p["cost"], f"{name}_tokens": p["tokens"],
                     f"{name}_wall_s": p["wall_s"]})
    quality = summary["comparisons"].get("quality_vs_debate")
    if quality is not None:
        cols.update({"quality_vs_debate_pp": quality["delta_pp"], "quality_vs_debate_p": quality["p"],
                     "quality_vs_debate_cost_ratio": quality["cost_ratio"]})
    matched = summary["comparisons"].get("debate_vs_vote_matched")
    if matched is not None:
        cols.update({"debate_vs_vote_matched_pp": matched["delta_pp"], "debate_vs_vote_matched_p": matched["p"],
                     "debate_vs_vote_matched_cost_ratio": matched["cost_ratio"]})
    cols["quality_layer"] = {name: p["quality_layer"] for name, p in summary["protocols"].items()
                             if p.get("quality_layer")} or None
    cmp_ = summary["comparisons"]["debate_vs_vote"]
    cal = summary["calibration"]
    cols.update({
        "oracle_gap": summary["oracle"]["oracle_gap"],
        "right_to_wrong": summary["flips"]["agent_right_to_wrong"],
        "wrong_to_right": summary["flips"]["agent_wrong_to_right"],
        "early_terminated": summary["early_terminated"],
        "debate_vs_vote_pp": cmp_["delta_pp"], "debate_vs_vote_p": cmp_["p"],
        "debate_vs_vote_cost_ratio": cmp_["cost_ratio"],
        "verdict_brier": cal.get("debate", {}).get("brier"), "verdict_ece": cal.get("debate", {}).get("ece"),
        "agreement_brier": cal.get("vote", {}).get("brier"), "agreement_ece": cal.get("vote", {}).get("ece"),
        "items_done": summary["items"], "items_failed": summary["failed_items"],
        "total_cost": summary["spent"]["cost"], "total_tokens": summary["spent"]["tokens"],
    })
    return cols
