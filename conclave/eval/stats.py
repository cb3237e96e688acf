"""Statistics for an evaluation: binomial intervals, McNemar's exact test, Brier score, calibration error.

Pure Python (no SciPy): the exact intervals and tests only need binomial tail sums, computed in log space.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a proportion (95% by default); (0, 1) when ``n`` is 0."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def _log_pmf(k: int, n: int, p: float) -> float:
    if p <= 0.0:
        return 0.0 if k == 0 else -math.inf
    if p >= 1.0:
        return 0.0 if k == n else -math.inf
    return (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
            + k * math.log(p) + (n - k) * math.log1p(-p))


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X ≤ k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, sum(math.exp(_log_pmf(i, n, p)) for i in range(k + 1)))


def clopper_pearson(successes: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval: conservative, never narrower than its nominal coverage."""
    if n <= 0:
        return 0.0, 1.0

    def solve(target: float, k: int, increasing: bool) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(60):  # bisection to ~1e-18
            mid = (lo + hi) / 2
            value = binom_cdf(k, n, mid)
            # binom_cdf(k, n, p) decreases in p
            if (value > target) == increasing:
                lo = mid
            else:
                hi = mid
        return (lo + hi) / 2

    lower = 0.0 if successes == 0 else solve(1 - alpha / 2, successes - 1, True)
    upper = 1.0 if successes == n else solve(alpha / 2, successes, True)
    return lower, upper


@dataclass(frozen=True)
class McNemar:
    """Paired comparison of protocols A and B on the same items: ``b`` = A right, B wrong; ``c`` = A wrong, B
    right; ``p`` = two-sided exact p-value (binomial on the discordant pairs; 1.0 when there are none)."""

    b: int
    c: int
    p: float


def mcnemar_exact(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> McNemar:
    if len(a_correct) != len(b_correct):
        raise ValueError("McNemar's test needs the two protocols' results on the same items")
    b = sum(1 for x, y in zip(a_correct, b_correct, strict=True) if x and not y)
    c = sum(1 for x, y in zip(a_correct, b_correct, strict=True) if y and not x)
    n = b + c
    if n == 0:
        return McNemar(b, c, 1.0)
    p = min(1.0, 2 * binom_cdf(min(b, c), n, 0.5))
    return McNemar(b, c, p)


def brier(confidences: Sequence[float], correct: Sequence[bool]) -> float | None:
    """Mean squared gap between stated confidence and the 0/1 outcome; None without data."""
    if not confidences:
        return None
    return sum((c - float(k)) ** 2 for c, k in zip(confidences, correct, strict=True)) / len(confidences)


@dataclass(frozen=True)
class Bin:
    lower: float
    upper: float
    count: int
    mean_confidence: float | None
    accuracy: float | None


def reliability_table(confidences: Sequence[float], correct: Sequence[bool], bins: int = 10) -> list[Bin]:
    """Equal-width confidence bins over [0, 1] (the last one closed), each with its mean confidence and accuracy."""
    members: list[list[int]] = [[] for _ in range(bins)]
    for index, value in enumerate(confidences):
        members[min(bins - 1, max(0, int(value * bins)))].append(index)
    table = []
    for b, indices in enumerate(members):
        conf = [confidences[i] for i in indices]
        hits = [correct[i] for i in indices]
        table.append(Bin(b / bins, (b + 1) / bins, len(indices),
                         sum(conf) / len(conf) if conf else None,
                         sum(hits) / len(hits) if hits else None))
    return table


def ece(confidences: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float | None:
    """Expected calibration error: the count-weighted mean |accuracy − confidence| over the reliability bins."""
    n = len(confidences)
    if n == 0:
        return None
    total = 0.0
    for row in reliability_table(confidences, correct, bins):
        if row.count and row.mean_confidence is not None and row.accuracy is not None:
            total += row.count / n * abs(row.accuracy - row.mean_confidence)
    return total
