"""cosFormer (Qin et al., ICLR 2022): ReLU linear attention with a cos-based distance re-weighting that
decomposes exactly into linear form; bidirectional and causal."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnbench.ops import linear_attn as la
from attnbench.core.protocol import AttnbenchError, ShapeError
from attnbench.attention.base import FeatureMap, FeatureMapAttention

PAPER = "Qin et al. 2022 (cosFormer: Rethinking Softmax in Attention, ICLR)"
CAUSAL_DEFAULT_MAX_LEN = 4096


class CosformerFeatureMap(FeatureMap):
    """``phi(x_i) = [ReLU(x_i) cos(pi i / 2M), ReLU(x_i) sin(pi i / 2M)]``, positions i = 1..N (as the released
    code): ``[B, H, N, D] -> [B, H, N, 2D]``. Then ``phi(q_i) . phi(k_j) = ReLU(q_i) . ReLU(k_j) cos(pi/2 (i-j)/M)``
    (cos(a - b) = cos a cos b + sin a sin b). ``M = max_len`` if given, else N (bidirectional only)."""

    name = "cosformer"
    paper = PAPER

    def __init__(self, *, heads, head_dim, causal=False, max_len: int | None = None):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        self.max_len = max_len

    @property
    def feature_dim(self) -> int:
        return 2 * self.head_dim

    def period(self, n: int) -> int:
        return n if self.max_len is None else self.max_len

    def phi_at(self, x: torch.Tensor, start: int, n: int) -> torch.Tensor:
        """Features of the tokens ``start : start + len(x)`` of a sequence of ``n`` tokens (the period depends
        on n when ``max_len`` is None): ``[B, H, L, D] -> [B, H, L, 2D]``."""
        pos = torch.arange(start + 1, start + x.shape[-2] + 1, device=x.device, dtype=x.dtype)  # [L]
        ang = (math.pi / 2) * pos / self.period(n)                            # [L] in (0, pi/2]
        r = F.relu(x)                                                         # [B, H, L, D]
        return torch.cat([r * torch.cos(ang)[:, None], r * torch.sin(ang)[:, None]], dim=-1)  # [B, H, L, 2D]

    def phi(self, x: torch.Tensor) -> torch.Tensor:
        return self.phi_at(x, 0, x.shape[-2])

    def block_functions(self, n: int):
        tmap = la.TokenMap(lambda x, start: self.phi_at(x, start, n))
        return tmap, tmap

    def block_maps(self, q: torch.Tensor, k: torch.Tensor, block_size: int):
        """Blocks keep their absolute positions and the whole sequence's period."""
        n = q.shape[-2]
        q_block, k_block = la.token_blocks(q, block_size), la.token_blocks(k, block_size)
        return (lambda s, e: self.phi_at(q_block(s, e), s, n)), (lambda s, e: self.phi_at(k_block(s, e), s, n))


class CosformerAttention(FeatureMapAttention):
    """cosFormer (Qin et al. 2022, Sec. 3.3-3.4, Eqs. 9-11):

    ``o_i = sum_j s_ij v_j / sum_j s_ij``, ``s_ij = ReLU(q_i) ReLU(k_j)^T cos(pi/2 * (i - j) / M)``, over j <= i
    when causal, computed through the decomposition
    ``[ReLU(q) cos, ReLU(q) sin] . [ReLU(k) cos, ReLU(k) sin]`` (:class:`CosformerFeatureMap`) and the shared
    normalised linear-attention op, with no eps (the released code clamps the denominator at 1e-6; here only an
    exactly zero one is guarded, see :mod:`attnbench.ops.linear_attn`).

    ``M`` (option ``max_len``):

    - bidirectional, ``max_len=None`` (default): ``M = N``, the paper's choice (the released code uses
      ``M = max(src_len, tgt_len)``);
    - causal: M must not depend on how long the sequence will become, so it is the fixed ``max_len``, default
      ``CAUSAL_DEFAULT_MAX_LEN = 4096``; inputs longer than M raise :class:`ShapeError` (beyond M the weights
      would turn negative). "M = number of positions so far" is not used: ``cos(pi/2 (i - j) / i)`` does not
      factor into query and key features, so it has no linear form. The released code's causal path uses the
      current length N, so a prefix's outputs depend on the total length.
    - ``max_len`` given in the bidirectional form: M fixed to it too (N <= max_len).
    - :func:`attnbench.api.registry.build_for_length` passes ``max_len=seq_len`` (``shape_options``): M is then the
      length the attention is built for (the context length), in both forms.

    ``reference`` materialises the N x N weights ``s_ij``; ``torch`` runs the associative (bidirectional) or
    chunked (causal) form.
    """

    name = "cosformer"
    paper = PAPER
    feature_map_cls = CosformerFeatureMap

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", max_len: int | None = None):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        if max_len is None and causal:
            max_len = CAUSAL_DEFAULT_MAX_LEN
        if max_len is not None and (not isinstance(max_len, int) or max_len < 1):
            raise AttnbenchError(f"cosformer: option 'max_len' must be None or a positive int, got {max_len!r}")
        self.max_len = max_len
        self.feature_map = self.make_feature_map(max_len=max_len)

    @classmethod
    def shape_options(cls, seq_len: int) -> dict:
        """Drivers that know the length at build time fix M to it (causal: the context length)."""
        return {"max_len": seq_len}

    def check_inputs(self, q, k, v):
        super().check_inputs(q, k, v)
        n = q.shape[-2]
        if self.max_len is not None and n > self.max_len:
            raise ShapeError(f"cosformer: the input has N={n} tokens (dim 2 of q, k, v), more than "
                             f"max_len={self.max_len} (the re-weighting period M); build with max_len >= {n}")

    def forward_reference(self, q, k, v):
        """The plain Eq. 9 weights ``ReLU(q_i) . ReLU(k_j) cos(pi/2 (i - j) / M)``, N x N, then normalise."""
        n = q.shape[-2]
        pos = torch.arange(1, n + 1, device=q.device, dtype=q.dtype)          # [N]
        w = torch.cos((math.pi / 2) * (pos[:, None] - pos[None, :]) / self.feature_map.period(n))  # [N, N]
        scores = (F.relu(q) @ F.relu(k).transpose(-1, -2)) * w                # [B, H, N, N]
        if self.causal:
            scores = scores.tril()
        cnt = (torch.arange(1, n + 1, device=q.device, dtype=q.dtype) if self.causal
               else torch.full((n,), float(n), device=q.device, dtype=q.dtype))[:, None]  # [N, 1]
        return ((scores @ v) / cnt) / la.safe_den(scores.sum(-1, keepdim=True) / cnt, self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", max_len={self.max_len}"
