"""Nyström helpers shared by ``nystromformer``, ``skyformer`` and ``laplacian``: segment-mean landmarks and the iterative
Moore–Penrose pseudo-inverse, each with a naive reference beside it.

- :func:`segment_means` (fast, ``adaptive_avg_pool1d``) / :func:`segment_means_reference` (a loop over the
  segments): ``[..., N, D] -> [..., m, D]``. Segment ``i`` covers tokens ``[floor(i N / m), ceil((i + 1) N / m))``,
  so for ``N`` divisible by ``m`` these are the equal, disjoint segments of Nyströmformer Sec. 3.3; otherwise
  neighbouring segments share at most one token ("adaptive" segment means).
- :func:`iterative_pinv` (the third-order iteration of Razavi et al. 2014 that Nyströmformer Eq. 16 and
  Skyformer Sec. 4.4 use) and :func:`newton_schulz_pinv` (the second-order Newton–Schulz iteration of
  LaplacianFormer Sec. 4.2) / :func:`pinv_reference` (``torch.linalg.pinv``, for the tests only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PINV_INITS = ("norm1inf", "norm1")
NS_SCALINGS = ("norm1inf", "soft", "paper")
NS_GRADS = ("unrolled", "implicit")


def segment_bounds(n: int, m: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each of the ``m`` segments of ``n`` tokens (``adaptive_avg_pool1d``'s windows)."""
    return [((i * n) // m, -((-(i + 1) * n) // m)) for i in range(m)]


def segment_means_reference(x: torch.Tensor, m: int) -> torch.Tensor:
    """Landmarks as the mean of each segment, one segment at a time: ``[..., N, D] -> [..., m, D]``."""
    n = x.shape[-2]
    return torch.stack([x[..., s:e, :].mean(-2) for s, e in segment_bounds(n, m)], dim=-2)


def segment_means(x: torch.Tensor, m: int) -> torch.Tensor:
    """Same as :func:`segment_means_reference`, by one ``adaptive_avg_pool1d``: ``[..., N, D] -> [..., m, D]``."""
    *lead, n, d = x.shape
    flat = x.reshape(-1, n, d).transpose(1, 2)                                # [L, D, N]
    return F.adaptive_avg_pool1d(flat, m).transpose(1, 2).reshape(*lead, m, d)


def iterative_pinv(a: torch.Tensor, iters: int = 6, init: str = "norm1inf") -> torch.Tensor:
    """Approximate Moore–Penrose pseudo-inverse of ``a: [..., m, m]`` (each matrix on its own).

    ``Z_{j+1} = 1/4 Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j)))`` (Nyströmformer Eq. 16; Razavi et al.
    2014), from ``Z_0 = A^T / s`` with

    - ``init="norm1inf"``: ``s = ||A||_1 ||A||_inf`` (Nyströmformer's initialisation; ``||A||_2^2 <= s``, so
      ``||I - A Z_0|| < 1`` and the iteration converges for any nonsingular A);
    - ``init="norm1"``: ``s = ||A||_1`` (max column sum; the released Nyströmformer and Skyformer code, equal to
      the above when A is row-stochastic, and valid for the symmetric, spectrally normalised matrix of Skyformer).

    The released code takes the max over the whole batch; here it is per matrix, so no statistic crosses
    batch elements (or heads). Gradients flow through the iterations (as in the released code).
    """
    if init not in PINV_INITS:
        raise ValueError(f"iterative_pinv: argument 'init' must be one of {PINV_INITS}, got {init!r}")
    m = a.shape[-1]
    eye = torch.eye(m, dtype=a.dtype, device=a.device)                        # [m, m]
    col = a.abs().sum(-2).amax(-1)                                            # [...] ||A||_1
    scale = col * a.abs().sum(-1).amax(-1) if init == "norm1inf" else col     # [...]
    z = a.transpose(-1, -2) / scale[..., None, None]                          # [..., m, m]
    for _ in range(iters):
        az = a @ z                                                            # [..., m, m]
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


class _ExactInverseGrad(torch.autograd.Function):
    """``apply(X, P) -> X`` whose backward treats X as the exact inverse of P: ``dP = -X^T G X^T`` (the
    released LaplacianFormer code's backward), not the derivative of the iterations that produced X."""

    @staticmethod
    def forward(ctx, X, P):
        ctx.save_for_backward(X)
        return X.view_as(X)

    @staticmethod
    def backward(ctx, G):
        (X,) = ctx.saved_tensors
        Xt = X.transpose(-1, -2)
        return None, -(Xt @ G @ Xt)


def newton_schulz_pinv(W: torch.Tensor, *, iters: int = 20, scaling: str = "norm1inf",
                       ridge: float = 0.0, step=None, grad: str = "unrolled") -> torch.Tensor:
    """Moore–Penrose pseudo-inverse of ``[..., m, m]`` matrices by Newton–Schulz (Sec. 4.2):
    ``X_{k+1} = X_k (2I - P X_k)``, ``X_0 = alpha P^T``, ``P = W + ridge * I``.

    ``scaling`` chooses alpha: ``"norm1inf"``: ``1 / (||P||_1 ||P||_inf)`` (<= 1/||P||_2^2, so the
    iteration converges for any P, symmetric or not); ``"soft"``: the released CUDA code's
    ``1.8 / max_rowsum(W)^2`` (valid for symmetric PSD W, as SOFT); ``"paper"``: the printed
    ``alpha = 2 / ||P||_2`` (spectral norm), kept as the literal reading: ``||I - alpha P P^T|| < 1`` needs
    ``alpha < 2 / ||P||_2^2``, so it diverges whenever ``||P||_2 > 1`` (every unit-diagonal kernel matrix with
    a ridge). ``grad="unrolled"``: gradients flow through the iterations; ``"implicit"``: the iterations run
    without autograd and the gradient is that of the exact inverse, ``-X^T G X^T`` (the released code's; in
    float32 the unrolled gradient of many iterations on an ill-conditioned P is dominated by rounding).
    ``step(X, P)`` may replace the PyTorch iteration (e.g. ``attnbench.kernels.newton_schulz_step``).
    """
    if scaling not in NS_SCALINGS:
        raise ValueError(f"newton_schulz_pinv: argument 'scaling' must be one of {NS_SCALINGS}, got {scaling!r}")
    if grad not in NS_GRADS:
        raise ValueError(f"newton_schulz_pinv: argument 'grad' must be one of {NS_GRADS}, got {grad!r}")
    if grad == "implicit" and torch.is_grad_enabled() and W.requires_grad:
        with torch.no_grad():
            X = newton_schulz_pinv(W, iters=iters, scaling=scaling, ridge=ridge, step=step)
        eye = torch.eye(W.shape[-1], dtype=W.dtype, device=W.device)
        return _ExactInverseGrad.apply(X, W + ridge * eye if ridge else W)
    m = W.shape[-1]
    eye = torch.eye(m, dtype=W.dtype, device=W.device)
    P = W + ridge * eye if ridge else W
    if scaling == "norm1inf":
        alpha = 1.0 / (P.abs().sum(-2).amax(-1) * P.abs().sum(-1).amax(-1))          # [...]
    elif scaling == "paper":
        alpha = 2.0 / torch.linalg.matrix_norm(P, ord=2)                             # [...]
    else:
        alpha = 1.8 / W.sum(-1).amax(-1).pow(2)
    X = alpha[..., None, None] * P.transpose(-1, -2)                                  # [..., m, m]
    for _ in range(iters):
        X = step(X, P) if step is not None else X @ (2 * eye - P @ X)
    return X


def pinv_reference(a: torch.Tensor) -> torch.Tensor:
    """The exact pseudo-inverse (SVD), what :func:`iterative_pinv` converges to: ``[..., m, m]``."""
    return torch.linalg.pinv(a)
