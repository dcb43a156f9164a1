"""Performer / FAVOR+ (Choromanski et al., ICLR 2021): softmax attention through positive orthogonal random
features, bidirectional and causal."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from attnbench.ops import linear_attn as la
from attnbench.core.protocol import AttnbenchError
from attnbench.attention.base import Attention, FeatureMap

PAPER = "Choromanski et al. 2021 (Rethinking Attention with Performers, ICLR)"


def orthogonal_gaussian(m: int, d: int, seed: int) -> torch.Tensor:
    """``[m, d]`` orthogonal random features (FAVOR+ Sec. 2.4): blocks of d exactly orthogonal directions
    (Haar, by QR of a Gaussian matrix with R's diagonal made positive), each row rescaled to the norm of an
    independent d-dim Gaussian vector so every row is marginally ``N(0, I_d)``. Drawn in float64 on the CPU
    from a private generator: the same ``seed`` gives the same matrix everywhere, whatever the global RNG."""
    g = torch.Generator().manual_seed(seed)
    blocks = []
    for _ in range(-(-m // d)):
        qm, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
        blocks.append((qm * torch.sign(torch.diagonal(r))).T)                 # [d, d] orthonormal rows
    w = torch.cat(blocks)[:m]                                                 # [m, d]
    norms = torch.randn(m, d, generator=g, dtype=torch.float64).norm(dim=1)   # [m] chi_d
    return w * norms[:, None]


class PerformerFeatureMap(FeatureMap):
    """Positive random features (FAVOR+, Lemma 1 / Eq. 7 with h(x) = exp(-|x|^2 / 2), f = exp):

    ``phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m)``, ``x' = x D^-1/4``, so that
    ``E[phi(q) . phi(k)] = exp(q . k / sqrt(D))``, the softmax kernel of scaled dot-product attention.

    ``W: [m, D]`` (``m = features``) are orthogonal random features drawn once at build from ``seed`` and kept as
    a registered buffer: saved in the state dict, moved by ``.to()``, never trained and never redrawn (the
    paper's periodic redrawing is not done). ``phi`` here is the unbiased, *unstabilised* estimator; the
    attention subtracts maxima before the exponential (see :class:`PerformerAttention`).
    """

    name = "performer"
    paper = PAPER

    def __init__(self, *, heads, head_dim, causal=False, features: int = 128, seed: int = 0):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal)
        if not isinstance(features, int) or features < 1:
            raise AttnbenchError(f"performer: option 'features' must be a positive int, got {features!r}")
        if not isinstance(seed, int):
            raise AttnbenchError(f"performer: option 'seed' must be an int, got {seed!r}")
        self.features, self.seed = features, seed
        self.register_buffer("projection", orthogonal_gaussian(features, head_dim, seed).float())  # [m, D]

    @property
    def feature_dim(self) -> int:
        return self.features

    def scaled_projection(self, dtype: torch.dtype) -> tuple[torch.Tensor, float]:
        """``(W^T D^-1/4 [D, m], -1 / (2 sqrt(D)))``: :meth:`logits` is ``x W' + half |x|^2`` with these."""
        return self.projection.to(dtype).T * self.head_dim ** -0.25, -0.5 * self.head_dim ** -0.5

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The exponent ``W x' - |x'|^2 / 2``: ``[B, H, N, D] -> [B, H, N, m]``."""
        x = x * self.head_dim ** -0.25                                        # [B, H, N, D]
        w = self.projection.to(x.dtype)                                       # [m, D]
        return x @ w.T - 0.5 * (x * x).sum(-1, keepdim=True)                  # [B, H, N, m]

    def phi(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.logits(x)) / math.sqrt(self.features)           # [B, H, N, m]


def _logits(x: torch.Tensor, w: torch.Tensor, half: float) -> torch.Tensor:
    """``x w + half |x|^2`` (:meth:`PerformerFeatureMap.logits` with the scale folded into ``w``), one addmm:
    ``[B, H, b, D] -> [B, H, b, m]``."""
    x2 = x.reshape(-1, x.shape[-1])                                           # [B H b, D]
    sq = (x2 * x2).sum(-1, keepdim=True)                                      # [B H b, 1]
    return torch.addmm(sq, x2, w, beta=half).view(*x.shape[:-1], w.shape[-1])


def _stable_features(fmap: PerformerFeatureMap, q: torch.Tensor, k: torch.Tensor):
    """``(fq, fk, s)``: query features divided by their per-token max, key features divided by their per-token
    max ``exp(s_j)`` (so both are <= 1/sqrt(m)); ``s: [B, H, N, 1]`` is the detached per-key log-max that the
    attention puts back relative to a max that only covers keys each query may see."""
    root = math.sqrt(fmap.features)
    zq, zk = fmap.logits(q), fmap.logits(k)                                   # [B, H, N, m]
    fq = torch.exp(zq - zq.amax(-1, keepdim=True).detach()) / root            # [B, H, N, m]
    s = zk.amax(-1, keepdim=True).detach()                                    # [B, H, N, 1]
    fk = torch.exp(zk - s) / root                                             # [B, H, N, m]
    return fq, fk, s


def performer_causal_chunked(fq: torch.Tensor, fk: torch.Tensor, s: torch.Tensor, v: torch.Tensor, *,
                             chunk_size: int) -> torch.Tensor:
    """Causal normalised linear attention with key features ``fk_j exp(s_j - c_t)`` for query t, where
    ``c_t = max_{j <= t} s_j`` is a running (prefix) max: every weight is <= 1, nothing depends on the future.

    Chunked: inside a chunk the masked ``C x C`` scores; across chunks, states kept relative to the prefix max
    at each chunk's end ``M_c`` and combined by the ``[n, n]`` matrix ``exp(M_c' - M_{c-1})`` (c' < c), <= 1.
    ``fq, fk: [B, H, N, m]``, ``s: [B, H, N, 1]`` (detached), ``v: [B, H, N, D]`` -> ``[B, H, N, D]``.
    """
    B, H, N, m = fq.shape
    D = v.shape[-1]
    C = max(1, min(N, max(chunk_size, math.isqrt(N - 1) + 1)))               # ~sqrt(N): O(N m D) both parts
    pad = (-N) % C
    va = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)                  # [B, H, N, D+1]: numerator | den
    s = s.squeeze(-1)                                                         # [B, H, N]
    if pad:  # zero features past the end; they come after every real token, so they change nothing
        fq, fk, va = (F.pad(t, (0, 0, 0, pad)) for t in (fq, fk, va))
        s = F.pad(s, (0, pad), value=float("-inf"))
    c = torch.cummax(s, dim=-1).values                                        # [B, H, N+pad] prefix max
    n = (N + pad) // C
    fq = fq.reshape(B, H, n, C, m)
    fk = fk.reshape(B, H, n, C, m)
    va = va.reshape(B, H, n, C, D + 1)
    s = s.reshape(B, H, n, C)
    c = c.reshape(B, H, n, C)
    M = c[..., -1]                                                            # [B, H, n] max at chunk end
    Mprev = F.pad(M[..., :-1], (1, 0), value=float("-inf"))                   # [B, H, n] max before chunk
    # per-chunk states relative to their own M_c
    wk = fk * torch.exp(s - M[..., None])[..., None]                          # [B, H, n, C, m]
    kv = wk.transpose(-1, -2) @ va                                            # [B, H, n, m, D+1]
    # state before chunk c relative to M_{c-1}: sum_{c' < c} kv_c' exp(M_c' - M_{c-1})
    idx = torch.arange(n, device=fq.device)
    before = idx[None, :] < idx[:, None]                                      # [n, n] (row c, col c')
    logw = torch.where(before, M[..., None, :] - Mprev[..., :, None], float("-inf"))
    S = torch.einsum("bhcx,bhxmd->bhcmd", torch.exp(logw), kv)                # [B, H, n, m, D+1]
    inter = (fq @ S) * torch.exp(Mprev[..., None] - c)[..., None]             # [B, H, n, C, D+1]
    tri = torch.ones(C, C, dtype=torch.bool, device=fq.device).tril()         # [C, C]
    logf = torch.where(tri, s[..., None, :] - c[..., :, None], float("-inf"))  # [B, H, n, C, C]
    wf = torch.exp(logf)                                                      # [B, H, n, C, C]
    intra = ((fq @ fk.transpose(-1, -2)) * wf) @ va                           # [B, H, n, C, D+1]
    out = (inter + intra).reshape(B, H, n * C, D + 1)[:, :, :N]               # [B, H, N, D+1]
    cnt = torch.arange(1, N + 1, device=fq.device, dtype=fq.dtype)[:, None]   # [N, 1]
    return (out[..., :D] / cnt) / la.safe_den(out[..., D:] / cnt)


class PerformerAttention(Attention):
    """FAVOR+ (Choromanski et al. 2021, Eqs. 4-5 with the positive features of Lemma 1, orthogonal features of
    Sec. 2.4): ``o_t = phi(q_t) sum_j phi(k_j)^T v_j / phi(q_t) sum_j phi(k_j)``, over j <= t when causal.

    Options: ``features`` (m, default 128; the Skyformer LRA setting's ``rp_dim=128``, kernel ``exp``),
    ``seed`` (default 0) for the orthogonal random features, drawn once at build and held fixed (a buffer,
    never redrawn; see :class:`PerformerFeatureMap`).

    Numerical stabiliser (the paper's code subtracts maxima in the exponent; here the choice keeps causality
    and batch invariance and is the same in every form):

    - queries: the per-token max over features of ``W q' - |q'|^2/2``; a per-query factor cancels exactly in
      the normalised output;
    - keys: every key is scaled by ``exp(-c_t)`` where ``c_t`` is the max over features *and over the keys
      query t may attend to*: all keys (bidirectional: one constant per sequence and head) or keys j <= t
      (causal: a running max, so no future key changes a past output). A common factor per query cancels.

    Both maxima are detached (as in the released code); they cancel exactly in the normaliser, which has no eps
    (:mod:`attnbench.ops.linear_attn`: the mean scores are tiny, ~1e-5 for unit Gaussian inputs at d = 64,
    m = 128, where any fixed eps would bias the output).
    The global max over the whole batch that the released JAX/PyTorch code uses for keys is not used: it
    leaks the future (through the released code's eps) and couples batch elements.

    ``reference`` materialises the N x N matrix of these weights; ``torch`` runs the associative form
    (bidirectional: features block by block through the shared blocked op, each key block with its own max as a
    log-scale, so memory beyond the inputs and output is O(block)) or a chunked running-max form (causal,
    :func:`performer_causal_chunked`).
    Note: the Nyströmformer LRA wrapper divided q, k by d^1/4 before a FAVOR+ that scales them again
    (effective temperature 1/d); this implementation uses the paper's 1/sqrt(d).
    """

    name = "performer"
    paper = PAPER
    impls = ("reference", "torch")
    chunk_size: int = 64
    block_size: int = 1024      # tokens whose features are computed at once (bidirectional; tests make it small)

    def __init__(self, *, heads, head_dim, causal=False, impl="auto", features: int = 128, seed: int = 0):
        super().__init__(heads=heads, head_dim=head_dim, causal=causal, impl=impl)
        self.feature_map = PerformerFeatureMap(heads=heads, head_dim=head_dim, causal=causal, features=features,
                                               seed=seed)

    def recurrent_state_size(self) -> int:
        """Per head ``S`` (``m x d``), ``z`` (``m``) and the keys' running max (one number)."""
        m = self.feature_map.feature_dim
        return self.heads * (m * self.head_dim + m + 1)

    def forward_reference(self, q, k, v):
        fq, fk, s = _stable_features(self.feature_map, q, k)
        n = q.shape[-2]
        if self.causal:
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()  # [N, N]
            c = torch.cummax(s.squeeze(-1), dim=-1).values                     # [B, H, N] max over j <= t
        else:
            mask = torch.ones(n, n, dtype=torch.bool, device=q.device)
            c = s.squeeze(-1).amax(-1, keepdim=True).expand(s.shape[:-1])      # [B, H, N] max over all j
        logf = torch.where(mask, s.transpose(-1, -2) - c[..., :, None], float("-inf"))  # [B, H, N, N]
        scores = (fq @ fk.transpose(-1, -2)) * torch.exp(logf)                # [B, H, N, N]
        cnt = mask.sum(-1, keepdim=True).to(q.dtype)                          # [N, 1] |I_t|
        num = scores @ v                                                      # [B, H, N, Dv]
        den = scores.sum(-1, keepdim=True)                                    # [B, H, N, 1]
        return (num / cnt) / la.safe_den(den / cnt)

    def forward_torch(self, q, k, v):
        if self.causal:
            fq, fk, s = _stable_features(self.feature_map, q, k)
            return performer_causal_chunked(fq, fk, s, v, chunk_size=self.chunk_size)
        # block by block through the shared op: never an [N, m] tensor for the whole sequence. The output does not
        # depend on a common factor of the query features (per query) or of the key features (no eps), so
        # 1/sqrt(m) is dropped, queries are shifted by their own max and each key block by its max,
        # carried as the block's log-scale (the op rescales its sums as the max grows: no second pass).
        fmap = self.feature_map
        w, half = fmap.scaled_projection(q.dtype)                             # [D, m], -1 / (2 sqrt(D))
        q_block, k_block = la.token_blocks(q, self.block_size), la.token_blocks(k, self.block_size)

        def map_q(a, b):
            zq = _logits(q_block(a, b), w, half)                              # [B, H, b, m]
            return zq.sub_(zq.amax(-1, keepdim=True).detach()).exp_()

        def map_k(a, b):
            zk = _logits(k_block(a, b), w, half)                              # [B, H, b, m]
            shift = zk.detach().amax((-2, -1), keepdim=True)                  # [B, H, 1, 1]
            return zk.sub_(shift).exp_(), shift

        return la.linear_attention_blocked(map_q, map_k, v, block_size=self.block_size)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", features={self.feature_map.features}, seed={self.feature_map.seed}"
