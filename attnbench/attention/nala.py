"""NaLaFormer (Meng et al., "Norm x Direction: Restoring the Missing Query Norm in Vision Linear Attention").

Linear attention cancels the query norm between numerator and denominator (paper Eq. 4-5). NaLa restores it
through a norm-dependent power on the query direction and keeps negative values through a cosine direction map.
"""

from __future__ import annotations

import math

import torch

from attnbench.ops.elementwise import abs_pow
from attnbench.ops.nala_map import nala_feature_map_blocked, nala_map_backward
from attnbench.core.protocol import AttnbenchError
from attnbench.attention.base import FeatureMap, FeatureMapAttention

PAPER = "Meng et al. 2026 (NaLaFormer, Norm x Direction)"
RELEASED_DEN_EPS = 1e-6  # the released code's normaliser: 1 / (q . mean(k) + 1e-6)


class NaLaFeatureMap(FeatureMap):
    """NaLa feature maps, paper Eqs. 6, 7, 11-13; feature size 2d.

    Query (Eq. 6, 12): ``phi_q(q) = [|dir(q)|^f(||q||) cos(theta_q); |dir(q)|^f(||q||) sin(theta_q)]`` with the
    norm-aware exponent ``f(x) = lam (tau + tanh x)`` in ``[lam tau, lam (tau + 1))``.
    Key (Eq. 6, 13): ``phi_k(k) = [|k|^lam cos(theta_k); |k|^lam sin(theta_k)]`` (raw key: its norm is kept).
    Angles (Sec. 3.2): ``theta = (pi/4) tanh(dir(x))``, so every per-coordinate term
    ``|a_i||b_i| cos(theta_qi - theta_ki)`` is >= 0 (|theta| < pi/4) and every score phi_q . phi_k >= 0 (Eq. 10),
    although the sin halves may be negative. Norms are L2 (the released code's choice), clamped at ``eps``.

    ``sign_split=True`` is the released ImageNet code instead (``NALA.py``): ``[relu(dir q)^f; relu(-dir q)^f]``
    and ``[relu(k)^lam; relu(-k)^lam]``, i.e. Eq. 7 with angles restricted to {0, pi/2}: opposite-sign pairs are
    fully inhibited.
    """

    name = "nala"
    paper = PAPER

    def __init__(self, *, heads, head_dim, causal=False, lam: float = 3.0, tau: float = 0.5,
                 sign_split: bool = False, eps: float = 1e-6):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if lam <= 0:
            raise AttnbenchError(f"nala: option 'lam' must be > 0, got {lam}")
        if tau < 0:
            raise AttnbenchError(f"nala: option 'tau' must be >= 0, got {tau}")
        self.lam, self.tau, self.sign_split, self.eps = float(lam), float(tau), bool(sign_split), float(eps)
        if not self.sign_split:  # the blocked map's hand-written backward (ops.nala_map) for the recomputing op
            opts = (self.lam, self.tau, self.eps)
            self.vjp_q = lambda x, feats, dfeats: nala_map_backward(x.contiguous(), dfeats, True, *opts)
            self.vjp_k = lambda x, feats, dfeats: nala_map_backward(x.contiguous(), dfeats, False, *opts)

    @property
    def feature_dim(self) -> int:
        return 2 * self.head_dim

    def exponent(self, q: torch.Tensor) -> torch.Tensor:
        """f(||q||) = lam (tau + tanh ||q||), per token: ``[B, H, N, 1]`` (Eq. 6)."""
        return self.lam * (self.tau + torch.tanh(q.norm(dim=-1, keepdim=True)))

    def _lift(self, x: torch.Tensor, mag: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
        if self.sign_split:
            return torch.cat([mag * (x > 0), mag * (x < 0)], dim=-1)                # [B, H, N, 2D]
        theta = (math.pi / 4) * torch.tanh(direction)                               # [B, H, N, D]
        return torch.cat([mag * torch.cos(theta), mag * torch.sin(theta)], dim=-1)  # [B, H, N, 2D]

    def _phi_q(self, q: torch.Tensor, power_of_abs) -> torch.Tensor:
        norm = q.norm(dim=-1, keepdim=True).clamp_min(self.eps)                     # [B, H, N, 1]
        direction = q / norm                                                        # [B, H, N, D]
        power = self.lam * (self.tau + torch.tanh(norm))                            # [B, H, N, 1]
        return self._lift(q, power_of_abs(direction, power), direction)

    def _phi_k(self, k: torch.Tensor, power_of_abs) -> torch.Tensor:
        direction = k / k.norm(dim=-1, keepdim=True).clamp_min(self.eps)            # [B, H, N, D]
        return self._lift(k, power_of_abs(k, self.lam), direction)

    # fast form: the blocked CPU map of attnbench.ops.nala_map (row blocks in cache, in place, hand-written
    # backward) for the cosine map, whose unfused form keeps every intermediate of the map alive; exp(p log|x|)
    # for sign_split (ATen's pow with a tensor exponent takes a slow path on the CPU)
    def phi_q(self, q: torch.Tensor) -> torch.Tensor:
        if self.sign_split:
            return self._phi_q(q, abs_pow)
        return nala_feature_map_blocked(q, is_query=True, lam=self.lam, tau=self.tau, eps=self.eps)

    def phi_k(self, k: torch.Tensor) -> torch.Tensor:
        if self.sign_split:
            return self._phi_k(k, abs_pow)
        return nala_feature_map_blocked(k, is_query=False, lam=self.lam, tau=self.tau, eps=self.eps)

    def features_triton(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The fused Triton feature-map kernel (norm, tanh, power, cos, sin in one pass)."""
        if self.sign_split:
            return self.phi_q(q), self.phi_k(k)
        from attnbench.kernels import nala_feature_map  # lazy: triton is optional

        opts = dict(lam=self.lam, tau=self.tau, eps=self.eps)
        return nala_feature_map(q, is_query=True, **opts), nala_feature_map(k, is_query=False, **opts)

    # reference: the plain power of the paper's Eqs. 12-13
    def phi_q_reference(self, q: torch.Tensor) -> torch.Tensor:
        return self._phi_q(q, lambda x, p: x.abs().pow(p))

    def phi_k_reference(self, k: torch.Tensor) -> torch.Tensor:
        return self._phi_k(k, lambda x, p: x.abs().pow(p))


class NaLaAttention(FeatureMapAttention):
    """NaLa linear attention, paper Eq. 14 without the gate (gate, LayerNorm, LePE and RoPE belong to the block).

    ``o_t = phi_q(q_t) sum_i phi_k(k_i)^T v_i / (phi_q(q_t) sum_j phi_k(k_j)^T)``, bidirectional or causal
    (``S_t = S_{t-1} + phi_k(k_t)^T v_t``, a 2d x d state per head). Options: ``lam`` (lambda, default 3),
    ``tau`` (default 0.5; Table 11's best), ``sign_split`` (the released code's hard sign split), ``den_eps``.

    ``den_eps``: a fixed eps added to the mean score, ``phi_q(q_t) . mean_j phi_k(k_j) + den_eps``, as the released
    code's normaliser ``1 / (q . mean(k) + 1e-6)`` does (Eq. 14 has none). Default: 1e-6 with ``sign_split``
    (the released code, which it then computes exactly), 0 otherwise (the paper's formula).
    """

    name = "nala"
    paper = PAPER
    feature_map_cls = NaLaFeatureMap

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", lam: float = 3.0, tau: float = 0.5,
                 sign_split: bool = False, den_eps: float | None = None):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        if den_eps is None:
            den_eps = RELEASED_DEN_EPS if sign_split else 0.0
        if isinstance(den_eps, bool) or not isinstance(den_eps, (int, float)) or not 0.0 <= den_eps < math.inf:
            raise AttnbenchError(f"nala: option 'den_eps' must be a number >= 0 (or omitted), got {den_eps!r}")
        self.eps = float(den_eps)   # FeatureMapAttention's fixed eps on the mean score
        self.feature_map = self.make_feature_map(lam=lam, tau=tau, sign_split=sign_split)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", den_eps={self.eps}"
