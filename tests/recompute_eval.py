"""Recompute every figure of an evaluation report from its items.jsonl alone, independently of conclave.

    python tests/recompute_eval.py items.jsonl report.json report.md

Reads only the item rows (the last line of an item wins, as a resumed run appends), recomputes each protocol's
accounting, accuracy and intervals, every paired comparison (headline on the items both protocols completed, and
intent to treat), calibration, flips, the oracle, agreement and the run's spending, then compares them with the JSON
report's summary and checks that the Markdown report prints them. Prints "<k> figures, <m> mismatches" and exits 1
on any mismatch. Uses the standard library only: nothing from conclave.eval.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

Z = 1.959963984540054
Z_POWER = 0.8416212335729143
FINISHED = ("complete", "completed_degraded")
KNOWN = ["single", "vote", "judge", "debate", "quality", "vote_matched"]
PAIRS = [("vote", "debate"), ("single", "vote"), ("single", "debate"), ("vote", "judge"), ("judge", "debate"),
         ("debate", "quality"), ("vote", "quality"), ("vote_matched", "debate"), ("single_best", "debate")]


def read_rows(path: Path) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            rows[str(row["item_id"])] = row
    return list(rows.values())


def wilson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + Z * Z / n
    c = (p + Z * Z / (2 * n)) / d
    h = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


def cdf(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k + 1))


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0

    def root(target: float, kk: int) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if cdf(kk, n, mid) > target else (lo, mid)
        return (lo + hi) / 2

    return (0.0 if k == 0 else root(0.975, k - 1)), (1.0 if k == n else root(0.025, k))


def mcnemar_p(b: int, c: int) -> float:
    m = b + c
    return 1.0 if m == 0 else min(1.0, 2 * sum(math.comb(m, i) for i in range(min(b, c) + 1)) / 2**m)


def newcombe(both: int, a_only: int, b_only: int, neither: int) -> tuple[float, float]:
    n = both + a_only + b_only + neither
    if n == 0:
        return 0.0, 0.0
    p1, p2 = (both + b_only) / n, (both + a_only) / n
    l1, u1 = wilson(both + b_only, n)
    l2, u2 = wilson(both + a_only, n)
    e, f, g, h = both + b_only, a_only + neither, both + a_only, b_only + neither
    phi = 0.0
    if e and f and g and h:
        a = both * neither - a_only * b_only
        a = a - n / 2 if a > n / 2 else 0 if a >= 0 else a
        phi = a / math.sqrt(e * f * g * h)
    low = p1 - p2 - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = p1 - p2 + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, low), min(1.0, high)


def status(row: dict[str, Any], name: str) -> str:
    stored = row.get(f"{name}_status")
    if stored in ("completed", "failed", "skipped"):
        return str(stored)
    if row.get(f"{name}_correct") is None:
        return "skipped"
    return "completed" if row.get("status") in FINISHED or row.get(f"{name}_answer") else "failed"


def ok(row: dict[str, Any], name: str) -> bool:
    return bool(row.get(f"{name}_correct"))


def protocol(rows: list[dict[str, Any]], name: str, prices: str) -> dict[str, Any]:
    n = len(rows)
    hits = sum(ok(r, name) for r in rows)
    done = [r for r in rows if status(r, name) == "completed"]
    hits_done = sum(ok(r, name) for r in done)
    costs = [r.get(f"{name}_cost") for r in rows]
    cost = None if prices == "unknown" or None in costs else round(math.fsum(costs), 6)
    low, high = wilson(hits, n)
    exact = clopper_pearson(hits, n)
    return {"correct": hits, "n": n, "accuracy": hits / n if n else None, "ci_low": low, "ci_high": high,
            "exact_ci_low": exact[0], "exact_ci_high": exact[1],
            "completed": len(done), "failed": sum(status(r, name) == "failed" for r in rows),
            "skipped": sum(status(r, name) == "skipped" for r in rows),
            "failed_ids": sorted(str(r["item_id"]) for r in rows if status(r, name) == "failed"),
            "skipped_ids": sorted(str(r["item_id"]) for r in rows if status(r, name) == "skipped"),
            "correct_completed": hits_done, "accuracy_completed": hits_done / len(done) if done else None,
            "cost": cost, "tokens": sum(int(r.get(f"{name}_tokens") or 0) for r in rows),
            "wall_s": round(sum(float(r.get(f"{name}_wall_s") or 0) for r in rows), 3)}


def paired(rows: list[dict[str, Any]], a: str, b: str) -> dict[str, Any]:
    n = len(rows)
    both = sum(ok(r, a) and ok(r, b) for r in rows)
    a_only = sum(ok(r, a) and not ok(r, b) for r in rows)
    b_only = sum(ok(r, b) and not ok(r, a) for r in rows)
    low, high = newcombe(both, a_only, b_only, n - both - a_only - b_only)
    share = (a_only + b_only) / n if n and a_only + b_only else 0.25
    return {"n": n, "delta_pp": round(100 * (b_only - a_only) / n, 2) if n else None,
            "ci_low_pp": round(100 * low, 2), "ci_high_pp": round(100 * high, 2), "p": mcnemar_p(a_only, b_only),
            "a_right_b_wrong": a_only, "a_wrong_b_right": b_only,
            "detectable_pp": round(100 * (Z + Z_POWER) * math.sqrt(share / n), 1) if n else None}


def calibration(rows: list[dict[str, Any]], name: str) -> dict[str, Any]:
    pairs = [(float(r[f"{name}_confidence"]), ok(r, name)) for r in rows
             if r.get(f"{name}_confidence") is not None and status(r, name) == "completed"
             and not (name == "debate" and r.get("early_terminated"))]
    n = len(pairs)
    bins: list[list[tuple[float, bool]]] = [[] for _ in range(10)]
    for conf, hit in pairs:
        bins[min(9, max(0, int(conf * 10)))].append((conf, hit))
    ece = sum(len(b) / n * abs(sum(h for _, h in b) / len(b) - sum(c for c, _ in b) / len(b)) for b in bins if b) \
        if n else None
    confs = [c for c, _ in pairs]
    mean = sum(confs) / n if n else None
    return {"n": n, "excluded": len(rows) - n, "brier": sum((c - h) ** 2 for c, h in pairs) / n if n else None,
            "ece": ece, "mean_confidence": mean, "min_confidence": min(confs) if confs else None,
            "sd_confidence": math.sqrt(sum((c - mean) ** 2 for c in confs) / (n - 1)) if n > 1 and mean is not None
            else None,
            "reliability": [{"count": len(b), "mean_confidence": sum(c for c, _ in b) / len(b),
                             "accuracy": sum(h for _, h in b) / len(b)} for b in bins if b]}


def expected(rows: list[dict[str, Any]], prices: str) -> dict[str, Any]:
    found = {k.removesuffix("_correct") for r in rows for k in r if k.endswith("_correct")}
    names = ["single", "vote", "judge", "debate"] + [p for p in KNOWN[4:] if p in found] + \
        sorted(found - set(KNOWN) - {p for p in found if p.startswith("single_")}) + \
        sorted(p for p in found if p.startswith("single_"))
    protocols = {name: protocol(rows, name, prices) for name in names}
    columns = {name: name for name in names}
    singles = [p for p in names if p.startswith("single_")]
    if singles:
        best = max(singles, key=lambda p: (protocols[p]["correct"], -singles.index(p)))
        protocols["single_best"] = protocols[best]
        columns["single_best"] = best
    comparisons = {}
    for a, b in PAIRS:
        if a in protocols and b in protocols:
            ca, cb = columns[a], columns[b]
            both = [r for r in rows if status(r, ca) == "completed" and status(r, cb) == "completed"]
            cost_a, cost_b = protocols[a]["cost"], protocols[b]["cost"]
            comparisons[f"{b}_vs_{a}"] = {
                **paired(both, ca, cb), "itt": paired(rows, ca, cb),
                "cost_ratio": cost_b / cost_a if cost_a and cost_b is not None else None,
                "token_ratio": protocols[b]["tokens"] / protocols[a]["tokens"] if protocols[a]["tokens"] else None}
    spent_costs: list[Any] = [fig.get("cost") for r in rows for fig in (r.get("spent") or {}).values()]
    total_cost = None if prices == "unknown" or None in spent_costs else round(math.fsum(spent_costs), 6)
    spent_tokens = sum(int(fig.get("tokens") or 0) for r in rows for fig in (r.get("spent") or {}).values())
    n = len(rows)
    batched = {}
    if any("batch_cost" in r for r in rows):  # a batched run: its spend at batch prices and the interactive equivalent
        billed = round(math.fsum(float(r.get("batch_cost") or 0.0) for r in rows), 8)
        equivalent = round(math.fsum(float(r.get("interactive_equivalent_cost") or 0.0) for r in rows), 8)
        batched = {"batch": {"batch_cost": billed, "interactive_cost": equivalent,
                             "ratio": round(billed / equivalent, 4) if equivalent else None}}
    return {**batched,
        "items": n, "failed_items": sum(r.get("status") not in FINISHED for r in rows),
        "protocols": protocols, "comparisons": comparisons,
        "calibration": {name: calibration(rows, name) for name in names if name != "judge"
                        and not name.startswith("single_")
                        and any(r.get(f"{name}_confidence") is not None for r in rows)},
        "spent": {"cost": total_cost, "tokens": spent_tokens},
        "flips": {"agent_right_to_wrong": sum(int(r.get("right_to_wrong") or 0) for r in rows),
                  "agent_wrong_to_right": sum(int(r.get("wrong_to_right") or 0) for r in rows),
                  "items_with_right_to_wrong": sum(1 for r in rows if r.get("right_to_wrong"))},
        "oracle": {"items_with_a_right_round_1_answer": sum(int(r.get("oracle") or 0) for r in rows),
                   "oracle_gap": sum(int(r.get("oracle_gap") or 0) for r in rows)},
        "agreement": {"unanimous_items": sum(float(r.get("agreement") or 0) >= 1 for r in rows)},
        "early_terminated": sum(int(r.get("early_terminated") or 0) for r in rows),
    }


class Checker:
    def __init__(self) -> None:
        self.figures = 0
        self.mismatches: list[str] = []

    def same(self, where: str, want: Any, got: Any) -> None:
        if isinstance(want, dict):
            for key, value in want.items():
                self.same(f"{where}.{key}", value, (got or {}).get(key) if isinstance(got, dict) else None)
            return
        if isinstance(want, list) and want and isinstance(want[0], dict):
            if not isinstance(got, list) or len(got) != len(want):
                self.mismatches.append(f"{where}: {len(want)} entries, report has {got!r}")
                return
            for index, (w, g) in enumerate(zip(want, got, strict=True)):
                self.same(f"{where}[{index}]", w, g)
            return
        self.figures += 1
        if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
            if math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-12):
                return
        elif want == got:
            return
        self.mismatches.append(f"{where}: recomputed {want!r}, report has {got!r}")

    def printed(self, where: str, text: str, markdown: str) -> None:
        self.figures += 1
        if text not in markdown:
            self.mismatches.append(f"{where}: the Markdown report does not print {text!r}")


def pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def main(items: Path, report: Path, markdown_path: Path) -> int:
    rows = read_rows(items)
    summary = json.loads(report.read_text(encoding="utf-8"))["summary"]
    markdown = markdown_path.read_text(encoding="utf-8")
    want = expected(rows, summary.get("prices", "known"))
    check = Checker()
    check.same("summary", want, summary)
    # the Markdown report prints the same figures
    for name, p in want["protocols"].items():
        if name == "single_best":
            continue
        check.printed(f"accuracy of {name}", f" | {p['correct']}/{p['n']} = {pct(p['accuracy'])} | "
                      f"{pct(p['ci_low'])}–{pct(p['ci_high'])} | {pct(p['exact_ci_low'])}–{pct(p['exact_ci_high'])}"
                      f" | {p['correct_completed']}/{p['completed']} = {pct(p['accuracy_completed'])} |", markdown)
        ids = ", ".join(p["failed_ids"] + p["skipped_ids"]) or "—"
        check.printed(f"accounting of {name}", f" | {p['completed']} | {p['failed']} | {p['skipped']} | {ids} |",
                      markdown)
    for key, c in want["comparisons"].items():
        a, b = key.split("_vs_")[1], key.split("_vs_")[0]
        if c["delta_pp"] is None:
            continue
        itt = c["itt"]
        check.printed(f"comparison {key}", f"| {b} vs {a} | {c['n']} | {c['delta_pp']:+.1f} pp | "
                      f"[{c['ci_low_pp']:+.1f}, {c['ci_high_pp']:+.1f}] | {c['a_wrong_b_right']} | "
                      f"{c['a_right_b_wrong']} | {c['p']:.3g} | {c['p']:.3g} | {itt['n']}, {itt['delta_pp']:+.1f} pp, "
                      f"{itt['p']:.3g} |", markdown)
    head = want["comparisons"]["debate_vs_vote"]
    check.printed("headline", f"**debate vs vote: {head['delta_pp']:+.1f} pp [{head['ci_low_pp']:+.1f}, "
                  f"{head['ci_high_pp']:+.1f}], p = ", markdown)
    check.printed("headline items", f", {head['n']} items", markdown)
    check.printed("power", f"with {head['n']} items, this run detects a difference of ≥ {head['detectable_pp']:.1f} pp",
                  markdown)
    if want["failed_items"]:
        check.printed("failures at the top", f"> **This run has failures**: {want['failed_items']} item(s) failed",
                      markdown)
    for name, cal in want["calibration"].items():
        num = (lambda v: "—" if v is None else f"{v:.3f}")  # noqa: E731
        check.printed(f"calibration of {name}", f" | {cal['n']} | {cal['excluded']} | {num(cal['mean_confidence'])} | "
                      f"{num(cal['min_confidence'])} | {num(cal['sd_confidence'])} | {num(cal['brier'])} | "
                      f"{num(cal['ece'])} |", markdown)
    total = want["spent"]
    money = "unknown" if total["cost"] is None else f"${total['cost']:.4f}"
    check.printed("run total", f"**Run total: {money}, {total['tokens']:,} billed tokens**", markdown)
    if "batch" in want:
        b = want["batch"]
        ratio = "—" if b["ratio"] is None else f"{b['ratio']:.3f}"
        check.printed("batch spend", f"**Batch spend: ${b['batch_cost']:.4f} at the providers' batch prices; the same "
                      f"calls interactively: ${b['interactive_cost']:.4f} (ratio {ratio})**", markdown)
    print(f"{check.figures} figures, {len(check.mismatches)} mismatches")
    for line in check.mismatches:
        print("  " + line)
    return 1 if check.mismatches else 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2].strip())
        raise SystemExit(2)
    raise SystemExit(main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))
