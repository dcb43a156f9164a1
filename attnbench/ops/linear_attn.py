"""Linear attention over precomputed feature maps, bidirectional and causal, with a naive reference each.

All functions take ``fq, fk: [B, H, N, M]`` (feature maps, M may differ from the value size) and
``v: [B, H, N, D]`` and return ``[B, H, N, D]``.

With ``normalize=True`` the output is the papers' normalised linear attention (Katharopoulos et al. 2020, Eq. 6;
causal, Eq. 9), with no eps:

    o_t = (phi_q_t . S_t / c_t) / (phi_q_t . z_t / c_t),   S_t = sum_{i in I_t} phi_k_i^T v_i,
                                                         z_t = sum_{i in I_t} phi_k_i,

where I_t is every token (bidirectional) or i <= t (causal) and c_t = |I_t| (the means keep states in the
features' range; c_t cancels). The only guard is for a denominator that is exactly zero, which for non-negative
scores means every score is zero and so is the numerator (an all-zero ReLU query): it is replaced by 1, so the
output is 0 and its gradients finite (:func:`safe_den`). Nothing else moves the output: it equals the formula to
rounding wherever the formula is defined, and scaling the query or key features by any constant (within the
dtype's range) changes nothing, so Performer's tiny mean scores need no special care. (A guard proportional to
the Cauchy-Schwarz bound ``||phi_q|| ||z / c||`` was not negligible where the features are non-negative and
nearly orthogonal: the bound then exceeds the score by orders of magnitude.)

``eps`` (default 0) adds a fixed eps to the mean score, ``den_t / c_t + eps``: the released NaLaFormer code's
normaliser (``1 / (q . mean(k) + 1e-6)``), which ``nala:sign_split=true`` reproduces; no paper's formula has one.
With ``normalize=False`` the output is the plain sum ``phi_q_t . S_t`` (SteLLA scales it by constants instead).

Key features may carry a log-scale (``linear_attention_blocked``: ``map_k`` returning ``(fk, shift)``): the true
features are ``fk * exp(shift)``; since the output does not depend on a common scale of the keys, only the
relative scales of the blocks matter (Performer's exponential features stay in range that way).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F


def _counts(n: int, causal: bool, like: torch.Tensor) -> torch.Tensor:
    """c_t of the module docstring, shaped [N, 1] to broadcast over [B, H, N, 1]."""
    if causal:
        return torch.arange(1, n + 1, device=like.device, dtype=like.dtype).unsqueeze(-1)
    return torch.full((n, 1), float(n), device=like.device, dtype=like.dtype)


class Permuted(NamedTuple):
    """G query feature sets that are the columns of one tensor in G orders: group g's features are
    ``features[..., perms[g]]`` (PolaFormer's same-sign and opposite-sign streams are ``[q+, q-]`` and
    ``[q-, q+]``). :func:`linear_attention_blocked` permutes the small state instead of the features:
    ``fq[..., p] @ S == fq @ S[p^-1]``, so every group comes out of one matmul with one feature tensor."""

    features: torch.Tensor                  # [B, H, b, M]
    perms: tuple[torch.Tensor, ...]         # G index tensors [M]


def safe_den(den: torch.Tensor, eps: float = 0.0, inplace: bool = False) -> torch.Tensor:
    """The divisor of the module docstring: the mean score ``den`` (``+ eps``), an exactly zero one replaced by 1
    (its numerator is 0 too, so the output is 0 and the gradient through the divisor is 0, as autograd gives for
    ``where``). ``inplace``: modify ``den`` (no gradient needed)."""
    if eps:
        den = den.add_(eps) if inplace else den + eps
    return den.masked_fill_(den == 0, 1.0) if inplace else den.masked_fill(den == 0, 1.0)


def normalise(num: torch.Tensor, den: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """``num / safe_den(den, eps)`` (``num, den`` already divided by the counts). In place on ``num`` and ``den``
    when no gradient is needed."""
    if _grad_needed(num, den):
        return num / safe_den(den, eps)
    return num.div_(safe_den(den, eps, inplace=True))


def linear_attention_reference(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                               normalize: bool = True, eps: float = 0.0) -> torch.Tensor:
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
    return (num / c) / safe_den(den / c, eps)


def linear_attention_recurrent(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, normalize: bool = True,
                               eps: float = 0.0) -> torch.Tensor:
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
            num = (num / (t + 1)) / safe_den(den / (t + 1), eps)
        outs.append(num)
    return torch.stack(outs, dim=2)


def linear_attention_bidirectional(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, normalize: bool = True,
                                   eps: float = 0.0) -> torch.Tensor:
    """Associative order phi(q) (phi(k)^T v): O(N M D) time, O(M D) state per head."""
    n = fq.shape[-2]
    if not normalize:
        return fq @ (fk.transpose(-1, -2) @ v)
    kv = (fk.transpose(-1, -2) @ v) / n                                       # [B, H, M, D]
    z = fk.mean(-2, keepdim=True)                                             # [B, H, 1, M]
    den = fq @ z.transpose(-1, -2)                                            # [B, H, N, 1]
    return normalise(fq @ kv, den, eps)


def linear_attention_chunked(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, normalize: bool = True,
                             eps: float = 0.0, chunk_size: int = 64, initial_state=None, offset: int = 0,
                             output_final_state: bool = False):
    """Causal chunked form: masked quadratic attention inside each chunk plus the state carried from before it.

    ``initial_state = (S0 [B, H, M, D], z0 [B, H, M])`` continues a sequence whose first ``offset`` tokens made
    that state (positions, hence the counts c_t, continue from ``offset``). With ``output_final_state`` the
    result is ``(o, (S, z))``.
    """
    B, H, N, M = fq.shape
    D = v.shape[-1]
    C = max(1, min(chunk_size, N))
    if C == N and initial_state is None and not output_final_state:
        return _one_chunk(fq, fk, v, normalize, eps, offset)
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
        c = _counts(offset + n * C, True, num)[offset:].reshape(n, C, 1)
        den = fq @ z_before.unsqueeze(-1) + scores.sum(-1, keepdim=True)      # [B, H, n, C, 1]
        num = normalise(num / c, den / c, eps)
    out = num.reshape(B, H, n * C, D)[:, :, :N]
    if not output_final_state:
        return out
    S_last = S[:, :, -1] + (initial_state[0] if initial_state is not None else 0)
    return out, (S_last, z_last)


def _one_chunk(fq, fk, v, normalize, eps, offset):
    """:func:`linear_attention_chunked` when the sequence is one chunk and starts from no state: its masked
    quadratic part alone. The chunked form would add the chunk's state ``fk^T v``, its prefix sums and the
    product of the queries with the zero state before it, all exactly zero in the output (``x + 0 == x``), so
    this is the same numbers for less work (at 64 tokens the state's matmul costs as much as the scores')."""
    scores = (fq @ fk.transpose(-1, -2)).tril()                               # [B, H, N, N]
    num = scores @ v                                                          # [B, H, N, D]
    if not normalize:
        return num
    c = _counts(offset + fq.shape[-2], True, num)[offset:]                    # [N, 1]
    den = scores.sum(-1, keepdim=True)                                        # [B, H, N, 1]
    return normalise(num / c, den / c, eps)


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


def scratch_map(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], block: Callable[[int, int], torch.Tensor],
                shape: Callable[[torch.Tensor], tuple] = lambda x: x.shape) -> Callable[[int, int], torch.Tensor]:
    """``map(s, e) = fn(block(s, e), buffer)``, every block into one buffer of ``shape(block)`` (grown as needed),
    for inference passes that consume each block before asking for the next (:func:`linear_attention_blocked`)."""
    buf = None

    def get(s: int, e: int) -> torch.Tensor:
        nonlocal buf
        x = block(s, e)
        if buf is None or buf.shape[2] < x.shape[2]:
            buf = x.new_empty(shape(x))
        return fn(x, buf[:, :, :x.shape[2]])
    return get


def linear_attention_blocked(map_q: Callable[[int, int], torch.Tensor | tuple[torch.Tensor, ...]],
                             map_k: Callable[[int, int], torch.Tensor], v: torch.Tensor, *, causal: bool = False,
                             normalize: bool = True, eps: float = 0.0, chunk_size: int = 64,
                             block_size: int = 2048, scale: torch.Tensor | float | None = None) -> torch.Tensor:
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

    Bidirectional only, ``map_k`` may return ``(fk, shift)`` with ``shift [B, H, 1, 1]`` (detached): the block's true
    features are ``fk * exp(shift)``. The running sums are kept at the largest shift seen so far, rescaled as it
    grows (as an online softmax does), so exponential features never leave the float range and never need a
    second pass for a global maximum; the output does not depend on the common scale (module docstring).
    Without a gradient the output is written block by block into one preallocated tensor.

    ``scale`` (bidirectional, ``normalize=False`` only): a scalar multiplying the output, applied to the
    ``[M, D]`` state instead of the ``[N, D]`` output (SteLLA's constant scales).
    """
    if scale is not None and (causal or normalize):
        raise ValueError("linear_attention_blocked: 'scale' is for the bidirectional unnormalised form only")
    return _blocked(map_q, map_k, v, causal, normalize, eps, chunk_size, block_size, scale)


