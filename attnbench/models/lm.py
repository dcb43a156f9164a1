"""A causal language model of delta-rule token mixers: DeltaNet and Gated DeltaNet with any registered q/k
feature map (SiLU, the published baseline; NaLa, NaLaFormer's Table 5), SwiGLU MLPs and RMSNorm.

The layers follow flash-linear-attention's published ones (``fla/layers/delta_net.py``, ``gated_deltanet.py``;
``../shared/notes/field.md`` §1.1): q, k, v projections, a short causal depthwise convolution on each (kernel 4),
the q/k feature map, q/k L2 normalisation, write strength ``beta = sigmoid(b_proj x)``, for Gated DeltaNet the
log decay ``g = -exp(A_log) softplus(a_proj x + dt_bias)``, the (gated) delta rule of
:func:`attnbench.ops.delta_rule` (FLA's chunk kernels on a GPU, the exact chunked form on a CPU), a per-head
RMSNorm of the output (times ``silu(g_proj x)`` when ``use_gate``, FLA's ``FusedRMSNormGated``) and ``o_proj``.
FLA applies SiLU as the q/k convolution's activation; here the convolution is linear and the *feature map*
comes after it, so ``feature_map="silu"`` is the same computation and any registered map can replace it.

**How a map that doubles the feature size meets the delta rule** (NaLa: ``phi(x)`` has ``2d`` features; the
paper does not say). Two choices, both options of :class:`LMConfig`:

- ``key_width``: ``"double"`` (default) keeps the projections of the baseline (``d`` per head) and lets the
  state grow to ``[2d, d_v]`` per head: same parameter count, twice the state (and scale ``(2d)^-1/2``).
  ``"match"`` projects q and k to ``d / r`` per head (``r`` = the map's expansion, 2 for NaLa) so the state has
  the baseline's size ``[d, d_v]`` (fewer projection parameters).
- ``qk_norm``: ``"l2"`` (default) L2-normalises ``phi(q)`` and ``phi(k)`` after the map, as the published layers
  do for SiLU features: ``||k|| = 1`` keeps ``I - beta k k^T`` a contraction (the delta rule's stability
  condition ``beta ||k||^2 <= 2``), but it also removes the query-norm *magnitude* NaLa restores; what survives
  is the norm-aware *sharpness* of the power ``|dir(q)|^(lam (tau + tanh ||q||))``. ``"k"`` normalises only the
  keys (stability kept, ``phi(q)``'s magnitude reaches the output); ``"none"`` normalises neither (an ablation:
  unstable unless the map bounds ``||phi(k)||``).

Incremental decoding: ``model(ids, caches=model.init_caches())`` carries each layer's convolution window and
delta-rule state, so feeding a sequence token by token equals one forward pass over it (tested). Feature maps
that pool over the sequence (MirrorLA's variance) are not carried token by token.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbench.api.registry import build_feature_map
from attnbench.core.errors import AttnbenchError
from attnbench.ops import delta

LAYER_KINDS = ("deltanet", "gated_deltanet")
QK_NORMS = ("l2", "k", "none")
KEY_WIDTHS = ("double", "match")


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """The model. Names follow FLA's configs (``hidden_size`` -> ``hidden``, ``num_hidden_layers`` -> ``layers``,
    ``num_heads`` -> ``heads``, the per-head key size ``head_dim``; value heads are ``head_dim * expand_v``).
    ``intermediate_size = 0`` takes FLA's rule: ``2/3 * hidden * hidden_ratio`` rounded up to a multiple of 256."""

    layer: str = "deltanet"
    vocab_size: int = 32000
    hidden: int = 1024
    layers: int = 24
    heads: int = 8
    head_dim: int = 128
    expand_v: float = 1.0
    use_gate: bool = False
    use_short_conv: bool = True
    conv_size: int = 4
    hidden_ratio: float = 4.0
    intermediate_size: int = 0
    tie_embeddings: bool = False
    norm_eps: float = 1e-6
    init_std: float = 0.02
    feature_map: str = "silu"
    feature_options: dict = dataclasses.field(default_factory=dict)
    qk_norm: str = "l2"
    key_width: str = "double"
    chunk_size: int = 64
    delta_impl: str = "auto"

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise AttnbenchError(f"LM config: {msg}")

        if self.layer not in LAYER_KINDS:
            bad(f"layer must be one of {', '.join(LAYER_KINDS)}, got {self.layer!r}")
        if self.qk_norm not in QK_NORMS:
            bad(f"qk_norm must be one of {', '.join(QK_NORMS)}, got {self.qk_norm!r}")
        if self.key_width not in KEY_WIDTHS:
            bad(f"key_width must be one of {', '.join(KEY_WIDTHS)}, got {self.key_width!r}")
        for k in ("vocab_size", "hidden", "layers", "heads", "head_dim", "conv_size", "chunk_size"):
            if getattr(self, k) < 1:
                bad(f"{k} must be >= 1, got {getattr(self, k)}")
        if self.head_dim * self.expand_v != int(self.head_dim * self.expand_v):
            bad(f"head_dim * expand_v must be an integer, got {self.head_dim} * {self.expand_v}")

    @property
    def value_head_dim(self) -> int:
        return int(self.head_dim * self.expand_v)

    @property
    def mlp_size(self) -> int:
        if self.intermediate_size:
            return self.intermediate_size
        size = int(self.hidden * self.hidden_ratio * 2 / 3)
        return 256 * ((size + 255) // 256)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LMConfig":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise AttnbenchError(f"LM config: unknown key(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    # x / sqrt(sum x^2 + eps) with eps 1e-12, not FLA's 1e-6: NaLa's cubed key features have squared norms near
    # 1e-5 at initialisation, many not far above 1e-6, which would shrink those keys well below unit norm so that
    # the delta rule barely writes; for SiLU features, whose squared norms are far above both, the two agree
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-12)


