"""Linear attention over precomputed feature maps, bidirectional and causal, with a naive reference each.

All functions take ``fq, fk: [B, H, N, M]`` (feature maps, M may differ from the value size) and
``v: [B, H, N, D]`` and return ``[B, H, N, D]``.

With ``normalize=True`` the output is

    o_t = (phi_q_t . S_t / c_t) / (phi_q_t . z_t / c_t + eps),   S_t = sum_{i in I_t} phi_k_i^T v_i,
                                                               z_t = sum_{i in I_t} phi_k_i,

where I_t is every token (bidirectional) or i <= t (causal) and c_t = |I_t|: the eps is measured against a
*mean* score, as in the released PolaFormer / NaLaFormer code. With ``normalize=False`` the output is the plain
sum ``phi_q_t . S_t`` (SteLLA scales it by constants instead).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F


def _counts(n: int, causal: bool, like: torch.Tensor) -> torch.Tensor:
    """c_t of the module docstring, shaped [N, 1] to broadcast over [B, H, N, 1]."""
    if causal:
        return torch.arange(1, n + 1, device=like.device, dtype=like.dtype).unsqueeze(-1)
    return torch.full((n, 1), float(n), device=like.device, dtype=like.dtype)


def linear_attention_reference(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                               normalize: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """Quadratic reference: materialise the N x N scores phi(q) phi(k)^T (masked when causal)."""
    n = fq.shape[-2]
    scores = fq @ fk.transpose(-1, -2)                                        # [B, H, N, N]
    if causal:
        scores = scores.tril()
    num = scores @ v                                                          # [B, H, N, D]
    if not normalize:
        return num
    c = _counts(n, causal, scores)
    den = scores.sum(-1, keepdim=True)                                        # [B, H, N, 1]
    return (num / c) / (den / c + eps)


def linear_attention_recurrent(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, normalize: bool = True,
                               eps: float = 1e-6) -> torch.Tensor:
    """Token-by-token causal recurrence S_t = S_{t-1} + phi_k_t^T v_t (the RNN view; slow, for reference)."""
    B, H, N, M = fq.shape
    S = fq.new_zeros(B, H, M, v.shape[-1])                                    # [B, H, M, D]
    z = fq.new_zeros(B, H, M)                                                 # [B, H, M]
    outs = []
    for t in range(N):
        S = S + fk[:, :, t, :, None] * v[:, :, t, None, :]
        z = z + fk[:, :, t]
        num = torch.einsum("bhm,bhmd->bhd", fq[:, :, t], S)
        if normalize:
            den = (fq[:, :, t] * z).sum(-1, keepdim=True)
            num = (num / (t + 1)) / (den / (t + 1) + eps)
        outs.append(num)
    return torch.stack(outs, dim=2)


def linear_attention_bidirectional(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, normalize: bool = True,
                                   eps: float = 1e-6) -> torch.Tensor:
    """Associative order phi(q) (phi(k)^T v): O(N M D) time, O(M D) state per head."""
    n = fq.shape[-2]
    if not normalize:
        return fq @ (fk.transpose(-1, -2) @ v)
    kv = (fk.transpose(-1, -2) @ v) / n                                       # [B, H, M, D]
    z = fk.mean(-2, keepdim=True)                                             # [B, H, 1, M]
    den = fq @ z.transpose(-1, -2)                                            # [B, H, N, 1]
    return (fq @ kv) / (den + eps)


def linear_attention_chunked(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, normalize: bool = True,
                             eps: float = 1e-6, chunk_size: int = 64, initial_state=None, offset: int = 0,
                             output_final_state: bool = False):
    """Causal chunked form: masked quadratic attention inside each chunk plus the state carried from before it.

    ``initial_state = (S0 [B, H, M, D], z0 [B, H, M])`` continues a sequence whose first ``offset`` tokens made
    that state (positions, hence the counts c_t, continue from ``offset``). With ``output_final_state`` the
    result is ``(o, (S, z))``.
    """
    B, H, N, M = fq.shape
    D = v.shape[-1]
    C = max(1, min(chunk_size, N))
    pad = (-N) % C
    if pad:  # zero features contribute nothing to states or scores; the padded rows are dropped at the end
        fq, fk, v = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, v))
    n = (N + pad) // C
    fq = fq.reshape(B, H, n, C, M)
    fk = fk.reshape(B, H, n, C, M)
    vc = v.reshape(B, H, n, C, D)
    kv = fk.transpose(-1, -2) @ vc                                            # [B, H, n, M, D] per-chunk states
    S = kv.cumsum(2)                                                          # inclusive prefix over chunks
    S_before = F.pad(S[:, :, :-1], (0, 0, 0, 0, 1, 0))                        # state before each chunk
    if initial_state is not None:
        S_before = S_before + initial_state[0].unsqueeze(2)
    scores = (fq @ fk.transpose(-1, -2)).tril()                               # [B, H, n, C, C]
    num = fq @ S_before + scores @ vc                                         # [B, H, n, C, D]
    z_last = None
    if normalize or output_final_state:
        zk = fk.sum(-2)                                                       # [B, H, n, M]
        z = zk.cumsum(2)
        z_before = F.pad(z[:, :, :-1], (0, 0, 1, 0))
        if initial_state is not None:
            z_before = z_before + initial_state[1].unsqueeze(2)
        z_last = z_before[:, :, -1] + zk[:, :, -1]
    if normalize:
        den = fq @ z_before.unsqueeze(-1) + scores.sum(-1, keepdim=True)      # [B, H, n, C, 1]
        c = _counts(offset + n * C, True, num)[offset:].reshape(n, C, 1)
        num = (num / c) / (den / c + eps)
    out = num.reshape(B, H, n * C, D)[:, :, :N]
    if not output_final_state:
        return out
    S_last = S[:, :, -1] + (initial_state[0] if initial_state is not None else 0)
    return out, (S_last, z_last)


def _grad_needed(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def token_blocks(x: torch.Tensor, block_size: int) -> Callable[[int, int], torch.Tensor]:
    """``get(s, e) == x[:, :, s:e]`` for the blocks of :func:`linear_attention_blocked` (``s`` a multiple of
    ``block_size``), all cut by one ``split``: under autograd a slice per block costs a zero tensor of x's full
    size in the backward (and one add to accumulate it), a split one concatenation for all the blocks."""
    parts = x.split(block_size, dim=2)

    def get(s: int, e: int) -> torch.Tensor:
        part = parts[s // block_size]
        if s % block_size or part.shape[2] != e - s:
            raise ValueError(f"token_blocks: [{s}, {e}) is not a block of size {block_size}")
        return part
    return get


def linear_attention_blocked(map_q: Callable[[int, int], torch.Tensor | tuple[torch.Tensor, ...]],
                             map_k: Callable[[int, int], torch.Tensor], v: torch.Tensor, *, causal: bool = False,
                             normalize: bool = True, eps: float = 1e-6, chunk_size: int = 64,
                             block_size: int = 2048) -> torch.Tensor:
    """Linear attention whose feature maps are computed block by block and never held for the whole sequence.

    ``map_q(start, stop)`` / ``map_k(start, stop)`` return the features of tokens ``start:stop``
    (``[B, H, stop - start, M]``), for the blocks ``[i * block_size, min((i + 1) * block_size, N))`` (cut them
    with :func:`token_blocks`). Bidirectional: one pass over key blocks accumulates S and z, one pass over
    query blocks applies them. Causal: blocks run in order, each through the chunked form with the carried state.
    Same math as :func:`linear_attention`; the blocks keep the elementwise work in cache and the peak memory at
    the inputs, the output and O(block) temporaries.

    ``map_q`` may return a tuple of G query features: v's last dim is then split in G equal groups, group g is
    attended with the g-th query features against the shared keys, each group with its own normaliser, and the
    groups' outputs are concatenated (PolaFormer's two polarity streams).
    """
    n = v.shape[-2]
    bounds = [(s, min(s + block_size, n)) for s in range(0, n, block_size)]
    v_block = token_blocks(v, block_size)

    def queries(s, e):
        fq = map_q(s, e)
        return fq if isinstance(fq, tuple) else (fq,)

    if causal:
        states, outs = None, []
        for s, e in bounds:
            fqs, fk = queries(s, e), map_k(s, e)
            states = states or [None] * len(fqs)
            parts = []
            for g, (fq, vg) in enumerate(zip(fqs, v_block(s, e).chunk(len(fqs), dim=-1))):
                o, states[g] = linear_attention_chunked(fq, fk, vg, normalize=normalize, eps=eps,
                                                        chunk_size=chunk_size, initial_state=states[g], offset=s,
                                                        output_final_state=True)
                parts.append(o)
            outs.append(torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0])
        return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    grad = _grad_needed(v)
    kv, z = None, None
    for s, e in bounds:
        fk = map_k(s, e)                                                      # [B, H, b, M]
        grad = grad or _grad_needed(fk)
        kv_b = fk.transpose(-1, -2) @ v_block(s, e)                           # [B, H, M, D]  every group at once
        z_b = fk.sum(-2, keepdim=True)                                        # [B, H, 1, M]
        kv = kv_b if kv is None else (kv + kv_b if grad else kv.add_(kv_b))
        z = z_b if z is None else (z + z_b if grad else z.add_(z_b))
    if normalize:
        kv, z_col = kv / n, (z / n).transpose(-1, -2)                          # [B, H, M, D], [B, H, M, 1]
    outs = []
    for s, e in bounds:
        fqs = queries(s, e)
        parts = []
        for fq, kv_g in zip(fqs, kv.chunk(len(fqs), dim=-1)):
            num = fq @ kv_g                                                   # [B, H, b, D / G]
            if normalize:
                den = fq @ z_col                                              # [B, H, b, 1]
                num = num / (den + eps) if grad or _grad_needed(fq) else num.div_(den.add_(eps))
            parts.append(num)
        outs.append(torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0])
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def linear_attention(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                     normalize: bool = True, eps: float = 1e-6, chunk_size: int = 64) -> torch.Tensor:
    """Efficient linear attention: associative when bidirectional, chunked when causal."""
    if causal:
        return linear_attention_chunked(fq, fk, v, normalize=normalize, eps=eps, chunk_size=chunk_size)
    return linear_attention_bidirectional(fq, fk, v, normalize=normalize, eps=eps)
