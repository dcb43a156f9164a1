"""The delta rule (DeltaNet) and the gated delta rule (Gated DeltaNet), causal, with a token-by-token reference.

Layout is attnbench's ``[B, H, N, D]``: ``q, k: [B, H, N, Dk]``, ``v: [B, H, N, Dv]``, ``beta: [B, H, N]``,
``g: [B, H, N]`` (log-space decay) or ``None``; ``Dk`` may differ from ``Dv`` (a NaLa feature map gives
``Dk = 2d``). The state is kept as FLA keeps it, ``S: [B, H, Dk, Dv]`` (keys by values), so an
``initial_state`` or a final state passes to and from ``fla.ops`` unchanged.

The recurrence (DeltaNet: Yang et al., "Parallelizing Linear Transformers with the Delta Rule over Sequence
Length", NeurIPS 2024; Gated DeltaNet: Yang et al., "Gated Delta Networks: Improving Mamba2 with Delta Rule",
ICLR 2025; the form NaLaFormer plugs its feature maps into, NaLaFormer, arXiv 2506.21137, Table 5), written in the
papers' ``[Dv, Dk]`` orientation,

    S_t = a_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,        o_t = scale * S_t q_t,

with ``a_t = exp(g_t)`` (Gated DeltaNet) or ``a_t = 1`` (DeltaNet), is, in the ``[Dk, Dv]`` orientation used
here, its transpose

    S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,        o_t = scale * S_t^T q_t.

``scale`` defaults to ``Dk ** -0.5`` and multiplies q, FLA's convention (``fla/ops/*/naive.py``).

Forms behind :func:`delta_rule` (``impl=``):

- ``"recurrent"``: :func:`delta_rule_recurrent`, the recurrence above, one token at a time (ground truth).
- ``"torch"``: :func:`delta_rule_chunked`, the exact chunked WY / UT-transform form in plain PyTorch (forward
  and backward through autograd); every chunk's intra-chunk work is one batched matmul or triangular solve
  over all chunks at once, only the carry of the state from chunk to chunk is a loop.
- ``"fla"``: flash-linear-attention's Triton ``chunk_delta_rule`` / ``chunk_gated_delta_rule`` (CUDA only,
  fp16 / bf16 only).
- ``"auto"``: ``"fla"`` on CUDA, ``"torch"`` elsewhere; see :func:`resolve_delta_impl`.

Precision: the reference and the PyTorch chunked form compute in float64 when the inputs are float64 and in
float32 otherwise (fp16 / bf16 inputs are upcast, as FLA's kernels accumulate in fp32). ``o`` is returned in
v's dtype; the final state in that compute dtype (float32 for FLA, as FLA returns it).
"""

from __future__ import annotations

import functools
import numbers

import torch
import torch.nn.functional as F
from packaging.version import Version

from attnbench.ops.elementwise import exp_floored, grad_in_layout
from attnbench.ops.forms import IMPLS, compute_dtype, resolve_impl
from attnbench.ops.threads import one_thread
from attnbench.core.protocol import FLOAT_DTYPES, ShapeError, UnsupportedError, _describe, validate_tensors

DELTA_IMPLS = IMPLS
FLA_CHUNK_SIZES = (16, 32, 64)
FLA_MAX_KEY_DIM = 256   # FLA's chunk kernels refuse larger key heads ("head dimension larger than 256")


# ----------------------------------------------------------------------------------------------------------
# dispatch and validation
# ----------------------------------------------------------------------------------------------------------

def resolve_delta_impl(device: torch.device | str, impl: str = "auto") -> str:
    """The concrete form ``impl`` names on ``device`` (:func:`attnbench.ops.forms.resolve_impl`)."""
    return resolve_impl("delta_rule", device, impl)


# the FLA op behind each LM mixer whose backward FLA refuses on Hopper with Triton < 3.7.1
FLA_GATED_OPS = {"gated_deltanet": "chunk_gated_delta_rule", "retnet": "chunk_simple_gla"}


