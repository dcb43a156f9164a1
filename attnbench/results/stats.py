"""The uncertainty of accuracy figures: every accuracy a leaderboard prints is a proportion of a finite test set.

The Wilson score interval of a proportion and the two-sided two-proportion z-test (pooled), which is what "is
52.0% on 150 images different from 48.7%?" needs; over seeds (:class:`SeedStats`), Student's t interval of the
mean, Welch's test and a χ² test of whether the seeds disagree more than the test set's sampling explains. The
distributions are scipy.stats' (imported on first use: the tables load this module on every command).
"""

from __future__ import annotations

import dataclasses
import math
import statistics

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


# --- over seeds ---------------------------------------------------------------------------------------------------
# A cell is (spec, task, seed); a leaderboard row is (spec, task) over its seeds. Two noises are told apart: the
# test set's (a binomial proportion of n items, the Wilson interval above) and the training's (the spread over seeds,
# a Student t interval).


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p-value of Student's t with ``df`` (>= 1) degrees of freedom: P(|T| >= |t|)."""
    from scipy import stats

    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return float(2 * stats.t.sf(abs(t), df))


def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of Student's t (e.g. 12.71 for df = 1, 4.30 for df = 2 at 95%)."""
    from scipy import stats

    return float(stats.t.ppf(1 - (1 - level) / 2, df))


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for a χ² variable with ``df`` (>= 1) degrees of freedom."""
    from scipy import stats

    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return float(stats.chi2.sf(x, df))


def welch_p(a: list[float], b: list[float]) -> float:
    """Two-sided p-value that two sets of seeds have the same mean (Welch's t-test, its fractional degrees of
    freedom rounded down, which errs towards 'not different'). Needs >= 2 values on each side."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError("Welch's test needs at least two values on each side")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    diff = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return 1.0 if diff == 0 else 0.0
    df = (va + vb) ** 2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))
    return t_two_sided_p(diff / math.sqrt(va + vb), max(1, int(df)))


#: p below which the seeds of a row are said to disagree beyond the test set's noise (:attr:`SeedStats.disagree`).
DISAGREE_P = 0.05


@dataclasses.dataclass(frozen=True)
class SeedStats:
    """One leaderboard row's figure over its seeds. ``values``: per seed, in the metric's unit (e.g. accuracy in %:
    ``scale`` = 100); ``n_test``: the test-set size when the figure is a proportion of it (None: not a proportion,
    e.g. perplexity, and no test-set interval or disagreement test)."""

    values: tuple[float, ...]
    seeds: tuple = ()
    n_test: int | None = None
    scale: float = 100.0

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def sd(self) -> float | None:
        return statistics.stdev(self.values) if self.n > 1 else None

    @property
    def half(self) -> float | None:
        """Half-width of the 95% t-interval of the mean over seeds (n − 1 degrees of freedom); None for one seed."""
        return t_quantile(self.n - 1) * self.sd / math.sqrt(self.n) if self.n > 1 else None

    @property
    def test_half(self) -> float | None:
        """Half-width of the 95% Wilson interval of the mean as a proportion of ``n_test`` items (in the metric's
        unit); None when the figure is not a proportion."""
        if not self.n_test:
            return None
        lo, hi = wilson_interval(self.mean / self.scale, self.n_test)
        return self.scale * (hi - lo) / 2

    @property
    def disagree_p(self) -> float | None:
        """p-value of the χ² test of homogeneity of the seeds' proportions (k seeds × ``n_test`` items, k − 1
        degrees of freedom): X² = Σ n_test (p_i − p̄)² / (p̄ (1 − p̄)). Small: the seeds differ more than drawing
        ``n_test`` test items explains. None with one seed or without ``n_test``."""
        if self.n < 2 or not self.n_test:
            return None
        ps = [v / self.scale for v in self.values]
        pbar = sum(ps) / len(ps)
        if pbar <= 0 or pbar >= 1:
            return 1.0
        x2 = sum(self.n_test * (p - pbar) ** 2 for p in ps) / (pbar * (1 - pbar))
        return chi2_sf(x2, self.n - 1)

    @property
    def disagree(self) -> bool:
        p = self.disagree_p
        return p is not None and p < DISAGREE_P


def seed_stats(values, *, seeds=(), n_test: int | None = None, scale: float = 100.0) -> SeedStats:
    """:class:`SeedStats` of ``values`` (one per seed)."""
    values = tuple(float(v) for v in values)
    if not values:
        raise ValueError("no values to aggregate over seeds")
    return SeedStats(values, tuple(seeds), int(n_test) if n_test else None, scale)
