"""A plug-in: your own attention mechanisms, benchmarked beside the built-ins without a fork.

Two mechanisms, each with its reference (the plain math, the ground truth the fast form is checked against):

- ``my_softplus``, a feature map: ``phi(x) = softplus(beta x) / beta`` (positive, smooth, close to ReLU for large
  ``beta``). Registering the map is all it takes: attnbench builds the linear attention around it through the shared
  op (``o_t = phi(q_t) sum_i phi(k_i)^T v_i / phi(q_t) sum_j phi(k_j)``, bidirectional and causal, blocked, with
  the recomputing backward), under the same name, and the LM suite uses the map in its delta rule
  (``--attn deltanet+my_softplus``).
- ``my_window``, a custom attention: softmax attention within a sliding window of ``window`` tokens (Beltagy et
  al. 2020, Longformer, Sec. 3.1: each token attends to ``window - 1`` neighbours on each side; causal: to the
  ``window - 1`` before it). The reference masks the full N x N scores; the fast form computes only the N x
  (2 window - 1) band.

Use it with any command that takes ``--attn``::

    attnbench check --plugin examples/my_attention.py --attn my_window,my_softplus
    attnbench run lra --plugin examples/my_attention.py --attn softmax,my_window,my_softplus --smoke
    attnbench run scaling --plugin examples/my_attention.py --attn softmax,my_window:window=64

or export ``ATTNBENCH_PLUGINS=examples/my_attention.py``. In your own tests::

    import attnbench.checks.contract
    attnbench.checks.contract.check_attention("my_window")
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench import register_attention, register_feature_map
from attnbench.attention.base import Attention, FeatureMap


@register_feature_map
class MySoftplus(FeatureMap):
    """``phi(x) = softplus(beta x) / beta = log(1 + exp(beta x)) / beta``, elementwise: ``[B, H, N, D] -> [B, H, N, D]``."""

    name = "my_softplus"
    paper = "example plug-in (examples/my_attention.py)"

    def __init__(self, *, heads: int, head_dim: int, causal: bool = False, beta: float = 1.0):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if not beta > 0:
            raise ValueError(f"my_softplus: option 'beta' must be > 0, got {beta!r}")
        self.beta = float(beta)

    def phi(self, x):
        return F.softplus(x, beta=self.beta)                # stable form: linear above the threshold

    def _plain(self, x):
        return torch.log1p(torch.exp(self.beta * x)) / self.beta   # the formula as written

    def phi_q_reference(self, q):
        return self._plain(q)

    def phi_k_reference(self, k):
        return self._plain(k)


@register_attention
class MyWindow(Attention):
    """Sliding-window softmax attention: ``o_t = sum_{s in W(t)} softmax_s(q_t k_s / sqrt(d)) v_s`` with
    ``W(t) = {s : |t - s| < window}`` (causal: ``0 <= t - s < window``), Longformer (Beltagy et al. 2020) Sec. 3.1."""

    name = "my_window"
    paper = "Beltagy et al. 2020 (Longformer), sliding window"
    impls = ("reference", "torch")

    def __init__(self, *, heads: int, head_dim: int, causal: bool = False, impl: str = "auto", window: int = 16):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"my_window: option 'window' must be a positive int, got {window!r}")
        self.window = window

    def forward_reference(self, q, k, v):
        """The full N x N scores, masked outside the window."""
        n = q.shape[-2]
        i = torch.arange(n, device=q.device)
        dist = i[:, None] - i[None, :]                                         # [N, N] t - s
        allowed = (dist < self.window) & (dist > -self.window)
        if self.causal:
            allowed &= dist >= 0
        scores = (q @ k.transpose(-1, -2)) * self.head_dim ** -0.5             # [B, H, N, N]
        return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v     # [B, H, N, Dv]

    def forward_torch(self, q, k, v):
        """Only the band: each query against its ``left + right + 1`` window slots (a view of the padded keys)."""
        n = q.shape[-2]
        left, right = self.window - 1, (0 if self.causal else self.window - 1)
        slots = left + right + 1
        kw = F.pad(k, (0, 0, left, right)).unfold(-2, slots, 1)               # [B, H, N, D, W]
        vw = F.pad(v, (0, 0, left, right)).unfold(-2, slots, 1)               # [B, H, N, Dv, W]
        scores = torch.einsum("bhnd,bhndw->bhnw", q, kw) * self.head_dim ** -0.5   # [B, H, N, W]
        pos = torch.arange(n, device=q.device)[:, None] + torch.arange(slots, device=q.device) - left  # [N, W]
        scores = scores.masked_fill(~((pos >= 0) & (pos < n)), float("-inf"))  # slots in the padding
        return torch.einsum("bhnw,bhndw->bhnd", scores.softmax(-1), vw)        # [B, H, N, Dv]
