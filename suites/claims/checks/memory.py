"""Memory at high resolution: the linear attentions' peak memory against softmax's as the token count grows to the
papers' largest (tens of thousands of tokens: NaLaFormer's "70K+ tokens" super-resolution, MirrorLA's
"ultra-long sequence super-resolution", LaplacianFormer's Fig. 3b, PolaFormer's LRA).

``memory``. Measured: the peak bytes of tensor storages alive at once during one forward pass (B = 1, H = 1,
d = 64, float32, no autograd) by :class:`attnbench.measure.memory.TensorMemory` (allocator-independent: the same on any
CPU), for the mechanism at each N and for softmax in its reference form (the N x N matrix the papers' baselines
materialise; SDPA's fused CPU kernel keeps its scratch out of sight of a tensor count) up to the size where its
two N x N float32 matrices exceed a cap. Statistic: the growth exponent of the mechanism's peak in N (slope of
log bytes against log N); the ratios to softmax are recorded beside the papers' printed savings (which are whole
models on GPUs, at other sizes: context, not a criterion).
"""

from __future__ import annotations

import torch

from attnbench.api.registry import build
from attnbench.measure.memory import TensorMemory

from .. import figures
from ..criteria import Criterion, Statistic, log_slope
from .base import ClaimCheck, Context, Result

# What the papers print (notes in ../shared/papers/notes/): whole-model peak memory, GPU, their baselines.
PAPERS = {
    "nala": "NaLaFormer: SR Urban100 x4, ESRT 69 GB -> NaLaSR 5.3 GB (-92.3%, '70K+ tokens'); LRA mean 2603.8 MB vs "
            "softmax 9003.6 MB (x0.29)",
    "mirrorla": "MirrorLA: SR x4, DCTLSA-softmax -> DCTLSA-MirrorLA, -79.6% to -82.9% (Urban100 4.28 -> 0.85 GB); "
                "x3: -77.5% to -80.1%",
    "polaformer": "PolaFormer (NaLaFormer Table 14): LRA mean 2047.2 MB vs softmax 9003.6 MB (x0.22)",
    "laplacian": "LaplacianFormer Fig. 3b: 'linear scaling', no numbers printed",
}


def peak_bytes(attn, n: int, dim: int, seed: int = 0) -> int:
    """Peak tensor bytes of one forward of ``attn`` at B = 1, H = 1, N = ``n`` (inputs not counted)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 1, n, dim, generator=g) for _ in range(3))
    with torch.no_grad(), TensorMemory() as mem:
        out = attn(q, k, v)
    del out
    return int(mem.peak)


def run_memory(ctx: Context) -> Result:
    s = ctx.settings
    sizes, dim, cap = s["sizes"], s["dim"], s["softmax_cap_bytes"]
    crit = Criterion("growth exponent of peak memory in N", "<", s["linear_below"], s["fails_above"],
                     f"peak forward memory grows at most linearly in N from {sizes[0]} to {sizes[-1]} tokens: the "
                     f"slope of log(peak bytes) against log N is below {s['linear_below']}; fails at "
                     f"{s['fails_above']} or above (softmax's N x N is 2), inconclusive in between")

    mech, soft, ratio = [], [], []
    for n in sizes:
        attn = ctx.spec.build(heads=1, head_dim=dim, seq_len=n)
        mech.append(peak_bytes(attn, n, dim, ctx.seed))
        if 2 * n * n * 4 <= cap:  # scores and softmax weights, float32
            soft.append(peak_bytes(build("softmax", heads=1, head_dim=dim, impl="reference"), n, dim, ctx.seed))
            ratio.append(mech[-1] / soft[-1])
        else:
            soft.append(None)
            ratio.append(None)
    slope = log_slope(sizes, mech)
    common = [i for i, r in enumerate(ratio) if r is not None]
    last = common[-1] if common else None
    desc = (f"synthetic: q, k, v ~ N(0, I), B = 1, H = 1, d = {dim}, float32, forward without autograd, N in {sizes}; "
            f"softmax (reference, N x N) up to N = {sizes[last] if last is not None else '-'} (cap: "
            f"{cap / 2**30:g} GiB for its two N x N matrices; larger N recorded as size-limited, not run)")
    res = Result(crit, Statistic.exact(float("nan") if slope is None else slope), desc,
                 {"sizes": sizes, "peak_bytes": mech, "softmax_peak_bytes": soft, "ratio_to_softmax": ratio,
                  "largest_common_n": sizes[last] if last is not None else None,
                  "ratio_at_largest_common_n": ratio[last] if last is not None else None,
                  "softmax_size_limited": [n for n, b in zip(sizes, soft) if b is None],
                  "impl": ctx.spec.build(heads=1, head_dim=dim, seq_len=sizes[0]).resolve_impl("cpu"),
                  "paper": PAPERS.get(ctx.spec.name, "")})
    fig, (ax,) = figures.axes(1)
    ax.loglog(sizes, [b / 2**20 for b in mech], "o-", label=ctx.spec.label)
    ns = [n for n, b in zip(sizes, soft) if b is not None]
    ax.loglog(ns, [b / 2**20 for b in soft if b is not None], "s--", label="softmax (reference)")
    for n, r in zip(sizes, ratio):
        if r is not None:
            ax.annotate(f"x{r:.3f}", (n, mech[sizes.index(n)] / 2**20), fontsize=7, textcoords="offset points",
                        xytext=(0, 6))
    ax.set_xlabel("N (tokens)")
    ax.set_ylabel("peak tensor memory of one forward (MiB)")
    ax.set_title(f"{ctx.spec.label}: exponent {slope:.2f}", fontsize=8)
    ax.legend(fontsize=8)
    res.figure = figures.save(fig, ctx.figure, f"memory ({ctx.spec.label})", res.verdict)
    return res


CHECKS = [
    ClaimCheck("memory", "NaLaFormer Sec. 4.4 / Table 4, MirrorLA Table 4, LaplacianFormer Fig. 3b, PolaFormer (LRA)",
          "peak memory grows linearly in the token count, far below softmax's at tens of thousands of tokens",
          ("nala", "mirrorla", "polaformer", "laplacian"), ("synthetic",), run_memory,
          {"sizes": [1024, 4096, 16384, 65536], "dim": 64, "softmax_cap_bytes": 2 * 2**30, "linear_below": 1.15,
           "fails_above": 1.5}, accepts=lambda spec: spec.name != "softmax"),  # softmax is the baseline of every cell
]
