"""NaLa feature maps (NaLaFormer Eqs. 6, 7, 11-13), fused: one pass per token, forward and backward.

For a token x ``[D]`` with n = max(||x||_2, eps), u = dir(x) = x / n and angles theta = (pi/4) tanh(u) (Sec. 3.2):

    query (Eqs. 6, 12):  p = lam (tau + tanh(n)),  mag = |u|^p             (norm-aware power of the direction)
    key   (Eqs. 6, 13):                            mag = |x|^lam           (fixed power of the raw key)
    phi(x) = [mag * cos(theta); mag * sin(theta)]   ``[2D]``, cos half first (Eq. 11)

Two forms with one meaning here: ``nala_feature_map_reference`` (plain PyTorch, autograd) and
``nala_feature_map`` (Triton kernel, any device the kernels run on); the fast CPU form in PyTorch is
``attnbench.ops.nala_map``. The gradient of |u|^p (and |x|^lam) is 0 where the coordinate is 0, as in PyTorch's
``abs().pow()``.

Backward (g = [g_c; g_s]): dmag = g_c cos + g_s sin, dtheta = mag (g_s cos - g_c sin),
du = dtheta (pi/4)(1 - tanh(u)^2) + [query] dmag p mag / u,  dp = sum dmag mag log|u|,  dn = dp lam (1 - tanh(n)^2),
dx = du / n + (dn - (du . u) / n) u  (the second term only where ||x|| >= eps)  + [key] dmag lam mag / x.
"""

from __future__ import annotations

import math
import torch

from ._util import check_launchable, jit, pow2, tl

__all__ = ["nala_feature_map", "nala_feature_map_reference", "NaLaFeatureMapFunction", "check_arguments"]

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


def check_arguments(name: str, x: torch.Tensor, lam: float, tau: float, eps: float) -> None:
    """One-line errors for a NaLa map's arguments (shared by every form of the map)."""
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
def _cos_quarter(t):
    """cos t for |t| <= pi/4 (the angles here): Taylor to t^10, error < 2e-10 (below float32 rounding). No call
    to libdevice's cosf, whose slow path for large arguments made ptxas spill around it."""
    t2 = t * t
    return 1.0 + t2 * (-0.5 + t2 * (1.0 / 24.0 + t2 * (-1.0 / 720.0 + t2 * (1.0 / 40320.0 + t2 * (-1.0 / 3628800.0)))))


@jit
def _sin_quarter(t):
    """sin t for |t| <= pi/4: Taylor to t^11, relative error < 1e-11 (below float32 rounding); see _cos_quarter."""
    t2 = t * t
    return t * (1.0 + t2 * (-1.0 / 6.0 + t2 * (1.0 / 120.0 + t2 * (-1.0 / 5040.0 + t2 * (1.0 / 362880.0 + t2 * (
        -1.0 / 39916800.0))))))


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
    tl.store(base, mag * _cos_quarter(th), mask=mask)                        # cos half [0, D)
    tl.store(base + D, mag * _sin_quarter(th), mask=mask)                    # sin half [D, 2D)


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
    c = _cos_quarter(th)                                                     # |th| <= pi/4
    s = _sin_quarter(th)
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
    """(rows per program, num_warps): about 8 elements per thread in the forward, 4 in the backward. No register
    spills on sm_80 or sm_90 for any D (``attnbench check --aot``) since sin/cos are polynomials on their bounded
    range (``_sin_quarter``): libdevice's sinf/cosf carry a slow path for large arguments around whose call ptxas
    saved 8 bytes to the stack in a few (D, dtype) configurations, whatever the tile."""
    return max(1, min(64, (512 if backward else 1024) // pow2(D, 1))), 4


class NaLaFeatureMapFunction(torch.autograd.Function):
    """``apply(x, is_query, lam, tau, eps)``: the forward and backward kernels."""

    @staticmethod
    def forward(ctx, x, is_query: bool, lam: float, tau: float, eps: float):
        xc = x.contiguous()
        ctx.save_for_backward(xc)
        ctx.meta = (is_query, lam, tau, eps)
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
        is_query, lam, tau, eps = ctx.meta
        g = g.contiguous()
        D = x.shape[-1]
        R = x.numel() // D
        dx = torch.empty_like(x)                                             # [..., D]
        BR, warps = _rows_per_program(D, backward=True)
        _nala_bwd_kernel[(-(-R // BR),)](x, g, dx, R, D, float(lam), float(tau), float(eps),
                                         BR=BR, BD=pow2(D, 1), IS_QUERY=bool(is_query), num_warps=warps)
        return dx, None, None, None, None


def nala_feature_map(x: torch.Tensor, *, is_query: bool, lam: float = 3.0, tau: float = 0.5,
                     eps: float = 1e-6) -> torch.Tensor:
    """NaLa map ``[..., D] -> [..., 2D]`` by the fused Triton kernel (forward and backward); same math as
    ``nala_feature_map_reference``. Output in x's dtype, computed in float32."""
    check_arguments("nala_feature_map", x, lam, tau, eps)
    check_launchable("nala_feature_map", x=x)
    return NaLaFeatureMapFunction.apply(x, bool(is_query), float(lam), float(tau), float(eps))
