"""Gated linear attention (GLA) and its scalar-decay special case (RetNet's retention), causal, with a
token-by-token reference.

Layout is attnbench's ``[B, H, N, D]``: ``q, k: [B, H, N, Dk]``, ``v: [B, H, N, Dv]``, and the log-space decay
``g`` either per key feature, ``[B, H, N, Dk]`` (GLA: Yang et al., "Gated Linear Attention Transformers with
Hardware-Efficient Training", ICML 2024, Eq. 3 and Sec. 4.1), or one per head and token, ``[B, H, N]`` (RetNet:
Sun et al., "Retentive Network", 2023, Eq. 1, where it is the constant ``log gamma_h``). The recurrence, in FLA's
keys-by-values orientation ``S: [B, H, Dk, Dv]`` so that states pass to and from ``fla.ops`` unchanged,

    S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t,        o_t = scale * q_t S_t,

with ``scale`` defaulting to ``Dk ** -0.5`` (FLA's convention: it multiplies q).

Forms behind :func:`gated_linear_attention` (``impl=``):

- ``"recurrent"``: :func:`gla_recurrent`, one token at a time (ground truth; FLA's ``naive_recurrent_gla``).
- ``"torch"``: :func:`gla_chunked`, the exact chunked form: within a chunk the decay between positions i >= j is
  ``exp(G_i - G_j)`` with ``G`` the cumulative log decay inside the chunk, an exponent that is never positive, so
  nothing overflows at any decay (the product ``(q exp(G)) (k exp(-G))^T`` of the paper's Sec. 4.2 would, which is
  why FLA adds secondary chunks); between chunks the state is carried. Backward through autograd.
- ``"fla"``: FLA's Triton ``chunk_gla`` / ``chunk_simple_gla`` (CUDA only, fp16 / bf16 only).
- ``"auto"``: ``"fla"`` on CUDA, ``"torch"`` elsewhere.

Precision: float64 inputs compute in float64, anything else in float32; ``o`` is returned in v's dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench.core.protocol import FLOAT_DTYPES, ShapeError, UnsupportedError, _describe, validate_tensors
from attnbench.ops.forms import IMPLS, compute_dtype, resolve_impl

GLA_IMPLS = IMPLS


def resolve_gla_impl(device: torch.device | str, impl: str = "auto") -> str:
    """The concrete form ``impl`` names on ``device`` (:func:`attnbench.ops.forms.resolve_impl`)."""
    return resolve_impl("gated_linear_attention", device, impl)


def _check_inputs(q, k, v, g, initial_state, chunk_size) -> None:
    name = "gated_linear_attention"
    validate_tensors(q, k, v, name=name)
    B, H, N, Dk = q.shape
    if tuple(k.shape) != tuple(q.shape):
        raise ShapeError(f"{name}: argument 'k' must match q's shape {tuple(q.shape)} [B, H, N, Dk], "
                         f"got {_describe(k)}")
    if tuple(v.shape[:3]) != (B, H, N):
        raise ShapeError(f"{name}: argument 'v' must be [B={B}, H={H}, N={N}, Dv], got {_describe(v)}")
    if not isinstance(g, torch.Tensor) or tuple(g.shape) not in ((B, H, N), (B, H, N, Dk)):
        raise ShapeError(f"{name}: argument 'g' (log-space decay) must be [B={B}, H={H}, N={N}] (one per head and "
                         f"token) or [B, H, N, Dk={Dk}] (one per key feature), got {_describe(g)}")
    if g.dtype not in FLOAT_DTYPES or g.device != q.device:
        raise ShapeError(f"{name}: argument 'g' must be a floating tensor on {q.device}, got {_describe(g)}")
    if initial_state is not None and (not isinstance(initial_state, torch.Tensor)
                                      or tuple(initial_state.shape) != (B, H, Dk, v.shape[-1])):
        raise ShapeError(f"{name}: argument 'initial_state' must be [B, H, Dk, Dv] = {(B, H, Dk, v.shape[-1])}, "
                         f"got {_describe(initial_state)}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ShapeError(f"{name}: argument 'chunk_size' must be a positive integer, got {chunk_size!r}")


def _prepare(q, k, v, g, initial_state):
    cd = compute_dtype(q.dtype)
    g = g if g.dim() == 4 else g.unsqueeze(-1)                                # [B, H, N, Dk or 1]
    S = (q.new_zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1], dtype=cd) if initial_state is None
         else initial_state.to(cd))
    return q.to(cd), k.to(cd), v.to(cd), g.to(cd), S


def gla_recurrent(q, k, v, g, *, scale: float | None = None, initial_state=None, output_final_state: bool = False):
    """The recurrence of the module docstring, one token at a time: ``(o [B, H, N, Dv], S_N or None)``."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out_dtype = v.dtype
    q, k, v, g, S = _prepare(q, k, v, g, initial_state)
    outs = []
    for t in range(q.shape[2]):
        S = g[:, :, t, :, None].exp() * S + k[:, :, t, :, None] * v[:, :, t, None, :]   # [B, H, Dk, Dv]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t] * scale, S))
    return torch.stack(outs, dim=2).to(out_dtype), (S if output_final_state else None)


