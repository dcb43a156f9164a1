"""Linformer (Wang et al., 2020): softmax attention over keys and values projected along the sequence to a
fixed number of rows; fixed sequence length, bidirectional only."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.core.protocol import AttnbenchError, ShapeError
from attnbench.attention.base import Attention

PAPER = "Wang et al. 2020 (Linformer: Self-Attention with Linear Complexity)"


class LinformerAttention(Attention):
    """``head = softmax(Q (E K)^T / sqrt(d)) (F V)`` (Wang et al. 2020, Eq. 7), with learnable projections
    ``E, F: [k, seq_len]`` along the sequence, shared across heads (the paper's headwise sharing, Sec. 4).

    Options:

    - ``seq_len`` (required): the one sequence length the projections are built for; a forward with another N
      raises :class:`ShapeError` naming both. (Generic drivers build through
      :func:`attnbench.api.registry.build_for_length`, which passes it.)
    - ``proj_dim`` (k, default 128; the Skyformer LRA setting's ``linformer_k=128``), reduced to ``seq_len``
      when ``seq_len < proj_dim``.
    - ``share_kv`` (default False): one projection for keys and values (``F = E``, the paper's key-value
      sharing, Sec. 4; what the Nyströmformer/Skyformer LRA code does, with one E per head there).

    Initialisation: ``N(0, 0.02^2)``, as the LRA re-implementations (Nyströmformer and Skyformer code).
    ``reference`` is the explicit softmax over the ``[N, k]`` scores; ``torch`` projects, then calls
    ``scaled_dot_product_attention`` on the projected keys and values. Both are O(N k d); there is no N x N form.
    """

    name = "linformer"
    paper = PAPER
    causal_form = False
    impls = ("reference", "torch")

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", seq_len: int | None = None,
                 proj_dim: int = 128, share_kv: bool = False):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        if seq_len is None:
            raise AttnbenchError("linformer: option 'seq_len' is required (the fixed sequence length the "
                                 "projections E, F are built for), e.g. build('linformer', ..., seq_len=1024)")
        if not isinstance(seq_len, int) or seq_len < 1:
            raise AttnbenchError(f"linformer: option 'seq_len' must be a positive int, got {seq_len!r}")
        if not isinstance(proj_dim, int) or proj_dim < 1:
            raise AttnbenchError(f"linformer: option 'proj_dim' must be a positive int, got {proj_dim!r}")
        self.seq_len, self.share_kv = seq_len, bool(share_kv)
        self.proj_dim = min(proj_dim, seq_len)
        self.E = nn.Parameter(torch.randn(self.proj_dim, seq_len) * 0.02)     # [k, N]
        self.F = None if self.share_kv else nn.Parameter(torch.randn(self.proj_dim, seq_len) * 0.02)

    @classmethod
    def shape_options(cls, seq_len: int) -> dict:
        return {"seq_len": seq_len}

    def check_inputs(self, q, k, v):
        super().check_inputs(q, k, v)
        n = q.shape[-2]
        if n != self.seq_len:
            raise ShapeError(f"linformer: the input has N={n} tokens (dim 2 of q, k, v) but the attention was "
                             f"built with seq_len={self.seq_len}; Linformer's projections fix the length, "
                             f"build it with seq_len={n}")

    def _projections(self, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.E.to(dtype)
        return e, (e if self.F is None else self.F.to(dtype))

    def forward_reference(self, q, k, v):
        e, f = self._projections(q.dtype)
        kp = torch.einsum("kn,bhnd->bhkd", e, k)                              # [B, H, k, d]  E K
        vp = torch.einsum("kn,bhnd->bhkd", f, v)                              # [B, H, k, Dv] F V
        scores = q @ kp.transpose(-1, -2) / math.sqrt(self.head_dim)          # [B, H, N, k]
        return torch.softmax(scores, dim=-1) @ vp                             # [B, H, N, Dv]

    def forward_torch(self, q, k, v):
        e, f = self._projections(q.dtype)
        return F.scaled_dot_product_attention(q, e @ k, f @ v, scale=1.0 / math.sqrt(self.head_dim))

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", seq_len={self.seq_len}, proj_dim={self.proj_dim}, "
                f"share_kv={self.share_kv}")
