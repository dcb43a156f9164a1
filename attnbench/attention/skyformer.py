"""Skyformer (Chen et al., NeurIPS 2021): Gaussian-kernel ("kernelized") attention approximated by a Nyström
method on the symmetrised (PSD) kernel matrix of queries and keys; bidirectional only."""

from __future__ import annotations

import torch

from attnbench.ops.nystrom import iterative_pinv, segment_means, segment_means_reference
from attnbench.core.protocol import AttnbenchError
from attnbench.attention.base import Attention

PAPER = "Chen et al. 2021 (Skyformer, NeurIPS)"
SAMPLINGS = ("segment_means", "uniform")


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``kappa(x_i, y_j) = exp(-|x_i - y_j|^2 / 2)`` (Sec. 4.1), as ``exp(x.y - |x|^2/2 - |y|^2/2)``:
    ``[B, H, N, d] x [B, H, M, d] -> [B, H, N, M]`` (no N x M x d difference tensor)."""
    sq_x = 0.5 * (x * x).sum(-1, keepdim=True)                                # [B, H, N, 1]
    sq_y = 0.5 * (y * y).sum(-1, keepdim=True)                                # [B, H, M, 1]
    return torch.exp(x @ y.transpose(-1, -2) - sq_x - sq_y.transpose(-1, -2))  # [B, H, N, M]


class SkyformerAttention(Attention):
    """Skyformer (Chen et al. 2021): ``O = C~ V`` where ``C = kappa(Q / d^1/4, K / d^1/4)`` is the Gaussian
    "kernelized attention" score matrix (Eq. 3) and ``C~`` its modified Nyström approximation (Eqs. 4-6):

    - symmetrise: ``C_bar = kappa(X, X)`` with ``X = [Q; K]`` (2N points, Eq. 4), a PSD matrix whose top-right
      N x N block is C;
    - Nyström on C_bar with m landmark points L (Eq. 5): ``C_bar~ = kappa(X, L) M^+ kappa(L, X)``, with
      ``M = kappa(L, L)``; take ``C~ = (I, 0) C_bar~ (0, I)^T = kappa(Q, L) M^+ kappa(L, K)`` (Eq. 6);
    - the pseudo-inverse as the paper's Sec. 4.4 and its code: ``M^+ ~ D^-1/2 Z D^-1/2`` with
      ``Z = iterative_pinv(D^-1/2 (M + gamma I) D^-1/2)``, ``D = diag((M + gamma I) 1)``, gamma = 0.1 (so
      in exact arithmetic ``M^+`` is replaced by the regularised ``(M + gamma I)^-1``, as in the code), and
      ``pinv_iters`` steps of the Nyströmformer iteration from ``Z_0 = A^T / ||A||_1`` (the code's start,
      per matrix instead of over the whole batch).

    Normalisation: none beyond the kernel's own. The paper's "automatic normalization" (Sec. 4.1) is that
    ``C = D_Q^-1/2 exp(Q K^T / sqrt(d)) D_K^-1/2`` with ``(D_Q)_ii = exp(|q_i|^2 / sqrt(d))``: the Gaussian
    kernel replaces softmax's row normalisation ``D^-1 A``; the released code computes ``Q~ (K~^T V)`` with no
    division by row sums, and so does this. The only other normalisation is the symmetric ``D_M^-1/2`` above,
    which conditions the pseudo-inverse (Lemma 3) and cancels in exact arithmetic.

    Landmarks (``landmarks`` = m, default 64; the Skyformer LRA setting uses ``nb_features=128``): m // 2 from
    the queries and m - m // 2 from the keys (the code's split of the 2N rows of X). ``sampling``:

    - ``"segment_means"`` (default): segment means of Q and of K (as Nyströmformer; deterministic, so
      evaluation is reproducible and batch elements never interact). Kernel evaluations at these points
      are the inducing-point form of Eq. 5 (C_bar~ stays PSD and <= C_bar);
    - ``"uniform"``: the paper's uniform sub-sampling (Definition 1; rows of Q and of K drawn with replacement,
      redrawn at every forward from torch's global RNG, one draw shared by the batch and heads). Not
      deterministic: results depend on the RNG state.

    When ``N <= landmarks // 2`` every token could be its own landmark and the exact ``C V`` is returned.
    ``reference`` builds the 2N x 2N ``C_bar~`` and takes its block (Eqs. 5-6) before multiplying by V;
    ``torch`` multiplies ``kappa(Q, L) (M^+ (kappa(L, K) V))``: O(N m (d + Dv)).
    """

    name = "skyformer"
    paper = PAPER
    causal_form = False
    impls = ("reference", "torch")
    gamma: float = 0.1

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", landmarks: int = 64, pinv_iters: int = 6,
                 sampling: str = "segment_means"):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        if not isinstance(landmarks, int) or landmarks < 2:
            raise AttnbenchError(f"skyformer: option 'landmarks' must be an int >= 2, got {landmarks!r}")
        if not isinstance(pinv_iters, int) or pinv_iters < 0:
            raise AttnbenchError(f"skyformer: option 'pinv_iters' must be a non-negative int, got {pinv_iters!r}")
        if sampling not in SAMPLINGS:
            raise AttnbenchError(f"skyformer: option 'sampling' must be one of {SAMPLINGS}, got {sampling!r}")
        self.landmarks, self.pinv_iters, self.sampling = landmarks, pinv_iters, sampling

    def _landmarks(self, q: torch.Tensor, k: torch.Tensor, reference: bool) -> torch.Tensor:
        """``L = [landmarks of Q; landmarks of K]``: ``[B, H, m, d]``."""
        mq = self.landmarks // 2
        mk = self.landmarks - mq
        n = q.shape[-2]
        if self.sampling == "uniform":
            iq = torch.randint(0, n, (mq,), device=q.device)
            ik = torch.randint(0, n, (mk,), device=q.device)
            return torch.cat([q[..., iq, :], k[..., ik, :]], dim=-2)
        pool = segment_means_reference if reference else segment_means
        return torch.cat([pool(q, mq), pool(k, mk)], dim=-2)

    def _core(self, lm: torch.Tensor) -> torch.Tensor:
        """``M^+ ~ D^-1/2 Z D^-1/2`` (Sec. 4.4): ``[B, H, m, m]``."""
        m = lm.shape[-2]
        mg = gaussian_kernel(lm, lm) + self.gamma * torch.eye(m, dtype=lm.dtype, device=lm.device)  # [B,H,m,m]
        d = mg.sum(-1).rsqrt()                                                # [B, H, m]
        z = iterative_pinv(d[..., :, None] * mg * d[..., None, :], self.pinv_iters, init="norm1")
        return d[..., :, None] * z * d[..., None, :]                          # [B, H, m, m]

    def forward_reference(self, q, k, v):
        s = self.head_dim ** -0.25
        q, k = q * s, k * s
        n = q.shape[-2]
        if n <= self.landmarks // 2:
            return gaussian_kernel(q, k) @ v                                  # Eq. 3, exact
        lm = self._landmarks(q, k, reference=True)                            # [B, H, m, d]
        x = torch.cat([q, k], dim=-2)                                         # [B, H, 2N, d]
        cxl = gaussian_kernel(x, lm)                                          # [B, H, 2N, m]
        c_bar = cxl @ self._core(lm) @ cxl.transpose(-1, -2)                  # [B, H, 2N, 2N] Eq. 5
        c_tilde = c_bar[..., :n, n:]                                          # [B, H, N, N] Eq. 6
        return c_tilde @ v

    def forward_torch(self, q, k, v):
        s = self.head_dim ** -0.25
        q, k = q * s, k * s
        n = q.shape[-2]
        if n <= self.landmarks // 2:
            return gaussian_kernel(q, k) @ v
        lm = self._landmarks(q, k, reference=False)                           # [B, H, m, d]
        cql = gaussian_kernel(q, lm)                                          # [B, H, N, m]
        clk = gaussian_kernel(lm, k)                                          # [B, H, m, N]
        return cql @ (self._core(lm) @ (clk @ v))                             # [B, H, N, Dv]

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", landmarks={self.landmarks}, pinv_iters={self.pinv_iters}, "
                f"sampling={self.sampling!r}")