def fla_tilelang_usable() -> bool:
    """Whether FLA would route its gated backward to TileLang here: tilelang importable, a usable nvcc for its JIT,
    and ``FLA_TILELANG`` not ``0`` (FLA's own ``TileLangBackend.is_available`` / ``is_enabled``)."""
    import importlib.util
    import os

    if importlib.util.find_spec("tilelang") is None or os.environ.get("FLA_TILELANG", "1") == "0":
        return False
    try:
        from fla.utils import has_usable_nvcc
    except ImportError:  # an FLA without the helper: nvcc on PATH is what its TileLang needs
        import shutil

        return shutil.which("nvcc") is not None
    return bool(has_usable_nvcc())


def fla_gated_backward_refusal(device: torch.device | str, *, op: str = "chunk_gated_delta_rule",
                               capability: tuple[int, int] | None = None, triton_version: str | None = None,
                               tilelang: bool | None = None) -> str | None:
    """Why FLA will refuse the backward of its gated chunk kernel ``op`` on ``device``, as one line with its remedy
    (None: it will not). FLA raises inside its gated ``chunk_bwd_dqkwg`` (the backward of ``chunk_gated_delta_rule``,
    Gated DeltaNet, and of ``chunk_simple_gla``, RetNet) on Hopper GPUs with Triton >= 3.4.0 and < 3.7.1 (its issue
    640: wrong gradients there), unless its TileLang backend takes the call (:func:`fla_tilelang_usable`). That
    backend takes only states in the inputs' dtype, and ``chunk_simple_gla`` keeps its states in float32 in its
    backward, so TileLang lifts the refusal for Gated DeltaNet alone (read in FLA 0.6's code; not yet seen on a GPU).
    A run that FLA refuses would stop at its first step: runs check this before they start
    (:func:`attnbench.models.mixers.fla_refusal`). The keywords stand in for this machine's GPU, Triton and
    TileLang (tests)."""
    if torch.device(device).type != "cuda":
        return None
    if capability is None:
        if not torch.cuda.is_available():  # no GPU to ask: the run fails on CUDA itself, not here
            return None
        capability = torch.cuda.get_device_capability(device)
    if triton_version is None:
        try:
            import triton
        except ImportError:
            return None
        triton_version = triton.__version__
    if capability[0] != 9 or not Version("3.4.0") <= Version(triton_version) < Version("3.7.1"):
        return None
    if tilelang is None:
        tilelang = fla_tilelang_usable()
    if tilelang and op == "chunk_gated_delta_rule":
        return None
    lifted = (" (TileLang is installed, but FLA's TileLang backward takes only states in the inputs' dtype, and "
              "chunk_simple_gla keeps its states in float32)" if tilelang else " or tilelang with nvcc")
    return (f"FLA refuses the backward of {op} on Hopper (sm_{capability[0]}{capability[1]}) with Triton "
            f"{triton_version} (FLA issue 640: Triton >= 3.4.0 and < 3.7.1 computes those gradients wrongly): "
            f"training it stops at its first step; pip install 'triton>=3.7.1'" + lifted)


