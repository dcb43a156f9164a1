"""LaplacianFormer kernels (laplacianformer notes Sec. 1.5, 1.7, 1.13): L1 distances and a Newton-Schulz step.

(a) ``l1_distance(x, y)``: x ``[B, H, N, d]`` (queries), y ``[B, H, m, d]`` (landmarks) -> ``[B, H, N, m]``,

        D[n, j] = sum_c |x[n, c] - y[j, c]|                       (the distance inside exp(-||q - k~||_1 / lam), Eq. 8)
        gx[n, c] =  sum_j g[n, j] sign(x[n, c] - y[j, c]),   gy[j, c] = -sum_n g[n, j] sign(x[n, c] - y[j, c])

    tiled so that no N x m x d tensor exists in memory (only a [BN, BM, BC] tile per program); sign(0) = 0.
(b) ``newton_schulz_step(X, W)``: X, W ``[B, H, m, m]`` (m <= 128) -> X (2I - W X) = 2X - X W X (Sec. 1.7), one
    program per block of rows of one matrix; backward (by matmuls) gX = 2G - G (W X)^T - (X W)^T G,
    gW = -X^T G X^T.
"""

from __future__ import annotations

import torch

from ._util import check_launchable, dot_precision, jit, pow2, tl

__all__ = ["l1_distance", "l1_distance_reference", "L1DistanceFunction",
           "newton_schulz_step", "newton_schulz_step_reference", "NewtonSchulzStepFunction"]

MAX_NS_SIZE = 128


# ----------------------------------------------------------------------------------------------- references