def _blocked(map_q, map_k, v, causal, normalize, eps, chunk_size, block_size, scale):
    n = v.shape[-2]
    bounds = [(s, min(s + block_size, n)) for s in range(0, n, block_size)]
    v_block = token_blocks(v, block_size)

    def queries(s, e):
        fq = map_q(s, e)
        if isinstance(fq, Permuted):
            return tuple(fq.features[..., p] for p in fq.perms)
        return fq if isinstance(fq, tuple) else (fq,)

    if causal:
        states, outs = None, []
        for s, e in bounds:
            fqs, fk = queries(s, e), map_k(s, e)
            if isinstance(fk, tuple):
                raise ValueError("linear_attention_blocked: log-scaled key blocks (fk, shift) are bidirectional only")
            states = states or [None] * len(fqs)
            more = e < n                                                      # the state only for a next block
            parts = []
            for g, (fq, vg) in enumerate(zip(fqs, v_block(s, e).chunk(len(fqs), dim=-1))):
                o = linear_attention_chunked(fq, fk, vg, normalize=normalize, eps=eps, chunk_size=chunk_size,
                                             initial_state=states[g], offset=s, output_final_state=more)
                if more:
                    o, states[g] = o
                parts.append(o)
            outs.append(torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0])
        return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    # bidirectional: one pass over key blocks accumulates [S | z] (and a common log-scale), one over query blocks
    B, H, _, D = v.shape
    grad = _grad_needed(v)
    kv = c = None
    for s, e in bounds:
        fk, shift = _split_shift(map_k(s, e))                                 # [B, H, b, M], [B, H, 1, 1] or None
        grad = grad or _grad_needed(fk)
        kv_b = fk.transpose(-1, -2) @ v_block(s, e)                           # [B, H, M, D]  every group at once
        if normalize:
            kv_b = torch.cat([kv_b, fk.sum(-2).unsqueeze(-1)], dim=-1)        # [B, H, M, D + 1]  [S | z]
        if kv is None:
            kv, c = kv_b, shift
        elif shift is None:
            kv = kv + kv_b if grad else kv.add_(kv_b)
        else:  # both to the larger log-scale: every factor <= 1, nothing overflows
            new = torch.maximum(c, shift)
            a, b = torch.exp(c - new), torch.exp(shift - new)                 # [B, H, 1, 1]
            kv = kv * a + kv_b * b if grad else kv.mul_(a).add_(kv_b.mul_(b))
            c = new
    if scale is not None:
        kv = kv * scale
        grad = grad or _grad_needed(kv)                                       # a learnable scale (SteLLA)
    if normalize:
        kv = kv / n                                                           # [B, H, M, D + 1]  [S | z] / n
    out = None
    outs = []

    def out_view(s, e):
        nonlocal out
        if out is None:
            out = v.new_empty(B, H, n, D)                                     # written block by block
        return out[:, :, s:e]
    pstate = None                                                             # the state for Permuted queries
    for s, e in bounds:
        fq = map_q(s, e)
        if isinstance(fq, Permuted):
            if pstate is None:
                pstate = _permuted_state(kv, fq.perms, D, normalize)          # [B, H, M, D (+ G)]
            part = _permuted_block(fq.features, pstate, len(fq.perms), D, normalize, eps,
                                   None if grad or _grad_needed(fq.features) else out_view(s, e))
            if part is not None:
                outs.append(part)
            continue
        fqs = fq if isinstance(fq, tuple) else (fq,)
        G, Dg = len(fqs), D // len(fqs)
        grad_q = grad or _grad_needed(*fqs)
        if out is None and not grad_q:
            out = v.new_empty(B, H, n, D)                                     # written block by block
        parts = []
        for g, fq in enumerate(fqs):
            kv_g = kv[..., g * Dg:(g + 1) * Dg]                               # [B, H, M, D / G]
            if not normalize:
                if grad_q:
                    parts.append(fq @ kv_g)                                   # [B, H, b, D / G]
                else:
                    torch.matmul(fq, kv_g, out=out[:, :, s:e, g * Dg:(g + 1) * Dg])
                continue
            nd = fq @ torch.cat([kv_g, kv[..., D:]], dim=-1) if G > 1 else fq @ kv  # [B, H, b, D/G + 1]
            num, den = nd[..., :Dg], nd[..., Dg:]
            if grad_q:
                parts.append(normalise(num, den, eps))
            else:  # straight into the output: no per-block concatenation afterwards
                torch.div(num, safe_den(den, eps, inplace=True), out=out[:, :, s:e, g * Dg:(g + 1) * Dg])
        if grad_q:
            outs.append(torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0])
    if out is not None and not outs:
        return out
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def _permuted_state(kv, perms, D, normalize):
    """``[S_0[p_0^-1] | ... | z[p_0^-1] | ...]``: group g's value columns (and normaliser column) with the rows in
    the inverse of group g's feature order, ``[B, H, M, D (+ G)]``."""
    G, Dg = len(perms), D // len(perms)
    inv = [torch.argsort(p) for p in perms]
    cols = [kv[..., inv[g], g * Dg:(g + 1) * Dg] for g in range(G)]
    if normalize:
        cols += [kv[..., inv[g], D:] for g in range(G)]
    return torch.cat(cols, dim=-1)