class ShortConv(nn.Module):
    """Causal depthwise 1-D convolution over time (FLA's ``ShortConvolution``), with an optional SiLU.

    ``forward(x [B, T, W], prev [B, K-1, W] | None)`` -> ``(y [B, T, W], the last K-1 inputs)``: ``prev`` holds
    the inputs before ``x`` (zeros at the start), so a sequence fed in pieces equals it fed at once."""

    def __init__(self, width: int, kernel: int, activation: bool):
        super().__init__()
        self.conv = nn.Conv1d(width, width, kernel, groups=width, bias=False)
        self.kernel, self.activation = kernel, activation

    def forward(self, x: torch.Tensor, prev: Optional[torch.Tensor] = None):
        K = self.kernel
        if prev is None:
            prev = x.new_zeros(x.shape[0], K - 1, x.shape[-1])
        xp = torch.cat([prev.to(x.dtype), x], dim=1)                          # [B, K-1+T, W]
        y = self.conv(xp.transpose(1, 2)).transpose(1, 2)                     # [B, T, W]
        return (F.silu(y) if self.activation else y), xp[:, xp.shape[1] - (K - 1):]


class DeltaMixer(nn.Module):
    """One DeltaNet (``cfg.layer == "deltanet"``) or Gated DeltaNet token mixer; see the module docstring."""
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
        self.feature_map = build_feature_map(cfg.feature_map, heads=H, head_dim=self.qk_dim, causal=True,
                                             **cfg.feature_options)
        if cfg.use_gate:
            self.g_proj = nn.Linear(C, H * dv, bias=False)
        self.o_norm = nn.RMSNorm(dv, eps=cfg.norm_eps)
        self.o_proj = nn.Linear(H * dv, C, bias=False)

    @property
    def key_dim(self) -> int:
        """Features per head the delta rule sees (the state is ``[key_dim, value_head_dim]`` per head)."""
        return self.feature_map.feature_dim

    def forward(self, x: torch.Tensor, cache: Optional[dict] = None, impl: Optional[str] = None):
        """``x [B, T, C]`` -> ``[B, T, C]``; with ``cache`` (a dict, empty at the start) also the updated cache."""
        cfg, H, dv = self.cfg, self.cfg.heads, self.cfg.value_head_dim
        B, T, _ = x.shape
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        new: dict[str, torch.Tensor] = {}
        if cfg.use_short_conv:
            q, new["q"] = self.q_conv(q, None if cache is None else cache.get("q"))
            k, new["k"] = self.k_conv(k, None if cache is None else cache.get("k"))
            v, new["v"] = self.v_conv(v, None if cache is None else cache.get("v"))
        else:
            v = F.silu(v)

        def heads(t: torch.Tensor, d: int) -> torch.Tensor:
            return t.reshape(B, T, H, d).transpose(1, 2)                      # [B, H, T, d]

        # the map in fp32 at least (NaLa's powers and angles in bf16 lose the norm-awareness they exist for)
        fq = self.feature_map.phi_q(_at_least_fp32(heads(q, self.qk_dim)))  # [B, H, T, Dk]
        fk = self.feature_map.phi_k(_at_least_fp32(heads(k, self.qk_dim)))  # [B, H, T, Dk]
        if cfg.qk_norm in ("l2",):
            fq = _l2norm(fq)
        if cfg.qk_norm in ("l2", "k"):
            fk = _l2norm(fk)
        beta = _at_least_fp32(self.b_proj(x)).sigmoid().transpose(1, 2)             # [B, H, T]
        g = None
        if self.gated:
            a = F.softplus(_at_least_fp32(self.a_proj(x)) + self.dt_bias)   # [B, T, H]
            g = (-_at_least_fp32(self.A_log).exp() * a).transpose(1, 2)      # [B, H, T] log decay
        vh = heads(v, dv)                                                     # [B, H, T, dv]
        o, state = delta.delta_rule(fq.to(vh.dtype), fk.to(vh.dtype), vh, beta, g,
                              initial_state=None if cache is None else cache.get("state"),
                              output_final_state=cache is not None, impl=impl or cfg.delta_impl,
                              chunk_size=cfg.chunk_size)                      # [B, H, T, dv]
        o = self.o_norm(o.transpose(1, 2))                                    # [B, T, H, dv]
        if cfg.use_gate:
            o = o * F.silu(self.g_proj(x).reshape(B, T, H, dv))
        y = self.o_proj(o.reshape(B, T, H * dv))
        if cache is None:
            return y
        new["state"] = state
        return y, new


