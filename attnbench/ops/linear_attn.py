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
                             eps: float = 1e-6, chunk_size: int = 64) -> torch.Tensor:
    """Causal chunked form: masked quadratic attention inside each chunk plus the state carried from before it."""
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
    S = F.pad(kv.cumsum(2)[:, :, :-1], (0, 0, 0, 0, 1, 0))                    # state before each chunk
    scores = (fq @ fk.transpose(-1, -2)).tril()                               # [B, H, n, C, C]
    num = fq @ S + scores @ vc                                                # [B, H, n, C, D]
    if normalize:
        zk = fk.sum(-2)                                                       # [B, H, n, M]
        z = F.pad(zk.cumsum(2)[:, :, :-1], (0, 0, 1, 0)).unsqueeze(-1)        # [B, H, n, M, 1]
        den = fq @ z + scores.sum(-1, keepdim=True)                           # [B, H, n, C, 1]
        c = _counts(n * C, True, num).reshape(n, C, 1)
        num = (num / c) / (den / c + eps)
    return num.reshape(B, H, n * C, D)[:, :, :N]


def linear_attention(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                     normalize: bool = True, eps: float = 1e-6, chunk_size: int = 64) -> torch.Tensor:
    """Efficient linear attention: associative when bidirectional, chunked when causal."""
    if causal:
        return linear_attention_chunked(fq, fk, v, normalize=normalize, eps=eps, chunk_size=chunk_size)
    return linear_attention_bidirectional(fq, fk, v, normalize=normalize, eps=eps)
