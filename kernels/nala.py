"""NaLa feature maps (NaLaFormer Eqs. 6, 7, 11-13), fused: one pass per token, forward and backward.

For a token x ``[D]`` with n = max(||x||_2, eps), u = dir(x) = x / n and angles theta = (pi/4) tanh(u) (Sec. 3.2):

    query (Eqs. 6, 12):  p = lam (tau + tanh(n)),  mag = |u|^p             (norm-aware power of the direction)
    key   (Eqs. 6, 13):                            mag = |x|^lam           (fixed power of the raw key)
    phi(x) = [mag * cos(theta); mag * sin(theta)]   ``[2D]``, cos half first (Eq. 11)

Three forms with one meaning: ``nala_feature_map_reference`` (plain PyTorch, autograd), ``nala_feature_map``
(Triton kernel, any device the kernels run on) and ``nala_feature_map_fused`` (PyTorch on row blocks that stay
in cache, in-place, hand-written backward: the fast CPU path, ``benchmarks/bench_kernels.py`` measures it against
the unfused map). The gradient of |u|^p (and |x|^lam) is 0 where
the coordinate is 0, as in PyTorch's ``abs().pow()``.

Backward (g = [g_c; g_s]): dmag = g_c cos + g_s sin, dtheta = mag (g_s cos - g_c sin),
du = dtheta (pi/4)(1 - tanh(u)^2) + [query] dmag p mag / u,  dp = sum dmag mag log|u|,  dn = dp lam (1 - tanh(n)^2),
dx = du / n + (dn - (du . u) / n) u  (the second term only where ||x|| >= eps)  + [key] dmag lam mag / x.
"""

from __future__ import annotations

import math
import torch

from ._util import check_launchable, jit, pow2, tl

__all__ = ["nala_feature_map", "nala_feature_map_fused", "nala_feature_map_reference", "NaLaFeatureMapFunction"]

_PI4 = math.pi / 4


# ----------------------------------------------------------------------------------------------- reference


def nala_feature_map_reference(x: torch.Tensor, *, is_query: bool, lam: float = 3.0, tau: float = 0.5,
                               eps: float = 1e-6) -> torch.Tensor:
    """Plain PyTorch NaLa map ``[..., D] -> [..., 2D]`` (Eqs. 6, 7, 11-13), differentiable by autograd."""
    n = x.norm(dim=-1, keepdim=True).clamp_min(eps)                          # [..., 1]
    u = x / n                                                                # [..., D] dir(x)
    theta = torch.tanh(u) * _PI4                                             # [..., D]
    if is_query:
        p = lam * (tau + torch.tanh(n))                                      # [..., 1] f(||q||)
        mag = u.abs().pow(p)                                                 # [..., D]
    else:
        mag = x.abs().pow(lam)                                               # [..., D]
    return torch.cat([mag * torch.cos(theta), mag * torch.sin(theta)], dim=-1)  # [..., 2D]


