"""LaplacianFormer (Sec. 3 and 4.2, Fig. 1, Table 3, Fig. 6, Algorithms 1-2): the L1 kernel, Nyström landmarks and
the Newton–Schulz pseudo-inverse.

``laplacian-distance``. Sec. 3 / Fig. 1: L2 query-key distances are heavy-tailed (outliers that exp(·) amplifies),
L1 distances "more concentrated and less sensitive to outliers". Measured: the excess kurtosis (a scale-free tail
weight) of the L2 distances minus that of the L1 distances over query-key pairs (standardised per layer and head
for real inputs). Positive: L2 is the heavier-tailed.

``laplacian-ns``. Sec. 4.2 / Algorithm 2: X_{k+1} = X_k (2I − P X_k) converges to the pseudo-inverse of the
landmark kernel matrix W (P = W + ridge·I, Eq. 9). Measured: ‖X_k − P⁺‖_F / ‖P⁺‖_F at the mechanism's
``ns_iters``, against ``torch.linalg.pinv`` in float64 (the worst of the landmark matrices of the input).

``laplacian-ns-vs-cg``. Table 3 and Fig. 6: Newton–Schulz beats conjugate gradient. Cost is counted in m x m
matrix products: one NS iteration is two; CG on all m right-hand sides costs one per iteration when P is symmetric
positive definite (the paper's tied Q = K landmarks, SOFT's setting) and two for the normal equations
P^T P X = P^T (CGNR) when it is not (attnbench's untied landmarks). Statistic: the ratio of the costs at which
each solver's median relative error first drops below a target (1e-6), as Fig. 6 compares convergence.

``laplacian-nystrom``. Sec. 4.2, Eqs. 8-9 and Algorithm 1: the Nyström form approximates the Laplacian-kernel
attention, better as landmarks grow. Measured: the relative distance of the mechanism's output (``landmarks = m``)
to the exact Laplacian-kernel attention (the full N x N kernel, the same injective normalisation, Eq. 4) for
m = 4 ... N, and Spearman's ρ(m, distance).
"""

from __future__ import annotations

import numpy as np
import torch

from attnbench.api.registry import build, get_attention, options_of
from attnbench.attention.laplacian import QK_SCALES, laplace_kernel
from attnbench.ops.nystrom import newton_schulz_pinv

from .. import figures
from ..criteria import Criterion, Statistic, bootstrap, excess_kurtosis, spearman
from ..inputs import cached_real_qk
from .base import ClaimCheck, Context, Result, Skip

ERR_FLOOR = 1e-12  # below this both solvers are at float64 round-off: a ratio there is noise


def _options(spec) -> dict:
    return {**options_of(get_attention("laplacian")), **dict(spec.options)}


