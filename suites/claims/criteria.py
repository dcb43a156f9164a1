"""Criteria stated before measuring, and the verdict rule (torch-free: numpy only).

A :class:`Criterion` is data: the statistic's name, the side the claim predicts (``"<"`` or ``">"``), the value
beyond which the claim *holds* and the value beyond which it *fails*. A measured :class:`Statistic` is a value with
a confidence interval (``lo``, ``hi``; equal to the value for a deterministic statistic). The verdict:

- ``holds`` when the whole interval lies on the claimed side of ``holds_at``;
- ``fails`` when the whole interval lies on the other side of ``fails_at``;
- ``inconclusive`` otherwise: the interval straddles a threshold (the statistic is within noise), or the value
  falls in the band between ``fails_at`` and ``holds_at`` that the criterion leaves undecided.

Every check builds its criterion from its settings before it draws any input, and records the criterion's text with
the verdict, so a reader sees what was promised and what was measured.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import numpy as np

VERDICTS = ("holds", "fails", "inconclusive")
CI_LEVEL = 0.99
Z99 = 2.5758293035489004


@dataclasses.dataclass(frozen=True)
class Criterion:
    """``statistic side holds_at`` holds; ``statistic (opposite side) fails_at`` fails (see the module doc)."""

    statistic: str
    side: str  # "<" or ">": the direction the claim predicts
    holds_at: float
    fails_at: float
    text: str  # the criterion in words, with the sample and the interval it uses

    def __post_init__(self):
        if self.side not in ("<", ">"):
            raise ValueError(f"Criterion.side must be '<' or '>', got {self.side!r}")
        if (self.side == "<" and self.fails_at < self.holds_at) or (self.side == ">" and self.fails_at > self.holds_at):
            raise ValueError(f"Criterion {self.statistic!r}: fails_at must be on the far side of holds_at")

    def verdict(self, stat: "Statistic") -> str:
        lo, hi = stat.lo, stat.hi
        if math.isnan(lo) or math.isnan(hi):  # an infinite end is a censored bound, still decisive
            return "inconclusive"
        if self.side == "<":
            if hi < self.holds_at:
                return "holds"
            if lo >= self.fails_at:
                return "fails"
        else:
            if lo > self.holds_at:
                return "holds"
            if hi <= self.fails_at:
                return "fails"
        return "inconclusive"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Statistic:
    value: float
    lo: float
    hi: float
    interval: str = "exact"  # how lo/hi were obtained ("exact": a deterministic statistic, lo = hi = value)

    @classmethod
    def exact(cls, value: float) -> "Statistic":
        v = float(value)
        return cls(v, v, v, "exact")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    ends = np.cumsum(counts)
    return ((ends - (counts - 1) / 2.0)[inverse]).astype(np.float64)


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[Statistic, float]:
    """Spearman's ρ (Pearson's r of the average ranks) with its 99% interval (Fisher z, standard error
    1.06 / sqrt(n - 3), Fieller et al. 1957) and the two-sided p-value of ρ = 0 (normal approximation of
    z·sqrt(n - 3) / 1.06; numpy only: scipy is not a dependency of attnbench)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    n = len(x)
    nan = float("nan")
    if n < 4:
        return Statistic(nan, nan, nan, "fisher-z 99%"), nan
    rx, ry = ranks(x), ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = math.sqrt(float((rx * rx).sum() * (ry * ry).sum()))
    if den == 0:  # a constant sequence: no correlation is defined
        return Statistic(nan, nan, nan, "fisher-z 99%"), nan
    rho = float((rx * ry).sum() / den)
    z = math.atanh(max(min(rho, 1 - 1e-12), -1 + 1e-12))
    se = 1.06 / math.sqrt(n - 3)
    p = math.erfc(abs(z) / se / math.sqrt(2))
    return Statistic(rho, math.tanh(z - Z99 * se), math.tanh(z + Z99 * se), "fisher-z 99%"), p


def spearman_pooled(groups: Sequence[tuple[Sequence[float], Sequence[float]]]) -> tuple[Statistic, list[float]]:
    """Spearman's ρ within each group, combined by the inverse-variance mean of Fisher's z (weights n - 3): the
    pooled ρ with its 99% interval, and the per-group ρ's. One group gives :func:`spearman`. Grouping keeps a
    confounder that differs between groups (e.g. the layer of a real model) out of the correlation."""
    zs, ws, rhos = [], [], []
    for x, y in groups:
        st, _ = spearman(x, y)
        rhos.append(st.value)
        n = len(x)
        if math.isfinite(st.value) and n > 3:
            zs.append(math.atanh(max(min(st.value, 1 - 1e-12), -1 + 1e-12)))
            ws.append(n - 3)
    if not ws:
        return Statistic(float("nan"), float("nan"), float("nan"), "pooled fisher-z 99%"), rhos
    z = float(np.average(zs, weights=ws))
    se = 1.06 / math.sqrt(sum(ws))
    return Statistic(math.tanh(z), math.tanh(z - Z99 * se), math.tanh(z + Z99 * se),
                     f"pooled fisher-z 99% ({len(ws)} groups)"), rhos


def bootstrap(stat: Callable[[np.ndarray], float], n: int, *, reps: int = 400, seed: int = 0) -> Statistic:
    """``stat(indices)`` on all ``n`` items and its 99% percentile interval over ``reps`` resamples (with
    replacement) of the items."""
    rng = np.random.default_rng(seed)
    value = float(stat(np.arange(n)))
    draws = np.array([stat(rng.integers(0, n, n)) for _ in range(reps)], dtype=np.float64)
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return Statistic(value, float("nan"), float("nan"), f"bootstrap 99% ({reps})")
    a = (1 - CI_LEVEL) / 2
    return Statistic(value, float(np.quantile(draws, a)), float(np.quantile(draws, 1 - a)),
                     f"bootstrap 99% ({reps} resamples)")


def excess_kurtosis(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    c = x - x.mean()
    v = (c * c).mean()
    return float((c ** 4).mean() / (v * v) - 3.0) if v > 0 else 0.0


def log_slope(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Least-squares slope of log(y) against log(x) (the growth exponent); None with fewer than two points."""
    pts = [(math.log(a), math.log(b)) for a, b in zip(xs, ys) if a > 0 and b > 0]
    if len({p[0] for p in pts}) < 2:
        return None
    px, py = np.array(pts).T
    return float(np.polyfit(px, py, 1)[0])
