"""The NaLa feature map (NaLaFormer Eqs. 6, 7, 11-13) in PyTorch on row blocks: the fast CPU form.

Same math as ``attnbench.kernels.nala`` (whose docstring gives the forward and the hand-written backward) and its
reference ``nala_feature_map_reference``; here each op runs on a block of rows that stays in cache, writing into
buffers made once, and the backward is hand-written rather than autograd's (which would keep every intermediate
of the map alive). Runs on any device; needs no triton.
"""

from __future__ import annotations

import math

import torch

__all__ = ["nala_feature_map_blocked", "nala_map_forward", "nala_map_backward", "NaLaMapBlockedFunction"]

_PI4 = math.pi / 4


_BLOCK_ELEMS = 1 << 16   # per torch thread: rows per block * D, so that a block's temporaries stay in cache


def _for_blocks(R: int, D: int, body, scratch=lambda rows: None) -> None:
    """Run ``body(r0, r1, buffers)`` over row blocks [r0, r1) of R rows, ``buffers = scratch(rows)`` made once.

    A block holds ``_BLOCK_ELEMS`` elements per torch thread: each op on it is big enough for ATen to split over
    its threads and small enough that the block's temporaries stay in cache (ATen's threads inside each op, not a
    pool of Python threads over smaller single-threaded blocks: those were slower).
    """
    BR = max(1, min(R, _BLOCK_ELEMS * torch.get_num_threads() // D))
    buffers = scratch(BR)
    for r0 in range(0, R, BR):
        body(r0, min(R, r0 + BR), buffers)


def nala_map_forward(x: torch.Tensor, is_query: bool, lam: float, tau: float, eps: float) -> torch.Tensor:
    """phi(x) ``[..., 2D]`` of a contiguous x ``[..., D]`` on row blocks, in place in each block's buffers."""
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


def nala_map_backward(x: torch.Tensor, g: torch.Tensor, is_query: bool, lam: float, tau: float,
                    eps: float) -> torch.Tensor:
    """The backward of :mod:`attnbench.kernels.nala`'s docstring on row blocks: dx ``[..., D]`` from x and the
    output gradient g ``[..., 2D]``, recomputing the forward quantities of each block."""
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


class NaLaMapBlockedFunction(torch.autograd.Function):
    """``apply(x, is_query, lam, tau, eps)`` of a contiguous x: :func:`nala_map_forward` and, for dx,
    :func:`nala_map_backward`."""

    @staticmethod
    def forward(ctx, x, *args):
        ctx.save_for_backward(x)
        ctx.args = args
        return nala_map_forward(x, *args)

    @staticmethod
    def backward(ctx, g):
        return (nala_map_backward(*ctx.saved_tensors, g.contiguous(), *ctx.args), *[None] * len(ctx.args))


def nala_feature_map_blocked(x: torch.Tensor, *, is_query: bool, lam: float = 3.0, tau: float = 0.5,
                             eps: float = 1e-6) -> torch.Tensor:
    """NaLa map ``[..., D] -> [..., 2D]`` in plain PyTorch on cache-sized row blocks, with a hand-written backward;
    same math as ``attnbench.kernels.nala_feature_map_reference``."""
    from attnbench.kernels.nala import check_arguments  # lazy: that module also holds the (optional) Triton kernels

    check_arguments("nala_feature_map_blocked", x, lam, tau, eps)
    return NaLaMapBlockedFunction.apply(x.contiguous(), bool(is_query), float(lam), float(tau), float(eps))
