"""MixA / SteLLA (Sec. 5.2, Theorems 5.1-5.3, Eqs. 4-7, Fig. 1): the fixed scales √d and N keep the output
variance O(1) as the sequence grows.

``stella-variance``. Theorem 5.2: with Var(A_ij V_jk) ≤ C, Var(Σ_j A_ij V_jk) = O(N²), so dividing by α = N (Eqs. 4
and 6) keeps Var(O) = O(1); Theorems 5.1 / 5.3 give the √d of the scores (Eqs. 5 and 7). The paper contrasts this
with ReLU linear attention normalised by each row's sum (cosFormer, EfficientViT), which it calls unstable (Fig. 1,
no numbers). Measured: Var(O) over all output entries of draws with q, k ~ N(0, I_d) (the theorems' assumption)
and v ~ N(1, I) (a common mean: the case where the O(N²) of Theorem 5.2 is attained without the 1/N), as N grows;
the statistic is the growth exponent, the least-squares slope of log Var(O) against log N.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import figures
from ..criteria import Criterion, Statistic, log_slope
from .base import ClaimCheck, Context, Result

BOUNDED = ("stella", "relu_quadratic")  # Eqs. 4-7 with α = N: Var(O) bounded (Theorem 5.2)


def variance_curve(spec, sizes, *, draws: int, heads: int, dim: int, v_mean: float, seed: int) -> list[float]:
    """Var(O) of ``spec`` at each N of ``sizes`` (``draws`` sequences each, fresh inputs per N)."""
    out = []
    for i, n in enumerate(sizes):
        g = torch.Generator().manual_seed(seed * 1000 + i)
        q, k = (torch.randn(draws, heads, n, dim, generator=g) for _ in range(2))
        v = torch.randn(draws, heads, n, dim, generator=g) + v_mean
        attn = spec.build(heads=heads, head_dim=dim, seq_len=n)
        with torch.no_grad():
            out.append(float(attn(q, k, v).double().var()))
    return out


def run_variance(ctx: Context) -> Result:
    s = ctx.settings
    lo, hi = s["bounded_below"], s["grows_above"]
    sizes = s["sizes"]
    if ctx.spec.name in BOUNDED:
        crit = Criterion("growth exponent of Var(O) in N", "<", lo, hi,
                         f"Var(O) stays bounded as N grows from {sizes[0]} to {sizes[-1]} (Theorem 5.2 with α = N): "
                         f"the slope of log Var(O) against log N is below {lo}; fails at {hi} or above (growing), "
                         f"inconclusive in between")
    else:
        crit = Criterion("growth exponent of Var(O) in N", ">", hi, lo,
                         f"the paper's contrast (Sec. 5.2, Fig. 1): this mechanism is not variance-stable, Var(O) grows "
                         f"with N from {sizes[0]} to {sizes[-1]}: the slope of log Var(O) against log N is {hi} or "
                         f"above; fails below {lo} (bounded), inconclusive in between")
    var = variance_curve(ctx.spec, sizes, draws=s["draws"], heads=1, dim=s["dim"], v_mean=s["v_mean"], seed=ctx.seed)
    slope = log_slope(sizes, var)
    desc = (f"synthetic: q, k ~ N(0, I_{s['dim']}), v ~ N({s['v_mean']}, I), {s['draws']} sequences per N, "
            f"N in {sizes}, float32")
    res = Result(crit, Statistic.exact(float("nan") if slope is None else slope), desc,
                 {"sizes": sizes, "variance": var})
    fig, (ax,) = figures.axes(1)
    ax.loglog(sizes, var, "o-", label=ctx.spec.label)
    ref = np.array(sizes, dtype=float) / sizes[0] * var[0]
    ax.loglog(sizes, [var[0]] * len(sizes), "k:", lw=0.8, label="slope 0 (bounded)")
    ax.loglog(sizes, ref, "k--", lw=0.8, label="slope 1")
    ax.set_xlabel("N (tokens)")
    ax.set_ylabel("Var(O)")
    ax.set_title(f"{ctx.spec.label}: growth exponent {slope:.2f}", fontsize=8)
    ax.legend(fontsize=8)
    res.figure = figures.save(fig, ctx.figure, f"stella-variance ({ctx.spec.label})", res.verdict)
    return res


CHECKS = [
    ClaimCheck("stella-variance", "MixA Sec. 5.2, Theorems 5.1-5.3, Eqs. 4-7, Fig. 1",
          "with the scales √d and N the output variance of SteLLA and ReLU quadratic attention stays bounded as N "
          "grows; row-normalised ReLU linear attention is the unstable one", ("stella", "relu_linear", "relu_quadratic"),
          ("synthetic",), run_variance,
          {"sizes": [64, 256, 1024, 4096], "draws": 8, "dim": 32, "v_mean": 1.0, "bounded_below": 0.25,
           "grows_above": 0.75}, accepts=lambda spec: spec.name in (*BOUNDED, "relu_linear")),
]