def _permuted_block(fq, pstate, G, D, normalize, eps, out):
    """One query block of :class:`Permuted` features against the permuted state: one matmul for all groups.
    Written into ``out`` (a view of the output) and None returned, or returned when ``out`` is None (autograd)."""
    Dg = D // G
    nd = fq @ pstate                                                          # [B, H, b, D (+ G)]
    if not normalize:
        if out is None:
            return nd
        out.copy_(nd)
        return None
    if out is None:
        return torch.cat([normalise(nd[..., g * Dg:(g + 1) * Dg], nd[..., D + g:D + g + 1], eps)
                          for g in range(G)], dim=-1)
    den = safe_den(nd[..., D:], eps, inplace=True)                            # [B, H, b, G]
    for g in range(G):
        torch.div(nd[..., g * Dg:(g + 1) * Dg], den[..., g:g + 1], out=out[..., g * Dg:(g + 1) * Dg])
    return None


def _split_shift(fk):
    """``(features, log-scale or None)`` of what a ``map_k`` returned (see :func:`linear_attention_blocked`)."""
    if isinstance(fk, tuple):
        return fk[0], fk[1].detach()
    return fk, None


def linear_attention(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                     normalize: bool = True, eps: float = 0.0, chunk_size: int = 64) -> torch.Tensor:
    """Efficient linear attention: associative when bidirectional, chunked when causal."""
    if causal:
        return linear_attention_chunked(fq, fk, v, normalize=normalize, eps=eps, chunk_size=chunk_size)
    return linear_attention_bidirectional(fq, fk, v, normalize=normalize, eps=eps)


