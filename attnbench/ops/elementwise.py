"""Elementwise pieces shared by several mechanisms (some faster than the generic ATen path on the CPU)."""

from __future__ import annotations

import torch

# e^-80 ~ 1.8e-35 stands in for anything smaller: ATen's CPU exp takes a slow path on arguments whose result
# underflows into subnormals or to 0
EXP_FLOOR = -80.0


def sum_to(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Reduce a broadcast gradient back to ``shape``."""
    while grad.dim() > len(shape):
        grad = grad.sum(0)
    for i, size in enumerate(shape):
        if size == 1 and grad.shape[i] != 1:
            grad = grad.sum(i, keepdim=True)
    return grad


class _AbsPow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        # |x|^p = exp(p log|x|), with log|x| and the exponent floored (|x|^p >= e^-80 ~ 1.8e-35 instead of 0):
        # ATen's log(0) = -inf, exp(-inf) and exp into subnormals take slow paths, and ReLU'd inputs are
        # half zeros.
        y = torch.exp(torch.log(x.abs().clamp_min_(1e-30)).mul_(p).clamp_min_(EXP_FLOOR))
        ctx.save_for_backward(x, p, y)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, p, y = ctx.saved_tensors
        nz = x != 0
        gx = gp = None
        if ctx.needs_input_grad[0]:                # d|x|^p/dx = p |x|^p / x (0 at x = 0, p > 1)
            gx = torch.where(nz, grad * p * y / torch.where(nz, x, torch.ones_like(x)), torch.zeros_like(x))
        if ctx.needs_input_grad[1]:                # d|x|^p/dp = |x|^p log|x| (0 at x = 0)
            logs = torch.log(torch.where(nz, x.abs(), torch.ones_like(x)))
            gp = sum_to(grad * y * logs, p.shape)
        return gx, gp


def exp_floored(x: torch.Tensor) -> torch.Tensor:
    """``exp(max(x, EXP_FLOOR))``, out of place (autograd-safe): strong decays give exponents of -250 and below,
    and the floor keeps every call on ATen's fast path. The gradient below the floor is 0 instead of e^x."""
    return torch.exp(x.clamp_min(EXP_FLOOR))


def abs_pow(x: torch.Tensor, p: torch.Tensor | float) -> torch.Tensor:
    """``|x| ** p`` for exponents p >= 1 (a tensor broadcasting against x, or a float), as exp(p log|x|).

    ATen's ``pow`` with a tensor exponent takes a much slower path on the CPU than exp/log. x = 0 gives
    about 1.8e-35 (a floor, see ``_AbsPow.forward``); gradients are exact, with the limits at x = 0 (0 for both x
    and p when p > 1) instead of NaN.
    """
    if not isinstance(p, torch.Tensor):
        p = torch.tensor(float(p), dtype=x.dtype, device=x.device)
    return _AbsPow.apply(x, p)


def relu_vjp(x, feats, dfeats):
    """ReLU's gradient by hand (for :class:`attnbench.ops.linear_attn.TokenMap`): dfeats where x > 0, in place."""
    return dfeats.mul_(feats > 0)


def position_counts(n: int, causal: bool, like: torch.Tensor) -> torch.Tensor:
    """The "N" of MixA's alpha * N: the sequence length, or, causally, the number of visible tokens t (``[N, 1]``)."""
    if causal:
        return torch.arange(1, n + 1, device=like.device, dtype=like.dtype).unsqueeze(-1)
    return torch.full((n, 1), float(n), device=like.device, dtype=like.dtype)


def _dense_strides(x: torch.Tensor) -> bool:
    """Whether x fills its storage without gaps or overlaps in some order of its dims (contiguous, or a permutation of
    a contiguous tensor, as a transposed view is)."""
    expected = 1
    for i in sorted(range(x.dim()), key=lambda i: x.stride(i)):
        if x.size(i) == 1:
            continue
        if x.stride(i) != expected:
            return False
        expected *= x.size(i)
    return True


class _GradInLayout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.size, ctx.stride = x.size(), x.stride()
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        if grad.stride() == ctx.stride:
            return grad
        return torch.empty_strided(ctx.size, ctx.stride, dtype=grad.dtype, device=grad.device).copy_(grad)


def grad_in_layout(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself, whose gradient is handed back in x's own memory layout. An op that multiplies by ``x^T`` hands x
    a transposed gradient, and an elementwise backward before it (a feature map's) with operands in two layouts
    leaves ATen's vectorised CPU loops (SiLU's backward, DeltaNet's feature map, several times slower). The delta
    rule calls this on its inputs; the gradient's values are the same, but what the backward before it computes
    may round differently in the vectorised loop (its exp). (The linear attention's feature maps gained nothing
    from it in the recall-tiny step, so it is not used there.)"""
    if not (x.requires_grad and torch.is_grad_enabled() and _dense_strides(x)):
        return x
    return _GradInLayout.apply(x)
