"""MirrorLA (Sec. 3.1, Eqs. 3-14 and 18, Algorithm 1): reflections before the ReLU against "passive truncation".

``mirrorla-isometry``. Sec. 3.1: Householder reflections are isometries, so ⟨Hq, Hk⟩ = ⟨q, k⟩ before the ReLU
(Eq. 11: "equivalent to the standard inner product"). Measured: the largest |⟨R(q), R(k)⟩ − ⟨q, k⟩| / (‖q‖‖k‖)
over all query-key pairs, R the map's pre-ReLU part (cross-head reflection, Eq. 18, then the block-wise
reflections, Eqs. 8-10, with the variance-aware angles of Eqs. 12-14 when enabled), in float64. With the
variance modulation q and k each get the angles of their own sequence statistics (the implementation's reading of
the paper's ambiguity A3), and the cross-head reflection (Eq. 18) preserves the inner product of the whole H·d
channel vector, not each head's: the per-head isometry can hold only with neither (both are options).

``mirrorla-truncation``. Sec. 1 / 3: a bare ReLU passively truncates the negative part of the pre-activation; a
reflection can turn informative directions into the positive orthant first. Measured: the fraction of
pre-activation energy that survives the ReLU, Σ ReLU(y)² / Σ y², with no reflection (y = x), with the map's
reflections at initialisation, and with reflections fitted (Adam on the map's angles and mirror, maximising the
surviving energy on one draw) and evaluated on a fresh draw of the same distribution: the capacity the learned
reflections have to undo the truncation. An orthogonal map cannot change the expected surviving energy of an
isotropic input, so the isotropic input is the case where the argument cannot hold.
"""

from __future__ import annotations

import numpy as np
import torch

from .. import figures
from ..criteria import Criterion, Statistic, bootstrap
from ..inputs import cached_real_qk
from .base import ClaimCheck, Context, Result, Skip


def feature_map(spec, heads: int, head_dim: int, seq_len: int):
    return spec.build(heads=heads, head_dim=head_dim, seq_len=seq_len).feature_map


def pre_relu(fm, x: torch.Tensor) -> torch.Tensor:
    """The reflecting map without its ReLU (``MirrorFeatureMap._phi`` before ``F.relu``): ``[B, H, N, d]``."""
    x = fm.reflect_heads(x)
    angles = (fm.modulate(fm.block_variance_reference(x)) if fm.variance_aware
              else fm.theta.to(x.dtype)[None, :, None, :])
    return fm.reflect_blocks(x, angles)


def _real(ctx: Context, what: str):
    if ctx.teacher is None:
        raise Skip("no trained model for real inputs")
    q, k = cached_real_qk(ctx.teacher)  # [L, I, H, N, d]
    L, I, H, N, d = q.shape
    desc = f"real: {what} of all {L} layers of {ctx.teacher.describe()} on {I} test images ({N} tokens, {H} heads)"
    return q.reshape(L * I, H, N, d), k.reshape(L * I, H, N, d), desc


