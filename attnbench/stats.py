"""The uncertainty of accuracy figures: every accuracy a leaderboard prints is a proportion of a finite test set.

Small closed-form statistics on purpose (no SciPy in the core): the Wilson score interval of a proportion, and
the two-sided two-proportion z-test (pooled), which is what "is 52.0% on 150 images different from 48.7%?" needs.
"""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def wilson_interval(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """95% (by default) Wilson score interval of a proportion ``p`` observed on ``n`` trials."""
    if n <= 0:
        return (0.0, 1.0)
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(max(p * (1 - p) / n + z * z / (4 * n * n), 0.0))
    return (max(0.0, center - half), min(1.0, center + half))


def two_proportion_p(p1: float, n1: int, p2: float, n2: int) -> float:
    """Two-sided p-value that proportions ``p1`` (of ``n1``) and ``p2`` (of ``n2``) are equal (pooled z-test)."""
    if n1 <= 0 or n2 <= 0:
        return 1.0
    pooled = (p1 * n1 + p2 * n2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return 1.0 if p1 == p2 else 0.0
    return math.erfc(abs(p1 - p2) / se / math.sqrt(2))


def above_rate_p(p: float, n: int, rate: float) -> float:
    """One-sided p-value that a proportion ``p`` of ``n`` trials is above a fixed ``rate`` (normal approximation
    of the binomial; e.g. is an accuracy above the majority-class rate?)."""
    if n <= 0 or not 0 < rate < 1:
        return 1.0 if p <= rate else 0.0
    z = (p - rate) / math.sqrt(rate * (1 - rate) / n)
    return 0.5 * math.erfc(z / math.sqrt(2))
