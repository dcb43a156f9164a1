"""The token mixers of the language model (:mod:`attnbench.models.lm`), one per row of NaLaFormer's Table 5, each
after flash-linear-attention's published layer (``fla/layers/*.py``; ``../shared/notes/field.md`` §1):

- ``transformer`` (:class:`AttentionMixer`, Transformer++): q, k, v, o projections, rotary embeddings on q and k,
  and any causal mechanism of the registry (softmax by default; ``transformer+nala`` puts NaLa in its place);
- ``retnet`` (:class:`GLAMixer`, multi-scale retention): rotary q and k, a fixed per-head decay
  ``gamma_h = 1 - 2^(-5-h)``, a per-head RMSNorm gated by ``silu(g_proj x)``;
- ``gla`` (:class:`GLAMixer`, gated linear attention): a data-dependent per-feature decay
  ``logsigmoid(gk_proj x) / 16`` through a rank-16 projection, the same output norm and gate;
- ``mamba`` (:class:`MambaMixer`, the selective SSM): ``in_proj`` to x and z, a causal depthwise convolution and
  SiLU on x, the input-dependent ``dt``, ``B``, ``C``, the selective scan, ``y * silu(z)``, ``out_proj``; a Mamba
  block has no MLP;
- ``deltanet`` and ``gated_deltanet`` (:class:`DeltaMixer`): see its docstring.

Every mixer takes ``x [B, T, C]`` and returns ``[B, T, C]``; with a ``cache`` (a dict, empty at the start) it
also returns the updated cache, so feeding a sequence token by token equals one forward pass over it (tested).
:meth:`state_size` is the recurrent state a layer carries per sequence (numbers; the convolution windows aside);
the Transformer's grows with the length (its KV cache), :meth:`AttentionMixer.state_size` gives it per token.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbench.api.spec import Spec
from attnbench.core.errors import AttnbenchError
from attnbench.ops import delta
from attnbench.ops.gla import gated_linear_attention, retention_decay
from attnbench.ops.ssm import selective_scan_recurrent

#: an :class:`attnbench.models.lm.LMConfig` (the config lives with the model, which imports the mixers)
LMConfig = Any

GLA_GATE_RANK = 16          # FLA's gate_low_rank_dim (its model never changes it)
GLA_GATE_NORMALIZER = 16    # FLA's gate_logit_normalizer: log decays logsigmoid(.) / 16


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    # x / sqrt(sum x^2 + eps) with eps 1e-12, not FLA's 1e-6: NaLa's cubed key features have squared norms near
    # 1e-5 at initialisation, many not far above 1e-6, which would shrink those keys well below unit norm so that
    # the delta rule barely writes; for SiLU features, whose squared norms are far above both, the two agree
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-12)


def _cached(cache: Optional[dict], key: str):
    return None if cache is None else cache.get(key)


class ShortConv(nn.Module):
    """Causal depthwise 1-D convolution over time (FLA's ``ShortConvolution``), with an optional SiLU.

    ``forward(x [B, T, W], prev [B, K-1, W] | None)`` -> ``(y [B, T, W], the last K-1 inputs)``: ``prev`` holds
    the inputs before ``x`` (zeros at the start), so a sequence fed in pieces equals it fed at once. ``y`` is a
    transposed view of the convolution's output, or with ``contiguous`` a contiguous copy: for a convolution read
    only by linear projections, which would each copy the view for themselves (a projection multiplies the same
    contiguous matrix either way, so the numbers are the same to the bit; not where elementwise ops or reductions
    read it: their backward's rounding follows the layout)."""

    def __init__(self, width: int, kernel: int, activation: bool, bias: bool = False, contiguous: bool = False):
        super().__init__()
        self.conv = nn.Conv1d(width, width, kernel, groups=width, bias=bias)
        self.kernel, self.activation, self.contiguous = kernel, activation, contiguous

    def forward(self, x: torch.Tensor, prev: Optional[torch.Tensor] = None):
        K = self.kernel
        if prev is None:
            prev = x.new_zeros(x.shape[0], K - 1, x.shape[-1])
        # the window built channels-first, in one pass: the convolution copies a transposed input to this layout
        # before oneDNN sees it, so the numbers are the same, for one copy less
        xp = torch.cat([prev.to(x.dtype).transpose(1, 2), x.transpose(1, 2)], dim=2)   # [B, W, K-1+T]
        y = self.conv(xp).transpose(1, 2)                                     # [B, T, W]
        if self.activation:
            y = F.silu(y)
        return (y.contiguous() if self.contiguous else y), xp[:, :, xp.shape[2] - (K - 1):].transpose(1, 2)

    def forward_reference(self, x: torch.Tensor, prev: Optional[torch.Tensor] = None):
        """The composed form :meth:`forward` must equal to the bit (the window along time, the convolution over its
        transposed view, the output that view, whatever ``contiguous``): for the tests and for
        ``bench_train_step --reference-forms``."""
        K = self.kernel
        if prev is None:
            prev = x.new_zeros(x.shape[0], K - 1, x.shape[-1])
        xp = torch.cat([prev.to(x.dtype), x], dim=1)                          # [B, K-1+T, W]
        y = self.conv(xp.transpose(1, 2)).transpose(1, 2)                     # [B, T, W]
        return (F.silu(y) if self.activation else y), xp[:, xp.shape[1] - (K - 1):]


def _constant_to_the_compiler(fn):
    """``torch.compiler.assume_constant_result``'s mark, set without it: that call imports torch._dynamo, seconds
    at every start of a process that never compiles (tests/test_lm_mixers.py checks the mark is torch's)."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_to_the_compiler
def _rotary_table(start: int, T: int, d: int, theta: float, dtype: torch.dtype, device: torch.device):
    """``(cos, sin)`` of :func:`rotary` for positions ``start .. start + T - 1``, each ``[T, d]``: built once per
    shape and kept (a step used to rebuild them for every q and k; under ``torch.compile`` the table was fused
    into the rotation and its cos and sin computed per element of ``[B, H, T, d]``, a third of the compiled
    step). A constant to the compiler: the same table for the same arguments."""
    key = (start, T, d, theta, dtype, device)
    table = _ROTARY_TABLES.get(key)
    if table is None:
        inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
        pos = torch.arange(start, start + T, dtype=torch.float64, device=device)
        freqs = torch.outer(pos, inv_freq)                                    # [T, d/2]
        table = tuple(torch.cat([f, f], dim=-1).to(dtype) for f in (freqs.cos(), freqs.sin()))
        if len(_ROTARY_TABLES) >= 256:                                        # decoding walks start: bound it
            _ROTARY_TABLES.clear()
        _ROTARY_TABLES[key] = table
    return table


_ROTARY_TABLES: dict = {}   # by hand, not functools.lru_cache: torch.compile looks through its wrapper, past the mark


def rotary(x: torch.Tensor, start: int, theta: float) -> torch.Tensor:
    """Rotary position embedding, rotate-half (GPT-NeoX) layout, of ``x [B, H, T, d]`` at positions
    ``start .. start + T - 1`` (Su et al., "RoFormer", Eq. 34; FLA's ``rotary_embedding_ref``)."""
    cos, sin = _rotary_table(start, x.shape[-2], x.shape[-1], theta, x.dtype, x.device)
    return _Rotary.apply(x, cos, sin)


def rotary_reference(x: torch.Tensor, start: int, theta: float) -> torch.Tensor:
    """:func:`rotary` as composed ops, whose autograd gradient :class:`_Rotary`'s must equal to the bit."""
    d = x.shape[-1]
    cos, sin = _rotary_table(start, x.shape[-2], d, theta, x.dtype, x.device)
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], dim=-1) * sin


class _Rotary(torch.autograd.Function):
    """``x cos + rotate_half(x) sin`` with ``rotate_half(x) = [-x2, x1]``, and its gradient ``g cos +
    [(g sin)_2, -(g sin)_1]`` written out: autograd's gradient of the composed form scatters each half of ``g sin``
    into a zero tensor of x's shape and adds the three (two fills, two copies, two adds of full size). Every element
    is computed by the same two roundings as the composed form, so outputs and gradients are the same to the bit
    (tests/test_lm_mixers.py), in the same layouts (the output in x's, the gradient contiguous)."""

    @staticmethod
    def forward(ctx, x, cos, sin):
        h = x.shape[-1] // 2
        out = x * cos
        out[..., :h] -= x[..., h:] * sin[..., :h]
        out[..., h:] += x[..., :h] * sin[..., h:]
        ctx.save_for_backward(cos, sin)
        return out

    @staticmethod
    def backward(ctx, g):
        cos, sin = ctx.saved_tensors
        h = g.shape[-1] // 2
        gx = torch.mul(g, cos, out=torch.empty(g.shape, dtype=g.dtype, device=g.device))
        gx[..., :h] += g[..., h:] * sin[..., h:]
        gx[..., h:] -= g[..., :h] * sin[..., :h]
        return gx, None, None


def _heads(t: torch.Tensor, H: int) -> torch.Tensor:
    B, T, W = t.shape
    return t.reshape(B, T, H, W // H).transpose(1, 2)                         # [B, H, T, W/H]


def _feature_map(cfg: LMConfig, head_dim: int):
    """The q/k feature map of ``cfg`` (None: none, the identity)."""
    if not cfg.qk_map:
        return None
    return Spec(cfg.qk_map, dict(cfg.feature_options), "feature map").build(heads=cfg.heads, head_dim=head_dim,
                                                                           causal=True)


def map_expansion(cfg: LMConfig) -> int:
    """Features per input dimension of ``cfg``'s q/k map (1 for SiLU or none, 2 for NaLa), from a trial build."""
    if not cfg.qk_map:
        return 1
    probe = Spec(cfg.qk_map, dict(cfg.feature_options), "feature map").build(heads=1, head_dim=8, causal=True)
    return max(1, probe.feature_dim // 8)


def key_feature_dim(cfg: LMConfig) -> int:
    """Per-head size of the key features the delta rule sees (its state's rows): the q/k projection's width per
    head (``head_dim``, or ``head_dim / expansion`` with ``key_width="match"``) times the map's expansion."""
    ratio = map_expansion(cfg)
    return cfg.head_dim if cfg.key_width == "match" else cfg.head_dim * ratio


class DeltaMixer(nn.Module):
    """One DeltaNet (``cfg.layer == "deltanet"``) or Gated DeltaNet token mixer, after FLA's ``delta_net.py`` and
    ``gated_deltanet.py``: q, k, v projections, a short causal depthwise convolution on each (kernel 4), the
    q/k feature map, q/k L2 normalisation, write strength ``beta = sigmoid(b_proj x)``, for Gated DeltaNet the
    log decay ``g = -exp(A_log) softplus(a_proj x + dt_bias)``, the (gated) delta rule of
    :func:`attnbench.ops.delta.delta_rule`, a per-head RMSNorm of the output (times ``silu(g_proj x)`` when
    ``use_gate``) and ``o_proj``. FLA applies SiLU as the q/k convolution's activation; here the convolution is
    linear and the *feature map* comes after it, so ``feature_map="silu"`` is the same computation and any
    registered map can replace it (how a map that doubles the feature size meets the delta rule:
    :mod:`attnbench.models.lm`)."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        H, C, dv = cfg.heads, cfg.hidden, cfg.value_head_dim
        self.cfg, self.gated = cfg, cfg.layer == "gated_deltanet"
        ratio = map_expansion(cfg)
        if cfg.key_width == "match":
            if cfg.head_dim % ratio:
                raise AttnbenchError(f"LM config: key_width='match' needs head_dim ({cfg.head_dim}) divisible by the "
                                     f"feature map's expansion ({ratio})")
            self.qk_dim = cfg.head_dim // ratio
        else:
            self.qk_dim = cfg.head_dim
        self.q_proj = nn.Linear(C, H * self.qk_dim, bias=False)
        self.k_proj = nn.Linear(C, H * self.qk_dim, bias=False)
        self.v_proj = nn.Linear(C, H * dv, bias=False)
        self.b_proj = nn.Linear(C, H, bias=False)
        if self.gated:
            self.a_proj = nn.Linear(C, H, bias=False)
            # FLA's initialisation: A ~ U(0, 16); dt log-uniform in [1e-3, 0.1], dt_bias its softplus inverse
            self.A_log = nn.Parameter(torch.empty(H).uniform_(0, 16).log())
            dt = torch.exp(torch.rand(H) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
            for p in (self.A_log, self.dt_bias):
                p._no_weight_decay = True
        if cfg.use_short_conv:
            self.q_conv = ShortConv(H * self.qk_dim, cfg.conv_size, activation=False)  # the map follows
            self.k_conv = ShortConv(H * self.qk_dim, cfg.conv_size, activation=False)
            self.v_conv = ShortConv(H * dv, cfg.conv_size, activation=True)
        self.feature_map = _feature_map(cfg, self.qk_dim)
        if self.feature_map is None:
            raise AttnbenchError(f"LM config: {cfg.layer} needs a q/k feature map (silu is the published one)")
        if cfg.use_gate:
            self.g_proj = nn.Linear(C, H * dv, bias=False)
        self.o_norm = nn.RMSNorm(dv, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(H * dv, C, bias=False)

    @property
    def key_dim(self) -> int:
        """Features per head the delta rule sees (the state is ``[key_dim, value_head_dim]`` per head)."""
        return self.feature_map.feature_dim

    def state_size(self) -> int:
        return self.cfg.heads * self.key_dim * self.cfg.value_head_dim

    def forward(self, x: torch.Tensor, cache: Optional[dict] = None, impl: Optional[str] = None):
        cfg, H, dv = self.cfg, self.cfg.heads, self.cfg.value_head_dim
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        new: dict[str, torch.Tensor] = {}
        if cfg.use_short_conv:
            q, new["q"] = self.q_conv(q, _cached(cache, "q"))
            k, new["k"] = self.k_conv(k, _cached(cache, "k"))
            v, new["v"] = self.v_conv(v, _cached(cache, "v"))
        else:
            v = F.silu(v)
        # the map in fp32 at least (NaLa's powers and angles in bf16 lose the norm-awareness they exist for)
        fq = self.feature_map.phi_q(_at_least_fp32(_heads(q, H)))            # [B, H, T, Dk]
        fk = self.feature_map.phi_k(_at_least_fp32(_heads(k, H)))            # [B, H, T, Dk]
        if cfg.qk_norm in ("l2",):
            fq = _l2norm(fq)
        if cfg.qk_norm in ("l2", "k"):
            fk = _l2norm(fk)
        beta = _at_least_fp32(self.b_proj(x)).sigmoid().transpose(1, 2)       # [B, H, T]
        g = None
        if self.gated:
            a = F.softplus(_at_least_fp32(self.a_proj(x)) + self.dt_bias)   # [B, T, H]
            g = (-_at_least_fp32(self.A_log).exp() * a).transpose(1, 2)      # [B, H, T] log decay
        vh = _heads(v, H)                                                     # [B, H, T, dv]
        o, state = delta.delta_rule(fq.to(vh.dtype), fk.to(vh.dtype), vh, beta, g,
                                    initial_state=_cached(cache, "state"), output_final_state=cache is not None,
                                    impl=impl or cfg.delta_impl, chunk_size=cfg.chunk_size)
        y = self.o_proj(_gated_norm(self, o, x, dv))
        if cache is None:
            return y
        new["state"] = state
        return y, new


def _gated_norm(mixer: nn.Module, o: torch.Tensor, x: torch.Tensor, dv: int) -> torch.Tensor:
    """``o [B, H, T, dv]`` -> ``[B, T, H * dv]``: a per-head RMSNorm, times ``silu(g_proj x)`` when the mixer has
    an output gate (FLA's ``FusedRMSNormGated``)."""
    B, H, T, _ = o.shape
    o = mixer.o_norm(o.transpose(1, 2))                                       # [B, T, H, dv]
    if hasattr(mixer, "g_proj"):
        o = o * F.silu(mixer.g_proj(x).reshape(B, T, H, dv))
    return o.reshape(B, T, H * dv)


class GLAMixer(nn.Module):
    """Gated linear attention (``cfg.layer == "gla"``, FLA's ``GatedLinearAttention``; Yang et al. 2024, Eq. 3 and
    Sec. 4.4) or multi-scale retention (``"retnet"``, FLA's ``MultiScaleRetention``; Sun et al. 2023, Eqs. 5-8):
    q, k, v projections (optional short convolutions with SiLU), an optional q/k feature map, the decay (GLA:
    ``logsigmoid(gk_proj x) / 16`` per key feature through a rank-16 projection with bias; RetNet: the fixed
    ``log(1 - 2^(-5-h))`` per head, and rotary q and k), :func:`attnbench.ops.gla.gated_linear_attention` with
    scale ``Dk^-0.5``, the per-head RMSNorm gated by ``silu(g_proj x)`` and ``o_proj``."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        H, C, dk, dv = cfg.heads, cfg.hidden, cfg.head_dim, cfg.value_head_dim
        self.cfg, self.retention = cfg, cfg.layer == "retnet"
        self.q_proj = nn.Linear(C, H * dk, bias=False)
        self.k_proj = nn.Linear(C, H * dk, bias=False)
        self.v_proj = nn.Linear(C, H * dv, bias=False)
        if cfg.use_gate:
            self.g_proj = nn.Linear(C, H * dv, bias=False)
        if not self.retention:
            self.gk_proj = nn.Sequential(nn.Linear(C, GLA_GATE_RANK, bias=False),
                                         nn.Linear(GLA_GATE_RANK, H * dk, bias=True))
        if cfg.use_short_conv:
            self.q_conv = ShortConv(H * dk, cfg.conv_size, activation=True)
            self.k_conv = ShortConv(H * dk, cfg.conv_size, activation=True)
            self.v_conv = ShortConv(H * dv, cfg.conv_size, activation=True)
        self.feature_map = _feature_map(cfg, dk)
        self.o_norm = nn.RMSNorm(dv, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(H * dv, C, bias=False)

    @property
    def key_dim(self) -> int:
        return self.cfg.head_dim if self.feature_map is None else self.feature_map.feature_dim

    def state_size(self) -> int:
        return self.cfg.heads * self.key_dim * self.cfg.value_head_dim

    def forward(self, x: torch.Tensor, cache: Optional[dict] = None, impl: Optional[str] = None):
        cfg, H, dv = self.cfg, self.cfg.heads, self.cfg.value_head_dim
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        new: dict = {}
        if cfg.use_short_conv:
            q, new["q"] = self.q_conv(q, _cached(cache, "q"))
            k, new["k"] = self.k_conv(k, _cached(cache, "k"))
            v, new["v"] = self.v_conv(v, _cached(cache, "v"))
        q, k, v = _heads(q, H), _heads(k, H), _heads(v, H)
        if self.feature_map is not None:
            q = self.feature_map.phi_q(_at_least_fp32(q)).to(v.dtype)
            k = self.feature_map.phi_k(_at_least_fp32(k)).to(v.dtype)
        start = _cached(cache, "pos") or 0
        B, _, T, _ = v.shape
        if self.retention:
            q, k = rotary(q, start, cfg.rope_theta), rotary(k, start, cfg.rope_theta)
            g = retention_decay(H).to(device=x.device, dtype=_at_least_fp32(v).dtype)[None, :, None].expand(B, H, T)
        else:
            g = F.logsigmoid(_at_least_fp32(self.gk_proj(x))) / GLA_GATE_NORMALIZER
            g = _heads(g, H)                                                  # [B, H, T, dk]
        # the recurrent forms share the delta rule's impl setting; the CPU chunked form keeps a [C, C, Dk] decay
        # tensor per chunk, so its chunks stay at 16 tokens whatever the delta rule's chunk size
        o, state = gated_linear_attention(q, k, v, g, initial_state=_cached(cache, "state"),
                                          output_final_state=cache is not None, impl=impl or cfg.delta_impl,
                                          chunk_size=min(cfg.chunk_size, 16))
        y = self.o_proj(_gated_norm(self, o, x, dv))
        if cache is None:
            return y
        new.update(state=state, pos=start + T)
        return y, new


class AttentionMixer(nn.Module):
    """Transformer++'s attention (``cfg.layer == "transformer"``, FLA's ``Attention``): q, k, v projections without
    bias, rotary q and k (rotate-half, base ``rope_theta``), a causal mechanism of the registry
    (``cfg.attention``: softmax is the Transformer++ row; any causal built-in or plug-in can stand in its
    place), ``o_proj``. With a cache, the q, k, v of the tokens so far are kept and the mechanism runs over the
    whole prefix, its last outputs taken: exact for any causal mechanism, whatever its form."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        H, C, d = cfg.heads, cfg.hidden, cfg.head_dim
        self.cfg = cfg
        self.q_proj = nn.Linear(C, H * d, bias=False)
        self.k_proj = nn.Linear(C, H * d, bias=False)
        self.v_proj = nn.Linear(C, H * d, bias=False)
        self.mech = Spec(cfg.attention, dict(cfg.attention_options), "attention").build(heads=H, head_dim=d,
                                                                                       causal=True)
        self.o_proj = nn.Linear(H * d, C, bias=False)

    @property
    def state_grows(self) -> bool:
        """Whether the mechanism keeps every past key and value (then :meth:`state_size` is per token)."""
        return self.mech.recurrent_state_size() is None

    def state_size(self) -> int:
        """The mechanism's recurrent state per sequence; for one that keeps every key and value (softmax), per
        token: the keys and values a KV cache keeps."""
        fixed = self.mech.recurrent_state_size()
        return 2 * self.cfg.heads * self.cfg.head_dim if fixed is None else fixed

    def forward(self, x: torch.Tensor, cache: Optional[dict] = None, impl: Optional[str] = None):
        cfg, H = self.cfg, self.cfg.heads
        B, T, _ = x.shape
        start = 0 if _cached(cache, "k") is None else cache["k"].shape[2]
        q = rotary(_heads(self.q_proj(x), H), start, cfg.rope_theta)
        k = rotary(_heads(self.k_proj(x), H), start, cfg.rope_theta)
        v = _heads(self.v_proj(x), H)
        if cache is not None and start:
            q, k, v = (torch.cat([cache[n], t], dim=2) for n, t in (("q", q), ("k", k), ("v", v)))
        o = self.mech(q, k, v)[:, :, start:]                                  # [B, H, T, d]
        y = self.o_proj(o.transpose(1, 2).reshape(B, T, -1))
        if cache is None:
            return y
        return y, {"q": q, "k": k, "v": v}


class MambaMixer(nn.Module):
    """Mamba's selective SSM (``cfg.layer == "mamba"``; Gu and Dao 2023, Sec. 3.4 and Fig. 3; FLA's ``MambaMixer``):
    ``in_proj`` to ``x`` and ``z`` (``E = ssm_expand * hidden`` each), a causal depthwise convolution with bias and
    SiLU on x, ``x_proj`` to ``dt`` (rank ``dt_rank``), ``B`` and ``C`` (``ssm_state`` each), ``dt =
    softplus(dt_proj dt)``, ``A = -exp(A_log)``, the selective scan of :mod:`attnbench.ops.ssm` with the skip
    ``D``, ``y * silu(z)``, ``out_proj``. Initialisation as the reference: ``A_log = log(1..N)`` per channel,
    ``D = 1``, ``dt`` log-uniform in [1e-3, 0.1] (floor 1e-4) through ``dt_proj``'s bias (softplus inverse)."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        C, E, N, R = cfg.hidden, cfg.ssm_inner, cfg.ssm_state, cfg.ssm_dt_rank
        self.cfg = cfg
        self.in_proj = nn.Linear(C, 2 * E, bias=False)
        self.conv = ShortConv(E, cfg.conv_size, activation=True, bias=True)
        self.x_proj = nn.Linear(E, R + 2 * N, bias=False)
        self.dt_proj = nn.Linear(R, E, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(E, 1))
        self.D = nn.Parameter(torch.ones(E))
        self.out_proj = nn.Linear(E, C, bias=False)
        self.reset_dt()

    def reset_dt(self) -> None:
        """The reference's initialisation of ``dt_proj`` (the LM's generic init must not overwrite it)."""
        R, E = self.cfg.ssm_dt_rank, self.cfg.ssm_inner
        with torch.no_grad():
            self.dt_proj.weight.uniform_(-R ** -0.5, R ** -0.5)
            dt = torch.exp(torch.rand(E) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))
        for p in (self.A_log, self.D):
            p._no_weight_decay = True

    def state_size(self) -> int:
        return self.cfg.ssm_inner * self.cfg.ssm_state

    def forward(self, x: torch.Tensor, cache: Optional[dict] = None, impl: Optional[str] = None):
        cfg = self.cfg
        N, R = cfg.ssm_state, cfg.ssm_dt_rank
        u, z = self.in_proj(x).chunk(2, dim=-1)                               # [B, T, E] each
        u, window = self.conv(u, _cached(cache, "conv"))
        dt, Bm, Cm = self.x_proj(u).split([R, N, N], dim=-1)
        dt = F.softplus(self.dt_proj(dt))                                     # [B, T, E]
        y, h = selective_scan_recurrent(u, dt, -self.A_log.exp(), Bm, Cm, self.D,
                                        initial_state=_cached(cache, "state"), output_final_state=cache is not None)
        y = self.out_proj(y * F.silu(z))
        if cache is None:
            return y
        return y, {"conv": window, "state": h}


#: layer kind -> its mixer class, and whether its block has an MLP after the mixer
MIXERS: dict[str, tuple[type, bool]] = {
    "transformer": (AttentionMixer, True),
    "retnet": (GLAMixer, True),
    "gla": (GLAMixer, True),
    "mamba": (MambaMixer, False),
    "deltanet": (DeltaMixer, True),
    "gated_deltanet": (DeltaMixer, True),
}

#: the layers whose backward on FLA's kernels runs its gated ``chunk_bwd_dqkwg`` (per-token or per-head decay g)
FLA_GATED_BACKWARD = tuple(delta.FLA_GATED_OPS)


def fla_refusal(cfg: LMConfig, device: torch.device | str) -> Optional[str]:
    """Why FLA will refuse to train ``cfg``'s mixer on ``device``, as one line (None: it will not), for runs to say
    before they start (:func:`attnbench.ops.delta.fla_gated_backward_refusal`)."""
    if cfg.layer not in FLA_GATED_BACKWARD or delta.resolve_delta_impl(device, cfg.delta_impl) != "fla":
        return None
    return delta.fla_gated_backward_refusal(device, op=delta.FLA_GATED_OPS[cfg.layer])


__all__ = ["AttentionMixer", "DeltaMixer", "FLA_GATED_BACKWARD", "GLAMixer", "MambaMixer", "MIXERS", "ShortConv",
           "fla_refusal", "key_feature_dim", "map_expansion", "rotary"]