def clustered_qk(seed: int, *, batch: int, heads: int, tokens: int, dim: int, clusters: int, spread: float,
                 noise: float, dtype=torch.float64):
    """Tokens in ``clusters`` consecutive runs along the sequence (the local structure that segment-mean landmarks
    pool, like the patches of an image region): centre ~ N(0, spread² I), token = centre + N(0, noise² I),
    queries and keys with their own noise."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(batch, heads, clusters, dim, generator=g, dtype=dtype) * spread
    idx = torch.arange(tokens) * clusters // tokens
    base = centres[:, :, idx]
    q = base + noise * torch.randn(batch, heads, tokens, dim, generator=g, dtype=dtype)
    k = base + noise * torch.randn(batch, heads, tokens, dim, generator=g, dtype=dtype)
    return q, k


def _real(ctx: Context):
    if ctx.teacher is None:
        raise Skip("no trained model for real inputs")
    q, k = cached_real_qk(ctx.teacher)  # [L, I, H, N, d]
    L, I, H, N, d = q.shape
    return q, k, (f"real: q, k of all {L} layers x {H} heads of {ctx.teacher.describe()} on {I} test images "
                  f"({N} tokens)")


# --- distances -------------------------------------------------------------------------------------------------
def run_distance(ctx: Context) -> Result:
    s = ctx.settings
    crit = Criterion("kurtosis(L2) − kurtosis(L1)", ">", 0.0, 0.0,
                     f"L2 query-key distances are heavier-tailed than L1: the 99% bootstrap interval (over "
                     f"{s['pairs']} random query-key pairs) of the difference of excess kurtoses lies above 0; "
                     f"fails if it lies at or below 0")
    g = torch.Generator().manual_seed(ctx.seed)
    B, N, d = s["batch"], s["tokens"], s["dim"]
    if ctx.input == "gaussian":
        q, k = (torch.randn(B, 1, N, d, generator=g, dtype=torch.float64) for _ in range(2))
        desc = f"synthetic gaussian: q, k ~ N(0, I_{d}), {B} x {N} tokens"
    elif ctx.input == "student-t":
        dist = torch.distributions.StudentT(torch.tensor(3.0, dtype=torch.float64))
        torch.manual_seed(ctx.seed)
        q, k = dist.sample((B, 1, N, d)), dist.sample((B, 1, N, d))
        desc = f"synthetic heavy-tailed: q, k coordinates ~ Student t (3 degrees of freedom), d = {d}, {B} x {N} tokens"
    elif ctx.input == "real":
        q5, k5, desc = _real(ctx)
        L, I, H, N, d = q5.shape
        q = q5.permute(0, 2, 1, 3, 4).reshape(L * H, I, N, d).double()  # groups (layer, head) first
        k = k5.permute(0, 2, 1, 3, 4).reshape(L * H, I, N, d).double()
        desc += "; distances standardised per (layer, head)"
    else:
        raise ValueError(ctx.input)
    l1 = torch.cdist(q, k, p=1)  # [G, ., N, N]: pairs within one sequence
    l2 = torch.cdist(q, k, p=2, compute_mode="donot_use_mm_for_euclid_dist")  # exact differences, not |q|²+|k|²-2qk
    if ctx.input == "real":  # a scale per (layer, head): standardise inside each before pooling
        l1 = (l1 - l1.mean((1, 2, 3), keepdim=True)) / l1.std(dim=(1, 2, 3), keepdim=True)
        l2 = (l2 - l2.mean((1, 2, 3), keepdim=True)) / l2.std(dim=(1, 2, 3), keepdim=True)
    l1, l2 = l1.flatten().numpy(), l2.flatten().numpy()
    pick = np.random.default_rng(ctx.seed).choice(len(l1), min(len(l1), s["pairs"]), replace=False)
    a1, a2 = l1[pick], l2[pick]
    stat = bootstrap(lambda ix: excess_kurtosis(a2[ix]) - excess_kurtosis(a1[ix]), len(pick), seed=ctx.seed)
    z = lambda a: (a - a.mean()) / a.std()  # noqa: E731
    res = Result(crit, stat, desc, {"kurtosis_l1": excess_kurtosis(a1), "kurtosis_l2": excess_kurtosis(a2),
                                    "cv_l1": float(a1.std() / abs(a1.mean())) if ctx.input != "real" else None,
                                    "cv_l2": float(a2.std() / abs(a2.mean())) if ctx.input != "real" else None,
                                    "p99_z_l1": float(np.quantile(z(a1), 0.99)),
                                    "p99_z_l2": float(np.quantile(z(a2), 0.99)), "pairs": int(len(pick))})
    fig, (ax,) = figures.axes(1)
    bins = np.linspace(-4, 8, 120)
    ax.hist(z(a1), bins=bins, histtype="step", label=f"L1 (kurtosis {res.details['kurtosis_l1']:.2f})", log=True)
    ax.hist(z(a2), bins=bins, histtype="step", label=f"L2 (kurtosis {res.details['kurtosis_l2']:.2f})", log=True)
    ax.set_xlabel("standardised query-key distance")
    ax.set_ylabel("pairs")
    ax.legend(fontsize=8)
    res.figure = figures.save(fig, ctx.figure, f"laplacian-distance ({ctx.input})", res.verdict)
    return res


# --- solvers ----------------------------------------------------------------------------------------------------
def landmark_matrices(ctx: Context, opts: dict) -> tuple[torch.Tensor, str]:
    """The landmark kernel matrices W = k(Q~, K~) (Eq. 9) the mechanism inverts, ``[G, m, m]`` float64, built by
    the mechanism itself (its ``qk_scale``, landmark pooling and λ); the ``tied`` input uses K = Q (the
    paper's symmetric PSD form)."""

    s = ctx.settings
    if ctx.input in ("synthetic", "tied"):
        q, k = clustered_qk(ctx.seed, batch=s["batch"], heads=1, tokens=s["tokens"], dim=s["dim"],
                            clusters=s["clusters"], spread=s["spread"], noise=s["noise"])
        desc = (f"synthetic: {s['batch']} sequences of {s['tokens']} tokens in {s['clusters']} consecutive clusters "
                f"(centres ~ N(0, {s['spread']}² I_{s['dim']}), tokens = centre + N(0, {s['noise']}² I)); ")
    else:
        q5, k5, desc = _real(ctx)
        q = q5.reshape(-1, q5.shape[2], q5.shape[3], q5.shape[4])[:: max(1, q5.shape[1] // 4)].double()
        k = k5.reshape(-1, k5.shape[2], k5.shape[3], k5.shape[4])[:: max(1, k5.shape[1] // 4)].double()
        desc += "; "
    attn = build("laplacian", heads=q.shape[1], head_dim=q.shape[-1], **dict(ctx.spec.options))
    with torch.no_grad():
        W = attn.landmark_kernel(q, q if ctx.input == "tied" else k)[-1]
    m = W.shape[-1]
    W = W.reshape(-1, m, m)
    kind = ("tied K = Q (symmetric PSD, the paper's form)" if ctx.input == "tied"
            else f"landmark_set = {attn.landmark_set}")
    return W, desc + (f"{len(W)} landmark matrices W = exp(−‖Q~ − K~‖₁/λ), λ = {opts['lam']}, m = {m} "
                      f"({opts['landmark_pool']} landmarks), q, k scaled by {attn.qk_scale}, {kind}, float64")


def ns_errors(P: torch.Tensor, exact: torch.Tensor, iters: int, scaling: str) -> np.ndarray:
    """``[iters + 1, G]``: relative Frobenius error of Newton–Schulz after 0 .. iters iterations."""
    out = []
    for it in range(iters + 1):
        X = newton_schulz_pinv(P, iters=it, scaling=scaling)
        out.append(((X - exact).norm(dim=(-2, -1)) / exact.norm(dim=(-2, -1))).numpy())
    return np.array(out)


def cg_errors(P: torch.Tensor, exact: torch.Tensor, products: int) -> tuple[np.ndarray, int]:
    """Conjugate gradient on all m columns of P X = I at once (each column its own step sizes), run for
    ``products`` m x m matrix products: ``([products // per_iter + 1, G], per_iter)``. P symmetric: plain CG (one
    product per iteration); else CG on the normal equations P^T P X = P^T (CGNR, two products)."""
    sym = bool(torch.allclose(P, P.transpose(-1, -2), atol=1e-12, rtol=0))
    A = P if sym else P.transpose(-1, -2) @ P  # the products of A are counted, not formed: CGNR applies P, then P^T
    rhs = torch.eye(P.shape[-1], dtype=P.dtype).expand_as(P) if sym else P.transpose(-1, -2)
    per = 1 if sym else 2
    X = torch.zeros_like(P)
    R = rhs.clone()
    D = R.clone()
    rr = (R * R).sum(-2, keepdim=True)  # [G, 1, m] per column
    errs = [((X - exact).norm(dim=(-2, -1)) / exact.norm(dim=(-2, -1))).numpy()]
    for _ in range(products // per):
        AD = A @ D
        alpha = rr / (D * AD).sum(-2, keepdim=True).clamp_min(1e-300)
        X = X + alpha * D
        R = R - alpha * AD
        rr_new = (R * R).sum(-2, keepdim=True)
        D = R + (rr_new / rr.clamp_min(1e-300)) * D
        rr = rr_new
        errs.append(((X - exact).norm(dim=(-2, -1)) / exact.norm(dim=(-2, -1))).numpy())
    return np.array(errs), per


def _solver_inputs(ctx: Context):
    opts = _options(ctx.spec)
    W, desc = landmark_matrices(ctx, opts)
    P = W + opts["ns_ridge"] * torch.eye(W.shape[-1], dtype=W.dtype)
    exact = torch.linalg.pinv(P)
    cond = torch.linalg.cond(P).numpy()
    return opts, W, P, exact, cond, desc + f"; P = W + {opts['ns_ridge']}·I, exact P⁺ by torch.linalg.pinv"


def run_ns(ctx: Context) -> Result:
    opts = _options(ctx.spec)
    tol, iters = ctx.settings["tolerance"], opts["ns_iters"]
    crit = Criterion("NS relative error at ns_iters", "<", tol, tol,
                     f"Newton–Schulz after the mechanism's {iters} iterations ({opts['ns_scaling']} scaling) is within "
                     f"{tol:g} of the exact pseudo-inverse (relative Frobenius error, worst landmark matrix)")
    opts, W, P, exact, cond, desc = _solver_inputs(ctx)
    errs = ns_errors(P, exact, max(iters, ctx.settings["curve"]), opts["ns_scaling"])
    worst = float(errs[iters].max())
    res = Result(crit, Statistic.exact(worst), desc,
                 {"ns_iters": iters, "condition_number_median": float(np.median(cond)),
                  "condition_number_max": float(cond.max()), "error_by_iteration_median":
                  np.median(errs, axis=1).tolist(), "error_by_iteration_worst": errs.max(axis=1).tolist(),
                  "ridge_bias": float(((torch.linalg.pinv(W) - exact).norm(dim=(-2, -1))
                                       / torch.linalg.pinv(W).norm(dim=(-2, -1))).median())})
    fig, (ax,) = figures.axes(1)
    ax.semilogy(np.median(errs, axis=1), label="median")
    ax.semilogy(errs.max(axis=1), label="worst")
    ax.axvline(iters, color="k", ls=":", lw=0.8, label=f"ns_iters = {iters}")
    ax.axhline(tol, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("Newton–Schulz iterations")
    ax.set_ylabel("‖X_k − P⁺‖_F / ‖P⁺‖_F")
    ax.set_title(f"{ctx.spec.label} · {ctx.input}: κ(P) median {np.median(cond):.3g}", fontsize=8)
    ax.legend(fontsize=8)
    res.figure = figures.save(fig, ctx.figure, f"laplacian-ns ({ctx.spec.label}, {ctx.input})", res.verdict)
    return res


def _first_below(curve: np.ndarray, level: float, per: int):
    """The cost (products) at which a median error curve first drops below ``level`` (None: never)."""
    hit = np.nonzero(curve < level)[0]
    return int(hit[0] * per) if len(hit) else None


def run_ns_vs_cg(ctx: Context) -> Result:
    s = ctx.settings
    target, horizon, fast, slow = s["target"], s["curve"], s["faster"], 1.0 / s["faster"]
    crit = Criterion("cost ratio CG / NS to reach the target error", ">", fast, slow,
                     f"Newton–Schulz reaches a relative error of {target:g} (median over the landmark matrices) at "
                     f"less cost than conjugate gradient: CG needs more than {fast}x NS's m x m products; fails if it "
                     f"needs fewer than {slow:.2f}x; inconclusive in between or if neither gets there within "
                     f"{2 * horizon} products (a solver that does not get there counts as needing more than that)")
    opts, W, P, exact, cond, desc = _solver_inputs(ctx)
    iters = opts["ns_iters"]
    ns_full = ns_errors(P, exact, max(horizon, iters), opts["ns_scaling"])  # [max(horizon, ns_iters) + 1, G]
    ns = ns_full[:horizon + 1]  # the criterion compares both solvers within the same horizon
    cg, per = cg_errors(P, exact, 2 * horizon)
    c_ns = _first_below(np.median(ns, axis=1), target, 2)
    c_cg = _first_below(np.median(cg, axis=1), target, per)
    beyond = 2 * horizon + 1  # a censored cost: more than the horizon
    if c_ns is None and c_cg is None:
        stat = Statistic(float("nan"), float("nan"), float("nan"), "neither converged")
    elif c_ns is None:  # CG got there, NS did not: the ratio is at most c_cg / beyond
        stat = Statistic(max(c_cg, 1) / beyond, 0.0, max(c_cg, 1) / beyond, "censored: NS beyond the horizon")
    elif c_cg is None:
        stat = Statistic(beyond / max(c_ns, 1), beyond / max(c_ns, 1), float("inf"), "censored: CG beyond the horizon")
    else:
        stat = Statistic.exact(max(c_cg, 1) / max(c_ns, 1))
    res = Result(crit, stat, desc,
                 {"products_ns": c_ns, "products_cg": c_cg, "cg_products_per_iteration": per, "target": target,
                  "ns_iters": iters, "ns_error_at_ns_iters": float(np.median(ns_full[iters])),
                  "cg_error_at_equal_cost": float(np.median(cg[min(len(cg) - 1, 2 * iters // per)])),
                  "condition_number_median": float(np.median(cond))})
    fig, (ax,) = figures.axes(1)
    ax.semilogy(np.arange(len(ns)) * 2, np.median(ns, axis=1), "o-", ms=3, label="Newton–Schulz")
    ax.semilogy(np.arange(len(cg)) * per, np.median(cg, axis=1), "s-", ms=3,
                label="CG" if per == 1 else "CG (normal equations)")
    ax.axvline(2 * iters, color="k", ls=":", lw=0.8, label=f"the mechanism's {iters} NS iterations")
    ax.axhline(target, color="grey", ls="--", lw=0.8)
    ax.set_xlabel("cost: m x m matrix products")
    ax.set_ylabel("relative error vs P⁺ (median over matrices)")
    ax.set_title(f"{ctx.spec.label} · {ctx.input}: κ(P) median {np.median(cond):.3g}", fontsize=8)
    ax.legend(fontsize=8)
    res.figure = figures.save(fig, ctx.figure, f"laplacian-ns-vs-cg ({ctx.spec.label}, {ctx.input})", res.verdict)
    return res


# --- Nyström ----------------------------------------------------------------------------------------------------
def exact_laplacian_attention(q, k, v, lam: float, eps: float, qk_scale: str = "none") -> torch.Tensor:
    """The Laplacian-kernel attention without Nyström: G = exp(−‖s q_i − s k_j‖₁/λ) in full (s the mechanism's
    ``qk_scale``), then the injective normalisation of Eq. 4 exactly as ``LaplacianAttention.forward_reference``
    applies it to its Ĝ."""

    s = QK_SCALES[qk_scale](q.shape[-1])
    G = laplace_kernel(q * s, k * s, lam)  # [B, H, N, N]
    var = G.var(dim=-2, unbiased=False, keepdim=True)
    Z = (G - G.mean(-1, keepdim=True)) / torch.sqrt(var + eps) + 1.0 / G.shape[-1]
    return Z @ v


def run_nystrom(ctx: Context) -> Result:
    s = ctx.settings
    crit = Criterion("spearman ρ(landmarks, distance)", "<", -0.8, 0.0,
                     "the Nyström output approaches the exact Laplacian-kernel attention as landmarks grow: "
                     "Spearman's ρ between m (4, 8, ..., N) and the relative distance is below −0.8; fails if it "
                     "is 0 or above (no decrease)")
    opts = _options(ctx.spec)
    if ctx.input == "synthetic":
        q, k = clustered_qk(ctx.seed, batch=s["batch"], heads=1, tokens=s["tokens"], dim=s["dim"],
                            clusters=s["clusters"], spread=s["spread"], noise=s["noise"])
        desc = (f"synthetic: {s['batch']} sequences of {s['tokens']} tokens in {s['clusters']} consecutive clusters "
                f"(centres ~ N(0, {s['spread']}² I_{s['dim']}), tokens = centre + N(0, {s['noise']}² I)), "
                f"v ~ N(0, I), float64")
    else:
        q5, k5, desc = _real(ctx)
        q = q5.reshape(-1, *q5.shape[2:])[:: max(1, q5.shape[1] // 4)].double()
        k = k5.reshape(-1, *k5.shape[2:])[:: max(1, k5.shape[1] // 4)].double()
        desc += f" (every {max(1, q5.shape[1] // 4)}-th sequence), v ~ N(0, I), float64"
    B, H, N, d = q.shape
    v = torch.randn(B, H, N, d, generator=torch.Generator().manual_seed(ctx.seed + 1), dtype=q.dtype)
    exact = exact_laplacian_attention(q, k, v, opts["lam"], opts["whiten_eps"], opts["qk_scale"] or "none")
    ms = sorted({m for m in [2 ** i for i in range(2, 16)] if m < N} | {N})

    dists = []
    for m in ms:  # the spec's options with the landmarks swept
        attn = build("laplacian", heads=H, head_dim=d, **{**dict(ctx.spec.options), "landmarks": m})
        with torch.no_grad():
            out = attn(q, k, v)
        dists.append(float((out - exact).norm() / exact.norm()))
    stat, p = spearman(ms, dists)
    res = Result(crit, Statistic.exact(stat.value), desc + f"; m in {ms}",
                 {"landmarks": ms, "distance": dists, "distance_ratio_last_first": dists[-1] / dists[0],
                  "ns_iters": opts["ns_iters"], "ns_ridge": opts["ns_ridge"]})
    fig, (ax,) = figures.axes(1)
    ax.loglog(ms, dists, "o-")
    ax.set_xticks(ms, [str(m) for m in ms], fontsize=7)
    ax.minorticks_off()
    ax.set_xlabel("landmarks m")
    ax.set_ylabel("‖O_Nyström − O_exact‖ / ‖O_exact‖")
    ax.set_title(f"{ctx.spec.label} · {ctx.input}: ρ = {stat.value:.2f}", fontsize=8)
    res.figure = figures.save(fig, ctx.figure, f"laplacian-nystrom ({ctx.spec.label}, {ctx.input})", res.verdict)
    return res


def _is_laplacian(spec) -> bool:
    return spec.name == "laplacian"


CLUSTERED = {"batch": 8, "tokens": 256, "dim": 32, "clusters": 16, "spread": 0.25, "noise": 0.1}
CHECKS = [
    ClaimCheck("laplacian-distance", "LaplacianFormer Sec. 3.1 (motivation), Fig. 1",
          "L2 query-key distances are heavier-tailed than L1 distances", ("laplacian",),
          ("gaussian", "student-t", "real"), run_distance, {"batch": 2, "tokens": 512, "dim": 32, "pairs": 20000},
          accepts=_is_laplacian),
    ClaimCheck("laplacian-ns", "LaplacianFormer Sec. 4.2, Algorithm 2",
          "Newton–Schulz reaches the pseudo-inverse of the landmark kernel matrix", ("laplacian",),
          ("synthetic", "tied", "real"), run_ns, {**CLUSTERED, "tolerance": 1e-2, "curve": 40}, accepts=_is_laplacian),
    ClaimCheck("laplacian-ns-vs-cg", "LaplacianFormer Table 3, Fig. 6",
          "Newton–Schulz is more accurate than conjugate gradient at equal cost", ("laplacian",),
          ("synthetic", "tied", "real"), run_ns_vs_cg, {**CLUSTERED, "target": 1e-6, "curve": 60, "faster": 1.25},
          accepts=_is_laplacian),
    ClaimCheck("laplacian-nystrom", "LaplacianFormer Sec. 4.2, Eqs. 8-9, Algorithm 1",
          "the Nyström output approaches the exact Laplacian-kernel attention as landmarks grow", ("laplacian",),
          ("synthetic", "real"), run_nystrom, {**CLUSTERED, "batch": 2}, accepts=_is_laplacian),
]