class TokenMap(NamedTuple):
    """A per-token feature map for :func:`linear_attention_recomputed`: ``phi(x, start)`` gives the features
    ``[B, H, b, M]`` of the tokens ``start : start + b`` (``x [B, H, b, D]``), differentiably; a token's features
    depend on the token, its position and parameters, never on other tokens. ``vjp(x, feats, dfeats) -> dx``
    (optional, for maps without parameters): the gradient by hand, no autograd; it may overwrite ``feats`` and
    ``dfeats``. For a cheap map it pays: per block, autograd's graph, its bookkeeping and fresh temporaries cost
    about as much as the map itself."""

    phi: Callable[[torch.Tensor, int], torch.Tensor]
    vjp: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None


def linear_attention_recomputed(phi_q: TokenMap, phi_k: TokenMap, q: torch.Tensor,
                                k: torch.Tensor, v: torch.Tensor, *, tensors: tuple[torch.Tensor, ...] = (),
                                normalize: bool = True, eps: float = 0.0, block_size: int = 2048,
                                scale: torch.Tensor | float | None = None,
                                inference_maps: tuple[Callable, Callable] | None = None,
                                perms: tuple[torch.Tensor, ...] | None = None) -> torch.Tensor:
    """Bidirectional :func:`linear_attention_blocked` of per-token feature maps, with a hand-written backward
    that recomputes each block's features instead of storing them.

    ``phi_q`` / ``phi_k`` (:class:`TokenMap`) map the tokens of q / k block by block; ``tensors``: what they close
    over that may need a gradient (parameters, or tensors computed from them); a map's hand-written ``vjp`` is
    used when none of them does. ``inference_maps`` (optional): the ``(map_q, map_k)`` of
    :func:`linear_attention_blocked` to use in the forward (in-place maps into reused buffers). ``perms``
    (optional, G index tensors ``[M]``): G query streams as in :class:`Permuted`, group g's query features
    ``phi_q[..., perms[g]]`` attending to v's g-th group of columns with its own normaliser (PolaFormer); the
    rows of the small state are permuted instead of the features. Same output and
    same gradients as the autograd path; what it saves is the autograd graph over the blocks: no per-block
    nodes, no feature tensors kept for the whole sequence (what the backward keeps beyond q, k, v and the output
    is S and z, O(M D)), and the gradients of q, k, v written block by block into one tensor each instead of
    concatenated. It pays for cheap maps and costs for a map with an MLP, whose recomputation redoes the MLP
    (Hedgehog keeps autograd); ``benchmarks/bench_fast_paths.py --backward-gain`` measures the gain per mechanism.

    Backward (normalised), for ``num = phi_q S / n``, ``den = phi_q z / n``, ``o = num r``, ``r = 1 / safe_den(den,
    eps)`` (module docstring) and the output's gradient G: ``d num = G r``, ``d den = -(G . o) r`` (0 where den is
    exactly 0: the divisor is a constant 1 there); ``d phi_q = d num (S / n)^T + d den (z / n)^T``;
    ``d S = phi_q^T d num / n``, ``d z = phi_q^T d den / n``; ``d phi_k = v dS^T + dz^T``, ``d v = phi_k dS``; then
    through each map, block by block (by hand or autograd).
    """
    if scale is not None and normalize:
        raise ValueError("linear_attention_recomputed: 'scale' is for the unnormalised form only")
    if not isinstance(scale, torch.Tensor) and scale is not None:
        scale = torch.tensor(float(scale), dtype=v.dtype, device=v.device)
    if perms is not None and v.shape[-1] % len(perms):
        raise ValueError(f"linear_attention_recomputed: v's last dim {v.shape[-1]} does not split into "
                         f"{len(perms)} groups")
    groups = None if perms is None else _Groups(perms)
    return _Recomputed.apply((phi_q, phi_k, inference_maps, normalize, eps, block_size, groups),
                             q, k, v, scale, *tensors)