def _check_inputs(q, k, v, beta, g, scale, initial_state, chunk_size=None) -> None:
    """Clear errors naming the bad argument, before any einsum sees it."""
    name = "delta_rule"
    validate_tensors(q, k, v, name=name)
    B, H, N, _ = q.shape
    if tuple(k.shape) != tuple(q.shape):
        raise ShapeError(f"{name}: argument 'k' must match q's shape {tuple(q.shape)} [B, H, N, Dk], "
                         f"got {_describe(k)}")
    if tuple(v.shape[:3]) != (B, H, N):
        raise ShapeError(f"{name}: argument 'v' must be [B={B}, H={H}, N={N}, Dv], got {_describe(v)}")
    if B == 0 or N == 0 or H == 0:
        raise ShapeError(f"{name}: q, k, v need at least one batch element, head and token, got {_describe(q)}")
    for arg, t in (("beta", beta), ("g", g)):
        if t is None and arg == "g":
            continue
        if not isinstance(t, torch.Tensor):
            raise ShapeError(f"{name}: argument {arg!r} must be a torch.Tensor of shape [B={B}, H={H}, N={N}], "
                             f"got {type(t).__name__}")
        if tuple(t.shape) != (B, H, N):
            what = "one write strength per token" if arg == "beta" else "one log-space decay per token"
            raise ShapeError(f"{name}: argument {arg!r} must be [B={B}, H={H}, N={N}] ({what}), got {_describe(t)}")
        if t.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{name}: argument {arg!r} must be a floating tensor, got {_describe(t)}")
        if t.device != q.device:
            raise ShapeError(f"{name}: argument {arg!r} is on {t.device} but q is on {q.device}")
    if initial_state is not None:
        shape = (B, H, q.shape[-1], v.shape[-1])
        if not isinstance(initial_state, torch.Tensor):
            raise ShapeError(f"{name}: argument 'initial_state' must be a torch.Tensor of shape {shape} "
                             f"[B, H, Dk, Dv], got {type(initial_state).__name__}")
        if tuple(initial_state.shape) != shape:
            raise ShapeError(f"{name}: argument 'initial_state' must be [B, H, Dk, Dv] = {shape} (keys by values, "
                             f"FLA's orientation), got {_describe(initial_state)}")
        if initial_state.dtype not in FLOAT_DTYPES:
            raise ShapeError(f"{name}: argument 'initial_state' must be a floating tensor, "
                             f"got {_describe(initial_state)}")
        if initial_state.device != q.device:
            raise ShapeError(f"{name}: argument 'initial_state' is on {initial_state.device} but q is on {q.device}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, numbers.Real)):
        raise ShapeError(f"{name}: argument 'scale' must be a real number or None (default Dk ** -0.5), "
                         f"got {type(scale).__name__}")
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral)
                                   or chunk_size < 1):
        raise ShapeError(f"{name}: argument 'chunk_size' must be a positive integer, got {chunk_size!r}")


