"""Chunked causal linear attention over precomputed feature maps, normaliser in the same pass (Triton).

Inputs ``fq, fk: [B, H, N, M]`` (feature maps; M may differ from D, M <= 256), ``v: [B, H, N, D]`` (D <= 256).
With counts c_t = offset + t (t = 1..N, 1-based inside this call):

    S_t = S0 + sum_{i<=t} phi_k_i^T v_i            [M, D]        z_t = z0 + sum_{i<=t} phi_k_i     [M]
    normalize=True :  o_t = (phi_q_t . S_t / c_t) / (phi_q_t . z_t / c_t + eps)  =  num_t / r_t,
                      r_t = den_t + eps * c_t, or 1 where that is exactly 0 (every score 0: num_t = 0)
    normalize=False:  o_t = phi_q_t . S_t

eps defaults to 0: the papers' normalised linear attention (Katharopoulos et al. 2020, Eq. 9), no eps; a fixed
eps on the mean score is a released code's normaliser (NaLaFormer's 1e-6). This is exactly
``attnbench.ops.linear_attn.linear_attention_chunked`` (same eps, same zero guard) when S0 = z0 = 0 and
offset = 0. Continuing a sequence: pass the prefix's final state as ``initial_state`` and the
prefix length as ``offset``; the two calls then equal one call on the whole sequence.

Kernels (one program per (batch*head, block), sequential over chunks of ``chunk_size`` tokens):
  forward   grid (D/BV, M/BM, B*H): state S [BM, BV] and z [BM] in registers; intra-chunk masked scores
            phi_q phi_k^T. One feature tile (BM >= M) unless M is too wide for a program's registers; then each
            program sums over its BM features and the caller adds the partial numerators and denominators.
  backward  with r_t = den_t + eps c_t, dnum_t = do_t / r_t, dden_t = -(do_t . o_t) / r_t (normalize=False:
            dnum = do, dden = 0):
    dq_t = dnum_t S_t^T + dden_t z_t                         (forward sweep, grid (M/BK, B*H))
    dk_i = v_i dS_i^T + dz_i,  dS_i = dS_N + sum_{t>=i} phi_q_t^T dnum_t,  dz_i = dz_N + sum_{t>=i} dden_t phi_q_t
                                                             (reverse sweep, grid (M/BK, B*H); also dS0, dz0)
    dv_i = phi_k_i dS_i                                      (reverse sweep, grid (D/BV, M/BM, B*H), as forward)

Precision: states, r_t and the returned final state are float32; o and the input gradients come back in the
inputs' dtypes. float32 inputs use exact dots; float16 tiles are upcast and dotted in tf32 (float32 range: the
unnormalised scores and states of e.g. NaLa's |k|^3 features cannot overflow); bfloat16 tiles are dotted in
bfloat16 with float32 accumulation (the flash-linear-attention practice). Tile sizes: ``_tiles``.
"""

from __future__ import annotations

import torch

from . import _util
from ._util import check_launchable, check_shape, dot_precision, jit, pow2, tl

__all__ = ["chunk_linear_attn", "chunk_linear_attn_reference", "ChunkLinearAttnFunction"]

MAX_FEATURE = 256  # the forward / dv kernels hold all of M in a tile (or split it), the dq / dk kernels all of D


# ----------------------------------------------------------------------------------------------- reference


def chunk_linear_attn_reference(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, normalize: bool = True,
                                eps: float = 0.0, initial_state=None, output_final_state: bool = False,
                                offset: int = 0):
    """Plain PyTorch, quadratic in N, in the inputs' dtype: the ground truth of ``chunk_linear_attn``.

    Same arguments and returns as ``chunk_linear_attn`` (module docstring for the formula).
    """
    S0, z0 = _split_state(initial_state)
    n = fq.shape[-2]
    scores = (fq @ fk.transpose(-1, -2)).tril()                              # [B, H, N, N]
    num = scores @ v                                                         # [B, H, N, D]
    if S0 is not None:
        num = num + fq @ S0.to(fq.dtype)                                     # [B, H, N, D]
    if normalize:
        den = scores.sum(-1, keepdim=True)                                   # [B, H, N, 1]
        if z0 is not None:
            den = den + fq @ z0.to(fq.dtype).unsqueeze(-1)                   # [B, H, N, 1]
        c = torch.arange(offset + 1, offset + n + 1, device=fq.device, dtype=fq.dtype).unsqueeze(-1)  # [N, 1]
        r = den / c + eps                                                    # [B, H, N, 1]
        o = (num / c) / r.masked_fill(r == 0, 1.0)
    else:
        o = num
    if not output_final_state:
        return o, None
    S = fk.transpose(-1, -2) @ v                                             # [B, H, M, D]
    z = fk.sum(-2)                                                           # [B, H, M]
    if S0 is not None:
        S = S + S0.to(S.dtype)
    if z0 is not None:
        z = z + z0.to(z.dtype)
    return o, (S, z)


