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

from attnbench.ops import linear_attn as la
from attnbench.core.protocol import AttnbenchError
from attnbench.attention.base import FeatureMap, FeatureMapAttention

PAPER = "Meng et al. 2026 (MirrorLA, Reflecting Feature Map)"
_STAT_BLOCK = 1024   # tokens per step of the whole-sequence variance (temporaries stay in cache)


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

    def pair_reflections(self, angles: torch.Tensor) -> torch.Tensor:
        """The block-wise reflections as one block-diagonal ``[d, d]`` matrix per (batch element, head), for angles
        that do not vary over tokens (``[B or 1, H, 1, d/2]``): ``reflect_blocks(x, angles) == x @ M``, one matmul
        per block of tokens instead of a dozen elementwise passes. Pair m's block is ``I - 2 u u^T``."""
        c, s = torch.cos(angles), torch.sin(angles)                                  # [B, H, 1, d/2]
        diag = torch.stack([1 - 2 * c * c, 1 - 2 * s * s], dim=-1).flatten(-2)       # [B, H, 1, d]
        off = torch.stack([-2 * c * s, torch.zeros_like(c)], dim=-1).flatten(-2)[..., :-1]  # [B, H, 1, d-1]
        M = torch.diag_embed(diag) + torch.diag_embed(off, 1) + torch.diag_embed(off, -1)   # [B, H, 1, d, d]
        return M.squeeze(-3)                                                         # [B, H, d, d]

    # --- block variance (Eq. 12) ----------------------------------------------------------------------------
    def block_variance(self, x: torch.Tensor, *, reflect: bool = False) -> torch.Tensor:
        """Eq. 12 over the whole sequence (``[B, H, 1, d/2]``), or over tokens <= t when causal (``[B, H, N, d/2]``,
        from cumulative sums). Both from sums shifted by the first token (variance is shift-invariant; token 1
        is in every prefix), for numerical stability. With ``reflect`` the cross-head reflection is applied to
        ``x`` first; the whole-sequence form then does it block by block and never holds a full-size temporary."""
        B, H, N, D = x.shape
        if self.causal:
            xb = (self.reflect_heads(x) if reflect else x).reshape(B, H, N, D // 2, 2)
            shifted = xb - xb[:, :, :1]
            count = torch.arange(1, N + 1, device=x.device, dtype=x.dtype).view(1, 1, N, 1, 1)
            mean = shifted.cumsum(2) / count
            mean_sq = shifted.pow(2).cumsum(2) / count
            return (mean_sq - mean.pow(2)).clamp_min(0).sum(-1) / 2.0                # [B, H, N, d/2]
        # one split: under autograd a slice per block zero-fills a tensor of x's full size in the backward, each
        parts = x.split(_STAT_BLOCK, dim=2)
        first = parts[0][:, :, :1]                                                   # [B, H, 1, D]
        first = self.reflect_heads(first) if reflect else first
        s1 = s2 = 0.0
        for xb in parts:
            xb = (self.reflect_heads(xb) if reflect else xb) - first
            s1 = s1 + xb.sum(2, keepdim=True)                                        # [B, H, 1, D]
            s2 = s2 + (xb * xb).sum(2, keepdim=True)
        mean = s1 / N
        var = (s2 / N - mean * mean).clamp_min(0)                                    # [B, H, 1, D] per channel
        return var.reshape(B, H, 1, D // 2, 2).sum(-1) / 2.0                         # [B, H, 1, d/2]

    def block_variance_reference(self, x: torch.Tensor) -> torch.Tensor:
        """Eq. 12 by its definition (centred); causal: an explicit masked mean over each prefix (quadratic)."""
        B, H, N, D = x.shape
        xb = x.reshape(B, H, N, D // 2, 2)
        if not self.causal:
            centred = xb - xb.mean(dim=2, keepdim=True)
            return centred.pow(2).sum(-1).mean(dim=2, keepdim=True) / 2.0
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

    def block_functions(self, n: int):
        return None  # a token's features depend on the sequence's statistics

    def carried_size(self) -> int:
        # causal variance: per side (q and k), the first token, the shifted sum and sum of squares (d each)
        return 6 * self.head_dim if self.causal and self.variance_aware else 0

    def block_maps(self, q: torch.Tensor, k: torch.Tensor, block_size: int):
        """The sequence statistics are computed once per input; blocks then only reflect and rectify."""
        return self._block_map(q, block_size), self._block_map(k, block_size)

    def _block_map(self, x: torch.Tensor, block_size: int):
        x_block = la.token_blocks(x, block_size)
        if self.causal and self.variance_aware:      # per-token angles: the elementwise reflections
            var_block = la.token_blocks(self.block_variance(x, reflect=True), block_size)  # [B, H, N, d/2]

            def block(s: int, e: int) -> torch.Tensor:
                angles = self.modulate(var_block(s, e))
                return F.relu(self.reflect_blocks(self.reflect_heads(x_block(s, e)), angles))
            return block
        # angles fixed over the sequence: both reflections of a block are one matmul and a rank-1 update,
        # y = (x - 2 <x, u_c> u_c) M = x M - 2 <x, u_c> (u_c M)
        angles = (self.modulate(self.block_variance(x, reflect=True)) if self.variance_aware
                  else self.theta.to(x.dtype)[None, :, None, :])
        M = self.pair_reflections(angles)                                            # [B or 1, H, d, d]
        if self.cross_head:
            u = F.normalize(self.mirror.to(x.dtype), dim=0).view(x.shape[1], 1, x.shape[3])  # [H, 1, d]
            uM = u @ M                                                               # [B or 1, H, 1, d]

        def block(s: int, e: int) -> torch.Tensor:
            xb = x_block(s, e)
            y = xb @ M                                                               # [B, H, b, d]
            if self.cross_head:
                proj = (xb @ u.transpose(-1, -2)).sum(1, keepdim=True)               # [B, 1, b, 1] = <x_t, u_c>
                y = y - 2.0 * proj * uM
            return F.relu(y)
        return block

    def phi_q_reference(self, q: torch.Tensor) -> torch.Tensor:
        return self._phi(q, self.block_variance_reference)

    def phi_k_reference(self, k: torch.Tensor) -> torch.Tensor:
        return self._phi(k, self.block_variance_reference)


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