def _upper_mask(C: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[C, C]`` upper triangle incl. the diagonal, as 0/1 in ``dtype``; cached, never written. Under
    ``torch.compile`` built in the graph (a constant the compiler folds), not read from the cache: dynamo looks
    through ``lru_cache`` and warns of it at every compiled delta rule."""
    if torch.compiler.is_compiling():
        return _build_upper_mask(C, dtype, device)
    return _cached_upper_mask(C, dtype, device)


def _build_upper_mask(C: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.ones(C, C, dtype=torch.bool, device=device).triu().to(dtype)


_cached_upper_mask = functools.lru_cache(maxsize=32)(_build_upper_mask)


# ----------------------------------------------------------------------------------------------------------
# reference: one token at a time
# ----------------------------------------------------------------------------------------------------------

def delta_rule_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                         g: torch.Tensor | None = None, *, scale: float | None = None,
                         initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token (gated) delta rule, the ground truth of the chunked forms.

    ``S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`` and ``o_t = scale * S_t^T q_t`` with
    ``S: [B, H, Dk, Dv]`` and ``a_t = exp(g_t)`` (or 1 when ``g`` is None); see the module docstring.
    Returns ``(o [B, H, N, Dv] in v's dtype, S_N [B, H, Dk, Dv] or None)``.
    """
    _check_inputs(q, k, v, beta, g, scale, initial_state)
    B, H, N, Dk = q.shape
    Dv = v.shape[-1]
    cd, out_dtype = compute_dtype(q.dtype), v.dtype
    scale = Dk ** -0.5 if scale is None else float(scale)
    q, k, v, beta = (t.to(cd) for t in (q, k, v, beta))
    a = None if g is None else g.to(cd).exp()                                 # [B, H, N]
    S = (q.new_zeros(B, H, Dk, Dv) if initial_state is None
         else initial_state.to(cd))                                           # [B, H, Dk, Dv]
    outs = []
    for t in range(N):
        kt = k[:, :, t, :, None]                                              # [B, H, Dk, 1]
        bt = beta[:, :, t, None, None]                                        # [B, H, 1, 1]
        # (I - beta k k^T) S = S - beta k (k^T S)
        S = S - bt * kt * (kt.transpose(-1, -2) @ S)                          # [B, H, Dk, Dv]
        if a is not None:
            S = a[:, :, t, None, None] * S
        S = S + bt * kt * v[:, :, t, None, :]                                 # [B, H, Dk, Dv]
        outs.append(scale * (q[:, :, t, None, :] @ S).squeeze(-2))            # [B, H, Dv]
    o = torch.stack(outs, dim=2)                                              # [B, H, N, Dv]
    return o.to(out_dtype), (S if output_final_state else None)


# ----------------------------------------------------------------------------------------------------------
# exact chunked form (WY / UT transform), plain PyTorch
# ----------------------------------------------------------------------------------------------------------

def delta_rule_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                       g: torch.Tensor | None = None, *, scale: float | None = None,
                       initial_state: torch.Tensor | None = None, output_final_state: bool = False,
                       chunk_size: int = 64, block_bytes: int = 1 << 20) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact chunked (gated) delta rule: the WY representation of each chunk via a UT transform.

    Within a chunk of C tokens with state S_0 on entry, cumulative log-gates ``G_i = g_1 + ... + g_i`` and
    ``D_ij = exp(G_i - G_j)`` (all ones without a gate), the recurrence of :func:`delta_rule_recurrent` unrolls
    to ``S_i = e^{G_i} S_0 + sum_{j <= i} D_ij k_j delta_j^T``, where the "new values"
    ``delta_i = beta_i (v_i - a_i S_{i-1}^T k_i)`` satisfy the unit lower-triangular system

        (I + L) Delta = diag(beta) (V - diag(e^G) K S_0),    L_ij = beta_i (k_i . k_j) D_ij  (j < i),

    i.e. ``Delta = U - W S_0`` with ``A = (I + L)^{-1}``, ``U = A diag(beta) V``, ``W = A diag(beta e^G) K`` (the
    WY representation / UT transform of DeltaNet's chunkwise form). Here beta is moved inside the triangular
    matrix so that no right-hand side needs scaling: with ``L'_ij = (k_i . beta_j k_j) D_ij``
    (``= L_ij beta_j / beta_i``, though no division is ever done) ``Delta = diag(beta) Delta'`` and

        [Y_V, Y_K] = (I + L')^{-1} [V, diag(e^G) K]                 (batched triangular solves)
        Delta'     = Y_V - Y_K S_0
        O          = scale * (diag(e^G) Q S_0 + lower(Q (beta K)^T * D) Delta')
        S_C        = e^{G_C} S_0 + (diag(beta e^{G_C - G}) K)^T Delta'.

    The sequence is streamed in blocks of whole chunks (``block_bytes`` per ``[B*H, block, D]`` slice, at least
    4 chunks): within a block everything but the S_0 -> S_C carry is one batched call over its chunks of all
    heads, and the carry is a loop over chunks of two small matmuls (never over tokens). Blocks keep every
    temporary small, so it stays in cache and the allocator reuses it instead of faulting in fresh pages on
    each call (whole-sequence batching makes temporaries large enough to be mapped and faulted in afresh
    every time), and memory beyond the inputs and output does not grow with N. N need not be a multiple of C:
    the tail is padded with k = v = beta = g = 0 tokens, which leave the state unchanged (a = 1, nothing
    written). A sequence of one chunk that starts from no state and returns none (a recall-tiny step) takes
    :func:`_delta_one_chunk`, the same output without the state's products.
    On a CPU the batched triangular solve runs on one thread (:func:`attnbench.ops.threads.one_thread`: set and
    restored inside this call, the same on every machine; LAPACK solves the small matrices one by one, each too
    small to share), the rest on the run's threads.
    Shapes and return value as :func:`delta_rule_recurrent`.
    """
    _check_inputs(q, k, v, beta, g, scale, initial_state, chunk_size)
    if isinstance(block_bytes, bool) or not isinstance(block_bytes, numbers.Integral) or block_bytes < 1:
        raise ShapeError(f"delta_rule_chunked: argument 'block_bytes' must be a positive integer, "
                         f"got {block_bytes!r}")
    B, H, N, Dk = q.shape
    Dv = v.shape[-1]
    cd, out_dtype = compute_dtype(q.dtype), v.dtype
    scale = Dk ** -0.5 if scale is None else float(scale)
    # the forms multiply by q^T and k^T: their gradients go back in the inputs' own layout (see grad_in_layout)
    q, k, v = (grad_in_layout(t.to(cd)) for t in (q, k, v))
    if N <= chunk_size and initial_state is None and not output_final_state:
        o = _delta_one_chunk(q, k, v, beta.to(cd), None if g is None else g.to(cd), scale)
        return o.to(out_dtype), None
    C = min(int(chunk_size), N)
    pad = (-N) % C
    n = (N + pad) // C
    BH = B * H

    beta = beta.to(cd)
    if g is not None:
        g = g.to(cd)
    if pad:  # padded tokens have k = v = beta = g = 0: a = 1 and nothing written, so S passes through unchanged
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
        beta = F.pad(beta, (0, pad))
        if g is not None:
            g = F.pad(g, (0, pad))
    S = (q.new_zeros(BH, Dk, Dv) if initial_state is None
         else initial_state.to(cd).reshape(BH, Dk, Dv))                       # [BH, Dk, Dv]
    track = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k, v, beta, g, S))
    per_chunk = BH * C * max(Dk, Dv) * q.element_size()
    chunks = max(4, int(block_bytes) // per_chunk)                            # chunks per block
    o = None if track else q.new_empty(BH, n, C, Dv)                          # [BH, n, C, Dv]
    outs = []
    # the blocks cut by one split per input (under autograd a slice per block would cost a full-size zero
    # tensor in the backward, each)
    blocks = zip(*(t.split(chunks * C, dim=2) for t in (q, k, v, beta)),
                 g.split(chunks * C, dim=2) if g is not None else [None] * n)
    for c0, (qb, kb, vb, bb, gb) in zip(range(0, n, chunks), blocks):
        c1 = min(n, c0 + chunks)
        o_blk, S = _delta_block(qb, kb, vb, bb, gb, S, scale, C, track)
        o_blk = o_blk.reshape(c1 - c0, BH, C, Dv).transpose(0, 1)         # [BH, m, C, Dv]
        if track:
            outs.append(o_blk)
        else:
            o[:, c0:c1] = o_blk
    if track:
        o = torch.cat(outs, dim=1)                                            # [BH, n, C, Dv]
    o = o.reshape(B, H, n * C, Dv)[:, :, :N]                                  # [B, H, N, Dv]
    final = S.reshape(B, H, Dk, Dv) if output_final_state else None           # [B, H, Dk, Dv]
    return o.to(out_dtype), final


def _decays_transposed(G: torch.Tensor) -> torch.Tensor:
    """``[.., C]`` cumulative log-gates of a chunk -> ``DT [.., C, C]``, ``DT_ji = D_ij = exp(G_i - G_j)`` for
    ``j <= i``, else 0, built transposed like ``LT``. The lower triangle is zeroed *before* the exp and again after
    it, so no inf ever meets a 0, forward or backward; the floored exp keeps strong decays off ATen's slow
    underflow path."""
    upper = _upper_mask(G.shape[-1], G.dtype, G.device)                       # [C, C]  1 where j <= i
    return exp_floored((G[..., None, :] - G[..., :, None]).mul_(upper)) * upper


def _unit_upper_inverse(LT: torch.Tensor) -> torch.Tensor:
    """``X = (I + LT)^{-1}`` for a batch of strictly upper ``LT [.., C, C]`` (the transpose of ``(I + L')^{-1}``),
    by LAPACK's trsm: ``X (I + LT) = I`` this way round reaches its column-major layout without a transposing copy;
    ``unitriangular=True`` supplies the unit diagonal, so LT's diagonal and lower triangle are never read. On one
    thread (:func:`attnbench.ops.threads.one_thread`: LAPACK solves the small matrices one by one, each too small
    to share between threads); the matmul with the inverse then runs on the run's threads. Inverse + matmul beat
    solving for the right-hand sides (benchmarks/bench_delta_rule.py); FLA's chunk forms also invert ``I + L``."""
    C = LT.shape[-1]
    with one_thread(LT.device.type == "cpu"):
        return torch.linalg.solve_triangular(LT, torch.eye(C, dtype=LT.dtype, device=LT.device).expand_as(LT),
                                             upper=True, left=False, unitriangular=True)


def _chunk_major(x: torch.Tensor, C: int) -> torch.Tensor:
    """``[B, H, m*C, ...]`` -> ``[m*B*H, C, ...]``, chunk by chunk (one copy): chunk c's heads are rows c*BH..."""
    B, H, T = x.shape[:3]
    m = T // C
    return x.reshape(B * H, m, C, *x.shape[3:]).transpose(0, 1).reshape(m * B * H, C, *x.shape[3:])


def _delta_block(q, k, v, beta, g, S, scale: float, C: int, track: bool):
    """One block of whole chunks of :func:`delta_rule_chunked`, carrying ``S [BH, Dk, Dv]`` in and out.

    Every tensor is chunk-major (``[m*BH, C, ...]``, chunk c in rows ``c*BH:(c+1)*BH``), so the carry loop
    reads and writes contiguous slices: a matmul into a strided slice costs several times one into a contiguous
    block on a CPU. Returns ``(o [m*BH, C, Dv] chunk-major, S_out [BH, Dk, Dv])``. With ``track`` (autograd) the
    loop works out of place; without it, in place into buffers private to this call.
    """
    BH, Dk, Dv = S.shape
    m = q.shape[2] // C
    qc = _chunk_major(q, C)                                                   # [m BH, C, Dk]
    # v and k side by side in one chunk-major buffer: the triangular solve then takes both right-hand sides in
    # one call (at C = 64 a LAPACK call's fixed cost per matrix is much of its time)
    vk = q.new_empty(m, BH, C, Dv + Dk)
    vk[..., :Dv] = v.reshape(BH, m, C, Dv).transpose(0, 1)
    vk[..., Dv:] = k.reshape(BH, m, C, Dk).transpose(0, 1)
    vk = vk.view(m * BH, C, Dv + Dk)                                          # [m BH, C, Dv + Dk]
    vc, kc = vk[..., :Dv], vk[..., Dv:]                                       # [m BH, C, Dv], [.., Dk]
    kb = kc * _chunk_major(beta, C).unsqueeze(-1)                            # [m BH, C, Dk]  beta_j k_j
    LT = torch.bmm(kb, kc.transpose(-1, -2))                                  # [m BH, C, C]  LT_ji = k_i . beta_j k_j
    PT = torch.bmm(kb, qc.transpose(-1, -2))                                  # [m BH, C, C]  PT_ji = q_i . beta_j k_j
    if g is None:
        # keep j <= i; a multiply by a cached 0/1 mask is much cheaper than triu_ here (values are finite)
        P = PT.mul_(_upper_mask(C, PT.dtype, PT.device)).transpose(-1, -2)   # [m BH, C, C]  j <= i
        rhs = vk                                                              # [V, K]
        a_c = None
    else:
        G = _chunk_major(g, C).cumsum(-1)                                     # [m BH, C]  G_i in the chunk
        DT = _decays_transposed(G)                                            # [m BH, C, C]
        LT = LT.mul_(DT)                                                      # [m BH, C, C]  L'^T
        P = PT.mul_(DT).transpose(-1, -2)                                     # [m BH, C, C]  j <= i
        eG = exp_floored(G).unsqueeze(-1)                                     # [m BH, C, 1]  e^{G_i}
        rhs = torch.cat([vc, kc * eG], dim=-1)                                # [V, diag(e^G) K]
        qc = qc * eG                                                          # [m BH, C, Dk]  e^{G_i} q_i
        GC = G[:, -1:]                                                        # [m BH, 1]  G_C
        kb = kb * exp_floored(GC - G).unsqueeze(-1)                           # [m BH, C, Dk]  beta_j e^{G_C-G_j} k_j
        a_c = exp_floored(GC).reshape(m, BH, 1, 1)                            # [m, BH, 1, 1]  e^{G_C} per chunk
    # [Y_V, Y_K] = (I + L')^{-1} [V, diag(e^G) K] = X^T R, by one matmul on the run's threads
    X = _unit_upper_inverse(LT)                                               # [m BH, C, C]
    Y = torch.bmm(X.transpose(-1, -2), rhs).reshape(m, BH, C, Dv + Dk)          # [m, BH, C, Dv + Dk]
    YV, YK = Y[..., :Dv], Y[..., Dv:]                                         # [m, BH, C, Dv], [.., Dk]
    kbT = kb.reshape(m, BH, C, Dk).transpose(-1, -2)                          # [m, BH, Dk, C]
    # the only sequential part, the S_0 -> S_C carry: Delta' = Y_V - Y_K S_0, S_C = e^{G_C} S_0 + kb^T Delta'
    if track:
        # per-chunk operands by unbind, not indexing: the backward of an index fills a zero tensor of the whole
        # block for each chunk, unbind's stacks the chunks' gradients once
        ds, ss = [], [S]
        gates = a_c.unbind(0) if a_c is not None else [None] * m
        for yv, yk, kt, a in zip(YV.unbind(0), YK.unbind(0), kbT.unbind(0), gates):
            d = torch.baddbmm(yv, yk, S, alpha=-1.0)                          # [BH, C, Dv]  Delta'
            S = (S if a is None else S * a).baddbmm(kt, d)                    # [BH, Dk, Dv]  S_C
            ds.append(d)
            ss.append(S)
        delta, states = torch.stack(ds), torch.stack(ss)                      # [m, BH, C, Dv], [m+1, BH, Dk, Dv]
    else:
        delta = YV.contiguous()                                               # [m, BH, C, Dv]  becomes Delta'
        states = S.new_empty(m + 1, BH, Dk, Dv)                               # [m+1, BH, Dk, Dv]  S on chunk entry
        states[0] = S
        for c in range(m):
            d = delta[c].baddbmm_(YK[c], states[c], alpha=-1.0)               # [BH, C, Dv]  Delta'
            s = states[c + 1].copy_(states[c])                                # [BH, Dk, Dv]
            if a_c is not None:
                s.mul_(a_c[c])                                                # e^{G_C} S_0
            s.baddbmm_(kbT[c], d)                                             # S_C
    # O = scale * (Q S_0 + P Delta') for every chunk of the block at once
    o = torch.bmm(qc, states[:m].reshape(m * BH, Dk, Dv))                     # [m BH, C, Dv]
    o = o.baddbmm_(P, delta.reshape(m * BH, C, Dv), beta=scale, alpha=scale)  # [m BH, C, Dv]
    return o, states[m]


def _delta_one_chunk(q, k, v, beta, g, scale: float) -> torch.Tensor:
    """:func:`delta_rule_chunked` when the sequence is one chunk and starts from no state (a recall-tiny step):
    with ``S_0 = 0`` the chunk's output is ``O = scale * P Y_V`` alone (``Delta' = Y_V``), so the keys' half of
    the solve's right-hand side, the products with the zero state and the state after the chunk are not
    computed. ``[B, H, N, D]`` in, ``o [B, H, N, Dv]`` out. Its gradients equal the chunked form's to rounding,
    not to the bit: that form's backward also sums zeros from the keys' half and the unused final state (which
    reach ``beta k`` first, in a transposed layout, so beta's gradient sums its terms in another order)."""
    B, H, N, Dk = q.shape
    Dv = v.shape[-1]
    qc, kc, vc = q.reshape(B * H, N, Dk), k.reshape(B * H, N, Dk), v.reshape(B * H, N, Dv)
    kb = kc * beta.reshape(B * H, N, 1)                                      # [BH, N, Dk]  beta_j k_j
    LT = torch.bmm(kb, kc.transpose(-1, -2))                                  # [BH, N, N]  LT_ji = k_i . beta_j k_j
    PT = torch.bmm(kb, qc.transpose(-1, -2))                                  # [BH, N, N]  PT_ji = q_i . beta_j k_j
    if g is None:
        P = PT.mul_(_upper_mask(N, PT.dtype, PT.device)).transpose(-1, -2)   # [BH, N, N]  j <= i
    else:
        DT = _decays_transposed(g.reshape(B * H, N).cumsum(-1))               # [BH, N, N]
        LT = LT.mul_(DT)
        P = PT.mul_(DT).transpose(-1, -2)                                     # [BH, N, N]  j <= i
    X = _unit_upper_inverse(LT)                                               # [BH, N, N]
    YV = torch.bmm(X.transpose(-1, -2), vc)                                   # [BH, N, Dv]  Delta'
    o = torch.bmm(P, YV).mul_(scale)                                          # [BH, N, Dv]
    return o.reshape(B, H, N, Dv)


# ----------------------------------------------------------------------------------------------------------
# FLA's Triton kernels (CUDA)
# ----------------------------------------------------------------------------------------------------------

def _delta_rule_fla(q, k, v, beta, g, *, scale, initial_state, output_final_state, chunk_size):
    """FLA's ``chunk_delta_rule`` / ``chunk_gated_delta_rule``: [B, H, N, D] -> [B, T, H, D] once, and back."""
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise UnsupportedError(
            f"delta_rule: impl='fla' runs FLA's Triton kernels, which take bfloat16 or float16 only; got q, k, v "
            f"in {str(q.dtype).replace('torch.', '')}. Cast q, k, v to torch.bfloat16, or use impl='torch' "
            f"(exact chunked PyTorch form, any float dtype)")
    if chunk_size not in FLA_CHUNK_SIZES:
        raise UnsupportedError(f"delta_rule: impl='fla' takes chunk_size in {FLA_CHUNK_SIZES}, got {chunk_size}")
    if q.shape[-1] > FLA_MAX_KEY_DIM:
        raise UnsupportedError(f"delta_rule: impl='fla' takes key heads of at most {FLA_MAX_KEY_DIM}, got "
                               f"{q.shape[-1]}; use smaller heads (an LM with NaLa: key_width=match) or impl='torch'")
    try:
        if g is None:
            from fla.ops.delta_rule import chunk_delta_rule
        else:
            from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as e:  # pragma: no cover - depends on the install
        raise UnsupportedError(f"delta_rule: impl='fla' needs flash-linear-attention "
                               f"(pip install flash-linear-attention): {e}") from e
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))                      # [B, N, H, D]
    bt = beta.to(q.dtype).transpose(1, 2)                                     # [B, N, H]
    h0 = None if initial_state is None else initial_state.float()             # [B, H, Dk, Dv]
    if g is None:
        o, final = chunk_delta_rule(qt, kt, vt, bt, scale=scale, initial_state=h0,
                                    output_final_state=output_final_state, chunk_size=chunk_size)
    else:
        gt = g.float().transpose(1, 2)                                        # [B, N, H]  log-space
        o, final = chunk_gated_delta_rule(qt, kt, vt, gt, bt, scale=scale, initial_state=h0,
                                          output_final_state=output_final_state, chunk_size=chunk_size)
    o = o.transpose(1, 2)                                                     # [B, H, N, Dv]
    return o.to(v.dtype), (final if output_final_state else None)


# ----------------------------------------------------------------------------------------------------------
# the entry point
# ----------------------------------------------------------------------------------------------------------

def delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
               g: torch.Tensor | None = None, *, scale: float | None = None,
               initial_state: torch.Tensor | None = None, output_final_state: bool = False,
               impl: str = "auto", chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(Gated) delta rule ``S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``, ``o_t = scale S_t^T q_t``.

    Args:
        q, k: ``[B, H, N, Dk]``; v: ``[B, H, N, Dv]``; beta: ``[B, H, N]`` write strengths (usually in (0, 1));
        g: ``[B, H, N]`` log-space decays ``a_t = exp(g_t)`` (Gated DeltaNet) or None (DeltaNet).
        scale: multiplies q; default ``Dk ** -0.5`` (FLA's convention).
        initial_state: ``[B, H, Dk, Dv]`` (FLA's keys-by-values orientation) or None (zeros).
        output_final_state: also return ``S_N: [B, H, Dk, Dv]``.
        impl: ``"auto"`` | ``"recurrent"`` | ``"torch"`` | ``"fla"``; see :func:`resolve_delta_impl`.
        chunk_size: chunk length of the chunked forms (FLA takes 16, 32 or 64).

    Returns ``(o [B, H, N, Dv] in v's dtype, final state or None)``. For stability keep ``beta ||k||^2 <= 2``
    (L2-normalise k, beta in (0, 1)); the forms agree for any input, but the recurrence itself blows up otherwise.
    """
    _check_inputs(q, k, v, beta, g, scale, initial_state, chunk_size)
    resolved = resolve_delta_impl(q.device, impl)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    kw = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    if resolved == "recurrent":
        return delta_rule_recurrent(q, k, v, beta, g, **kw)
    if resolved == "torch":
        return delta_rule_chunked(q, k, v, beta, g, chunk_size=chunk_size, **kw)
    return _delta_rule_fla(q, k, v, beta, g, chunk_size=chunk_size, **kw)


__all__ = ["DELTA_IMPLS", "delta_rule", "delta_rule_chunked", "delta_rule_recurrent", "resolve_delta_impl"]