def _split_state(initial_state):
    if initial_state is None:
        return None, None
    if isinstance(initial_state, torch.Tensor):
        return initial_state, None
    if isinstance(initial_state, (tuple, list)) and len(initial_state) == 2:
        return initial_state[0], initial_state[1]
    raise TypeError("initial_state must be None, a tensor S0 [B, H, M, D] or a tuple (S0, z0 [B, H, M] or None), "
                    f"got {type(initial_state).__name__}")


# ----------------------------------------------------------------------------------------------- kernels
# Every tile is loaded in the layout its dot wants (k^T, v^T, do^T straight from memory, no tl.trans) and states
# are accumulated by tl.dot(a, b, acc). LOWP (bfloat16): dot operands stay bfloat16, fp32 accumulators are cast
# down for the dot, as flash-linear-attention does; otherwise every tile is upcast to float32 and PREC applies.


@jit
def _fwd_kernel(q, k, v, o, r, s0, z0, sT, zT, N, M, D, offset, eps,
                BT: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr, SPLIT: tl.constexpr, NORMALIZE: tl.constexpr,
                HAS_S0: tl.constexpr, HAS_Z0: tl.constexpr, LOWP: tl.constexpr, PREC: tl.constexpr):
    """o_t = (phi_q_t S_{t-1 chunk} + masked scores @ v) / r_t,  r_t = den_t + eps c_t; grid (D/BV, M/BM, B*H).
    SPLIT (M > BM): each program sums over its BM features only and stores its partial numerator (float32) and
    denominator in o[i_m], r[i_m] ([M/BM, B*H, N, D], [M/BM, B*H, N]); the caller adds them up and divides."""
    i_v, i_bh = tl.program_id(0), tl.program_id(2)
    bh = i_bh.to(tl.int64)
    offs_m = tl.arange(0, BM)
    slot = bh
    if SPLIT:                                                                # features [i_m BM, (i_m + 1) BM)
        i_m = tl.program_id(1)
        offs_m += i_m * BM
        slot += i_m.to(tl.int64) * tl.num_programs(2)                        # its partial sums' slot
    q += bh * N * M
    k += bh * N * M
    v += bh * N * D
    o += slot * N * D
    r += slot * N
    offs_t = tl.arange(0, BT)
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_m = offs_m < M
    mask_v = offs_v < D
    causal = offs_t[:, None] >= offs_t[None, :]                              # [BT, BT] (t, i): i <= t
    S = tl.zeros([BM, BV], dtype=tl.float32)                                 # [M, BV] state
    z = tl.zeros([BM], dtype=tl.float32)                                     # [M]
    if HAS_S0:
        S += tl.load(s0 + bh * M * D + offs_m[:, None] * D + offs_v[None, :],
                     mask=mask_m[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    if HAS_Z0:
        z += tl.load(z0 + bh * M + offs_m, mask=mask_m, other=0.0).to(tl.float32)
    for t0 in range(0, N, BT):
        rows = t0 + offs_t
        mask_t = rows < N
        bq = tl.load(q + rows[:, None] * M + offs_m[None, :], mask=mask_t[:, None] & mask_m[None, :], other=0.0)
        bkt = tl.load(k + rows[None, :] * M + offs_m[:, None], mask=mask_m[:, None] & mask_t[None, :], other=0.0)
        bv = tl.load(v + rows[:, None] * D + offs_v[None, :], mask=mask_t[:, None] & mask_v[None, :], other=0.0)
        if not LOWP:
            bq = bq.to(tl.float32)                                           # [BT, M]
            bkt = bkt.to(tl.float32)                                         # [M, BT] phi_k^T
            bv = bv.to(tl.float32)                                           # [BT, BV]
        A = tl.dot(bq, bkt, input_precision=PREC)                           # [BT, BT] scores
        A = tl.where(causal, A, 0.0)
        num = tl.dot(bq, S.to(bq.dtype), input_precision=PREC)              # [BT, BV] earlier chunks
        num = tl.dot(A.to(bv.dtype), bv, num, input_precision=PREC)         # + this chunk
        if NORMALIZE:
            den = tl.sum(A, axis=1) + tl.sum(bq.to(tl.float32) * z[None, :], axis=1)  # [BT]
            if SPLIT:                                                        # this tile's share of den_t
                tl.store(r + rows, den, mask=mask_t & (i_v == 0))
            else:
                rr = den + eps * (offset + rows + 1).to(tl.float32)          # [BT] r_t = den_t + eps c_t
                rr = tl.where(rr == 0.0, 1.0, rr)                            # exactly 0: every score 0, num 0
                num = num / rr[:, None]
                tl.store(r + rows, rr, mask=mask_t & (i_v == 0))
        z += tl.sum(bkt.to(tl.float32), axis=1)                              # [M]
        tl.store(o + rows[:, None] * D + offs_v[None, :], num.to(o.dtype.element_ty),
                 mask=mask_t[:, None] & mask_v[None, :])
        S = tl.dot(bkt, bv, S, input_precision=PREC)                         # [M, BV] += phi_k^T v
    tl.store(sT + bh * M * D + offs_m[:, None] * D + offs_v[None, :], S, mask=mask_m[:, None] & mask_v[None, :])
    tl.store(zT + bh * M + offs_m, z, mask=mask_m & (i_v == 0))


@jit
def _bwd_dq_kernel(k, v, do, r, dden, s0, z0, dq, N, M, D,
                   BT: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, NORMALIZE: tl.constexpr,
                   HAS_S0: tl.constexpr, HAS_Z0: tl.constexpr, LOWP: tl.constexpr, PREC: tl.constexpr):
    """dq_t = dnum_t S_t^T + dden_t z_t, forward sweep (S^T [D, BK] and z rebuilt from S0, z0); grid (M/BK, B*H)."""
    i_k, i_bh = tl.program_id(0), tl.program_id(1)
    bh = i_bh.to(tl.int64)
    k += bh * N * M
    dq += bh * N * M
    v += bh * N * D
    do += bh * N * D
    r += bh * N
    dden += bh * N
    offs_t = tl.arange(0, BT)
    offs_k = i_k * BK + tl.arange(0, BK)
    offs_d = tl.arange(0, BD)
    mask_k = offs_k < M
    mask_d = offs_d < D
    causal = offs_t[:, None] >= offs_t[None, :]                              # [BT, BT] (t, i): i <= t
    ST = tl.zeros([BD, BK], dtype=tl.float32)                                # [D, BK] S^T
    z = tl.zeros([BK], dtype=tl.float32)                                     # [BK]
    if HAS_S0:
        ST += tl.load(s0 + bh * M * D + offs_k[None, :] * D + offs_d[:, None],
                      mask=mask_k[None, :] & mask_d[:, None], other=0.0).to(tl.float32)
    if HAS_Z0:
        z += tl.load(z0 + bh * M + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    for t0 in range(0, N, BT):
        rows = t0 + offs_t
        mask_t = rows < N
        bk = tl.load(k + rows[:, None] * M + offs_k[None, :], mask=mask_t[:, None] & mask_k[None, :], other=0.0)
        bvt = tl.load(v + rows[None, :] * D + offs_d[:, None], mask=mask_d[:, None] & mask_t[None, :], other=0.0)
        dn = tl.load(do + rows[:, None] * D + offs_d[None, :], mask=mask_t[:, None] & mask_d[None, :],
                     other=0.0).to(tl.float32)                               # [BT, D]
        if not LOWP:
            bk = bk.to(tl.float32)                                           # [BT, BK]
            bvt = bvt.to(tl.float32)                                         # [D, BT] v^T
        if NORMALIZE:
            rr = tl.load(r + rows, mask=mask_t, other=1.0)                   # [BT]
            dd = tl.load(dden + rows, mask=mask_t, other=0.0)                # [BT]
            dn = dn / rr[:, None]                                            # dnum
        A = tl.dot(dn.to(bvt.dtype), bvt, input_precision=PREC)             # [BT, BT] dnum_t . v_i
        if NORMALIZE:
            A += dd[:, None]
        A = tl.where(causal, A, 0.0)
        bdq = tl.dot(dn.to(bk.dtype), ST.to(bk.dtype), input_precision=PREC)  # [BT, BK] earlier chunks
        bdq = tl.dot(A.to(bk.dtype), bk, bdq, input_precision=PREC)          # + this chunk
        if NORMALIZE:
            bdq += dd[:, None] * z[None, :]
        tl.store(dq + rows[:, None] * M + offs_k[None, :], bdq.to(dq.dtype.element_ty),
                 mask=mask_t[:, None] & mask_k[None, :])
        ST = tl.dot(bvt, bk, ST, input_precision=PREC)                       # [D, BK] += v^T phi_k
        z += tl.sum(bk.to(tl.float32), axis=0)                               # [BK]


@jit
def _bwd_dk_kernel(q, v, do, r, dden, dsT, dzT, dk, ds0, dz0, N, M, D,
                   BT: tl.constexpr, BK: tl.constexpr, BD: tl.constexpr, NORMALIZE: tl.constexpr,
                   HAS_DST: tl.constexpr, HAS_DZT: tl.constexpr, LOWP: tl.constexpr, PREC: tl.constexpr):
    """dk_i = v_i dS_i^T + dz_i, reverse sweep (dS^T [D, BK]); ends with dS0, dz0; grid (M/BK, B*H)."""
    i_k, i_bh = tl.program_id(0), tl.program_id(1)
    bh = i_bh.to(tl.int64)
    q += bh * N * M
    dk += bh * N * M
    v += bh * N * D
    do += bh * N * D
    r += bh * N
    dden += bh * N
    offs_t = tl.arange(0, BT)
    offs_k = i_k * BK + tl.arange(0, BK)
    offs_d = tl.arange(0, BD)
    mask_k = offs_k < M
    mask_d = offs_d < D
    anticausal = offs_t[:, None] <= offs_t[None, :]                          # [BT, BT] (i, t): t >= i
    dST = tl.zeros([BD, BK], dtype=tl.float32)                               # [D, BK] dS^T
    dz = tl.zeros([BK], dtype=tl.float32)                                    # [BK]
    if HAS_DST:
        dST += tl.load(dsT + bh * M * D + offs_k[None, :] * D + offs_d[:, None],
                       mask=mask_k[None, :] & mask_d[:, None], other=0.0).to(tl.float32)
    if HAS_DZT:
        dz += tl.load(dzT + bh * M + offs_k, mask=mask_k, other=0.0).to(tl.float32)
    NT = tl.cdiv(N, BT)
    for it in range(0, NT):
        rows = (NT - 1 - it) * BT + offs_t
        mask_t = rows < N
        bq = tl.load(q + rows[:, None] * M + offs_k[None, :], mask=mask_t[:, None] & mask_k[None, :], other=0.0)
        bv = tl.load(v + rows[:, None] * D + offs_d[None, :], mask=mask_t[:, None] & mask_d[None, :], other=0.0)
        dnt = tl.load(do + rows[None, :] * D + offs_d[:, None], mask=mask_d[:, None] & mask_t[None, :],
                      other=0.0).to(tl.float32)                              # [D, BT] do^T
        if not LOWP:
            bq = bq.to(tl.float32)                                           # [BT, BK]
            bv = bv.to(tl.float32)                                           # [BT, D]
        if NORMALIZE:
            rr = tl.load(r + rows, mask=mask_t, other=1.0)                   # [BT]
            dd = tl.load(dden + rows, mask=mask_t, other=0.0)                # [BT]
            dnt = dnt / rr[None, :]                                          # dnum^T
        At = tl.dot(bv, dnt.to(bv.dtype), input_precision=PREC)            # [BT(i), BT(t)] v_i . dnum_t
        if NORMALIZE:
            At += dd[None, :]
        At = tl.where(anticausal, At, 0.0)
        bdk = tl.dot(bv, dST.to(bv.dtype), input_precision=PREC)            # [BT, BK] later chunks, final state
        bdk = tl.dot(At.to(bq.dtype), bq, bdk, input_precision=PREC)        # + this chunk
        bdk += dz[None, :]
        tl.store(dk + rows[:, None] * M + offs_k[None, :], bdk.to(dk.dtype.element_ty),
                 mask=mask_t[:, None] & mask_k[None, :])
        dST = tl.dot(dnt.to(bq.dtype), bq, dST, input_precision=PREC)        # [D, BK] += dnum^T phi_q
        if NORMALIZE:
            dz += tl.sum(dd[:, None] * bq.to(tl.float32), axis=0)            # [BK]
    tl.store(ds0 + bh * M * D + offs_k[None, :] * D + offs_d[:, None], dST, mask=mask_k[None, :] & mask_d[:, None])
    tl.store(dz0 + bh * M + offs_k, dz, mask=mask_k)


@jit
def _bwd_dv_kernel(q, k, do, r, dsT, dv, N, M, D,
                   BT: tl.constexpr, BM: tl.constexpr, BV: tl.constexpr, SPLIT: tl.constexpr,
                   NORMALIZE: tl.constexpr, HAS_DST: tl.constexpr, LOWP: tl.constexpr, PREC: tl.constexpr):
    """dv_i = phi_k_i dS_i, reverse sweep (dS [M, BV] as in the dk kernel, blocked over D); grid (D/BV, M/BM, B*H).
    SPLIT (M > BM): each program sums over its BM features and stores its share in dv[i_m] ([M/BM, B*H, N, D],
    float32); the caller adds them up."""
    i_v, i_bh = tl.program_id(0), tl.program_id(2)
    bh = i_bh.to(tl.int64)
    offs_m = tl.arange(0, BM)
    slot = bh
    if SPLIT:                                                                # features [i_m BM, (i_m + 1) BM)
        i_m = tl.program_id(1)
        offs_m += i_m * BM
        slot += i_m.to(tl.int64) * tl.num_programs(2)                        # its share's slot
    q += bh * N * M
    k += bh * N * M
    do += bh * N * D
    dv += slot * N * D
    r += bh * N
    offs_t = tl.arange(0, BT)
    offs_v = i_v * BV + tl.arange(0, BV)
    mask_m = offs_m < M
    mask_v = offs_v < D
    anticausal = offs_t[:, None] <= offs_t[None, :]                          # [BT, BT] (i, t): t >= i
    dS = tl.zeros([BM, BV], dtype=tl.float32)                                # [M, BV]
    if HAS_DST:
        dS += tl.load(dsT + bh * M * D + offs_m[:, None] * D + offs_v[None, :],
                      mask=mask_m[:, None] & mask_v[None, :], other=0.0).to(tl.float32)
    NT = tl.cdiv(N, BT)
    for it in range(0, NT):
        rows = (NT - 1 - it) * BT + offs_t
        mask_t = rows < N
        bqt = tl.load(q + rows[None, :] * M + offs_m[:, None], mask=mask_m[:, None] & mask_t[None, :], other=0.0)
        bk = tl.load(k + rows[:, None] * M + offs_m[None, :], mask=mask_t[:, None] & mask_m[None, :], other=0.0)
        dn = tl.load(do + rows[:, None] * D + offs_v[None, :], mask=mask_t[:, None] & mask_v[None, :],
                     other=0.0).to(tl.float32)                               # [BT, BV]
        if not LOWP:
            bqt = bqt.to(tl.float32)                                         # [M, BT] phi_q^T
            bk = bk.to(tl.float32)                                           # [BT, M]
        if NORMALIZE:
            rr = tl.load(r + rows, mask=mask_t, other=1.0)                   # [BT]
            dn = dn / rr[:, None]                                            # dnum
        At = tl.dot(bk, bqt, input_precision=PREC)                          # [BT(i), BT(t)] scores^T
        At = tl.where(anticausal, At, 0.0)
        bdv = tl.dot(bk, dS.to(bk.dtype), input_precision=PREC)             # [BT, BV] later chunks, final state
        bdv = tl.dot(At.to(bk.dtype), dn.to(bk.dtype), bdv, input_precision=PREC)  # + this chunk
        tl.store(dv + rows[:, None] * D + offs_v[None, :], bdv.to(dv.dtype.element_ty),
                 mask=mask_t[:, None] & mask_v[None, :])
        dS = tl.dot(bqt, dn.to(bqt.dtype), dS, input_precision=PREC)        # [M, BV] += phi_q^T dnum


# ----------------------------------------------------------------------------------------------- autograd


# Live tile elements per program at 8 warps for bfloat16 tiles (half for tiles upcast to float32): no register
# spill on sm_80 or sm_90 at the presets' shapes (``attnbench check --aot``). Where all of M does not fit even with
# the smallest token and value tiles (M = 256 upcast to float32), the forward and dv kernels split M over programs
# of _SPLIT_FEATURES features each, at the smallest BT and BV: 128 features would sit at the 255-register limit
# (float32 with a normaliser and an initial state spills 16 B on sm_90), and so would 64 with BT = 32 (12 B);
# 64 features at BT = BV = 16 leave room (at most about 160 registers).
_TILE_BUDGET = 16384
_SPLIT_FEATURES = 64


def _shrink(footprint, sizes: dict, order: tuple, budget: int) -> dict:
    """Halve the largest tile size named in ``order`` (ties: the first; never below 16) until
    ``footprint(**sizes) <= budget``; the sizes not named stay."""
    sizes = dict(sizes)
    while footprint(**sizes) > budget:
        name = max((n for n in order if sizes[n] > 16), key=lambda n: sizes[n], default=None)
        if name is None:
            break
        sizes[name] //= 2
    return sizes


def _tiles(M: int, D: int, chunk_size: int, dtype: torch.dtype) -> tuple[dict, dict]:
    """Tiles and launch options of (forward and dv kernels, dq and dk kernels).

    BT (tokens per tile) starts at ``chunk_size``, the M / D tiles at 64; the largest is halved until the live tiles fit
    the register budget of a GPU program (checked by ``attnbench check --aot``). The forward and dv kernels hold all
    of M (BM) if that fits with the smallest BT and BV; else M is split over programs of ``_SPLIT_FEATURES``
    features at those smallest tiles, whose partial sums the caller adds (``SPLIT``: M = 256 upcast to float32,
    where one 256-wide tile spilled about 700 B of registers). A smaller tile or a split changes rounding only.
    Tiles upcast to float32 (float32, float16 inputs) get half the budget; float32 (exact dots, which a GPU runs
    as FMA loops) also runs unpipelined (num_stages=1)."""
    BM, BD = pow2(M), pow2(D)
    launch = dict(num_warps=8, num_stages=1 if dtype == torch.float32 else 2)
    budget = _TILE_BUDGET if dtype in _util.LOWP_DTYPES else _TILE_BUDGET // 2

    def fv_live(BT, BV, BM):                                                 # q, k, S, v, num, A
        return 2 * BT * BM + BM * BV + 2 * BT * BV + BT * BT

    fv = _shrink(fv_live, dict(BT=chunk_size, BV=min(BD, 64), BM=BM), ("BV", "BT"), budget)
    if fv_live(**fv) > budget:   # all of M does not fit one program even at BT = BV = 16: split M
        fv["BM"] = min(BM, _SPLIT_FEATURES)
    qk = _shrink(lambda BT, BK: 2 * BT * BK + 2 * BT * BD + BK * BD + BT * BT,   # k, dq, v, do, S, A
                 dict(BT=chunk_size, BK=min(BM, 64)), ("BK", "BT"), budget)
    return dict(fv, SPLIT=fv["BM"] < BM, **launch), dict(qk, BD=BD, **launch)


class ChunkLinearAttnFunction(torch.autograd.Function):
    """Autograd wrapper of the kernels: ``apply(fq, fk, v, S0, z0, normalize, eps, offset, chunk_size)`` returns
    ``(o [B, H, N, D] in v's dtype, S [B, H, M, D] fp32, z [B, H, M] fp32)``; S0/z0 may be None."""

    @staticmethod
    def forward(ctx, fq, fk, v, S0, z0, normalize: bool, eps: float, offset: int, chunk_size: int):
        B, H, N, M = fq.shape
        D = v.shape[-1]
        fq, fk, v = fq.contiguous(), fk.contiguous(), v.contiguous()
        S0c = S0.contiguous() if S0 is not None else None
        z0c = z0.contiguous() if z0 is not None else None
        t, _ = _tiles(M, D, chunk_size, fq.dtype)
        nm = _cdiv(M, t["BM"])                                               # feature tiles (> 1: SPLIT)
        if t["SPLIT"]:  # the programs' partial numerators and denominators, added up below
            o = torch.empty(nm, B, H, N, D, device=v.device, dtype=torch.float32)  # [NM, B, H, N, D]
            r = torch.empty(nm, B, H, N, device=v.device, dtype=torch.float32)     # [NM, B, H, N]
        else:
            o = torch.empty_like(v)                                          # [B, H, N, D]
            r = torch.empty(B, H, N, device=v.device, dtype=torch.float32)   # [B, H, N] den + eps c
        S = torch.empty(B, H, M, D, device=v.device, dtype=torch.float32)    # [B, H, M, D]
        z = torch.empty(B, H, M, device=v.device, dtype=torch.float32)       # [B, H, M]
        prec = dot_precision(fq.dtype)
        lowp = fq.dtype in _util.LOWP_DTYPES
        _fwd_kernel[(_cdiv(D, t["BV"]), nm, B * H)](
            fq, fk, v, o, r, S0c if S0c is not None else S, z0c if z0c is not None else z, S, z,
            N, M, D, offset, float(eps),
            BT=t["BT"], BM=t["BM"], BV=t["BV"], SPLIT=t["SPLIT"], NORMALIZE=normalize, HAS_S0=S0c is not None,
            HAS_Z0=z0c is not None, LOWP=lowp, PREC=prec, num_warps=t["num_warps"], num_stages=t["num_stages"])
        if t["SPLIT"]:  # as the unsplit kernel's epilogue: r_t = den_t + eps c_t (1 where exactly 0), o = num / r
            o = o.sum(0)                                                     # [B, H, N, D] numerator
            if normalize:
                c = torch.arange(offset + 1, offset + N + 1, device=v.device, dtype=torch.float32)   # [N]
                r = r.sum(0) + eps * c                                       # [B, H, N]
                r = torch.where(r == 0.0, 1.0, r)
                o = o / r.unsqueeze(-1)
            else:
                r = r[0]                                                     # unused (as unsplit)
            o = o.to(v.dtype)
        ctx.save_for_backward(fq, fk, v, o, r, S0c, z0c)
        ctx.meta = (normalize, chunk_size, S0 is not None, z0 is not None)
        return o, S, z

    @staticmethod
    def backward(ctx, do, dS, dz):
        fq, fk, v, o, r, S0, z0 = ctx.saved_tensors
        normalize, chunk_size, had_S0, had_z0 = ctx.meta
        B, H, N, M = fq.shape
        D = v.shape[-1]
        fv, qk = _tiles(M, D, chunk_size, fq.dtype)
        common = dict(PREC=dot_precision(fq.dtype), LOWP=fq.dtype in _util.LOWP_DTYPES, NORMALIZE=normalize,
                      num_warps=fv["num_warps"], num_stages=fv["num_stages"])
        do = do.contiguous()
        if normalize:  # dden_t = -(do_t . o_t) / r_t
            dden = -(do.float() * o.float()).sum(-1) / r                     # [B, H, N]
        else:
            dden = r                                                         # unused placeholder
        nm = _cdiv(M, fv["BM"])
        dq, dk = torch.empty_like(fq), torch.empty_like(fk)
        dv = torch.empty(nm, B, H, N, D, device=v.device, dtype=torch.float32) if fv["SPLIT"] else torch.empty_like(v)
        dS0 = torch.empty(B, H, M, D, device=v.device, dtype=torch.float32)  # [B, H, M, D]
        dz0 = torch.empty(B, H, M, device=v.device, dtype=torch.float32)     # [B, H, M]
        dSc = dS.contiguous() if dS is not None else None
        dzc = dz.contiguous() if dz is not None else None
        _bwd_dq_kernel[(_cdiv(M, qk["BK"]), B * H)](
            fk, v, do, r, dden, S0 if S0 is not None else dS0, z0 if z0 is not None else dz0, dq, N, M, D,
            BT=qk["BT"], BK=qk["BK"], BD=qk["BD"], HAS_S0=S0 is not None, HAS_Z0=z0 is not None, **common)
        _bwd_dk_kernel[(_cdiv(M, qk["BK"]), B * H)](
            fq, v, do, r, dden, dSc if dSc is not None else dS0, dzc if dzc is not None else dz0, dk, dS0, dz0,
            N, M, D, BT=qk["BT"], BK=qk["BK"], BD=qk["BD"], HAS_DST=dSc is not None, HAS_DZT=dzc is not None,
            **common)
        _bwd_dv_kernel[(_cdiv(D, fv["BV"]), nm, B * H)](
            fq, fk, do, r, dSc if dSc is not None else dS0, dv, N, M, D,
            BT=fv["BT"], BM=fv["BM"], BV=fv["BV"], SPLIT=fv["SPLIT"], HAS_DST=dSc is not None, **common)
        if fv["SPLIT"]:
            dv = dv.sum(0).to(v.dtype)                                       # [B, H, N, D] the tiles' shares
        gS0 = dS0.to(S0.dtype) if had_S0 else None
        gz0 = dz0.to(z0.dtype) if had_z0 else None
        return dq, dk, dv, gS0, gz0, None, None, None, None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------------------------------------- public entry


def chunk_linear_attn(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, *, normalize: bool = True,
                      eps: float = 0.0, initial_state=None, output_final_state: bool = False,
                      chunk_size: int = 64, offset: int = 0):
    """Causal linear attention, chunked Triton kernel, forward and backward (module docstring for the math).

    Args:
        fq, fk: feature maps phi(q), phi(k) ``[B, H, N, M]``, M <= 256.
        v: values ``[B, H, N, D]``, D <= 256. fq, fk, v share dtype (float32, float16, bfloat16) and device.
        normalize: divide by the normaliser phi_q_t . z_t, else the plain sum.
        eps: a fixed eps added to the mean score phi_q_t . z_t / c_t (default 0: none; module docstring).
        initial_state: None, ``S0 [B, H, M, D]``, or ``(S0, z0 [B, H, M] or None)``; missing parts are zeros.
        output_final_state: also return ``(S_N [B, H, M, D], z_N [B, H, M])`` in float32.
        chunk_size: tokens per chunk, a power of two >= 16 (changes rounding only, never the result); large M
            may get smaller kernel tiles (see ``_tiles``).
        offset: tokens already summarised by ``initial_state``; counts are c_t = offset + t.

    Returns:
        ``(o [B, H, N, D] in v's dtype, (S_N, z_N) or None)``.
    """
    name = "chunk_linear_attn"
    check_launchable(name, fq=fq, fk=fk, v=v)
    if fq.dim() != 4:
        raise ValueError(f"{name}: fq must be [B, H, N, M], got {list(fq.shape)}")
    B, H, N, M = fq.shape
    check_shape(name, "fk", fk, (B, H, N, M), "[B, H, N, M] like fq")
    if v.dim() != 4 or tuple(v.shape[:3]) != (B, H, N):
        raise ValueError(f"{name}: v must be [B, H, N, D] = [{B}, {H}, {N}, D], got {list(v.shape)}")
    D = v.shape[-1]
    if fk.dtype != fq.dtype or v.dtype != fq.dtype:
        raise TypeError(f"{name}: fq, fk, v must share a dtype, got {fq.dtype}, {fk.dtype}, {v.dtype}")
    if N == 0 or M == 0 or D == 0:
        raise ValueError(f"{name}: empty input: N={N}, M={M}, D={D}")
    if M > MAX_FEATURE:
        raise ValueError(f"{name}: feature size M = fq.shape[-1] = {M} > {MAX_FEATURE} (one tile holds all of M)")
    if D > MAX_FEATURE:
        raise ValueError(f"{name}: value size D = v.shape[-1] = {D} > {MAX_FEATURE} (one tile holds all of D)")
    if not isinstance(chunk_size, int) or chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"{name}: chunk_size must be a power of two >= 16, got {chunk_size!r}")
    if not isinstance(offset, int) or offset < 0:
        raise ValueError(f"{name}: offset must be an int >= 0, got {offset!r}")
    S0, z0 = _split_state(initial_state)
    if S0 is not None:
        check_launchable(name, fq=fq, initial_state=S0)
        check_shape(name, "initial_state[0] (S0)", S0, (B, H, M, D), "[B, H, M, D]")
    if z0 is not None:
        check_launchable(name, fq=fq, initial_state=z0)
        check_shape(name, "initial_state[1] (z0)", z0, (B, H, M), "[B, H, M]")
    o, S, z = ChunkLinearAttnFunction.apply(fq, fk, v, S0, z0, bool(normalize), float(eps), offset, chunk_size)
    return o, ((S, z) if output_final_state else None)
