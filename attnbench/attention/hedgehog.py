"""Hedgehog (Zhang et al., ICLR 2024): linear attention with a learnable, spiky, positive feature map
``softmax([xW + b, -(xW + b)])`` per head; bidirectional and causal."""

from __future__ import annotations

import torch
from torch import nn

from ..registry import register_attention, register_feature_map
from .base import FeatureMap, FeatureMapAttention

PAPER = "Zhang et al. 2024 (The Hedgehog & the Porcupine, ICLR)"


@register_feature_map
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

    def phi(self, x):
        return self.phi_q(x)

    def phi_q(self, q):
        return self._map(q, self.weight_q, self.bias_q)

    def phi_k(self, k):
        if self.tie_qk:
            return self._map(k, self.weight_q, self.bias_q)
        return self._map(k, self.weight_k, self.bias_k)


@register_attention
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

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", tie_qk: bool = False):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        self.feature_map = self.make_feature_map(tie_qk=tie_qk)
