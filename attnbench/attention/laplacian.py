"""LaplacianFormer (Feng et al., ICLR 2026): Laplacian-kernel attention with Nyström landmarks, a Newton–Schulz
pseudo-inverse and an injective (whitened) normalisation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..protocol import AttnbenchError
from ..registry import register_attention
from .base import Attention

PAPER = "Feng et al. 2026 (LaplacianFormer, ICLR)"
NS_SCALINGS = ("norm1inf", "soft")


def laplace_kernel(x: torch.Tensor, y: torch.Tensor, lam: float) -> torch.Tensor:
    """k(x, y) = exp(-||x - y||_1 / lam) (Sec. 3): ``[B, H, N, d] x [B, H, M, d] -> [B, H, N, M]``."""
    return torch.exp(-torch.cdist(x, y, p=1) / lam)


def newton_schulz_pinv(W: torch.Tensor, *, iters: int = 20, scaling: str = "norm1inf",
                       ridge: float = 0.0) -> torch.Tensor:
    """Moore–Penrose pseudo-inverse of ``[..., m, m]`` matrices by Newton–Schulz (Sec. 4.2):
    ``X_{k+1} = X_k (2I - P X_k)``, ``X_0 = alpha P^T``, ``P = W + ridge * I``.

    ``scaling`` chooses alpha: ``"norm1inf"``: ``1 / (||P||_1 ||P||_inf)`` (<= 1/||P||_2^2, so the
    iteration converges for any P, symmetric or not); ``"soft"``: the released CUDA code's
    ``1.8 / max_rowsum(W)^2`` (valid for symmetric PSD W, as SOFT). The paper's printed ``alpha = 2/||W||_2``
    does not guarantee ``||I - alpha W W^T|| < 1`` and is not offered. Gradients flow through the iterations.
    """
    if scaling not in NS_SCALINGS:
        raise AttnbenchError(f"laplacian: option 'ns_scaling' must be one of {NS_SCALINGS}, got {scaling!r}")
    m = W.shape[-1]
    eye = torch.eye(m, dtype=W.dtype, device=W.device)
    P = W + ridge * eye if ridge else W
    if scaling == "norm1inf":
        alpha = 1.0 / (P.abs().sum(-2).amax(-1) * P.abs().sum(-1).amax(-1))          # [...]
    else:
        alpha = 1.8 / W.sum(-1).amax(-1).pow(2)
    X = alpha[..., None, None] * P.transpose(-1, -2)                                  # [..., m, m]
    for _ in range(iters):
        X = X @ (2 * eye - P @ X)
    return X


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

    def _nystrom(self, q, k):
        """(C, W^+, R): ``k(Q, K~) [B,H,N,m]``, the NS inverse ``[B,H,m,m]``, ``k(Q~, K) [B,H,m,N]``."""
        n = q.shape[-2]
        m = min(self.landmarks, n)

        def pool(x):  # segment means: [B, H, N, d] -> [B, H, m, d]
            return F.adaptive_avg_pool1d(x.flatten(0, 1).transpose(1, 2), m).transpose(1, 2).reshape(
                *x.shape[:2], m, x.shape[-1])

        q_l, k_l = pool(q), pool(k)
        C = laplace_kernel(q, k_l, self.lam)                                         # [B, H, N, m]  Eq. 8
        W = laplace_kernel(q_l, k_l, self.lam)                                       # [B, H, m, m]  Eq. 9
        R = laplace_kernel(q_l, k, self.lam)                                         # [B, H, m, N]
        W_pinv = newton_schulz_pinv(W, iters=self.ns_iters, scaling=self.ns_scaling, ridge=self.ns_ridge)
        return C, W_pinv, R

    def forward_reference(self, q, k, v):
        C, W_pinv, R = self._nystrom(q, k)
        G = C @ W_pinv @ R                                                           # [B, H, N, N]
        n = G.shape[-1]
        var = G.var(dim=-2, unbiased=False, keepdim=True)                            # [B, H, 1, N] over rows
        Z = (G - G.mean(-1, keepdim=True)) / torch.sqrt(var + self.whiten_eps) + 1.0 / n   # Eq. 4
        return Z @ v

    def forward_torch(self, q, k, v):
        C, W_pinv, R = self._nystrom(q, k)
        n = q.shape[-2]
        A = C @ W_pinv                                                               # [B, H, N, m]
        A_c = A - A.mean(-2, keepdim=True)
        cov = A_c.transpose(-1, -2) @ A_c / n                                        # [B, H, m, m]
        var = ((cov @ R) * R).sum(-2)                                                # [B, H, N] column variances
        dinv = torch.rsqrt(var.clamp_min(0) + self.whiten_eps).unsqueeze(-1)         # [B, H, N, 1]
        dv = dinv * v                                                                # D^-1/2 V
        rowmean = A @ R.mean(-1, keepdim=True)                                       # [B, H, N, 1]
        return A @ (R @ dv) - rowmean * dv.sum(-2, keepdim=True) + v.mean(-2, keepdim=True)