class _Groups:
    """G query streams whose features are one tensor's columns in G orders (:class:`Permuted`): the state's rows
    are permuted per group, ``S_g = S[inv_g, group g's columns]``, ``z_g = z[inv_g]`` (``inv_g`` the inverse of
    ``perms[g]``), so that ``phi[..., perms[g]] @ S[:, cols_g] == phi @ S_g``; the gradients go back the same way."""

    def __init__(self, perms):
        self.perms = perms
        self.inv = [torch.argsort(p) for p in perms]

    def state(self, S, z):
        """``(S_p [.., M, D], z_p [.., M, G])``: every group's rows in its query order."""
        Dg = S.shape[-1] // len(self.perms)
        S_p = torch.cat([S[..., inv, g * Dg:(g + 1) * Dg] for g, inv in enumerate(self.inv)], -1)
        z_p = None if z is None else torch.cat([z[..., inv, :] for inv in self.inv], -1)
        return S_p, z_p

    def unpermute(self, dS_p, dz_p):
        """The gradients of S and z from those of ``S_p`` and ``z_p``."""
        Dg = dS_p.shape[-1] // len(self.perms)
        dS = torch.cat([dS_p[..., p, g * Dg:(g + 1) * Dg] for g, p in enumerate(self.perms)], -1)
        dz = None if dz_p is None else sum(dz_p[..., p, g:g + 1] for g, p in enumerate(self.perms))
        return dS, dz