class SwiGLU(nn.Module):
    """``down(silu(gate x) * up x)`` (FLA's ``GatedMLP`` with ``hidden_act="swish"``)."""
    def __init__(self, hidden: int, size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, size, bias=False)
        self.up_proj = nn.Linear(hidden, size, bias=False)
        self.down_proj = nn.Linear(size, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LMBlock(nn.Module):
    """Pre-norm: ``x + mixer(norm x)``, then ``x + mlp(norm x)``."""
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attn = DeltaMixer(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden, cfg.mlp_size)

    def forward(self, x: torch.Tensor, cache: Optional[dict] = None, impl: Optional[str] = None):
        if cache is None:
            x = x + self.attn(self.attn_norm(x), impl=impl)
            return x + self.mlp(self.mlp_norm(x))
        y, cache = self.attn(self.attn_norm(x), cache, impl=impl)
        x = x + y
        return x + self.mlp(self.mlp_norm(x)), cache


class DeltaLM(nn.Module):
    """Embedding, ``cfg.layers`` blocks, final RMSNorm, LM head (tied to the embedding or not).

    ``forward(input_ids [B, T])`` -> logits ``[B, T, V]``; ``forward(ids, caches=...)`` -> ``(logits, caches)``
    (start from :meth:`init_caches`). :meth:`loss` is next-token cross entropy over ``ids [B, T+1]``."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList(LMBlock(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self._init_weights()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def _init_weights(self) -> None:
        # FLA's _init_weights: N(0, initializer_range) for every linear and the embedding
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=self.cfg.init_std)

    def init_caches(self) -> list[dict]:
        return [{} for _ in self.blocks]

    def forward(self, input_ids: torch.Tensor, caches: Optional[list[dict]] = None, impl: Optional[str] = None):
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise AttnbenchError(f"DeltaLM: input_ids must be an integer tensor [B, T], got "
                                 f"{input_ids.dtype} {tuple(input_ids.shape)}")
        x = self.embed(input_ids)
        if caches is None:
            for block in self.blocks:
                x = block(x, impl=impl)
            return self.lm_head(self.norm(x))
        out = []
        for block, cache in zip(self.blocks, caches):
            x, cache = block(x, cache, impl=impl)
            out.append(cache)
        return self.lm_head(self.norm(x)), out

    def loss(self, ids: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Next-token cross entropy of ``ids [B, T+1]`` (inputs ``ids[:, :-1]``, targets ``ids[:, 1:]``)."""
        logits = self(ids[:, :-1])
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                               reduction=reduction)

    def fsdp_units(self) -> list[nn.Module]:
        """What FSDP2 shards one by one (each block), before the root."""
        return list(self.blocks)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # a tied weight is one Parameter: counted once


def key_feature_dim(cfg: LMConfig) -> int:
    """Per-head size of the key features the delta rule sees (its state's rows): the q/k projection's width per
    head (``head_dim``, or ``head_dim / expansion`` with ``key_width="match"``) times the map's expansion."""
    ratio = map_expansion(cfg)
    return cfg.head_dim if cfg.key_width == "match" else cfg.head_dim * ratio


def map_expansion(cfg: LMConfig) -> int:
    """Features per input dimension of ``cfg.feature_map`` (1 for SiLU, 2 for NaLa), from a trial build."""
    probe = build_feature_map(cfg.feature_map, heads=1, head_dim=8, causal=True, **cfg.feature_options)
    return max(1, probe.feature_dim // 8)


def build_lm(cfg: LMConfig, device: torch.device | str | None = None) -> DeltaLM:
    """:class:`DeltaLM` of ``cfg`` (``device="meta"`` instantiates without memory, for counting parameters)."""
    if device is None:
        return DeltaLM(cfg)
    with torch.device(device):
        return DeltaLM(cfg)


__all__ = ["LMConfig", "DeltaLM", "DeltaMixer", "LMBlock", "ShortConv", "SwiGLU", "build_lm", "map_expansion",
           "LAYER_KINDS", "QK_NORMS", "KEY_WIDTHS"]
