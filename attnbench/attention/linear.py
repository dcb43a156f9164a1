"""Kernelized linear attention with phi = ELU + 1 (Katharopoulos et al., 2020): the "Kernelized" baseline."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench.attention.base import FeatureMap, FeatureMapAttention


class _EluPlusOne(torch.autograd.Function):
    """ELU(x) + 1 = exp(min(x, 0)) + max(x, 0), with the derivative from the saved output: ``min(phi, 1)`` (e^x
    below 0, 1 above). ATen's ``elu_backward`` recomputes the exponential instead."""

    @staticmethod
    def forward(ctx, x):
        y = x.clamp(max=0).exp_().add_(x.clamp(min=0))                        # in place: cheaper than ATen's elu on the CPU
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return y.clamp(max=1.0).mul_(grad)


class EluFeatureMap(FeatureMap):
    """phi(x) = ELU(x) + 1 > 0 (Katharopoulos et al. 2020, Sec. 3.2)."""

    name = "elu"
    paper = "Katharopoulos et al. 2020 (Transformers are RNNs)"

    def phi(self, x):
        return _EluPlusOne.apply(x)

    def phi_into(self, x, out):
        return torch.clamp(x, max=0, out=out).exp_().add_(F.relu(x))

    @staticmethod
    def _vjp(x, feats, dfeats):
        return feats.clamp_(max=1.0).mul_(dfeats)                             # min(phi, 1) dphi, in place

    vjp_q = vjp_k = _vjp

    def phi_q_reference(self, q):
        return F.elu(q) + 1.0

    def phi_k_reference(self, k):
        return F.elu(k) + 1.0


class LinearAttention(FeatureMapAttention):
    """``o_t = phi(q_t) sum_i phi(k_i)^T v_i / phi(q_t) sum_j phi(k_j)`` with phi = ELU + 1 (Katharopoulos et al.
    2020, Eq. 6; NaLaFormer Eq. 4; the "Kernelized" row of NaLaFormer Table 14)."""

    name = "linear"
    paper = EluFeatureMap.paper
    feature_map_cls = EluFeatureMap

    def __init__(self, *, heads, head_dim, causal=False, impl="auto"):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        self.feature_map = self.make_feature_map()