def gla_chunked(q, k, v, g, *, scale: float | None = None, initial_state=None, output_final_state: bool = False,
                chunk_size: int = 16):
    """The exact chunked form (module docstring): ``(o [B, H, N, Dv], S_N or None)``.

    The intra-chunk decays of a per-feature ``g`` form a ``[C, C, Dk]`` tensor per chunk (hence the CPU default
    of 16-token chunks); a per-head ``g`` gives a ``[C, C]`` matrix."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out_dtype = v.dtype
    q, k, v, g, S = _prepare(q, k, v, g, initial_state)
    B, H, N, Dk = q.shape
    C = chunk_size
    pad = (-N) % C
    if pad:  # zero keys write nothing and zero log decays keep the state: the padding changes nothing
        q, k, v, g = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v, g))
    nc = (N + pad) // C
    q, k, v, g = (t.reshape(B, H, nc, C, t.shape[-1]) for t in (q * scale, k, v, g))
    G = g.cumsum(dim=3)                                                       # [B, H, nc, C, Dg] inclusive
    # 0 on and below the diagonal, -inf above: one add (cheaper than masked_fill with a broadcast mask)
    above = torch.full((C, C), float("-inf"), dtype=q.dtype, device=q.device).triu(1)[:, :, None]
    diff = G[:, :, :, :, None, :] - G[:, :, :, None, :, :]                    # [B, H, nc, C_i, C_j, Dg]
    decay = (diff + above).exp()                                              # exp(G_i - G_j), 0 above the diagonal
    if g.shape[-1] == 1:
        A = (q @ k.transpose(-1, -2)) * decay[..., 0]                         # [B, H, nc, C, C]
    else:
        # A_ij = sum_d (decay_ijd k_jd) q_id as one batched matrix-vector product per query row: torch.einsum
        # of the three operands forms the [C, C, Dk] outer product of q and k first and contracts it with
        # [1, Dk] x [Dk, 1] matmuls, over twice the time
        A = ((decay * k[:, :, :, None]) @ q[..., None]).squeeze(-1)           # [B, H, nc, C, C]
    o = A @ v                                                                 # [B, H, nc, C, Dv] within chunks
    last = G[:, :, :, -1:, :]                                                 # [B, H, nc, 1, Dg]
    q_in = q * G.exp()                                                        # decay from the chunk start to i
    k_out = k * (last - G).exp()                                              # decay from j to the chunk end
    carried = []
    for c in range(nc):
        carried.append(q_in[:, :, c] @ S)                                     # [B, H, C, Dv]
        S = last[:, :, c, 0, :, None].exp() * S + k_out[:, :, c].transpose(-1, -2) @ v[:, :, c]
    o = (o + torch.stack(carried, dim=2)).reshape(B, H, nc * C, -1)[:, :, :N]
    return o.to(out_dtype), (S if output_final_state else None)


def _gla_fla(q, k, v, g, *, scale, initial_state, output_final_state):
    """FLA's ``chunk_gla`` (per-feature decay) / ``chunk_simple_gla`` (per-head decay), in FLA's [B, N, H, D]."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise UnsupportedError(f"gated_linear_attention: impl='fla' runs FLA's Triton kernels, which take bfloat16 "
                               f"or float16 only; got {str(q.dtype).replace('torch.', '')}: cast q, k, v or use "
                               f"impl='torch'")
    try:
        if g.dim() == 4:
            from fla.ops.gla import chunk_gla as kernel
        else:
            from fla.ops.simple_gla import chunk_simple_gla as kernel
    except ImportError as e:  # pragma: no cover - depends on the install
        raise UnsupportedError(f"gated_linear_attention: impl='fla' needs flash-linear-attention: {e}") from e
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))                      # [B, N, H, D]
    gt = g.float().transpose(1, 2)                                            # [B, N, H(, Dk)]
    h0 = None if initial_state is None else initial_state.float()
    o, final = kernel(qt, kt, vt, gt, scale=scale, initial_state=h0, output_final_state=output_final_state)
    return o.transpose(1, 2).to(v.dtype), (final if output_final_state else None)


def gated_linear_attention(q, k, v, g, *, scale: float | None = None, initial_state=None,
                           output_final_state: bool = False, impl: str = "auto", chunk_size: int = 16):
    """``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``, ``o_t = scale q_t S_t`` (module docstring).

    Args:
        q, k: ``[B, H, N, Dk]``; v: ``[B, H, N, Dv]``; g: log-space decay, ``[B, H, N, Dk]`` or ``[B, H, N]``.
        scale: multiplies q; default ``Dk ** -0.5``.
        initial_state: ``[B, H, Dk, Dv]`` or None (zeros). output_final_state: also return ``S_N``.
        impl: ``"auto"`` | ``"recurrent"`` | ``"torch"`` | ``"fla"``. chunk_size: of the ``"torch"`` form.
    """
    _check_inputs(q, k, v, g, initial_state, chunk_size)
    resolved = resolve_gla_impl(q.device, impl)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if resolved == "recurrent":
        return gla_recurrent(q, k, v, g, **kw)
    if resolved == "torch":
        return gla_chunked(q, k, v, g, chunk_size=chunk_size, **kw)
    return _gla_fla(q, k, v, g, **kw)


def retention_decay(heads: int) -> torch.Tensor:
    """RetNet's fixed per-head log decay ``log(1 - 2^(-5 - h))``, h = 0 .. heads-1 (Sun et al. 2023, Sec. 2.2;
    FLA's ``fla/ops/retention``), float64 ``[heads]`` (cast it to the compute dtype)."""
    return torch.log1p(-torch.pow(2.0, -5.0 - torch.arange(heads, dtype=torch.float64)))


__all__ = ["GLA_IMPLS", "gated_linear_attention", "gla_chunked", "gla_recurrent", "resolve_gla_impl",
           "retention_decay"]
