"""PolaFormer (Meng et al., ICLR 2025): polarity-aware linear attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.ops import linear_attn as la
from attnbench.ops.elementwise import EXP_FLOOR, sum_to
from attnbench.core.protocol import AttnbenchError, validate_qkv
from attnbench.attention.base import Attention


def polarity_split(x: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ReLU(x)^p, ReLU(-x)^p)``, the two powers as written (the reference)."""
    return F.relu(x).pow(p), F.relu(-x).pow(p)


class _PolarityFeatures(torch.autograd.Function):
    """``[ReLU(x inv_s)^p, ReLU(-x inv_s)^p]`` (``x [..., D]``, ``inv_s``, ``p`` broadcasting to it) ``-> [..., 2D]``,
    forward by :func:`_polarity_into`, backward by hand: with ``y = x inv_s``, ``f = |y|^p`` on the half where y
    has that sign and ``gf`` the gradient of that half, ``dy = p f gf / y``, ``dp = sum f gf ln|y|``,
    ``dx = dy inv_s``, ``d inv_s = sum dy x`` (0 where y = 0, p > 1). One autograd node instead of abs_pow, two sign
    masks, a concatenation and ``x / s``, each of which would keep its own temporaries for the backward."""

    @staticmethod
    def forward(ctx, x, inv_s, p):
        out = x.new_empty(*x.shape[:-1], 2 * x.shape[-1])
        _polarity_into(x, inv_s, torch.cat([p, p], -1), out)
        ctx.save_for_backward(x, inv_s, p, out)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, inv_s, p, out = ctx.saved_tensors
        D = x.shape[-1]
        y = x * inv_s
        pos, neg = y > 0, y < 0
        gf = grad[..., :D] * pos + grad[..., D:] * neg                      # the active half's gradient
        t = (out[..., :D] * pos + out[..., D:] * neg).mul_(gf)              # f gf (0 where y = 0)
        y_safe = y.masked_fill(y == 0, 1.0)
        dy = t * p / y_safe
        dx = dy * inv_s if ctx.needs_input_grad[0] else None
        d_inv_s = sum_to(dy * x, inv_s.shape) if ctx.needs_input_grad[1] else None
        dp = sum_to(t * y_safe.abs().log_(), p.shape) if ctx.needs_input_grad[2] else None
        return dx, d_inv_s, dp


