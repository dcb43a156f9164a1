"""The Attention protocol: shapes, validation and clear errors.

Every attention in attnbench is an ``nn.Module`` built by :func:`attnbench.build` whose ``forward(q, k, v)``
takes ``q, k: [B, H, N, Dk]`` and ``v: [B, H, N, Dv]`` and returns ``[B, H, N, Dv]`` in v's dtype. Causality,
options and the implementation are fixed at build time. Bad input fails here, with a message that names the
argument and the expected and actual shape or dtype, never deep inside an einsum.
"""

from __future__ import annotations

import torch

from attnbench.core.errors import AttnbenchError, ShapeError, UnknownNameError, UnsupportedError  # noqa: F401

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)} dtype {str(t.dtype).replace('torch.', '')}"


def validate_tensors(q, k, v, *, name: str) -> None:
    """q, k, v are rank-4 floating tensors of one dtype on one device (shared by every op taking q, k, v)."""
    for arg, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ShapeError(f"{name}: argument {arg!r} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ShapeError(f"{name}: argument {arg!r} must have rank 4 [B, H, N, D], got rank {t.dim()} "
                             f"({_describe(t)})")
        if t.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{name}: argument {arg!r} must be a floating tensor (fp16, bf16, fp32, fp64), "
                             f"got {_describe(t)}")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ShapeError(f"{name}: q, k and v must share one dtype, got q {q.dtype}, k {k.dtype}, v {v.dtype}")
    if q.device != k.device or q.device != v.device:
        raise ShapeError(f"{name}: q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")


def validate_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, heads: int, head_dim: int,
                 name: str, value_dim: int | None = None, even_value_dim: bool = False) -> None:
    """Check q, k, v against the protocol of an attention built with ``heads`` and ``head_dim``.

    Raises :class:`ShapeError` naming the offending argument.
    """
    validate_tensors(q, k, v, name=name)
    B, H, N, D = q.shape
    if H != heads:
        raise ShapeError(f"{name}: argument 'q' has {H} heads (dim 1) but the attention was built with "
                         f"heads={heads} ({_describe(q)})")
    if D != head_dim:
        raise ShapeError(f"{name}: argument 'q' has head size {D} (dim 3) but the attention was built with "
                         f"head_dim={head_dim} ({_describe(q)})")
    if tuple(k.shape) != tuple(q.shape):
        raise ShapeError(f"{name}: argument 'k' must match q's shape {tuple(q.shape)}, got {_describe(k)}")
    if tuple(v.shape[:3]) != (B, H, N):
        raise ShapeError(f"{name}: argument 'v' must be [B={B}, H={H}, N={N}, Dv], got {_describe(v)}")
    if value_dim is not None and v.shape[-1] != value_dim:
        raise ShapeError(f"{name}: argument 'v' must have value size {value_dim} (dim 3), got {_describe(v)}")
    if even_value_dim and v.shape[-1] % 2:
        raise ShapeError(f"{name}: argument 'v' must have an even value size (it is split in two), "
                         f"got {_describe(v)}")
    if N == 0 or B == 0:
        raise ShapeError(f"{name}: q, k, v must have at least one batch element and one token, got {_describe(q)}")
