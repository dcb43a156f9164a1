"""MirrorLA (Meng et al., "MirrorLA: Reflecting Feature Map for Vision Linear Attention").

Instead of truncating negative values with a bare ReLU, MirrorLA first applies learnable Householder
reflections (isometries, so pre-ReLU inner products are kept) that can turn informative directions into the
positive orthant, then the ReLU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..protocol import AttnbenchError
from ..registry import register_attention, register_feature_map
from .base import FeatureMap, FeatureMapAttention

PAPER = "Meng et al. 2026 (MirrorLA, Reflecting Feature Map)"


@register_feature_map
class MirrorFeatureMap(FeatureMap):
    """Reflecting feature map, paper Algorithm 1 and Eqs. 7-14, 18:
    ``phi(x) = ReLU(BlockReflect_Theta(x H_c))``.

    1. Cross-head reflection (Eq. 18): over the H*d channels of a token, ``x <- x - 2 <x, u_c> u_c``,
       ``u_c = normalize(u)``, one learnable mirror per map, applied before the head split.
    2. Block-wise 2-D reflections (Eqs. 8-10): each head's d channels form d/2 pairs x_m; pair m of head h is
       reflected by ``H_m = I - 2 u u^T``, ``u = (cos Theta_m, sin Theta_m)`` (Algorithm 1's form; Eq. 6 as
       printed differs by a sign, i.e. theta -> theta + pi/2, the same family).
    3. Variance-aware angle modulation (Eqs. 12-14): ``Theta_m = theta_m + sigmoid(lam / (var_m + eps)) alpha_max``
       with ``var_m = (1/2L) sum_t ||x_{t,m} - mean_m||^2`` over the sequence, per (batch element, head, block);
       ``lam = 1``, ``alpha_max = pi/2`` (Table 8's best). Base angles ``theta ~ N(0, 1)`` of shape [H, d/2]
       and ``u ~ N(0, I)`` as in Algorithm 1.
    4. ReLU.

    One map (one set of angles and one mirror) serves both q and k, so without the modulation the pre-ReLU
    inner products are exactly preserved (the isometry argument of Sec. 3.1). With it, q and k each get the
    angles of their own sequence statistics (the paper is silent here, ambiguity A3).

    Causal form: the paper pools the variance over the whole sequence (non-causal, A5). Here token t uses the
    variance of tokens 1..t only (a running statistic from cumulative sums, shifted by the first token for
    numerical stability), so the map never looks ahead and a recurrent state stays valid: phi(k_i) is fixed
    once token i is seen.
    """

    name = "mirrorla"
    paper = PAPER

    def __init__(self, *, heads, head_dim, causal=False, lam: float = 1.0, alpha_max: float = math.pi / 2,
                 var_eps: float = 1e-6, variance_aware: bool = True, cross_head: bool = True):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if head_dim % 2:
            raise AttnbenchError(f"mirrorla: argument 'head_dim' must be even (channels are reflected in pairs), "
                                 f"got {head_dim}")
        self.lam, self.alpha_max, self.var_eps = float(lam), float(alpha_max), float(var_eps)
        self.variance_aware, self.cross_head = bool(variance_aware), bool(cross_head)
        self.theta = nn.Parameter(torch.randn(heads, head_dim // 2))                # base angles theta_m
        if cross_head:
            self.mirror = nn.Parameter(torch.randn(heads * head_dim))                # u_c before normalising

    # --- the reflections (pre-ReLU), shared by the fast and reference forms --------------------------------
    def reflect_heads(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 18 on ``[B, H, N, d]``: one reflection of each token's H*d channel vector."""
        if not self.cross_head:
            return x
        H, D = x.shape[1], x.shape[3]
        u = F.normalize(self.mirror.to(x.dtype), dim=0).view(H, 1, D)                # [H, 1, d]
        proj = (x @ u.transpose(-1, -2)).sum(1, keepdim=True)                        # [B, 1, N, 1] = <x_t, u_c>
        return x - 2.0 * proj * u                                                    # [B, H, N, d]

    def reflect_blocks(self, x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
        """Eq. 9 / Algorithm 1: ``x_m - 2 <x_m, u_m> u_m`` per pair; angles broadcast to ``[B, H, N, d/2]``."""
        B, H, N, D = x.shape
        xb = x.reshape(B, H, N, D // 2, 2)
        x1, x2 = xb[..., 0], xb[..., 1]                                              # [B, H, N, d/2]
        c, s = torch.cos(angles), torch.sin(angles)
        proj = x1 * c + x2 * s                                                        # <x_m, u_m>
        return torch.stack([x1 - 2 * proj * c, x2 - 2 * proj * s], dim=-1).reshape(B, H, N, D)

    def modulate(self, var: torch.Tensor) -> torch.Tensor:
        """Eq. 13-14: Theta = theta + sigmoid(lam / (var + eps)) * alpha_max; var broadcasts over [B, H, *, d/2]."""
        base = self.theta.to(var.dtype)[None, :, None, :]                            # [1, H, 1, d/2]
        return base + torch.sigmoid(self.lam / (var + self.var_eps)) * self.alpha_max

    # --- block variance (Eq. 12) ----------------------------------------------------------------------------
    def block_variance(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 12 over the whole sequence (``[B, H, 1, d/2]``), or over tokens <= t when causal (``[B, H, N, d/2]``,
        from cumulative sums)."""
        B, H, N, D = x.shape
        xb = x.reshape(B, H, N, D // 2, 2)
        if not self.causal:
            centred = xb - xb.mean(dim=2, keepdim=True)
            return centred.pow(2).sum(-1).mean(dim=2, keepdim=True) / 2.0
        shifted = xb - xb[:, :, :1]                  # variance is shift-invariant; token 1 is in every prefix
        count = torch.arange(1, N + 1, device=x.device, dtype=x.dtype).view(1, 1, N, 1, 1)
        mean = shifted.cumsum(2) / count
        mean_sq = shifted.pow(2).cumsum(2) / count
        return (mean_sq - mean.pow(2)).clamp_min(0).sum(-1) / 2.0                    # [B, H, N, d/2]

    def block_variance_reference(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 12 by its definition; causal: an explicit masked mean over each prefix (quadratic)."""
        if not self.causal:
            return self.block_variance(x)
        B, H, N, D = x.shape
        xb = x.reshape(B, H, N, D // 2, 2)
        mask = torch.ones(N, N, dtype=x.dtype, device=x.device).tril()               # [t, i]: i <= t
        w = mask / mask.sum(-1, keepdim=True)
        mean = torch.einsum("ti,bhimc->bhtmc", w, xb)                                # prefix means
        dev = (xb.unsqueeze(2) - mean.unsqueeze(3)).pow(2).sum(-1)                   # [B, H, t, i, d/2]
        return torch.einsum("ti,bhtim->bhtm", w, dev) / 2.0

    def _phi(self, x: torch.Tensor, variance) -> torch.Tensor:
        x = self.reflect_heads(x)
        if self.variance_aware:
            angles = self.modulate(variance(x))
        else:
            angles = self.theta.to(x.dtype)[None, :, None, :]
        return F.relu(self.reflect_blocks(x, angles))

    def phi(self, x: torch.Tensor) -> torch.Tensor:
        return self._phi(x, self.block_variance)

    def block_maps(self, q: torch.Tensor, k: torch.Tensor):
        """The sequence statistics are computed once per input; blocks then only reflect and rectify."""
        return self._block_map(q), self._block_map(k)

    def _block_map(self, x: torch.Tensor):
        if not self.variance_aware:
            return lambda s, e: self._phi(x[:, :, s:e], None)
        var = self.block_variance(self.reflect_heads(x))                             # [B, H, 1 or N, d/2]
        per_token = var.shape[2] > 1

        def block(s: int, e: int) -> torch.Tensor:
            angles = self.modulate(var[:, :, s:e] if per_token else var)
            return F.relu(self.reflect_blocks(self.reflect_heads(x[:, :, s:e]), angles))
        return block

    def phi_q_reference(self, q: torch.Tensor) -> torch.Tensor:
        return self._phi(q, self.block_variance_reference)

    def phi_k_reference(self, k: torch.Tensor) -> torch.Tensor:
        return self._phi(k, self.block_variance_reference)


@register_attention
class MirrorLAAttention(FeatureMapAttention):
    """MirrorLA linear attention: the reflecting feature map (Algorithm 1) inside Eq. 2's normalised linear
    attention. Options: ``lam`` (1), ``alpha_max`` (pi/2), ``variance_aware`` (the "full" column of Table 8),
    ``cross_head`` (the "head" column), ``var_eps`` (not given by the paper; 1e-6).
    """

    name = "mirrorla"
    paper = PAPER
    feature_map_cls = MirrorFeatureMap

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", lam: float = 1.0,
                 alpha_max: float = math.pi / 2, variance_aware: bool = True, cross_head: bool = True,
                 var_eps: float = 1e-6):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        self.feature_map = self.make_feature_map(lam=lam, alpha_max=alpha_max, variance_aware=variance_aware,
                                                 cross_head=cross_head, var_eps=var_eps)
