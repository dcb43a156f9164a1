"""FLatten Transformer (Han et al., ICCV 2023): focused linear attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.ops import linear_attn as la
from attnbench.core.protocol import AttnbenchError
from attnbench.attention.base import FeatureMap, FeatureMapAttention

PAPER = "Han et al. 2023 (FLatten Transformer, ICCV)"


class FocusedFeatureMap(FeatureMap):
    """Focused map (FLatten Eq. 5-6): ``x = ReLU(x) + 1e-6``, divided by a learnable per-channel
    ``softplus(s)`` (s initialised to 0), then ``f_p(x) = ||x|| * x^p / ||x^p||`` with p = ``focusing_factor``
    (3): the direction is sharpened towards the dominant channels and the norm is kept."""

    name = "focused"
    paper = PAPER

    def __init__(self, *, heads, head_dim, causal=False, focusing_factor: float = 3.0):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if focusing_factor <= 0:
            raise AttnbenchError(f"flatten: option 'focusing_factor' must be > 0, got {focusing_factor}")
        self.focusing_factor = float(focusing_factor)
        self.scale = nn.Parameter(torch.zeros(heads, 1, head_dim))

    def phi(self, x: torch.Tensor) -> torch.Tensor:
        x = (F.relu(x) + 1e-6) / F.softplus(self.scale.to(x.dtype))                 # [B, H, N, D], > 0
        sharp = x.pow(self.focusing_factor)
        return sharp * (x.norm(dim=-1, keepdim=True) / sharp.norm(dim=-1, keepdim=True))

    def _phi_into(self, x: torch.Tensor, out: torch.Tensor, keep_norm: bool) -> torch.Tensor:
        """:meth:`phi` in place in ``out``. Without ``keep_norm`` the per-token factor ``||x|| / ||x^p||`` is left
        out: for queries it cancels in the normalised attention (which has no eps)."""
        inv = F.softplus(self.scale.to(x.dtype)).reciprocal_()                      # [H, 1, D]
        torch.clamp(x, min=0, out=out).add_(1e-6).mul_(inv)
        if not keep_norm:
            return out.pow_(self.focusing_factor)
        norm = torch.linalg.vector_norm(out, dim=-1, keepdim=True)                  # [B, H, n, 1]
        out.pow_(self.focusing_factor)
        return out.mul_(norm.div_(torch.linalg.vector_norm(out, dim=-1, keepdim=True)))

    def block_maps(self, q: torch.Tensor, k: torch.Tensor, block_size: int):
        """Inference: every block in place into one reused buffer per side (see :meth:`_phi_into`)."""
        if self.needs_grad(q, k):
            return super().block_maps(q, k, block_size)
        q_block, k_block = la.token_blocks(q, block_size), la.token_blocks(k, block_size)
        return (la.scratch_map(lambda x, out: self._phi_into(x, out, False), q_block),
                la.scratch_map(lambda x, out: self._phi_into(x, out, True), k_block))


class FlattenAttention(FeatureMapAttention):
    """Focused linear attention (FLatten Eq. 4-6) with the mean-key normaliser; the DWC rank-restoration on V
    belongs to the block. Option: ``focusing_factor`` (p, default 3)."""

    name = "flatten"
    paper = PAPER
    feature_map_cls = FocusedFeatureMap

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", focusing_factor: float = 3.0):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        self.feature_map = self.make_feature_map(focusing_factor=focusing_factor)
