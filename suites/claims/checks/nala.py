"""NaLaFormer (Sec. 3.1, Theorems 1-2, Figs. 1 and 3; Appendix A.2): the query norm as an inverse temperature.

``nala-entropy``. Theorem 1: in softmax attention a larger ‖q‖ lowers the positive-sequence entropy (PSE, Eq. 15)
of the query's attention row; Theorem 2 (Eqs. 32-33): a feature-map linear attention whose map is (nearly)
homogeneous is query-norm-unaware, its PSE does not fall as ‖q‖ grows; NaLa's norm-dependent power
f(‖q‖) = λ(τ + tanh‖q‖) (Eq. 6) restores the negative correlation (Fig. 3). Measured: per query, PSE of its
attention row (the mechanism's reference form applied to V = I, so the row is exactly what multiplies V), and
Spearman's ρ(‖q‖, PSE) over all queries. Expected: negative for softmax and nala, not negative for the others.

``nala-nonneg``. Eqs. 9-10: every NaLa score φ_q(q)·φ_k(k) = Σ_i |a_i||b_i| cos(θ_qi − θ_ki) is ≥ 0 because the
angles are squeezed into [−π/4, π/4]. Measured: the smallest score over all query-key pairs, relative to the
largest, in float64.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from attnbench.api.registry import get_attention

from .. import figures
from ..criteria import Criterion, Statistic, spearman_pooled
from ..inputs import cached_real_qk
from .base import ClaimCheck, Context, Result, Skip

NEGATIVE = ("softmax", "nala")  # Theorem 1 (softmax) and Sec. 3.1 / Fig. 3 (nala): PSE falls as ‖q‖ grows
BAND = 0.1  # |ρ| below this is "no correlation" (the usual weak-effect convention), fixed before measuring


def pse(rows: torch.Tensor) -> torch.Tensor:
    """Positive-sequence entropy (Eq. 15) of each row of non-negative weights ``[..., N] -> [...]``."""
    p = rows.double().clamp_min(0)
    p = p / p.sum(-1, keepdim=True)
    return -(p * torch.log(p.clamp_min(1e-300))).sum(-1)


def attention_rows(spec, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The attention matrix of ``spec`` on ``q, k [B, H, N, d]``: its reference form with V = I (``[B, H, N, N]``),
    so any mechanism of the form O = A V gives its A, normalisation included."""
    B, H, N, d = q.shape
    attn = spec.build(heads=H, head_dim=d, seq_len=N)
    eye = torch.eye(N, dtype=q.dtype).expand(B, H, N, N)
    with torch.no_grad():
        return attn.reference(q, k, eye)


def synthetic_qk(seed: int, *, batch: int, tokens: int, dim: int, r_min: float, r_max: float,
                 dtype=torch.float32):
    """q = r·u with u uniform on the unit sphere of R^d and log r uniform on [log r_min, log r_max]; k ~ N(0, I)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(batch, 1, tokens, dim, generator=g, dtype=torch.float64)
    u = u / u.norm(dim=-1, keepdim=True)
    r = torch.exp(torch.empty(batch, 1, tokens, 1, dtype=torch.float64).uniform_(math.log(r_min), math.log(r_max),
                                                                                  generator=g))
    k = torch.randn(batch, 1, tokens, dim, generator=g, dtype=torch.float64)
    return (u * r).to(dtype), k.to(dtype)


def _inputs(ctx: Context):
    s = ctx.settings
    if ctx.input == "synthetic":
        q, k = synthetic_qk(ctx.seed, batch=s["batch"], tokens=s["tokens"], dim=s["dim"], r_min=s["r_min"],
                            r_max=s["r_max"])
        desc = (f"synthetic: {s['batch']} x {s['tokens']} queries q = r·u (u uniform on the sphere of R^{s['dim']}, "
                f"log r ~ U[log {s['r_min']}, log {s['r_max']}]), keys k ~ N(0, I), {s['tokens']} keys per query")
        return q, k, desc, torch.zeros(q.shape[:-1], dtype=torch.long)
    if ctx.input == "real":
        if ctx.teacher is None:
            raise Skip("no trained model for real inputs")
        q, k = cached_real_qk(ctx.teacher)  # [L, I, H, N, d]
        L, I, H, N, d = q.shape
        desc = (f"real: q, k of all {L} layers x {H} heads of {ctx.teacher.describe()} on {I} test images "
                f"({N} tokens; {L * I * H * N} queries, not independent: they share images and layers)")
        group = (torch.arange(L).view(L, 1, 1, 1) * H + torch.arange(H).view(1, 1, H, 1)).expand(L, I, H, N)
        return q.reshape(L * I, H, N, d), k.reshape(L * I, H, N, d), desc, group.reshape(L * I, H, N)
    raise ValueError(f"nala checks have no input {ctx.input!r}")


def entropy_criterion(name: str, n_queries: str) -> Criterion:
    if name in NEGATIVE:
        return Criterion("spearman ρ(‖q‖, PSE)", "<", -BAND, -BAND,
                         f"ρ < −{BAND} (the query norm lowers the entropy): the 99% interval of Spearman's ρ over "
                         f"{n_queries} queries lies below −{BAND}; fails if it lies at or above −{BAND}")
    return Criterion("spearman ρ(‖q‖, PSE)", ">", -BAND, -BAND,
                     f"ρ > −{BAND} (query-norm-unaware, Theorem 2: no negative correlation): the 99% interval of "
                     f"Spearman's ρ over {n_queries} queries lies above −{BAND}; fails if it lies at or below −{BAND}")


def run_entropy(ctx: Context) -> Result:
    s = ctx.settings
    n_queries = (f"{s['batch'] * s['tokens']}" if ctx.input == "synthetic" else
                 "all real queries, pooled over the (layer, head) groups by Fisher's z,")
    crit = entropy_criterion(ctx.spec.name, n_queries)  # stated before any input is drawn
    q, k, desc, group = _inputs(ctx)
    A = attention_rows(ctx.spec, q, k)
    ent = pse(A).flatten().numpy()
    norms = q.double().norm(dim=-1).flatten().numpy()
    group = group.flatten().numpy()
    stat, per_group = spearman_pooled([(norms[group == g], ent[group == g]) for g in np.unique(group)])
    res = Result(crit, stat, desc, {"rho_per_group": per_group, "queries": int(len(ent)), "pse_mean": float(ent.mean()),
                                    "pse_max_possible": math.log(q.shape[-2]),
                                    "min_weight": float(A.min())})
    fig, (ax,) = figures.axes(1)
    sub = np.random.default_rng(0).choice(len(ent), min(len(ent), 4000), replace=False)
    ax.scatter(norms[sub], ent[sub], s=3, alpha=0.4, c=group[sub], cmap="tab10" if group.max() < 10 else "viridis")
    ax.set_xscale("log")
    ax.set_xlabel("‖q‖")
    ax.set_ylabel("PSE of the attention row (Eq. 15)")
    ax.set_title(f"{ctx.spec.label} · {ctx.input}: Spearman ρ = {stat.value:.3f} "
                 f"[{stat.lo:.3f}, {stat.hi:.3f}]", fontsize=8)
    res.figure = figures.save(fig, ctx.figure, f"nala-entropy ({ctx.spec.label}, {ctx.input})", res.verdict)
    return res


def scores(spec, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``φ_q(q) φ_k(k)^T`` of a feature-map mechanism (``[B, H, N, N]``)."""
    B, H, N, d = q.shape
    fm = spec.build(heads=H, head_dim=d, seq_len=N).feature_map.double()
    with torch.no_grad():
        return fm.phi_q_reference(q) @ fm.phi_k_reference(k).transpose(-1, -2)


