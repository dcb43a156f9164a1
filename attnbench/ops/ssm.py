"""Mamba's selective scan (Gu and Dao, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces", 2023,
Algorithm 2 and Eqs. 2a-2b, 4 with the zero-order hold of A and the simplified (Euler) discretisation of B that
the reference implementation uses):

    h_t = exp(dt_t A) * h_{t-1} + (dt_t u_t) B_t,        y_t = h_t C_t + D u_t,

per channel e of ``E`` and state index n of ``N``: ``u, dt: [B, T, E]``, ``A: [E, N]`` (negative), ``B_t, C_t:
[B, T, N]`` shared by the channels, ``D: [E]``, state ``h: [B, E, N]``.

Forms: ``"recurrent"`` (:func:`selective_scan_recurrent`, one token at a time: the ground truth, and the CPU form;
a sequence's autograd graph is a few elementwise ops per token) and ``"chunked"`` (:func:`selective_scan_chunked`:
within a chunk the decay from j to i is ``exp(L_i - L_j)`` with ``L`` the cumulative ``dt A``, an exponent that is
never positive; its ``[C, C, E, N]`` intermediate makes it a check of the recurrence more than a faster form on a
CPU). Float64 inputs compute in float64, anything else in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnbench.core.protocol import ShapeError, _describe
from attnbench.ops.forms import compute_dtype


def _check(u, dt, A, Bm, Cm, D, h0) -> None:
    name = "selective_scan"
    if not all(isinstance(t, torch.Tensor) for t in (u, dt, A, Bm, Cm)):
        raise ShapeError(f"{name}: u, dt, A, B and C must be tensors")
    if u.dim() != 3:
        raise ShapeError(f"{name}: argument 'u' must be [B, T, E], got {_describe(u)}")
    Bsz, T, E = u.shape
    if tuple(dt.shape) != (Bsz, T, E):
        raise ShapeError(f"{name}: argument 'dt' must match u's shape {(Bsz, T, E)}, got {_describe(dt)}")
    if A.dim() != 2 or A.shape[0] != E:
        raise ShapeError(f"{name}: argument 'A' must be [E={E}, N], got {_describe(A)}")
    N = A.shape[1]
    for arg, t in (("B", Bm), ("C", Cm)):
        if tuple(t.shape) != (Bsz, T, N):
            raise ShapeError(f"{name}: argument {arg!r} must be [B={Bsz}, T={T}, N={N}], got {_describe(t)}")
    if D is not None and tuple(D.shape) != (E,):
        raise ShapeError(f"{name}: argument 'D' must be [E={E}], got {_describe(D)}")
    if h0 is not None and tuple(h0.shape) != (Bsz, E, N):
        raise ShapeError(f"{name}: argument 'initial_state' must be [B, E, N] = {(Bsz, E, N)}, got {_describe(h0)}")


def _cast(u, dt, A, Bm, Cm, D, h0):
    cd = compute_dtype(u.dtype)
    h = u.new_zeros(u.shape[0], u.shape[2], A.shape[1], dtype=cd) if h0 is None else h0.to(cd)
    return [t.to(cd) for t in (u, dt, A, Bm, Cm)] + [None if D is None else D.to(cd), h]


def selective_scan_recurrent(u, dt, A, Bm, Cm, D=None, *, initial_state=None, output_final_state=False):
    """The recurrence, one token at a time: ``(y [B, T, E] in u's dtype, h_T or None)``."""
    _check(u, dt, A, Bm, Cm, D, initial_state)
    out_dtype = u.dtype
    u, dt, A, Bm, Cm, D, h = _cast(u, dt, A, Bm, Cm, D, initial_state)
    # every token's decay and write at once, then the sequence cut by one unbind each: the same numbers as
    # computing them token by token, but the backward gathers each slice's gradient with one stack where
    # indexing [:, t] costs a zero tensor of the whole sequence per token
    decays = (dt[..., None] * A).exp().unbind(1)                               # T x [B, E, N]
    writes = ((dt * u)[..., None] * Bm[:, :, None, :]).unbind(1)              # T x [B, E, N]
    ys = []
    for a, w, c in zip(decays, writes, Cm.unbind(1)):
        h = a * h + w
        ys.append(torch.einsum("ben,bn->be", h, c))
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + D * u
    return y.to(out_dtype), (h if output_final_state else None)


def selective_scan_chunked(u, dt, A, Bm, Cm, D=None, *, initial_state=None, output_final_state=False,
                           chunk_size: int = 8):
    """The exact chunked form (module docstring): ``(y [B, T, E], h_T or None)``."""
    _check(u, dt, A, Bm, Cm, D, initial_state)
    out_dtype = u.dtype
    u, dt, A, Bm, Cm, D, h = _cast(u, dt, A, Bm, Cm, D, initial_state)
    Bsz, T, E = u.shape
    C = chunk_size
    pad = (-T) % C
    x = dt * u                                                                # [B, T, E] what is written
    logdecay = dt[..., None] * A                                              # [B, T, E, N]
    if pad:  # zero writes and zero log decays: the padding changes nothing
        x, Bm, Cm = (F.pad(t, (0, 0, 0, pad)) for t in (x, Bm, Cm))
        logdecay = F.pad(logdecay, (0, 0, 0, 0, 0, pad))
    nc = (T + pad) // C
    x, Bm, Cm = (t.reshape(Bsz, nc, C, t.shape[-1]) for t in (x, Bm, Cm))
    L = logdecay.reshape(Bsz, nc, C, E, -1).cumsum(dim=2)                     # [B, nc, C, E, N] inclusive
    causal = torch.ones(C, C, dtype=torch.bool, device=u.device).tril()
    diff = L[:, :, :, None] - L[:, :, None, :]                                # [B, nc, C_i, C_j, E, N]
    decay = diff.masked_fill(~causal[:, :, None, None], float("-inf")).exp()
    y = torch.einsum("bcin,bcijen,bcjn,bcje->bcie", Cm, decay, Bm, x)         # within chunks
    ys = []
    for c in range(nc):
        ys.append(torch.einsum("bin,bien,ben->bie", Cm[:, c], L[:, c].exp(), h))   # the carried state
        last = L[:, c, -1]                                                    # [B, E, N]
        h = last.exp() * h + torch.einsum("bjen,bjn,bje->ben", (last[:, None] - L[:, c]).exp(), Bm[:, c], x[:, c])
    y = (y + torch.stack(ys, dim=1)).reshape(Bsz, nc * C, E)[:, :T]
    if D is not None:
        y = y + D * u
    return y.to(out_dtype), (h if output_final_state else None)


__all__ = ["selective_scan_chunked", "selective_scan_recurrent"]
