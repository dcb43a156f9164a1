"""MixA's ReLU quadratic attention, kept in the critical layers (Ahmed et al., ICCV 2025; Wortsman et al. 2023)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.core.protocol import AttnbenchError
from attnbench.attention.base import Attention
from attnbench.ops.elementwise import position_counts


class ReluQuadraticAttention(Attention):
    """MixA Eqs. 4-5: ``O = ReLU(Q K^T / (beta sqrt(d))) V / (alpha N)``, alpha, beta learnable, initialised to 1;
    causal: lower-triangular mask and the position count t in place of N.

    Quadratic by design. ``reference`` materialises the N x N matrix; ``torch`` computes the same in query blocks
    of ``block_size`` rows, so memory grows as N * block_size instead of N^2.
    """

    name = "relu_quadratic"
    paper = "Ahmed et al. 2025 (MixA / SteLLA, ICCV)"

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", block_size: int = 128):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        self.alpha = nn.Parameter(torch.ones(()))
        self.beta = nn.Parameter(torch.ones(()))
        if not isinstance(block_size, int) or block_size < 1:
            raise AttnbenchError(f"relu_quadratic: option 'block_size' must be a positive int, got {block_size!r}")
        self.block_size = block_size

    def _scores(self, q, k):
        return F.relu(q @ k.transpose(-1, -2) / (self.beta.to(q.dtype) * math.sqrt(self.head_dim)))

    def forward_reference(self, q, k, v):
        A = self._scores(q, k)                                                       # [B, H, N, N]
        if self.causal:
            A = A.tril()
        return (A @ v) / (self.alpha.to(q.dtype) * position_counts(q.shape[-2], self.causal, q))

    def forward_torch(self, q, k, v):
        n = q.shape[-2]
        counts = self.alpha.to(q.dtype) * position_counts(n, self.causal, q)         # [N, 1]
        outs = []
        # query blocks by one split (a slice per block would fill a full-size zero gradient each, in backward)
        for start, q_blk in zip(range(0, n, self.block_size), q.split(self.block_size, dim=2)):
            stop = start + q_blk.shape[2]
            keys = stop if self.causal else n                                        # causal: keys <= last query
            A = self._scores(q_blk, k[:, :, :keys] if self.causal else k)            # [B, H, b, keys]
            if self.causal:
                A = A.tril(diagonal=start)
            outs.append(A @ (v[:, :, :keys] if self.causal else v))
        return torch.cat(outs, dim=2) / counts