class PolaAttention(Attention):
    """Polarity-aware linear attention (PolaFormer; formulation of the released ``PolaLinearAttention``).

    1. Learnable scale: ``q, k <- q / softplus(s), k / softplus(s)``, s per channel, initialised to 0 (ln 2).
    2. Learnable per-channel power ``p = 1 + alpha * sigmoid(w)`` in (1, 1 + alpha), w initialised to 0.
    3. Polarity split: ``q+ = ReLU(q)^p``, ``q- = ReLU(-q)^p`` (and k). Same-sign path ``[q+, q-] . [k+, k-]``
       (q+k+ + q-k-), opposite-sign path ``[q-, q+] . [k+, k-]`` (q-k+ + q+k-).
    4. The value is split in two halves: ``o = [LA(q_sim, k, v1), LA(q_opp, k, v2)]``, each normalised
       separately, ``LA(phi_q, phi_k, v)_t = phi_q(q_t) sum_j phi_k(k_j)^T v_j / phi_q(q_t) sum_j phi_k(k_j)``
       with no eps (:mod:`attnbench.ops.linear_attn`); the block's output projection learns how to mix the two
       streams (the paper's learnable polarity coefficients G).

    ``alpha`` defaults to 3 (the best average of the PolaFormer LRA table; the released code uses 4).
    The value size must be even. Gate, DWC and positional encoding belong to the block.
    """

    name = "polaformer"
    paper = "Meng et al. 2025 (PolaFormer, ICLR)"
    eps: float = 0.0            # a fixed eps on each stream's mean score (the released code's 1e-6); 0: the formula
    chunk_size: int = 64
    block_size: int = 1024
    recompute_backward: bool = True  # bidirectional training over several blocks: ops.linear_attention_recomputed

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", alpha: float = 3.0):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        if alpha <= 0:
            raise AttnbenchError(f"polaformer: option 'alpha' must be > 0, got {alpha}")
        self.alpha = float(alpha)
        self.scale = nn.Parameter(torch.zeros(heads, 1, head_dim))                  # softplus -> ln 2
        self.power = nn.Parameter(torch.zeros(heads, 1, head_dim))                  # sigmoid -> 1/2

    def recurrent_state_size(self) -> int:
        """Per head two streams, each ``S`` (``2d x d/2``: the key features ``[k+, k-]`` against half the value)
        and ``z`` (``2d``)."""
        d = self.head_dim
        return self.heads * 2 * (2 * d * (d // 2) + 2 * d)

    def check_inputs(self, q, k, v):
        validate_qkv(q, k, v, heads=self.heads, head_dim=self.head_dim, name=self.name, even_value_dim=True)

    def _params(self, dtype):
        s = F.softplus(self.scale.to(dtype))                                         # [H, 1, D]
        p = 1.0 + self.alpha * torch.sigmoid(self.power.to(dtype))                   # [H, 1, D]
        return s, p

    @staticmethod
    def query_streams(q, s, p, fast: bool):
        """``(q_sim, q_opp)``, each ``[..., 2D]``: ``[q+, q-]`` (same-sign path) and ``[q-, q+]`` (opposite-sign
        path) of ``q / s``; ``fast=False`` is the plain-power reference (:func:`polarity_split`)."""
        if fast:
            sim = _PolarityFeatures.apply(q, s.reciprocal(), p)
            D = q.shape[-1]
            return sim, torch.cat([sim[..., D:], sim[..., :D]], -1)
        pos, neg = polarity_split(q / s, p)                                          # [..., D] each
        return torch.cat([pos, neg], -1), torch.cat([neg, pos], -1)

    @staticmethod
    def key_features(k, s, p, fast: bool):
        """``[k+, k-]`` of ``k / s``: ``[..., 2D]`` (``fast``: one map with a hand-written backward)."""
        if fast:
            return _PolarityFeatures.apply(k, s.reciprocal(), p)
        return torch.cat(polarity_split(k / s, p), -1)

    def forward_reference(self, q, k, v):
        s, p = self._params(q.dtype)
        q_sim, q_opp = self.query_streams(q, s, p, False)                             # [B, H, N, 2D] each
        kf = self.key_features(k, s, p, False)                                        # [B, H, N, 2D]
        v_sim, v_opp = v.chunk(2, dim=-1)                                            # [B, H, N, Dv/2] each
        return torch.cat([la.linear_attention_reference(q_sim, kf, v_sim, causal=self.causal, eps=self.eps),
                          la.linear_attention_reference(q_opp, kf, v_opp, causal=self.causal, eps=self.eps)], -1)

    def forward_torch(self, q, k, v):
        # features block by block (never [B, H, N, 2D] for the whole sequence: at long N those are tensors large
        # enough that the allocator maps and faults them in on every call); the two streams share the key pass
        s, p = self._params(q.dtype)
        q_block, k_block = la.token_blocks(q, self.block_size), la.token_blocks(k, self.block_size)
        if self.causal:
            def map_q(a, b):
                return self.query_streams(q_block(a, b), s, p, True)              # q_sim, q_opp

            def map_k(a, b):
                return self.key_features(k_block(a, b), s, p, True)               # [B, H, b, 2D]
            return la.linear_attention_blocked(map_q, map_k, v, causal=True, eps=self.eps,
                                               chunk_size=self.chunk_size, block_size=self.block_size)
        # bidirectional: q_opp = [q-, q+] is q_sim = [q+, q-] with its halves swapped, and the keys' features
        # [k+, k-] have q_sim's layout: one feature map for all three, the swap done on the small state
        D = q.shape[-1]
        swap = torch.cat([torch.arange(D, 2 * D), torch.arange(D)]).to(q.device)
        perms = (torch.arange(2 * D, device=q.device), swap)
        inv_s = s.reciprocal()

        def inference_maps(q, k, inv_s, p):  # every block in place into one reused buffer per side
            p2, shape = torch.cat([p, p], -1), (lambda x: (*x.shape[:-1], 2 * D))  # noqa: E731
            into = (lambda x, out: _polarity_into(x, inv_s, p2, out))  # noqa: E731
            blocks = la.token_blocks(q, self.block_size), la.token_blocks(k, self.block_size)
            return tuple(la.scratch_map(into, block, shape) for block in blocks)
        params = [t for t in (inv_s, p) if t.requires_grad]
        if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or params)):
            fq_map, map_k = inference_maps(q, k, inv_s, p)
            return la.linear_attention_blocked(lambda a, b: la.Permuted(fq_map(a, b), perms), map_k, v, eps=self.eps,
                                               block_size=self.block_size)
        if q.shape[-2] > self.block_size and self.recompute_backward:
            # training over several blocks: the hand-written backward recomputes each block's features (no graph
            # over the blocks, no features kept); the forward uses the in-place maps
            tmap = la.TokenMap(lambda x, start: _PolarityFeatures.apply(x, inv_s, p))
            with torch.no_grad():
                maps = inference_maps(q.detach(), k.detach(), inv_s.detach(), p.detach())
            return la.linear_attention_recomputed(tmap, tmap, q, k, v, tensors=tuple(params), eps=self.eps,
                                                  block_size=self.block_size, inference_maps=maps, perms=perms)
        map_q = (lambda a, b: la.Permuted(self.key_features(q_block(a, b), s, p, True), perms))  # noqa: E731
        map_k = (lambda a, b: self.key_features(k_block(a, b), s, p, True))  # noqa: E731
        return la.linear_attention_blocked(map_q, map_k, v, eps=self.eps, block_size=self.block_size)


def _polarity_into(x: torch.Tensor, inv_s: torch.Tensor, p2: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``[ReLU(x / s)^p, ReLU(-x / s)^p]`` into ``out [..., 2D]`` without autograd (``p2 = [p, p]``): ``x / s`` and
    ``-x / s`` into the halves, then one power over the whole contiguous buffer as exp(p log max(., 1e-30)),
    floored like :func:`~attnbench.ops.elementwise.abs_pow`, then every entry at or below the clamp's value (a
    negative entry, or a positive one whose power is under ~1e-30) set to exactly 0, ReLU's value. Two
    transcendentals per output element, but no sign masks: on the CPU the comparisons and the mask products
    cost more than the log and exp they save. The floor keeps exp on ATen's vectorised path (an exponent of
    -inf or below about -87 takes a path tens of times slower); the zeros keep the matmuls that follow off
    subnormals (e^-80 times a small weight underflows, and the CPU handles those products in microcode)."""
    D = x.shape[-1]
    torch.mul(x, inv_s, out=out[..., :D])
    torch.mul(x, inv_s.neg(), out=out[..., D:])
    out.clamp_min_(1e-30).log_().mul_(p2).clamp_min_(EXP_FLOOR).exp_()
    return F.threshold_(out, _AT_THE_CLAMP, 0.0)


# the largest value a clamped entry reaches (1e-30 to a power p >= 1, rounded): anything at or below it becomes 0
_AT_THE_CLAMP = 1.001e-30
