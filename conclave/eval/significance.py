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


def newcombe_paired(both: int, a_only: int, b_only: int, neither: int, z: float = Z95) -> tuple[float, float]:
    """95% interval of the paired difference p_B − p_A (Newcombe 1998, method 10: Wilson score limits of each
    proportion combined with the phi correlation of the pairs). ``a_only``: A right, B wrong; ``b_only``: B right,
    A wrong. (0, 0) without items."""
    n = both + a_only + b_only + neither
    if n == 0:
        return 0.0, 0.0
    right_a, right_b = both + a_only, both + b_only
    l1, u1 = wilson(right_b, n, z)
    l2, u2 = wilson(right_a, n, z)
    p1, p2 = right_b / n, right_a / n
    delta = p1 - p2
    margins = [(both + a_only), (b_only + neither), (both + b_only), (a_only + neither)]
    phi = 0.0
    if all(margins):
        product = margins[0] * margins[1] * margins[2] * margins[3]
        numerator = float(both * neither - a_only * b_only)
        # the correction of method 10: a positive numerator is shrunk by n/2 towards zero
        if numerator > 0:
            numerator = max(0.0, numerator - n / 2)
        phi = numerator / math.sqrt(product)
    d_low = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    d_high = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, delta - d_low), min(1.0, delta + d_high)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (same order as given), controlling the family-wise
    error rate."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    m = len(p_values)
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


Z80 = 0.8416212335729143  # one-sided z of 80% power


def detectable_pp(n: int, discordant_share: float) -> float | None:
    """The smallest paired difference (percentage points) a two-sided 5% McNemar test detects with 80% power on
    ``n`` items when ``discordant_share`` of items are discordant (normal approximation:
    (z_0.975 + z_0.8) · sqrt(d / n)). None without items."""
    if n <= 0:
        return None
    return 100 * (Z95 + Z80) * math.sqrt(max(discordant_share, 0.0) / n)
