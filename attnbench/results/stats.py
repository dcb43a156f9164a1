"""The uncertainty of accuracy figures: every accuracy a leaderboard prints is a proportion of a finite test set.

The Wilson score interval of a proportion and the two-sided two-proportion z-test (pooled), which is what "is
52.0% on 150 images different from 48.7%?" needs; over seeds (:class:`SeedStats`), Student's t interval of the
mean, Welch's test and a χ² test of whether the seeds disagree more than the test set's sampling explains. The
distributions are scipy's: Student's t and χ² from scipy.special (the functions scipy.stats' t and chi2 call; a
second to import where scipy.stats takes two), the noncentral t of the projection from scipy.stats, each imported
on first use (the tables load this module on every command).
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
    from scipy import special

    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return float(2 * special.stdtr(df, -abs(t)))


def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided ``level`` quantile of Student's t (e.g. 12.71 for df = 1, 4.30 for df = 2 at 95%)."""
    from scipy import special

    return float(special.stdtrit(df, 1 - (1 - level) / 2))


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for a χ² variable with ``df`` (>= 1) degrees of freedom."""
    from scipy import special

    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    return float(special.chdtrc(df, x))


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


# --- what more seeds would tell apart (a projection, not a measurement) -------------------------------------------
# A leaderboard's pairs are tested by Welch's t over seeds, Holm-corrected over all its pairs (attnbench.views.compare).
# Given the means and standard deviations its seeds show, how many pairs would S seeds a row separate? The power of
# each pair's test, taking the observed means and spreads as the truth, at the Holm level that pair would face.

#: The family-wise error rate of a leaderboard's separation line (Holm over its pairs).
HOLM_ALPHA = 0.05
#: A pair counts as separable at S seeds when its test would pass at least this often (the usual design power).
DESIGN_POWER = 0.8
#: Seeds a row needs before its spread means anything: the fewest whose 95% t interval is not dominated by the
#: quantile of one degree of freedom (two seeds: 12.7 standard errors; three: 4.3).
FIRST_ESTIMATE_SEEDS = 3


@dataclasses.dataclass(frozen=True)
class PairSpread:
    """One pair of leaderboard rows as its seeds show it: the difference of the means, each row's standard deviation
    over seeds and its number of seeds (Welch's test compares the two)."""

    diff: float
    sd_a: float
    sd_b: float
    n_a: int
    n_b: int

    def at(self, n_a: int, n_b: int | None = None) -> "PairSpread":
        """The same pair with ``n_a`` and ``n_b`` (default ``n_a``) seeds a row."""
        return dataclasses.replace(self, n_a=n_a, n_b=n_a if n_b is None else n_b)

    @property
    def strength(self) -> float:
        """The difference in standard errors (the noncentrality of Welch's t at these seeds): inf when neither row
        varies and the means differ."""
        se2 = self.sd_a ** 2 / self.n_a + self.sd_b ** 2 / self.n_b
        if se2 == 0:
            return math.inf if self.diff != 0 else 0.0
        return abs(self.diff) / math.sqrt(se2)


def welch_power(pair: PairSpread, level: float) -> float:
    """The probability that Welch's two-sided test at ``level`` rejects equal means for ``pair`` (its observed means
    and standard deviations taken as the truth): P(|T| > t_crit) for T noncentral t with the pair's Welch-Satterthwaite
    degrees of freedom (rounded down, as :func:`welch_p` tests) and noncentrality diff / SE. Equal means give about
    ``level``, whatever the seeds."""
    from scipy import stats

    if pair.n_a < 2 or pair.n_b < 2:
        return 0.0
    va, vb = pair.sd_a ** 2 / pair.n_a, pair.sd_b ** 2 / pair.n_b
    if va + vb == 0:
        return 1.0 if pair.diff != 0 else 0.0
    df = max(1, int((va + vb) ** 2 / (va * va / (pair.n_a - 1) + vb * vb / (pair.n_b - 1))))
    ncp = abs(pair.diff) / math.sqrt(va + vb)
    crit = stats.t.ppf(1 - level / 2, df)
    upper, lower = float(stats.nct.sf(crit, df, ncp)), float(stats.nct.cdf(-crit, df, ncp))
    # scipy's noncentral t returns nan far in a tail: the wrong-sign tail is then nil, the right one the normal's
    upper = upper if math.isfinite(upper) else float(stats.norm.sf(crit - ncp))
    lower = lower if math.isfinite(lower) else 0.0
    return min(1.0, max(0.0, upper + lower))


def holm_powers(pairs: list[PairSpread], alpha: float = HOLM_ALPHA) -> list[float]:
    """Each pair's power at the Holm level it would face, in the order of ``pairs``.

    How the Holm level of a pair is assigned: Holm's step-down tests the smallest p-value at alpha / m, the next at
    alpha / (m - 1), and so on while they pass. The pairs are ranked by their expected strength (difference over
    standard error, :attr:`PairSpread.strength`); a pair faces alpha / (m - E), E the expected number of separations
    among the pairs ranked before it (the sum of their powers), so a pair behind sure separations gets their relief
    and one behind doubtful ones only part of it. Tested against simulated draws of the seeds (Welch and Holm on
    each draw, tests/test_projection.py): the count agrees within a fraction of a pair from six seeds a row on; at
    three it overstates (there Welch's degrees of freedom, estimated from three values a side, fall below those of
    the spreads taken as the truth)."""
    m = len(pairs)
    powers = [0.0] * m
    ahead = 0.0
    for i in sorted(range(m), key=lambda i: -pairs[i].strength):
        powers[i] = welch_power(pairs[i], alpha / max(1.0, m - ahead))
        ahead += powers[i]
    return powers


def expected_separated(pairs: list[PairSpread], alpha: float = HOLM_ALPHA) -> float:
    """The expected number of ``pairs`` Welch's test with Holm over all of them separates (:func:`holm_powers`)."""
    return sum(holm_powers(pairs, alpha))


def projection_seeds(n: int) -> tuple[int, ...]:
    """The seed counts a table's projection names: 8, 16 and 32, or, past those, two and four times ``n``."""
    return tuple(s for s in (8, 16, 32) if s > n) or (2 * n, 4 * n)


@dataclasses.dataclass(frozen=True)
class SeedProjection:
    """What a leaderboard's observed spreads imply for more seeds: ``expected[S]``, the pairs S seeds a row would
    separate (Welch + Holm, :func:`expected_separated`); ``hopeless``, the pairs still below even odds at the largest
    S (their gap is within their seed noise there: equal means are never separated)."""

    pairs: int
    seeds_now: int
    expected: dict[int, float]
    hopeless: int

    def line(self) -> str:
        (first, e1), *rest = self.expected.items()
        more = "".join(f", {s} about {round(e)}" for s, e in rest)
        return (f"Projection (a calculation, not a measurement: these means and spreads taken as the truth, Welch's "
                f"t at the Holm level each pair would face): {first} seeds a row would separate about {round(e1)} of "
                f"{self.pairs} pairs{more}; {self.hopeless} differ by less than their seed noise could show at "
                f"{max(self.expected)} seeds (under even odds); `attnbench plan` sizes a run.")


def seed_projection(pairs: list[PairSpread], alpha: float = HOLM_ALPHA) -> SeedProjection | None:
    """The :class:`SeedProjection` of a table's pairs (each with two or more seeds a side), or None without pairs."""
    if not pairs:
        return None
    now = min(min(p.n_a, p.n_b) for p in pairs)
    expected, powers = {}, []
    for s in projection_seeds(now):
        powers = holm_powers([p.at(max(s, p.n_a), max(s, p.n_b)) for p in pairs], alpha)
        expected[s] = sum(powers)
    return SeedProjection(len(pairs), now, expected, sum(p < 0.5 for p in powers))


def one_seed_line() -> str:
    """What a table of one seed a row can and cannot say (the other half of :class:`SeedProjection`)."""
    return (f"One seed a row: its intervals are the test set's alone; the spread from seed to seed (initialisation, "
            f"data order) is unmeasured, and a difference may be no more than a lucky seed. A first estimate of that "
            f"spread needs {FIRST_ESTIMATE_SEEDS} seeds a row (`--seeds 0,1,2`); `attnbench plan` then sizes a run "
            f"to separate the rows.")