def run_isometry(ctx: Context) -> Result:
    tol = ctx.settings["tolerance"]
    crit = Criterion("max |⟨Rq,Rk⟩−⟨q,k⟩| / (‖q‖‖k‖)", "<", tol, tol,
                     f"the pre-ReLU map preserves every query-key inner product of every head (what the head's "
                     f"scores use): the largest deviation over all pairs and heads, relative to ‖q‖‖k‖, is below "
                     f"{tol:g} (float64 round-off)")
    s = ctx.settings
    if ctx.input == "synthetic":
        g = torch.Generator().manual_seed(ctx.seed)
        B, H, N, d = s["batch"], s["heads"], s["tokens"], s["dim"]
        q = torch.randn(B, H, N, d, generator=g, dtype=torch.float64)
        kscale = torch.exp(torch.empty(1, H, 1, d, dtype=torch.float64).uniform_(-0.7, 0.7, generator=g))
        k = torch.randn(B, H, N, d, generator=g, dtype=torch.float64) * kscale
        desc = (f"synthetic: {B} sequences of {N} tokens, {H} heads x {d}: q ~ N(0, I), k ~ N(0, diag(σ²)) with "
                f"log σ_c ~ U[−0.7, 0.7] per channel (queries and keys of different spread), float64")
    else:
        q, k, desc = _real(ctx, "q, k")
        q, k = q.double(), k.double()
    torch.manual_seed(ctx.seed)
    fm = feature_map(ctx.spec, q.shape[1], q.shape[-1], q.shape[-2]).double()
    with torch.no_grad():
        rq, rk = pre_relu(fm, q), pre_relu(fm, k)
        before = q @ k.transpose(-1, -2)
        after = rq @ rk.transpose(-1, -2)
        denom = q.norm(dim=-1, keepdim=True) * k.norm(dim=-1, keepdim=True).transpose(-1, -2)
        dev = ((after - before).abs() / denom.clamp_min(1e-300))
        # over all H*d channels (what the cross-head reflection of Eq. 18 preserves) beside per head (what each
        # head's attention scores use)
        cat = lambda t: t.transpose(1, 2).flatten(2)  # noqa: E731  [B, N, H*d]
        full = ((cat(rq) @ cat(rk).transpose(-1, -2) - cat(q) @ cat(k).transpose(-1, -2)).abs()
                / (cat(q).norm(dim=-1, keepdim=True) * cat(k).norm(dim=-1, keepdim=True).transpose(-1, -2)))
        norm_dev = float(((rq.norm(dim=-1) - q.norm(dim=-1)).abs() / q.norm(dim=-1)).max())
    res = Result(crit, Statistic.exact(float(dev.max())), desc,
                 {"median_deviation": float(dev.median()), "max_deviation_all_heads": float(full.max()),
                  "max_per_head_norm_change": norm_dev,
                  "variance_aware": bool(fm.variance_aware), "cross_head": bool(fm.cross_head)})
    fig, (ax,) = figures.axes(1)
    idx = torch.randperm(before.numel(), generator=torch.Generator().manual_seed(0))[:4000]
    ax.scatter(before.flatten()[idx], after.flatten()[idx], s=3, alpha=0.4)
    lim = float(before.abs().max())
    ax.plot([-lim, lim], [-lim, lim], "k--", lw=0.8)
    ax.set_xlabel("⟨q, k⟩")
    ax.set_ylabel("⟨R q, R k⟩ (before the ReLU)")
    ax.set_title(f"{ctx.spec.label} · {ctx.input}: max rel. deviation {float(dev.max()):.2g}", fontsize=8)
    res.figure = figures.save(fig, ctx.figure, f"mirrorla-isometry ({ctx.spec.label}, {ctx.input})", res.verdict)
    return res


def _draw(ctx: Context, seed: int) -> tuple[torch.Tensor, str]:
    s = ctx.settings
    B, H, N, d = s["batch"], s["heads"], s["tokens"], s["dim"]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, H, N, d, generator=g)
    if ctx.input == "isotropic":
        return x, f"synthetic isotropic: x ~ N(0, I), {B} x {N} tokens, {H} heads x {d}"
    if ctx.input == "shifted":
        return x - s["shift"], (f"synthetic shifted: x ~ N(−{s['shift']}·1, I) (most pre-activations negative), "
                                f"{B} x {N} tokens, {H} heads x {d}")
    raise ValueError(ctx.input)


def _energy_parts(y: torch.Tensor):
    """Per token (summed over heads and channels): surviving energy Σ ReLU(y)² and total energy Σ y²."""
    y = y.double()
    return (torch.relu(y) ** 2).sum((1, 3)).flatten().numpy(), (y ** 2).sum((1, 3)).flatten().numpy()


