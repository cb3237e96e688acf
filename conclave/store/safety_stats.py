"""The safety evaluator's figures for ``conclave stats``: tier reached, blocks (and shadow would-blocks) by category,
full evaluations and tier 1's mean time per response, over a period's consultations."""

from __future__ import annotations

from typing import Any

from conclave.store.period_sql import period_rows, period_where


def safety_figures(conn: Any, since: str | None, until: str | None) -> dict[str, Any]:
    where, params = period_where(since, until)
    tiers = dict(conn.execute(
        f"select c.safety_tier, count(*) from consultations c {where} "
        f"{'and' if where else 'where'} c.safety_tier is not null group by c.safety_tier", params).fetchall())
    blocked, would_block = conn.execute(
        f"select coalesce(sum(c.safety_blocked), 0), coalesce(sum(c.safety_would_block), 0) from consultations c "
        f"{where}", params).fetchone()
    source, checks_params = period_rows("safety_checks", "s", since, until)
    evaluations, responses, tier1_ms = conn.execute(
        f"select coalesce(sum(s.evaluated), 0), coalesce(sum(s.responses), 0), total(s.tier1_ms) {source}",
        checks_params).fetchone()
    source, blocks_params = period_rows("safety_checks", "s", since, until, "(s.blocked = 1 or s.would_block = 1)")
    by_category = conn.execute(
        f"select s.block_category, sum(s.blocked), sum(s.would_block) {source} group by s.block_category "
        "order by s.block_category", blocks_params).fetchall()
    return {
        "screened": sum(tiers.values()),
        "tier_reached": {str(tier): tiers.get(tier, 0) for tier in (1, 2, 3)},
        "blocked": blocked,
        "would_block": would_block,
        "blocks_by_category": {str(cat): {"blocked": b or 0, "would_block": w or 0} for cat, b, w in by_category},
        "evaluations": evaluations,
        "tier1_ms_per_response": round(tier1_ms / responses, 4) if responses else None,
    }


def render_line(safety: dict[str, Any]) -> str | None:
    """The stats report's safety line, or None when no consultation was screened."""
    if not safety or not safety.get("screened"):
        return None
    tiers = " · ".join(f"tier {t} {n}" for t, n in safety["tier_reached"].items())
    categories = ", ".join(f"{c} {v['blocked'] + v['would_block']}" for c, v in safety["blocks_by_category"].items())
    ms = safety["tier1_ms_per_response"]
    return (f"safety             {safety['screened']} screened ({tiers}) · {safety['blocked']} blocked"
            f"{f' ({categories})' if categories else ''} · {safety['would_block']} would block (shadow) · "
            f"{safety['evaluations']} full evaluations · tier 1 {'-' if ms is None else f'{ms:.3f}'} ms/response")
