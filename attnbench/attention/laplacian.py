"""LaplacianFormer (Feng et al., ICLR 2026): Laplacian-kernel attention with Nyström landmarks, a Newton–Schulz
pseudo-inverse and an injective (whitened) normalisation."""

from __future__ import annotations

import torch

from ..ops.nystrom import NS_SCALINGS, newton_schulz_pinv, segment_means
from ..protocol import AttnbenchError
from ..registry import register_attention
from .base import Attention

PAPER = "Feng et al. 2026 (LaplacianFormer, ICLR)"


def laplace_kernel(x: torch.Tensor, y: torch.Tensor, lam: float, distance=None) -> torch.Tensor:
    """k(x, y) = exp(-||x - y||_1 / lam) (Sec. 3): ``[B, H, N, d] x [B, H, M, d] -> [B, H, N, M]``.
    ``distance`` may replace ``torch.cdist(p=1)`` (e.g. the Triton ``attnbench.kernels.l1_distance``)."""
    dist = torch.cdist(x, y, p=1) if distance is None else distance(x, y)
    return torch.exp(-dist / lam)


@register_attention
class LaplacianAttention(Attention):
    """LaplacianFormer attention, Eqs. 4-9 and Algorithm 1, bidirectional only.

    Kernel: the L1 Laplacian ``k(q, k) = exp(-||q - k||_1 / lam)``, lam = 4 (Table 3).
    Nyström (Eqs. 8-9): ``m = landmarks`` landmark queries and keys are segment means along the sequence (the
    1-D version of the paper's r x r average pooling; all tokens when N <= m). Queries and keys are not tied in
    this protocol, so the kernel matrix is approximated in the Nyströmformer-consistent form
    ``G ~ k(Q, K~) W^+ k(Q~, K)`` with ``W = k(Q~, K~)`` (the paper's ``C W^+ C^T`` is the tied special case);
    ``W^+`` by Newton–Schulz (``ns_iters``, ``ns_scaling``, ``ns_ridge``: the released code uses a 0.01 ridge).
    Injective normalisation (Eqs. 4-6): ``z_ij = (g_ij - mean_j' g_ij') / sqrt(var_j + eps) + 1/N`` with the
    diagonal estimator var_j taken over the N query rows of the same sequence (no statistics across the batch),
    and ``o_i = sum_j z_ij v_j``. The DWC(V) term of Eq. 7 belongs to the block.

    ``reference`` materialises the N x N matrices; ``torch`` keeps everything factorised (O(N m (d + m))):
    ``A = k(Q, K~) W^+``, ``o = A (R (D^-1/2 V)) - rowmean (1^T D^-1/2 V) + mean(V)`` with ``R = k(Q~, K)`` and
    the column variances ``var_j = R_j^T Cov(A) R_j`` from the centred rows of A.
    """

    name = "laplacian"
    paper = PAPER
    causal_form = False
    impls = ("reference", "torch", "triton")
    gpu_impl = "triton"

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", lam: float = 4.0, landmarks: int = 64,
                 ns_iters: int = 20, ns_scaling: str = "norm1inf", ns_ridge: float = 0.01,
                 whiten_eps: float = 1e-6):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        if lam <= 0:
            raise AttnbenchError(f"laplacian: option 'lam' must be > 0, got {lam}")
        if not isinstance(landmarks, int) or landmarks < 1:
            raise AttnbenchError(f"laplacian: option 'landmarks' must be a positive int, got {landmarks!r}")
        if not isinstance(ns_iters, int) or ns_iters < 0:
            raise AttnbenchError(f"laplacian: option 'ns_iters' must be a non-negative int, got {ns_iters!r}")
        if ns_scaling not in NS_SCALINGS:
            raise AttnbenchError(f"laplacian: option 'ns_scaling' must be one of {NS_SCALINGS}, got {ns_scaling!r}")
        self.lam, self.landmarks, self.ns_iters = float(lam), landmarks, ns_iters
        self.ns_scaling, self.ns_ridge, self.whiten_eps = ns_scaling, float(ns_ridge), float(whiten_eps)

    def _nystrom(self, q, k, distance=None, ns_step=None):
        """(C, W^+, R): ``k(Q, K~) [B,H,N,m]``, the NS inverse ``[B,H,m,m]``, ``k(Q~, K) [B,H,m,N]``."""
        m = min(self.landmarks, q.shape[-2])
        q_l, k_l = segment_means(q, m), segment_means(k, m)                          # [B, H, m, d]
        C = laplace_kernel(q, k_l, self.lam, distance)                               # [B, H, N, m]  Eq. 8
        W = laplace_kernel(q_l, k_l, self.lam, distance)                             # [B, H, m, m]  Eq. 9
        R = laplace_kernel(k, q_l, self.lam, distance).transpose(-1, -2)             # [B, H, m, N]
        W_pinv = newton_schulz_pinv(W, iters=self.ns_iters, scaling=self.ns_scaling, ridge=self.ns_ridge,
                                    step=ns_step)
        return C, W_pinv, R

    def forward_reference(self, q, k, v):
        C, W_pinv, R = self._nystrom(q, k)
        G = C @ W_pinv @ R                                                           # [B, H, N, N]
        n = G.shape[-1]
        var = G.var(dim=-2, unbiased=False, keepdim=True)                            # [B, H, 1, N] over rows
        Z = (G - G.mean(-1, keepdim=True)) / torch.sqrt(var + self.whiten_eps) + 1.0 / n   # Eq. 4
        return Z @ v

    def forward_torch(self, q, k, v):
        return self._factorised(q, k, v, *self._nystrom(q, k))

    def forward_triton(self, q, k, v):
        """The factorised form with the paper's two custom kernels: the L1 distances (no N x m x d
        intermediate) and the Newton–Schulz step."""
        from ..kernels import l1_distance, newton_schulz_step  # lazy: triton is optional

        return self._factorised(q, k, v, *self._nystrom(q, k, l1_distance, newton_schulz_step))

    def _factorised(self, q, k, v, C, W_pinv, R):
        n = q.shape[-2]
        A = C @ W_pinv                                                               # [B, H, N, m]
        A_c = A - A.mean(-2, keepdim=True)
        cov = A_c.transpose(-1, -2) @ A_c / n                                        # [B, H, m, m]
        var = ((cov @ R) * R).sum(-2)                                                # [B, H, N] column variances
        dinv = torch.rsqrt(var.clamp_min(0) + self.whiten_eps).unsqueeze(-1)         # [B, H, N, 1]
        dv = dinv * v                                                                # D^-1/2 V
        rowmean = A @ R.mean(-1, keepdim=True)                                       # [B, H, N, 1]
        return A @ (R @ dv) - rowmean * dv.sum(-2, keepdim=True) + v.mean(-2, keepdim=True)