def run_truncation(ctx: Context) -> Result:
    s = ctx.settings
    margin = s["margin"]
    crit = Criterion("Δ surviving energy (fitted reflections − none)", ">", margin, margin,
                     f"reflections fitted on one draw raise the fraction of pre-activation energy surviving the "
                     f"ReLU on a fresh draw by more than {margin}: the 99% bootstrap interval (over tokens) of the "
                     f"difference lies above {margin}; fails if it lies at or below {margin}")
    if ctx.input == "real":
        if ctx.teacher is None:
            raise Skip("no trained model for real inputs")
        q, _ = cached_real_qk(ctx.teacher)  # [L, I, H, N, d]
        half = q.shape[1] // 2
        pairs = [(q[layer, :half], q[layer, half:]) for layer in range(q.shape[0])]  # one map per layer, as a model
        desc = (f"real: the queries (pre-activations of φ_q) of {ctx.teacher.describe()}, {q.shape[3]} tokens x "
                f"{q.shape[2]} heads; one map per layer ({q.shape[0]}), fitted on {half} test images and measured "
                f"on the other {q.shape[1] - half}")
    else:
        test, desc = _draw(ctx, ctx.seed + 1)
        pairs = [(_draw(ctx, ctx.seed)[0], test)]
    parts = {"none": [], "init": [], "fit": []}
    curves = []
    for i, (train, test) in enumerate(pairs):
        torch.manual_seed(ctx.seed + i)
        fm = feature_map(ctx.spec, test.shape[1], test.shape[-1], test.shape[-2])
        with torch.no_grad():
            init = pre_relu(fm, test)
        opt = torch.optim.Adam(list(fm.parameters()), lr=s["lr"])
        curve = []
        for _ in range(s["steps"]):
            y = pre_relu(fm, train)
            frac = (torch.relu(y) ** 2).sum() / (y ** 2).sum()
            opt.zero_grad()
            (-frac).backward()
            opt.step()
            curve.append(frac.item())
        curves.append(curve)
        with torch.no_grad():
            fit = pre_relu(fm, test)
        for key, y in (("none", test), ("init", init), ("fit", fit)):
            parts[key].append(_energy_parts(y))
    (kept0, tot0), (kept_i, tot_i), (kept_f, tot_f) = (
        tuple(np.concatenate(a) for a in zip(*parts[key])) for key in ("none", "init", "fit"))
    curve = np.mean(curves, axis=0).tolist()

    def delta(ix):
        return kept_f[ix].sum() / tot_f[ix].sum() - kept0[ix].sum() / tot0[ix].sum()

    stat = bootstrap(delta, len(kept0), seed=ctx.seed)
    e_none, e_init, e_fit = (float(a.sum() / b.sum()) for a, b in ((kept0, tot0), (kept_i, tot_i), (kept_f, tot_f)))
    res = Result(crit, stat, desc, {"energy_no_reflection": e_none, "energy_init_reflections": e_init,
                                    "energy_fitted_reflections": e_fit, "fit_steps": s["steps"],
                                    "fit_curve": curve[:: max(1, len(curve) // 50)]})
    fig, (a1, a2) = figures.axes(2)
    a1.bar(["none", "init", "fitted"], [e_none, e_init, e_fit], color=["grey", "tab:blue", "tab:green"])
    a1.set_ylim(0, 1)
    a1.set_ylabel("fraction of energy surviving the ReLU")
    a1.set_title(f"{ctx.spec.label} · {ctx.input} (held-out)", fontsize=8)
    a2.plot(curve)
    a2.set_xlabel("fit step (Adam)")
    a2.set_ylabel("surviving fraction, fit draw")
    res.figure = figures.save(fig, ctx.figure, f"mirrorla-truncation ({ctx.spec.label}, {ctx.input})", res.verdict)
    return res


def _is_mirror(spec) -> bool:
    return spec.name == "mirrorla"


SIZES = {"batch": 2, "heads": 2, "tokens": 256, "dim": 32}
CHECKS = [
    ClaimCheck("mirrorla-isometry", "MirrorLA Sec. 3.1, Eqs. 3 and 8-11, 18",
          "the reflections preserve query-key inner products before the ReLU (exactly)",
          ("mirrorla", "mirrorla:variance_aware=False", "mirrorla:cross_head=False:variance_aware=False"),
          ("synthetic", "real"), run_isometry,
          {**SIZES, "tolerance": 1e-9}, accepts=_is_mirror),
    ClaimCheck("mirrorla-truncation", "MirrorLA Sec. 1 and 3 ('passive truncation'), Algorithm 1",
          "learned reflections let more pre-activation energy survive the ReLU than a bare ReLU",
          ("mirrorla",), ("shifted", "isotropic", "real"), run_truncation,
          {**SIZES, "shift": 1.0, "steps": 150, "lr": 0.05, "margin": 0.02}, accepts=_is_mirror),
]