class _Recomputed(torch.autograd.Function):
    # S [B, H, M, D] and z [B, H, M, 1] are kept apart (not [S | z]): matmuls with 65 columns, or with the
    # transpose of a [M, 65] view, are markedly slower than with 64 in the CPU BLAS.
    @staticmethod
    def forward(ctx, cfg, q, k, v, scale, *tensors):
        phi_q, phi_k, inference_maps, normalize, eps, block_size, groups = cfg
        B, H, n, D = v.shape
        if inference_maps is not None:
            map_q, map_k = inference_maps
        else:
            map_q, map_k = (lambda s, e: phi_q.phi(q[:, :, s:e], s)), (lambda s, e: phi_k.phi(k[:, :, s:e], s))
        S = z = None
        for s, e in _bounds(n, block_size):
            fk = map_k(s, e)                                                  # [B, H, b, M]
            S_b = fk.transpose(-1, -2) @ v[:, :, s:e]                         # [B, H, M, D]
            S = S_b if S is None else S.add_(S_b)
            if normalize:
                z_b = fk.sum(-2).unsqueeze(-1)                                # [B, H, M, 1]
                z = z_b if z is None else z.add_(z_b)
        Sq, zq = _query_state(S, z, n, scale)
        if groups is not None:
            Sq, zq = groups.state(Sq, zq)                                     # [B, H, M, D], [B, H, M, G]
        G = 1 if groups is None else len(groups.perms)
        out = v.new_empty(B, H, n, D)
        for s, e in _bounds(n, block_size):
            fq = map_q(s, e)
            if not normalize:
                torch.matmul(fq, Sq, out=out[:, :, s:e])
                continue
            den = safe_den(fq @ zq, eps, inplace=True)                        # [B, H, b, G] mean score
            torch.div((fq @ Sq).unflatten(-1, (G, D // G)), den.unsqueeze(-1),
                      out=out[:, :, s:e].unflatten(-1, (G, D // G)))
        ctx.cfg = cfg
        ctx.save_for_backward(q, k, v, scale, S, z, out if normalize else None, *tensors)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        phi_q, phi_k, _, normalize, eps, block_size, groups = ctx.cfg
        q, k, v, scale, S, z, out, *tensors = ctx.saved_tensors
        n, D = v.shape[-2:]
        G = 1 if groups is None else len(groups.perms)
        need_q, need_k, need_v, need_scale = ctx.needs_input_grad[1:5]
        need_t = ctx.needs_input_grad[5:]
        wrt_t = [t for t, need in zip(tensors, need_t) if need]
        grad_t = [None] * len(wrt_t)
        grad = grad.contiguous()
        dq = torch.empty_like(q) if need_q else None
        dk = torch.empty_like(k) if need_k else None
        dv = torch.empty_like(v) if need_v else None

        def features(tmap, x, s, e, need_x):
            """(the block's features, None or ``vjp(dfeats, dx_out)``: dx into dx_out, the tensors' gradients
            accumulated)."""
            xb = x[:, :, s:e]
            if not (need_x or wrt_t):
                return tmap.phi(xb, s), None
            if tmap.vjp is not None and not wrt_t:  # by hand
                feats = tmap.phi(xb, s)
                return feats, (lambda dfeats, dx_out: dx_out.copy_(tmap.vjp(xb, feats, dfeats)))
            xg = xb.detach().requires_grad_(need_x)
            with torch.enable_grad():
                feats = tmap.phi(xg, s)

            def vjp(dfeats, dx_out):  # by autograd over this block alone
                grads = torch.autograd.grad(feats, ([xg] if need_x else []) + wrt_t, dfeats, allow_unused=True)
                if need_x:
                    dx_out.copy_(grads[0])
                    grads = grads[1:]
                for i, gt in enumerate(grads):
                    if gt is not None:
                        grad_t[i] = gt if grad_t[i] is None else grad_t[i] + gt
            return feats.detach(), vjp

        Sq, zq = _query_state(S, z, n, scale)
        Sp, zp = (Sq, zq) if groups is None else groups.state(Sq, zq)        # [B, H, M, D], [B, H, M, G]
        dSp = torch.zeros_like(Sp)
        if normalize:
            dzp = torch.zeros_like(zp)
        for s, e in _bounds(n, block_size):                                   # query blocks
            fq, vjp = features(phi_q, q, s, e, need_q)
            gb = grad[:, :, s:e]
            if normalize:  # r = 1 / den again from the features (the forward's may differ by a per-token
                # factor that cancels in the output: inference maps may leave it out)
                den = (fq @ zp).add_(eps)                                     # [B, H, b, G]
                zero = den == 0
                r = den.masked_fill_(zero, 1.0).reciprocal_()                 # 1 / safe_den
                dden = (gb * out[:, :, s:e]).unflatten(-1, (G, D // G)).sum(-1).mul_(r).neg_()  # [B, H, b, G]
                dden.masked_fill_(zero, 0.0)
                dnum = gb * r if G == 1 else (gb.unflatten(-1, (G, D // G)) * r.unsqueeze(-1)).flatten(-2)
                dzp.add_(fq.transpose(-1, -2) @ dden)
            else:
                dnum = gb
            dSp.add_(fq.transpose(-1, -2) @ dnum)
            if vjp is not None:
                dfq = dnum @ Sp.transpose(-1, -2)                             # [B, H, b, M]
                if normalize:  # the mean score's z
                    dfq.add_(dden * zp.transpose(-1, -2) if G == 1 else dden @ zp.transpose(-1, -2))
                vjp(dfq, dq[:, :, s:e] if need_q else None)
        dSq, dzq = (dSp, dzp if normalize else None) if groups is None else \
            groups.unpermute(dSp, dzp if normalize else None)
        dscale = None
        if normalize:
            dS, dz = dSq.div_(n), dzq.div_(n).transpose(-1, -2)               # [B, H, M, D], [B, H, 1, M]
        elif scale is not None:
            dscale = (dSq * S).sum().reshape(scale.shape) if need_scale else None
            dS = dSq.mul_(scale)
        else:
            dS = dSq
        for s, e in _bounds(n, block_size):                                   # key blocks
            fk, vjp = features(phi_k, k, s, e, need_k)
            if need_v:
                dv[:, :, s:e] = fk @ dS
            if vjp is not None:
                dfk = v[:, :, s:e] @ dS.transpose(-1, -2)                     # [B, H, b, M]
                vjp(dfk.add_(dz) if normalize else dfk, dk[:, :, s:e] if need_k else None)
        grads_t = iter(grad_t)
        return (None, dq, dk, dv, dscale, *[next(grads_t) if need else None for need in need_t])


def _bounds(n: int, block_size: int) -> list[tuple[int, int]]:
    return [(s, min(s + block_size, n)) for s in range(0, n, block_size)]


def _query_state(S, z, n, scale):
    """What the queries multiply: ``(S / n, z / n)`` normalised, ``(S * scale, None)`` (or S) unnormalised."""
    if z is not None:
        return S / n, z / n
    return (S * scale if scale is not None else S), None
