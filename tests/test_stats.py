"""``conclave stats``: every figure agrees with the recorded events, over the chosen period."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from conclave import events as ev
from conclave.errors import UsageError
from conclave.store.paths import StoreLayout
from conclave.store.period_stats import compute_stats, period_from_args
from conclave.store.recorder import Recorder
from conclave.store.sqlite_index import connect
from conclave.testing.synthetic_events import synthetic_events

NOW = datetime(2026, 3, 15, 12, 0, tzinfo=UTC)
DAY = 86400.0


def record(home: Path, streams: list[list]) -> None:
    recorder = Recorder(home)
    for stream in streams:
        for event in stream:
            recorder(event)
    recorder.close()


def stats_for(home: Path, **period: object) -> dict:
    db = connect(StoreLayout(home).index_path)
    try:
        return compute_stats(db, period_from_args(now=NOW, **period))  # type: ignore[arg-type]
    finally:
        db.close()


def test_all_time_figures_match_the_events(tmp_path: Path) -> None:
    streams = [synthetic_events(n, interrupted_after_round=3 if n % 7 == 0 else None) for n in range(40)]
    record(tmp_path, streams)
    stats = stats_for(tmp_path)

    costs, tokens_in, tokens_out, cached_in, written, confidences, durations = [], 0, 0, 0, 0, [], []
    providers: dict[str, Counter] = defaultdict(Counter)
    saved_cost, accepted, filter_saved, filter_before = 0.0, 0, 0, 0
    modes: Counter[str] = Counter()
    for stream in streams:
        attempts = [e.data for e in stream if e.type == ev.PROVIDER_ATTEMPT]
        costs.append(sum(a["cost"] for a in attempts))
        tokens_in += sum(a["input_tokens"] for a in attempts)
        tokens_out += sum(a["output_tokens"] for a in attempts)
        cached_in += sum(a.get("cached_input_tokens") or 0 for a in attempts)
        written += sum(a.get("cache_write_tokens") or 0 for a in attempts)
        for a in attempts:
            providers[a["provider"]]["calls"] += 1
            providers[a["provider"]]["failed"] += a["outcome"] != "ok"
        modes[stream[0].data["mode"]] += 1
        for e in stream:
            if e.type == ev.EARLY_TERMINATION and e.data["accepted"]:
                accepted += 1
                saved_cost += e.data["estimated_cost_saved"]
            if e.type == ev.CONSULTATION_COMPLETED:
                # a consultation's savings are its result's token_efficiency_stats
                efficiency = e.data["result"]["token_efficiency_stats"] or {}
                filter_saved += efficiency.get("tokens_saved_via_filtering", 0)
                filter_before += efficiency.get("tokens_saved_via_filtering", 0) + efficiency.get("tokens_used", 0)
                confidences.append(e.data["result"]["confidence"])
                durations.append(e.ts - stream[0].ts)

    assert stats["consultations"] == 40
    finished = sum(any(e.type == ev.CONSULTATION_COMPLETED for e in stream) for stream in streams)
    assert 0 < finished < 40
    assert stats["by_status"] == {"complete": finished, "running": 40 - finished}
    assert stats["cost"]["total"] == pytest.approx(sum(costs))
    assert stats["cost"]["median"] == pytest.approx(statistics.median(costs), abs=1e-6)
    assert stats["tokens"] == {"input": tokens_in, "output": tokens_out, "total": tokens_in + tokens_out,
                               "cached_input": cached_in, "cache_write": written}
    assert stats["duration_s"]["median"] == pytest.approx(statistics.median(durations), abs=2e-3)
    distribution = stats["confidence"]["distribution"]
    assert distribution[">=0.85"] == sum(c >= 0.85 for c in confidences)
    assert distribution["<0.50"] + distribution["0.50-0.70"] == sum(c < 0.7 for c in confidences)
    assert distribution["unknown"] == 40 - finished
    assert stats["early_termination"]["accepted"] == accepted > 0
    assert stats["early_termination"]["rate"] == pytest.approx(accepted / 40, abs=1e-4)
    assert stats["early_termination"]["cost_saved"] == pytest.approx(saved_cost)
    assert stats["filtering"]["tokens_saved"] == filter_saved > 0
    assert stats["filtering"]["efficiency_pct"] == round(100 * filter_saved / filter_before, 1)
    assert {p["provider"]: (p["calls"], p["failed_calls"]) for p in stats["providers"]} == {
        name: (c["calls"], c["failed"]) for name, c in providers.items()}
    assert {m["mode"]: m["consultations"] for m in stats["modes"]} == dict(modes)


def test_substitutions_are_a_share_of_agent_seats(tmp_path: Path) -> None:
    streams = [synthetic_events(n) for n in range(30)]
    record(tmp_path, streams)
    per_consultation = [sum(e.type == ev.PROVIDER_SUBSTITUTED for e in s) for s in streams]
    seats = sum(len(s[0].data["agents"]) for s in streams)
    assert sum(per_consultation) > 0
    assert stats_for(tmp_path)["substitutions"] == {
        "count": sum(per_consultation), "rate": round(sum(per_consultation) / seats, 4),
        "consultations": sum(n > 0 for n in per_consultation)}


def test_periods_select_by_start_time(tmp_path: Path) -> None:
    ages_days = [1, 3, 6, 10, 20, 29, 40, 70]
    streams = [synthetic_events(n, start_ts=NOW.timestamp() - age * DAY, spacing_s=0)
               for n, age in enumerate(ages_days)]
    record(tmp_path, streams)
    week = stats_for(tmp_path, week=True)
    assert week["consultations"] == 3
    # the window starts mid-day: its first day comes from the raw calls, the rest from the daily rollup
    assert sum(p["calls"] for p in week["providers"]) == sum(
        e.type == ev.PROVIDER_ATTEMPT for stream in streams[:3] for e in stream)
    week_costs = [sum(e.data["cost"] for e in stream if e.type == ev.PROVIDER_ATTEMPT) for stream in streams[:3]]
    assert week["cost"]["median"] == pytest.approx(statistics.median(week_costs), abs=1e-6)
    assert stats_for(tmp_path, month="")["consultations"] == 6  # rolling 30 days
    january = NOW - timedelta(days=70)
    assert january.strftime("%Y-%m") == "2026-01"
    assert stats_for(tmp_path, month="2026-01")["consultations"] == 1
    assert stats_for(tmp_path, all_time=True)["consultations"] == 8
    assert stats_for(tmp_path, month="2025-12")["consultations"] == 0


def test_a_bad_month_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="YYYY-MM"):
        period_from_args(month="2026-13")


def run_stats(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conclave", "stats", *args], capture_output=True, text=True,
                          env={"CONCLAVE_HOME": str(home)}, timeout=60)


def test_cli_prints_json_and_text(tmp_path: Path) -> None:
    record(tmp_path, [synthetic_events(n) for n in range(5)])
    as_json = run_stats(tmp_path, "--all-time", "--json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["consultations"] == 5 and data["period"]["label"] == "all time"
    text = run_stats(tmp_path, "--month")
    assert text.returncode == 0
    assert "last 30 days" in text.stdout
    bad = run_stats(tmp_path, "--month", "march")
    assert bad.returncode == 2 and "YYYY-MM" in bad.stderr


def test_an_empty_home_has_no_consultations(tmp_path: Path) -> None:
    stats = stats_for(tmp_path, week=True)
    assert stats["consultations"] == 0 and stats["cost"]["median"] is None


def test_debate_quality_figures_match_the_checks(tmp_path: Path) -> None:
    streams = [synthetic_events(n) for n in range(12)]
    record(tmp_path, streams)
    quality = stats_for(tmp_path)["quality"]
    checks = [e.data for stream in streams for e in stream if e.type == ev.QUALITY_CHECKS]
    labelled = sum(c["labelled"] for c in checks)
    facts, cited = sum(c["facts"] for c in checks), sum(c["facts_cited"] for c in checks)
    assert quality["claims"] == labelled and labelled > 0
    assert quality["label_adoption"] == round(labelled / (labelled + sum(c["unlabelled"] for c in checks)), 4)
    assert quality["citation_compliance"] == round(cited / facts, 4) and cited < facts
    assert quality["rule_violations"] == facts - cited
    u2 = [c["verification"][0]["passed"] for c in checks]
    assert quality["pass_rate"] == {"U2": round(sum(u2) / len(u2), 4)}
    text = run_stats(tmp_path).stdout
    assert f"{labelled:,} claims" in text and "verification       U2 " in text
