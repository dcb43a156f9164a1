"""Hedgehog (Zhang et al., ICLR 2024): linear attention with a learnable, spiky, positive feature map
``softmax([xW + b, -(xW + b)])`` per head; bidirectional and causal."""

from __future__ import annotations

import torch
from torch import nn

from attnbench.ops import linear_attn as la
from attnbench.attention.base import FeatureMap, FeatureMapAttention

PAPER = "Zhang et al. 2024 (The Hedgehog & the Porcupine, ICLR)"


class HedgehogFeatureMap(FeatureMap):
    """``phi(x) = softmax([x W_h + b_h, -(x W_h + b_h)])`` over the 2D features, one ``W_h: [D, D]``, ``b_h: [D]``
    per head h: ``[B, H, N, D] -> [B, H, N, 2D]``.

    The paper's map (Sec. 4.1, phi_mlp) is ``[exp(x W + b), exp(-(x W + b))]``; dividing by its sum over the 2D
    features (the softmax) is the form of the released Hedgehog / LoLCATs / FLA code: it bounds the features in
    (0, 1), and for queries the factor cancels in normalised attention. Separate maps for queries and keys
    (option ``tie_qk=False``, as the released code), initialised to ``W = I, b = 0`` (FLA's init) and trainable.
    ``phi`` (a symmetric use) is the query-side map.
    """

    name = "hedgehog"
    paper = PAPER

    def __init__(self, *, heads, head_dim, causal=False, tie_qk: bool = False):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        self.tie_qk = bool(tie_qk)
        eye = torch.eye(head_dim).expand(heads, head_dim, head_dim)
        self.weight_q = nn.Parameter(eye.clone())                             # [H, D, D]
        self.bias_q = nn.Parameter(torch.zeros(heads, head_dim))              # [H, D]
        if not self.tie_qk:
            self.weight_k = nn.Parameter(eye.clone())                         # [H, D, D]
            self.bias_k = nn.Parameter(torch.zeros(heads, head_dim))          # [H, D]

    @property
    def feature_dim(self) -> int:
        return 2 * self.head_dim

    @staticmethod
    def _map(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        z = torch.einsum("bhnd,hde->bhne", x, w.to(x.dtype)) + b.to(x.dtype)[:, None, :]  # [B, H, N, D]
        return torch.softmax(torch.cat([z, -z], dim=-1), dim=-1)              # [B, H, N, 2D]

    @staticmethod
    def _map_into(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, out: torch.Tensor, normalise: bool):
        """:meth:`_map` written into ``out [B, H, n, 2D]`` without the cat or the softmax's temporaries:
        ``exp(+-z - max|z|)``, divided by its sum only for keys (a per-query factor cancels in the normalised
        attention, which has no eps)."""
        D = x.shape[-1]
        z = torch.matmul(x, w.to(x.dtype)).add_(b.to(x.dtype)[:, None, :])   # [B, H, n, D]
        # max |z| from two plain reductions (aminmax and max(dim) take much slower paths on the CPU)
        m = torch.maximum(z.amax(-1, keepdim=True), z.amin(-1, keepdim=True).neg_())  # [B, H, n, 1]
        torch.sub(z, m, out=out[..., :D])
        torch.sub(m.neg_(), z, out=out[..., D:])                              # -z - max|z|
        out.exp_()                                                            # one contiguous pass, not two strided
        if normalise:
            out.div_(out.sum(-1, keepdim=True))
        return out

    def block_maps(self, q: torch.Tensor, k: torch.Tensor, block_size: int):
        """Inference: every block straight into one reused buffer per side (see :meth:`_map_into`)."""
        if self.needs_grad(q, k):
            return super().block_maps(q, k, block_size)
        wk, bk = (self.weight_q, self.bias_q) if self.tie_qk else (self.weight_k, self.bias_k)
        q_block, k_block = la.token_blocks(q, block_size), la.token_blocks(k, block_size)
        shape = lambda x: (*x.shape[:-1], 2 * x.shape[-1])  # noqa: E731
        return (la.scratch_map(lambda x, out: self._map_into(x, self.weight_q, self.bias_q, out, False), q_block,
                               shape),
                la.scratch_map(lambda x, out: self._map_into(x, wk, bk, out, True), k_block, shape))

    def phi(self, x):
        return self.phi_q(x)

    def phi_q(self, q):
        return self._map(q, self.weight_q, self.bias_q)

    def phi_k(self, k):
        if self.tie_qk:
            return self._map(k, self.weight_q, self.bias_q)
        return self._map(k, self.weight_k, self.bias_k)


class HedgehogAttention(FeatureMapAttention):
    """``o_t = phi_q(q_t) sum_j phi_k(k_j)^T v_j / phi_q(q_t) sum_j phi_k(k_j)`` (Zhang et al. 2024, Eq. 2 with
    the feature map of :class:`HedgehogFeatureMap`), over j <= t when causal.

    Option ``tie_qk`` (default False: separate trainable query and key maps). Feature size 2D. The paper trains
    the maps to mimic softmax attention (distillation); that training belongs to the suites, not here.
    ``reference`` materialises the N x N scores; ``torch`` runs the associative (bidirectional) or chunked
    (causal) form of :mod:`attnbench.ops.linear_attn`.
    """

    name = "hedgehog"
    paper = PAPER
    feature_map_cls = HedgehogFeatureMap
    # the recomputing backward would redo the MLP and its autograd per block, which costs more than it saves
    # (benchmarks/bench_fast_paths.py --backward-gain); autograd through the blocked op is kept
    recompute_backward = False

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", tie_qk: bool = False):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        self.feature_map = self.make_feature_map(tie_qk=tie_qk)
