"""Aggregate figures of one evaluation run, from its item rows: accuracy with 95% intervals, cost, paired tests,
flips, oracle gap, agreement and calibration. The result is plain JSON (stored in ``run.json`` and the index)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conclave.eval import quality_arm
from conclave.eval.protocols import BASE_PROTOCOLS, PROTOCOLS
from conclave.eval.stats import brier, clopper_pearson, ece, mcnemar_exact, reliability_table, wilson

#: paired comparisons reported, (A, B): "B vs A"
PAIRS = (("vote", "debate"), ("single", "vote"), ("single", "debate"), ("vote", "judge"), ("judge", "debate"),
         ("debate", "quality"), ("vote", "quality"), ("vote_matched", "debate"))
#: confidence sources whose calibration is reported: name -> (confidence column, correct column)
CALIBRATION = {
    "verdict": ("debate_confidence", "debate_correct"),
    "agreement": ("agreement_confidence", "vote_correct"),
    "synthesis": ("judge_confidence", "judge_correct"),
    "single_agent": ("single_confidence", "single_correct"),
    "quality_verdict": ("quality_confidence", "quality_correct"),
}


def protocols_in(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The protocols a run scored: the four every run has, and ``quality`` when its arm ran."""
    extra = [p for p in PROTOCOLS if p not in BASE_PROTOCOLS and any(r.get(f"{p}_correct") is not None for r in rows)]
    return [*BASE_PROTOCOLS, *extra]


def summarise(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    protocols: dict[str, Any] = {}
    names = protocols_in(rows)
    for name in names:
        hits = sum(int(r.get(f"{name}_correct") or 0) for r in rows)
        costs = [r.get(f"{name}_cost") for r in rows]
        known = None if any(c is None for c in costs) else round(sum(float(c) for c in costs if c is not None), 6)
        low, high = wilson(hits, n)
        exact_low, exact_high = clopper_pearson(hits, n)
        protocols[name] = {
            "correct": hits, "n": n, "accuracy": hits / n if n else None,
            "ci_low": low, "ci_high": high, "exact_ci_low": exact_low, "exact_ci_high": exact_high,
            "cost": known, "cost_per_item": None if known is None or not n else known / n,
            "tokens": sum(int(r.get(f"{name}_tokens") or 0) for r in rows),
            "wall_s": round(sum(float(r.get(f"{name}_wall_s") or 0.0) for r in rows), 3),
            "quality_layer": quality_arm.total(rows, name),
        }
    comparisons = {}
    for a, b in PAIRS:
        if a not in protocols or b not in protocols:
            continue
        test = mcnemar_exact([bool(r.get(f"{a}_correct")) for r in rows], [bool(r.get(f"{b}_correct")) for r in rows])
        acc_a, acc_b = protocols[a]["accuracy"], protocols[b]["accuracy"]
        cost_a, cost_b = protocols[a]["cost"], protocols[b]["cost"]
        comparisons[f"{b}_vs_{a}"] = {
            "a": a, "b": b, "delta_pp": None if acc_a is None else round(100 * (acc_b - acc_a), 2),
            "p": test.p, f"{a}_right_{b}_wrong": test.b, f"{a}_wrong_{b}_right": test.c,
            "cost_ratio": cost_b / cost_a if cost_a and cost_b is not None else None,
            "token_ratio": (protocols[b]["tokens"] / protocols[a]["tokens"]) if protocols[a]["tokens"] else None,
        }
    calibration = {}
    for name, (conf_key, correct_key) in CALIBRATION.items():
        if name == "quality_verdict" and "quality" not in protocols:
            continue
        pairs = [(float(r[conf_key]), bool(r.get(correct_key))) for r in rows if r.get(conf_key) is not None]
        conf, hits_ = [p[0] for p in pairs], [p[1] for p in pairs]
        values = sorted(conf)
        calibration[name] = {
            "n": len(pairs), "brier": brier(conf, hits_), "ece": ece(conf, hits_),
            "mean_confidence": sum(conf) / len(conf) if conf else None,
            "min_confidence": values[0] if values else None,
            "sd_confidence": _sd(conf),
            "reliability": [
                {"bin": f"{b.lower:.1f}–{b.upper:.1f}", "count": b.count, "mean_confidence": b.mean_confidence,
                 "accuracy": b.accuracy}
                for b in reliability_table(conf, hits_) if b.count
            ],
        }
    return {
        "items": n,
        "failed_items": sum(1 for r in rows if r.get("status") not in ("complete", "completed_degraded")),
        "protocols": protocols,
        "comparisons": comparisons,
        "flips": {
            "agent_right_to_wrong": sum(int(r.get("right_to_wrong") or 0) for r in rows),
            "agent_wrong_to_right": sum(int(r.get("wrong_to_right") or 0) for r in rows),
            "items_with_right_to_wrong": sum(1 for r in rows if r.get("right_to_wrong")),
            # anti-conformity: switches that cited no accepted (or new) claim or evidence id, whose earlier
            # answer still counts for aggregation when it is on
            "unsupported_switches": sum(int((r.get("answers") or {}).get("unsupported_switches") or 0) for r in rows),
            "vote_right_debate_wrong": comparisons["debate_vs_vote"]["vote_right_debate_wrong"],
            "vote_wrong_debate_right": comparisons["debate_vs_vote"]["vote_wrong_debate_right"],
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
        "verdict_line": verdict_line(protocols, comparisons["debate_vs_vote"]),
        **({"quality_line": verdict_line(protocols, comparisons["quality_vs_debate"]),
            "quality_flips": sum(int(r.get("quality_right_to_wrong") or 0) for r in rows),
            "quality_oracle_gap": sum(1 for r in rows if r.get("oracle") and not r.get("quality_correct")),
            "quality_reused_round_1": sum(int(r.get("quality_reused_round_1") or 0) for r in rows)}
           if "quality_vs_debate" in comparisons else {}),
        **({"matched_line": verdict_line(protocols, comparisons["debate_vs_vote_matched"]).replace(
            "vs vote_matched:", "vs vote at the debate's budget:"),
            "matched_samples": sum(int(r.get("vote_matched_samples") or 0) for r in rows)}
           if "debate_vs_vote_matched" in comparisons else {}),
    }


def verdict_line(protocols: dict[str, Any], comparison: dict[str, Any]) -> str:
    """The plain line: ``debate vs vote: +x pp (p = …) at y× the cost`` (or another pair's: ``quality vs
    debate: …``)."""
    a, b = comparison["a"], comparison["b"]
    if comparison["delta_pp"] is None:
        return f"{b} vs {a}: no items"
    ratio, tokens = comparison["cost_ratio"], comparison["token_ratio"]
    free = protocols[a]["cost"] == 0 and protocols[b]["cost"] == 0
    if ratio is not None:
        at = f"at {ratio:.1f}× the cost"
    elif tokens is not None:
        why = "every call was free: a local model" if free else "cost unknown: a model has no price"
        at = f"at {tokens:.1f}× the tokens ({why})"
    else:
        at = "cost unknown"
    return f"{b} vs {a}: {comparison['delta_pp']:+.1f} pp (p = {_p(comparison['p'])}) {at}"


def _p(p: float) -> str:
    return "1" if p >= 0.9995 else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _sd(values: Sequence[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


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
        "verdict_brier": cal["verdict"]["brier"], "verdict_ece": cal["verdict"]["ece"],
        "agreement_brier": cal["agreement"]["brier"], "agreement_ece": cal["agreement"]["ece"],
        "items_done": summary["items"], "items_failed": summary["failed_items"],
    })
    return cols