def _check(name: str, x: torch.Tensor, lam: float, tau: float, eps: float) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: x must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{name}: x must be [..., D] with D >= 1, got {list(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: x must be floating point, got {x.dtype}")
    if not eps > 0:
        raise ValueError(f"{name}: eps must be > 0, got {eps}")
    if not lam > 0:
        raise ValueError(f"{name}: lam must be > 0, got {lam}")


# ----------------------------------------------------------------------------------------------- Triton kernels


@jit
def _tanh(x):
    """tanh from exp (no tanh in tl on every backend): sign(x) (1 - e^{-2|x|}) / (1 + e^{-2|x|})."""
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


@jit
def _nala_fwd_kernel(x, out, R, D, lam, tau, eps, BR: tl.constexpr, BD: tl.constexpr, IS_QUERY: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    bx = tl.load(x + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)  # [BR, D]
    n = tl.maximum(tl.sqrt(tl.sum(bx * bx, axis=1)), eps)                    # [BR] clamped norm
    u = bx / n[:, None]                                                      # [BR, D] direction
    th = 0.7853981633974483 * _tanh(u)                                       # [BR, D] angles (pi/4) tanh(u)
    if IS_QUERY:
        p = lam * (tau + _tanh(n))                                           # [BR] exponent (Eq. 6)
        a = tl.abs(u)
        mag = tl.where(a > 0, tl.exp2(p[:, None] * tl.log2(tl.where(a > 0, a, 1.0))), 0.0)  # [BR, D] |u|^p
    else:
        a = tl.abs(bx)
        mag = tl.where(a > 0, tl.exp2(lam * tl.log2(tl.where(a > 0, a, 1.0))), 0.0)  # [BR, D] |x|^lam
    base = out + rows[:, None] * (2 * D) + cols[None, :]
    tl.store(base, mag * tl.cos(th), mask=mask)                              # cos half [0, D)
    tl.store(base + D, mag * tl.sin(th), mask=mask)                          # sin half [D, 2D)


@jit
def _nala_bwd_kernel(x, g, dx, R, D, lam, tau, eps, BR: tl.constexpr, BD: tl.constexpr, IS_QUERY: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    mask = (rows < R)[:, None] & (cols < D)[None, :]
    bx = tl.load(x + rows[:, None] * D + cols[None, :], mask=mask, other=0.0).to(tl.float32)  # [BR, D]
    gbase = g + rows[:, None] * (2 * D) + cols[None, :]
    gc = tl.load(gbase, mask=mask, other=0.0).to(tl.float32)                 # [BR, D]
    gs = tl.load(gbase + D, mask=mask, other=0.0).to(tl.float32)             # [BR, D]
    nrm = tl.sqrt(tl.sum(bx * bx, axis=1))                                   # [BR]
    n = tl.maximum(nrm, eps)
    u = bx / n[:, None]                                                      # [BR, D]
    tu = _tanh(u)
    th = 0.7853981633974483 * tu
    c = tl.cos(th)
    s = tl.sin(th)
    if IS_QUERY:
        tn = _tanh(n)
        p = lam * (tau + tn)                                                 # [BR]
        a = tl.abs(u)
        pos = a > 0
        la = tl.log2(tl.where(pos, a, 1.0))                                  # [BR, D] log2|u| (0 where u = 0)
        mag = tl.where(pos, tl.exp2(p[:, None] * la), 0.0)
    else:
        a = tl.abs(bx)
        pos = a > 0
        mag = tl.where(pos, tl.exp2(lam * tl.log2(tl.where(pos, a, 1.0))), 0.0)
    dm = gc * c + gs * s                                                     # [BR, D] d/dmag
    du = mag * (gs * c - gc * s) * (0.7853981633974483 * (1.0 - tu * tu))    # [BR, D] through theta
    if IS_QUERY:
        du += tl.where(pos, dm * p[:, None] * mag / tl.where(pos, u, 1.0), 0.0)  # d|u|^p / du = p mag / u
        dp = tl.sum(dm * mag * la, axis=1) * 0.6931471805599453              # [BR] sum dmag mag ln|u|
        dn = dp * lam * (1.0 - tn * tn)                                      # [BR] through p = lam (tau + tanh n)
    else:
        dn = tl.zeros([BR], dtype=tl.float32)
    corr = tl.where(nrm >= eps, dn - tl.sum(du * u, axis=1) / n, 0.0)       # [BR] through n (zero if clamped)
    bdx = du / n[:, None] + corr[:, None] * u                                # [BR, D]
    if not IS_QUERY:
        bdx += tl.where(pos, dm * lam * mag / tl.where(pos, bx, 1.0), 0.0)   # d|x|^lam / dx = lam mag / x
    tl.store(dx + rows[:, None] * D + cols[None, :], bdx, mask=mask)


def _rows_per_program(D: int, backward: bool = False) -> tuple[int, int]:
    """(rows per program, num_warps): about 8 elements per thread in the forward, 4 in the backward: the fewest
    register spills on sm_80 and sm_90 (``attnbench check --aot``). What is left is ptxas saving one 8-byte value
    around sin/cos's slow-path call in a few (D, dtype) configurations, at low register counts, whatever the tile
    (the forward spills so with fewer elements per thread, the float32 query backward with more)."""
    return max(1, min(64, (512 if backward else 1024) // pow2(D, 1))), 4


class NaLaFeatureMapFunction(torch.autograd.Function):
    """``apply(x, is_query, lam, tau, eps, impl)`` with impl "triton" (kernels) or "torch" (fused row blocks)."""

    @staticmethod
    def forward(ctx, x, is_query: bool, lam: float, tau: float, eps: float, impl: str):
        xc = x.contiguous()
        ctx.save_for_backward(xc)
        ctx.meta = (is_query, lam, tau, eps, impl)
        if impl == "torch":
            return _fused_forward(xc, is_query, lam, tau, eps)
        D = x.shape[-1]
        R = xc.numel() // D
        out = x.new_empty(*x.shape[:-1], 2 * D)                              # [..., 2D]
        BR, warps = _rows_per_program(D)
        _nala_fwd_kernel[(-(-R // BR),)](xc, out, R, D, float(lam), float(tau), float(eps),
                                         BR=BR, BD=pow2(D, 1), IS_QUERY=bool(is_query), num_warps=warps)
        return out

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        is_query, lam, tau, eps, impl = ctx.meta
        g = g.contiguous()
        if impl == "torch":
            return _fused_backward(x, g, is_query, lam, tau, eps), None, None, None, None, None
        D = x.shape[-1]
        R = x.numel() // D
        dx = torch.empty_like(x)                                             # [..., D]
        BR, warps = _rows_per_program(D, backward=True)
        _nala_bwd_kernel[(-(-R // BR),)](x, g, dx, R, D, float(lam), float(tau), float(eps),
                                         BR=BR, BD=pow2(D, 1), IS_QUERY=bool(is_query), num_warps=warps)
        return dx, None, None, None, None, None


def nala_feature_map(x: torch.Tensor, *, is_query: bool, lam: float = 3.0, tau: float = 0.5,
                     eps: float = 1e-6) -> torch.Tensor:
    """NaLa map ``[..., D] -> [..., 2D]`` by the fused Triton kernel (forward and backward); same math as
    ``nala_feature_map_reference``. Output in x's dtype, computed in float32."""
    _check("nala_feature_map", x, lam, tau, eps)
    check_launchable("nala_feature_map", x=x)
    return NaLaFeatureMapFunction.apply(x, bool(is_query), float(lam), float(tau), float(eps), "triton")


# ----------------------------------------------------------------------------------------------- fused PyTorch (CPU)

_BLOCK_ELEMS = 1 << 16   # per torch thread: rows per block * D (measured best; the temporaries stay in cache)


def _for_blocks(R: int, D: int, body, scratch=lambda rows: None) -> None:
    """Run ``body(r0, r1, buffers)`` over row blocks [r0, r1) of R rows, ``buffers = scratch(rows)`` made once.

    A block holds ``_BLOCK_ELEMS`` elements per torch thread: each op on it is big enough for ATen to split over
    its threads and small enough that the block's temporaries stay in cache. (A pool of Python threads over
    smaller single-threaded blocks was tried: 2-3x slower than this with 2 threads, measured.)
    """
    BR = max(1, min(R, _BLOCK_ELEMS * torch.get_num_threads() // D))
    buffers = scratch(BR)
    for r0 in range(0, R, BR):
        body(r0, min(R, r0 + BR), buffers)


def _fused_forward(x: torch.Tensor, is_query: bool, lam: float, tau: float, eps: float) -> torch.Tensor:
    D = x.shape[-1]
    x2 = x.reshape(-1, D)                                                    # [R, D]
    R = x2.shape[0]
    out = x.new_empty(R, 2, D)                                               # [R, 2, D]: cos half, sin half

    def scratch(rows):
        return x.new_empty(rows, 1), *(x.new_empty(rows, D) for _ in range(3))  # n [rows, 1]; u, t, c [rows, D]

    def body(r0, r1, buffers):
        m = r1 - r0
        nb, ub, tb, cb = (b[:m] for b in buffers)
        xb, ob = x2[r0:r1], out[r0:r1]
        torch.linalg.vector_norm(xb, dim=-1, keepdim=True, out=nb).clamp_min_(eps)
        torch.div(xb, nb, out=ub)                                            # u = x / n
        torch.tanh(ub, out=tb).mul_(_PI4)                                    # theta
        torch.cos(tb, out=cb)
        tb.sin_()
        if is_query:
            torch.tanh(nb, out=nb).add_(tau).mul_(lam)                       # p (overwrites n: no longer needed)
            ub.abs_().log_().mul_(nb).exp_()                                 # |u|^p (log 0 = -inf -> 0)
        else:
            torch.abs(xb, out=ub).pow_(lam)                                  # |x|^lam
        # out-of-place into the strided halves: in-place ops on strided views are slow on the CPU
        torch.mul(cb, ub, out=ob[:, 0])
        torch.mul(tb, ub, out=ob[:, 1])

    _for_blocks(R, D, body, scratch)
    return out.reshape(*x.shape[:-1], 2 * D)


def _fused_backward(x: torch.Tensor, g: torch.Tensor, is_query: bool, lam: float, tau: float,
                    eps: float) -> torch.Tensor:
    """Module docstring's backward, on row blocks; recomputes the forward quantities of each block."""
    D = x.shape[-1]
    x2 = x.reshape(-1, D)                                                    # [R, D]
    g2 = g.reshape(-1, 2 * D)                                                # [R, 2D]
    R = x2.shape[0]
    dx = torch.empty_like(x2)                                                # [R, D]

    def body(r0, r1, _):
        xb, gc, gs = x2[r0:r1], g2[r0:r1, :D], g2[r0:r1, D:]
        nrm = torch.linalg.vector_norm(xb, dim=-1, keepdim=True)             # [m, 1]
        n = nrm.clamp_min(eps)
        u = xb / n                                                           # [m, D]
        tu = torch.tanh(u)
        th = tu * _PI4
        c, s = torch.cos(th), torch.sin(th)
        zero = (u == 0) if is_query else (xb == 0)                           # [m, D] where |.|^p has gradient 0
        if is_query:
            tn = torch.tanh(n)
            p = (tn + tau).mul_(lam)                                         # [m, 1]
            la = u.abs().log_().masked_fill_(zero, 0.0)                      # ln|u| (0 where u = 0)
            mag = (la * p).exp_().masked_fill_(zero, 0.0)                    # |u|^p
        else:
            mag = xb.abs().pow_(lam)                                         # |x|^lam
        dm = gc * c + gs * s                                                 # [m, D]
        du = (gs * c - gc * s).mul_(mag).mul_(tu.mul_(tu).neg_().add_(1.0).mul_(_PI4))
        if is_query:
            du += (dm * p * mag / u).masked_fill_(zero, 0.0)
            dn = (dm * mag * la).sum(-1, keepdim=True) * lam * (1.0 - tn * tn)  # [m, 1]
        else:
            dn = 0.0
        corr = (dn - (du * u).sum(-1, keepdim=True) / n).masked_fill_(nrm < eps, 0.0)  # [m, 1]
        dxb = du.div_(n).add_(corr * u)
        if not is_query:
            dxb += (dm * lam * mag / xb).masked_fill_(zero, 0.0)
        dx[r0:r1] = dxb

    _for_blocks(R, D, body)
    return dx.reshape(x.shape)


def nala_feature_map_fused(x: torch.Tensor, *, is_query: bool, lam: float = 3.0, tau: float = 0.5,
                           eps: float = 1e-6) -> torch.Tensor:
    """NaLa map ``[..., D] -> [..., 2D]`` in plain PyTorch on cache-sized row blocks, in place, with a
    hand-written backward: the fast CPU path (any device works; no triton needed)."""
    _check("nala_feature_map_fused", x, lam, tau, eps)
    return NaLaFeatureMapFunction.apply(x, bool(is_query), float(lam), float(tau), float(eps), "torch")
