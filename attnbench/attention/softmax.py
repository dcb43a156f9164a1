"""Softmax attention (Vaswani et al., 2017): the quadratic baseline every paper compares against."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnbench.attention.base import Attention


class SoftmaxAttention(Attention):
    """``O = softmax(Q K^T / sqrt(d)) V`` (NaLaFormer Eq. 2; MirrorLA Eq. 1), with a lower-triangular mask when
    causal. ``reference`` is the eager N x N form; ``sdpa`` is ``torch.nn.functional.scaled_dot_product_attention``.

    Options: ``scale`` (default ``1/sqrt(head_dim)``).
    """

    name = "softmax"
    paper = "Vaswani et al. 2017 (Attention Is All You Need)"
    impls = ("reference", "sdpa")
    cpu_impl = gpu_impl = "sdpa"
    upcast_half = False  # SDPA handles fp16/bf16 itself; the eager reference upcasts below

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", scale: float | None = None):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        self.scale = float(scale) if scale is not None else 1.0 / math.sqrt(head_dim)

    def forward_reference(self, q, k, v):
        dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        scores = (q @ k.transpose(-1, -2)) * self.scale                       # [B, H, N, N]
        if self.causal:
            n = q.shape[-2]
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1) @ v

    def forward_sdpa(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, scale=self.scale)
