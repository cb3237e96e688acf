"""Evaluations under a provider's rate limit: the pace a 429 sets for the endpoint, and a sweep of 3 points
against the fake server's token bucket (rate-limit headers on every answer, 429 with Retry-After when empty) that
finishes unattended, with few retries and nothing paid twice (the smaller version of bench/eval_ratelimit.py, run as
that script). The pace the headers set: tests/test_pacing.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conclave.providers.pacing import SPEED_UP, Pacer

ROOT = Path(__file__).resolve().parent.parent


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_endpoint_is_unpaced_until_it_answers_429() -> None:
    pacer = Pacer(Clock())
    for _ in range(5):
        assert pacer.take() == 0.0
        pacer.answered()
    assert pacer.interval == 0.0


def test_a_429_halves_the_rate_once_per_burst_and_honours_retry_after() -> None:
    clock = Clock()
    pacer = Pacer(clock)
    for _ in range(11):  # ten requests a second
        assert pacer.take() == 0.0
        clock.now += 0.1
    sent_under = pacer.cuts
    for _ in range(4):  # four in flight refused together: one cut
        pacer.refused(sent_under, retry_after_s=0.15)
    assert pacer.cuts == 1 and pacer.interval == pytest.approx(0.2)  # five a second
    assert pacer.take() == pytest.approx(0.15)  # not before the Retry-After
    clock.now += 0.15
    assert pacer.take() == 0.0
    assert pacer.take() == pytest.approx(0.2)  # then one every 0.2 s
    clock.now += 1.0
    pacer.refused(pacer.cuts, retry_after_s=None)  # sent after the cut, refused: cut again
    assert pacer.interval == pytest.approx(0.4)
    pacer.answered()
    assert pacer.interval == pytest.approx(0.4 * SPEED_UP)
    pacer.refused(pacer.cuts, retry_after_s=2.0)  # never faster than the endpoint's Retry-After
    assert pacer.interval == pytest.approx(2.0)


def test_a_sweep_of_3_points_under_429s_finishes_unattended_with_few_retries_and_none_paid_twice() -> None:
    # joblib runs the points as 3 processes sharing the key's limit; each paces itself by the x-ratelimit-* headers
    # of every answer (the server's own count for the key), so they slow together before the bucket runs dry
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "eval_ratelimit.py"), "--items", "20", "--per-second", "8",
         "--burst", "40", "--json", "eval.concurrency=2"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    assert figures["exit_code"] == 0, figures["stderr_tail"]
    # every point finishes; an item whose call used up its attempts in a burst of 429s would end degraded, not lost
    assert figures["items"] == 60 and figures["points_complete"] == 3
    assert figures["items_complete"] >= 57
    assert figures["lowest_remaining"] <= 20  # the limit did bind: the sweep spent over half the bucket
    assert figures["retry_share"] <= 0.10
    assert figures["paid_twice"] == 0