def run_nonneg(ctx: Context) -> Result:
    tol = ctx.settings["tolerance"]
    crit = Criterion("min score / max score", ">", -tol, -tol,
                     f"every score φ_q(q)·φ_k(k) ≥ 0 (Eq. 10): the smallest over all query-key pairs, relative to "
                     f"the largest, is above −{tol:g} (float64 round-off)")
    if ctx.input == "synthetic":
        s = ctx.settings
        g = torch.Generator().manual_seed(ctx.seed)
        # scales from 0.1 to 10 per token: the norm-dependent power f(‖q‖) spans its range [λτ, λ(τ + 1))
        scale = torch.exp(torch.empty(s["batch"], 1, s["tokens"], 1, dtype=torch.float64)
                          .uniform_(math.log(0.1), math.log(10), generator=g))
        q = torch.randn(s["batch"], 1, s["tokens"], s["dim"], generator=g, dtype=torch.float64) * scale
        k = torch.randn(s["batch"], 1, s["tokens"], s["dim"], generator=g, dtype=torch.float64) * scale.flip(2)
        desc = (f"synthetic: {s['batch']} x {s['tokens']} queries and keys ~ N(0, σ² I_{s['dim']}), log σ ~ "
                f"U[log 0.1, log 10] per token, float64")
    else:
        q, k, desc, _ = _inputs(ctx)
        q, k = q.double(), k.double()
    S = scores(ctx.spec, q, k)
    ratio = float(S.min() / S.abs().max())
    res = Result(crit, Statistic.exact(ratio), desc, {"min_score": float(S.min()), "max_score": float(S.max()),
                                                      "negative_fraction": float((S < 0).double().mean()),
                                                      "pairs": int(S.numel())})
    fig, (ax,) = figures.axes(1)
    vals = (S / S.abs().max()).flatten().numpy()
    ax.hist(vals, bins=100, log=True)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_xlabel("score / max score")
    ax.set_ylabel("pairs")
    ax.set_title(f"{ctx.spec.label} · {ctx.input}: min = {ratio:.3g}", fontsize=8)
    res.figure = figures.save(fig, ctx.figure, f"nala-nonneg ({ctx.spec.label}, {ctx.input})", res.verdict)
    return res


def _is_feature_map(spec) -> bool:
    return hasattr(get_attention(spec.name), "feature_map_cls")


CHECKS = [
    ClaimCheck("nala-entropy", "NaLaFormer Sec. 3.1, Theorems 1-2 (App. A.2), Figs. 1 and 3, PSE of Eq. 15",
          "a larger query norm lowers the attention entropy in softmax and NaLa attention, not in norm-unaware "
          "linear attention", ("softmax", "nala", "relu_linear", "linear", "flatten"), ("synthetic", "real"),
          run_entropy, {"batch": 2, "tokens": 1024, "dim": 32, "r_min": 0.25, "r_max": 16.0},
          # rows that are distributions: softmax and the feature maps (not e.g. laplacian's whitened, signed rows)
          accepts=lambda spec: spec.name == "softmax" or _is_feature_map(spec)),
    ClaimCheck("nala-nonneg", "NaLaFormer Sec. 3.2, Eqs. 7-10", "every NaLa score φ_q(q)·φ_k(k) is non-negative",
          ("nala",), ("synthetic", "real"), run_nonneg,
          {"batch": 2, "tokens": 512, "dim": 32, "tolerance": 1e-9}, accepts=_is_feature_map),
]
