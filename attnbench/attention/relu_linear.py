"""Row-normalised ReLU linear attention: phi = ReLU (the ReLU + LA baseline of MirrorLA Table 7; the row-sum
normalised form MixA contrasts SteLLA with)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench.attention.base import FeatureMap, FeatureMapAttention
from attnbench.ops.elementwise import relu_vjp


class ReluFeatureMap(FeatureMap):
    """phi(x) = ReLU(x) (MirrorLA Eq. 2 with phi_r = ReLU; EfficientViT / cosFormer kernels)."""

    name = "relu"
    paper = "Katharopoulos et al. 2020; Cai et al. 2023 (EfficientViT)"

    def phi(self, x):
        return F.relu(x)

    def phi_into(self, x, out):
        return torch.clamp(x, min=0, out=out)

    vjp_q = vjp_k = staticmethod(relu_vjp)


class ReluLinearAttention(FeatureMapAttention):
    """``o_t = ReLU(q_t) sum_i ReLU(k_i)^T v_i / ReLU(q_t) sum_j ReLU(k_j)`` (MirrorLA Eq. 2 with ReLU), no eps.

    A query whose scores are all zero (e.g. its ReLU is all zero) gets a zero output: the only guard, for an
    exactly zero denominator (:mod:`attnbench.ops.linear_attn`)."""

    name = "relu_linear"
    paper = ReluFeatureMap.paper
    feature_map_cls = ReluFeatureMap

    def __init__(self, *, heads, head_dim, causal=False, impl="auto"):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        self.feature_map = self.make_feature_map()