def l1_distance_reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch ``[B, H, N, d], [B, H, m, d] -> [B, H, N, m]``; materialises the N x m x d differences
    (autograd then gives exactly the sign formulas of the module docstring). ``torch.cdist(x, y, p=1)`` agrees."""
    return (x.unsqueeze(-2) - y.unsqueeze(-3)).abs().sum(-1)                # [B, H, N, m]


def newton_schulz_step_reference(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """One Newton-Schulz iteration X_{k+1} = X_k (2I - W X_k) (Sec. 1.7), ``[B, H, m, m]``."""
    return 2 * X - X @ (W @ X)                                               # [B, H, m, m]


# ----------------------------------------------------------------------------------------------- L1 distance


@jit
def _l1_fwd_kernel(x, y, out, N, Mm, d, BN: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr):
    i_n, i_m, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = i_bh.to(tl.int64)
    x += bh * N * d
    y += bh * Mm * d
    out += bh * N * Mm
    rn = i_n * BN + tl.arange(0, BN)
    rm = i_m * BM + tl.arange(0, BM)
    rc = tl.arange(0, BC)
    acc = tl.zeros([BN, BM], dtype=tl.float32)                               # [BN, BM]
    for c0 in range(0, d, BC):
        cc = c0 + rc
        bx = tl.load(x + rn[:, None] * d + cc[None, :], mask=(rn < N)[:, None] & (cc < d)[None, :],
                     other=0.0).to(tl.float32)                               # [BN, BC]
        by = tl.load(y + rm[:, None] * d + cc[None, :], mask=(rm < Mm)[:, None] & (cc < d)[None, :],
                     other=0.0).to(tl.float32)                               # [BM, BC]
        acc += tl.sum(tl.abs(bx[:, None, :] - by[None, :, :]), axis=2)      # [BN, BM] (padded c: |0 - 0| = 0)
    tl.store(out + rn[:, None] * Mm + rm[None, :], acc, mask=(rn < N)[:, None] & (rm < Mm)[None, :])


@jit
def _sign(t):
    return tl.where(t > 0, 1.0, 0.0) - tl.where(t < 0, 1.0, 0.0)


@jit
def _l1_bwd_x_kernel(x, y, g, gx, N, Mm, d, BN: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr):
    """gx[n, c] = sum_j g[n, j] sign(x[n, c] - y[j, c]); loops over landmark blocks."""
    i_n, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = i_bh.to(tl.int64)
    x += bh * N * d
    gx += bh * N * d
    y += bh * Mm * d
    g += bh * N * Mm
    rn = i_n * BN + tl.arange(0, BN)
    cc = i_c * BC + tl.arange(0, BC)
    mx = (rn < N)[:, None] & (cc < d)[None, :]
    bx = tl.load(x + rn[:, None] * d + cc[None, :], mask=mx, other=0.0).to(tl.float32)  # [BN, BC]
    acc = tl.zeros([BN, BC], dtype=tl.float32)                               # [BN, BC]
    for m0 in range(0, Mm, BM):
        rm = m0 + tl.arange(0, BM)
        by = tl.load(y + rm[:, None] * d + cc[None, :], mask=(rm < Mm)[:, None] & (cc < d)[None, :],
                     other=0.0).to(tl.float32)                               # [BM, BC]
        bg = tl.load(g + rn[:, None] * Mm + rm[None, :], mask=(rn < N)[:, None] & (rm < Mm)[None, :],
                     other=0.0).to(tl.float32)                               # [BN, BM] (0 on padding)
        acc += tl.sum(bg[:, :, None] * _sign(bx[:, None, :] - by[None, :, :]), axis=1)
    tl.store(gx + rn[:, None] * d + cc[None, :], acc, mask=mx)


@jit
def _l1_bwd_y_kernel(x, y, g, gy, N, Mm, d, BN: tl.constexpr, BM: tl.constexpr, BC: tl.constexpr):
    """gy[j, c] = -sum_n g[n, j] sign(x[n, c] - y[j, c]); loops over query blocks."""
    i_m, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bh = i_bh.to(tl.int64)
    x += bh * N * d
    y += bh * Mm * d
    gy += bh * Mm * d
    g += bh * N * Mm
    rm = i_m * BM + tl.arange(0, BM)
    cc = i_c * BC + tl.arange(0, BC)
    my = (rm < Mm)[:, None] & (cc < d)[None, :]
    by = tl.load(y + rm[:, None] * d + cc[None, :], mask=my, other=0.0).to(tl.float32)  # [BM, BC]
    acc = tl.zeros([BM, BC], dtype=tl.float32)                               # [BM, BC]
    for n0 in range(0, N, BN):
        rn = n0 + tl.arange(0, BN)
        bx = tl.load(x + rn[:, None] * d + cc[None, :], mask=(rn < N)[:, None] & (cc < d)[None, :],
                     other=0.0).to(tl.float32)                               # [BN, BC]
        bg = tl.load(g + rn[:, None] * Mm + rm[None, :], mask=(rn < N)[:, None] & (rm < Mm)[None, :],
                     other=0.0).to(tl.float32)                               # [BN, BM] (0 on padding)
        acc -= tl.sum(bg[:, :, None] * _sign(bx[:, None, :] - by[None, :, :]), axis=0)
    tl.store(gy + rm[:, None] * d + cc[None, :], acc, mask=my)


_L1_BN, _L1_BM, _L1_BC = 32, 32, 8  # a [32, 32, 8] difference tile per program


class L1DistanceFunction(torch.autograd.Function):
    """``apply(x [B, H, N, d], y [B, H, m, d]) -> [B, H, N, m]`` in x's dtype (fp32 accumulation)."""

    @staticmethod
    def forward(ctx, x, y):
        x, y = x.contiguous(), y.contiguous()
        B, H, N, d = x.shape
        m = y.shape[-2]
        out = x.new_empty(B, H, N, m)                                        # [B, H, N, m]
        grid = (-(-N // _L1_BN), -(-m // _L1_BM), B * H)
        _l1_fwd_kernel[grid](x, y, out, N, m, d, BN=_L1_BN, BM=_L1_BM, BC=_L1_BC)
        ctx.save_for_backward(x, y)
        return out

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        B, H, N, d = x.shape
        m = y.shape[-2]
        g = g.contiguous()
        gx = gy = None
        if ctx.needs_input_grad[0]:
            gx = torch.empty_like(x)                                         # [B, H, N, d]
            _l1_bwd_x_kernel[(-(-N // _L1_BN), -(-d // _L1_BC), B * H)](
                x, y, g, gx, N, m, d, BN=_L1_BN, BM=_L1_BM, BC=_L1_BC)
        if ctx.needs_input_grad[1]:
            gy = torch.empty_like(y)                                         # [B, H, m, d]
            _l1_bwd_y_kernel[(-(-m // _L1_BM), -(-d // _L1_BC), B * H)](
                x, y, g, gy, N, m, d, BN=_L1_BN, BM=_L1_BM, BC=_L1_BC)
        return gx, gy


def l1_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pairwise L1 distances ``[B, H, N, d], [B, H, m, d] -> [B, H, N, m]`` by Triton kernels, forward and
    backward, with no N x m x d intermediate (module docstring for the formulas)."""
    name = "l1_distance"
    check_launchable(name, x=x, y=y)
    if x.dim() != 4:
        raise ValueError(f"{name}: x must be [B, H, N, d], got {list(x.shape)}")
    B, H, N, d = x.shape
    if y.dim() != 4 or (y.shape[0], y.shape[1], y.shape[3]) != (B, H, d):
        raise ValueError(f"{name}: y must be [B, H, m, d] = [{B}, {H}, m, {d}], got {list(y.shape)}")
    if y.dtype != x.dtype:
        raise TypeError(f"{name}: x and y must share a dtype, got {x.dtype} and {y.dtype}")
    if N == 0 or d == 0 or y.shape[2] == 0:
        raise ValueError(f"{name}: empty input: N={N}, m={y.shape[2]}, d={d}")
    return L1DistanceFunction.apply(x, y)


# ----------------------------------------------------------------------------------------------- Newton-Schulz


@jit
def _ns_step_kernel(X, W, Y, m, BR: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """Y[rows] = 2 X[rows] - sum_k X[rows, k] (W X)[k, :], with (W X)[k-block, :] built from BK-sized tiles."""
    i_r, i_b = tl.program_id(0), tl.program_id(1)
    b = i_b.to(tl.int64)
    X += b * m * m
    W += b * m * m
    Y += b * m * m
    rows = i_r * BR + tl.arange(0, BR)
    cols = tl.arange(0, BM)
    mr = rows < m
    mc = cols < m
    acc = tl.zeros([BR, BM], dtype=tl.float32)                               # [BR, m] X W X rows
    for k0 in range(0, m, BK):
        kk = k0 + tl.arange(0, BK)
        mk = kk < m
        wx = tl.zeros([BK, BM], dtype=tl.float32)                            # [BK, m] (W X)[kk, :]
        for j0 in range(0, m, BK):
            jj = j0 + tl.arange(0, BK)
            mj = jj < m
            bw = tl.load(W + kk[:, None] * m + jj[None, :], mask=mk[:, None] & mj[None, :],
                         other=0.0).to(tl.float32)                           # [BK, BK]
            bxj = tl.load(X + jj[:, None] * m + cols[None, :], mask=mj[:, None] & mc[None, :],
                          other=0.0).to(tl.float32)                          # [BK, m]
            wx += tl.dot(bw, bxj, input_precision=PREC)
        bxr = tl.load(X + rows[:, None] * m + kk[None, :], mask=mr[:, None] & mk[None, :],
                      other=0.0).to(tl.float32)                              # [BR, BK]
        acc += tl.dot(bxr, wx, input_precision=PREC)
    mo = mr[:, None] & mc[None, :]
    bx = tl.load(X + rows[:, None] * m + cols[None, :], mask=mo, other=0.0).to(tl.float32)  # [BR, m]
    tl.store(Y + rows[:, None] * m + cols[None, :], 2.0 * bx - acc, mask=mo)


def _ns_tiles(m: int) -> dict:
    """Rows per program BR, padded size BM, inner tile BK and warps: a [BR, BM] fp32 accumulator per program."""
    BM = pow2(m)
    return dict(BR=min(BM, 64), BM=BM, BK=16, num_warps=8 if BM >= 128 else 4)


class NewtonSchulzStepFunction(torch.autograd.Function):
    """``apply(X, W) -> 2X - X W X`` (kernel forward; backward by two batched matmuls each)."""

    @staticmethod
    def forward(ctx, X, W):
        X, W = X.contiguous(), W.contiguous()
        m = X.shape[-1]
        batch = X.numel() // (m * m)
        Y = torch.empty_like(X)                                              # [B, H, m, m]
        t = _ns_tiles(m)
        _ns_step_kernel[(-(-m // t["BR"]), batch)](X, W, Y, m, BR=t["BR"], BM=t["BM"], BK=t["BK"],
                                                   PREC=dot_precision(X.dtype), num_warps=t["num_warps"])
        ctx.save_for_backward(X, W)
        return Y

    @staticmethod
    def backward(ctx, G):
        X, W = ctx.saved_tensors
        gX = gW = None
        Xt = X.transpose(-1, -2)
        if ctx.needs_input_grad[0]:
            gX = 2 * G - G @ (W @ X).transpose(-1, -2) - (X @ W).transpose(-1, -2) @ G  # [B, H, m, m]
        if ctx.needs_input_grad[1]:
            gW = -(Xt @ G @ Xt)                                              # [B, H, m, m]
        return gX, gW


def newton_schulz_step(X: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
    """One Newton-Schulz step X (2I - W X) for batched square matrices ``[..., m, m]`` (m <= 128) by a Triton
    kernel (one launch; W X is never written to memory). Differentiable in X and W."""
    name = "newton_schulz_step"
    check_launchable(name, X=X, W=W)
    if X.dim() < 2 or X.shape[-1] != X.shape[-2] or X.shape[-1] == 0:
        raise ValueError(f"{name}: X must be [..., m, m] (square, m >= 1), got {list(X.shape)}")
    if W.shape != X.shape:
        raise ValueError(f"{name}: W must have X's shape {list(X.shape)}, got {list(W.shape)}")
    if W.dtype != X.dtype:
        raise TypeError(f"{name}: X and W must share a dtype, got {X.dtype} and {W.dtype}")
    if X.shape[-1] > MAX_NS_SIZE:
        raise ValueError(f"{name}: matrix size m = X.shape[-1] = {X.shape[-1]} > {MAX_NS_SIZE}")
    return NewtonSchulzStepFunction.apply(X, W)
