"""SteLLA, the Stable Lightweight Linear Attention of MixA (Ahmed et al., ICCV 2025)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.ops import linear_attn as la
from attnbench.attention.base import Attention
from attnbench.ops.elementwise import position_counts, relu_vjp


class SteLLAAttention(Attention):
    """SteLLA, MixA Eqs. 6-7: ``O = ReLU(Q) (ReLU(K)^T V) / (beta * sqrt(d) * alpha * N)``.

    No data-dependent row-sum denominator (unlike cosFormer / EfficientViT): the scales sqrt(d) (Theorem 5.3,
    Var(ReLU(q)^T ReLU(k)) = O(d)) and N (Theorem 5.2, Var(sum_j A_ij V_jk) = O(N^2)) keep the output variance
    O(1); ``alpha`` and ``beta`` are learnable scalars initialised to 1. Causal form: token t divides by the
    position count t in place of N.
    """

    name = "stella"
    paper = "Ahmed et al. 2025 (MixA / SteLLA, ICCV)"
    chunk_size: int = 64
    block_size: int = 1024      # tokens whose features are computed at once (bidirectional; tests make it small)
    recompute_backward: bool = True  # training over several blocks: ops.linear_attention_recomputed

    def __init__(self, *, heads, head_dim, causal=False, impl="auto"):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        self.alpha = nn.Parameter(torch.ones(()))
        self.beta = nn.Parameter(torch.ones(()))

    def recurrent_state_size(self) -> int:
        """Per head ``S = sum ReLU(k)^T v`` (``d x d``); the divisor is the position count, not a state."""
        return self.heads * self.head_dim * self.head_dim

    def _scale(self, n: int, like: torch.Tensor) -> torch.Tensor:
        return (self.alpha * self.beta * math.sqrt(self.head_dim)).to(like.dtype) * position_counts(
            n, self.causal, like)

    def forward_reference(self, q, k, v):
        A = F.relu(q) @ F.relu(k).transpose(-1, -2) / (self.beta.to(q.dtype) * math.sqrt(self.head_dim))
        if self.causal:
            A = A.tril()                                                             # [B, H, N, N]
        return (A @ v) / (self.alpha.to(q.dtype) * position_counts(q.shape[-2], self.causal, q))

    def forward_torch(self, q, k, v):
        n = q.shape[-2]
        if self.causal:  # position-dependent scale t: on the output
            num = la.linear_attention(F.relu(q), F.relu(k), v, causal=True, normalize=False,
                                      chunk_size=self.chunk_size)
            return num / self._scale(n, q)
        # features block by block; the constant 1 / (alpha beta sqrt(d) N) scales the [d, d] state, not the output
        scale = 1.0 / (self.alpha * self.beta * (math.sqrt(self.head_dim) * n)).to(q.dtype)
        relu_into = (lambda x, out: torch.clamp(x, min=0, out=out))  # noqa: E731
        maps = tuple(la.scratch_map(relu_into, la.token_blocks(x.detach(), self.block_size)) for x in (q, k))
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or scale.requires_grad):
            if n > self.block_size and self.recompute_backward:
                # training, several blocks: the recomputing backward (no graph over the blocks), ReLU's gradient
                # by hand (with one block, autograd is faster: FeatureMapAttention.forward_torch)
                relu = la.TokenMap(lambda x, start: F.relu(x), relu_vjp)
                return la.linear_attention_recomputed(relu, relu, q, k, v, normalize=False,
                                                      block_size=self.block_size, scale=scale, inference_maps=maps)
            q_block, k_block = la.token_blocks(q, self.block_size), la.token_blocks(k, self.block_size)
            maps = (lambda s, e: F.relu(q_block(s, e))), (lambda s, e: F.relu(k_block(s, e)))
        return la.linear_attention_blocked(*maps, v, normalize=False, block_size=self.block_size, scale=scale)
