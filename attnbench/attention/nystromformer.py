"""Nyströmformer (Xiong et al., AAAI 2021): softmax attention through a Nyström approximation on segment-mean
landmarks, with an iterative pseudo-inverse; bidirectional only."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.ops.nystrom import iterative_pinv, segment_means, segment_means_reference
from attnbench.core.protocol import AttnbenchError
from attnbench.attention.base import Attention

PAPER = "Xiong et al. 2021 (Nyströmformer, AAAI)"


class NystromformerAttention(Attention):
    """``O ~ F~ A~^+ B~ V`` (Xiong et al. 2021, Sec. 3, Eqs. 13-16) with

    - ``F~ = softmax(Q K~^T / sqrt(d))  [N, m]``, ``A~ = softmax(Q~ K~^T / sqrt(d))  [m, m]``,
      ``B~ = softmax(Q~ K^T / sqrt(d))  [m, N]``;
    - landmarks ``Q~, K~`` the segment means of Q and K (``landmarks`` = m segments; when m does not divide N,
      adaptive segments ``[floor(iN/m), ceil((i+1)N/m))``, see :mod:`attnbench.ops.nystrom`);
    - ``A~^+`` by ``pinv_iters`` steps of the iterative Moore–Penrose inverse (Eq. 16) from the paper's
      ``Z_0 = A~^T / (||A~||_1 ||A~||_inf)``, per matrix (the released code's max over the whole batch would
      couple batch elements);
    - ``N <= landmarks``: exact softmax attention (every token is its own landmark; the released code does the
      same when ``num_landmarks == seq_len``).

    Options: ``landmarks`` (default 64; the Skyformer LRA setting uses 128), ``pinv_iters`` (default 6),
    ``conv_kernel`` (default None). The paper's model adds a depthwise convolution of V along the sequence
    (kernel 35 in the authors' LRA configs, none in the Skyformer setting); it is part of their attention, so it
    is exposed here: ``conv_kernel=k`` (odd) adds ``DConv_k(V)`` per head, a learnable ``[H, 1, k, 1]`` weight.

    ``reference`` materialises the N x N approximation ``F~ A~^+ B~`` and multiplies by V; ``torch`` keeps the
    factorised order ``F~ (A~^+ (B~ V))``: O(N m (d + Dv)) time, no N x N tensor.
    """

    name = "nystromformer"
    paper = PAPER
    causal_form = False
    impls = ("reference", "torch")

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", landmarks: int = 64, pinv_iters: int = 6,
                 conv_kernel: int | None = None):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        if not isinstance(landmarks, int) or landmarks < 1:
            raise AttnbenchError(f"nystromformer: option 'landmarks' must be a positive int, got {landmarks!r}")
        if not isinstance(pinv_iters, int) or pinv_iters < 0:
            raise AttnbenchError(f"nystromformer: option 'pinv_iters' must be a non-negative int, got {pinv_iters!r}")
        if conv_kernel is not None and (not isinstance(conv_kernel, int) or conv_kernel < 1 or conv_kernel % 2 == 0):
            raise AttnbenchError(f"nystromformer: option 'conv_kernel' must be None or an odd positive int, "
                                 f"got {conv_kernel!r}")
        self.landmarks, self.pinv_iters, self.conv_kernel = landmarks, pinv_iters, conv_kernel
        if conv_kernel is not None:
            w = torch.empty(heads, 1, conv_kernel, 1)
            nn.init.kaiming_uniform_(w, a=5 ** 0.5)  # nn.Conv2d's default initialisation
            self.conv_weight = nn.Parameter(w)                                # [H, 1, k, 1]

    def _conv(self, v: torch.Tensor) -> torch.Tensor:
        """Depthwise convolution of V along the sequence, one kernel per head: ``[B, H, N, Dv]``."""
        k = self.conv_kernel
        return F.conv2d(v, self.conv_weight.to(v.dtype), padding=(k // 2, 0), groups=self.heads)

    def _finish(self, out: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return out + self._conv(v) if self.conv_kernel is not None else out

    def forward_reference(self, q, k, v):
        s = self.head_dim ** -0.25
        q, k = q * s, k * s                                                   # scores = q k^T / sqrt(d)
        n = q.shape[-2]
        if n <= self.landmarks:
            attn = torch.softmax(q @ k.transpose(-1, -2), dim=-1)             # [B, H, N, N]
            return self._finish(attn @ v, v)
        ql, kl = segment_means_reference(q, self.landmarks), segment_means_reference(k, self.landmarks)
        f = torch.softmax(q @ kl.transpose(-1, -2), dim=-1)                   # [B, H, N, m]
        a = torch.softmax(ql @ kl.transpose(-1, -2), dim=-1)                  # [B, H, m, m]
        b = torch.softmax(ql @ k.transpose(-1, -2), dim=-1)                   # [B, H, m, N]
        s_hat = f @ iterative_pinv(a, self.pinv_iters) @ b                    # [B, H, N, N]
        return self._finish(s_hat @ v, v)

    def forward_torch(self, q, k, v):
        s = self.head_dim ** -0.25
        q, k = q * s, k * s
        n = q.shape[-2]
        if n <= self.landmarks:
            return self._finish(F.scaled_dot_product_attention(q, k, v, scale=1.0), v)
        ql, kl = segment_means(q, self.landmarks), segment_means(k, self.landmarks)
        f = torch.softmax(q @ kl.transpose(-1, -2), dim=-1)                   # [B, H, N, m]
        a = torch.softmax(ql @ kl.transpose(-1, -2), dim=-1)                  # [B, H, m, m]
        b = torch.softmax(ql @ k.transpose(-1, -2), dim=-1)                   # [B, H, m, N]
        z = iterative_pinv(a, self.pinv_iters)                                # [B, H, m, m]
        return self._finish(f @ (z @ (b @ v)), v)                             # [B, H, N, Dv]

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", landmarks={self.landmarks}, pinv_iters={self.pinv_iters}, "
                f"conv_kernel={self.conv_kernel}")
