"""A causal language model whose token mixer is chosen by name: Transformer++, RetNet, GLA, Mamba, DeltaNet or
Gated DeltaNet (the rows of NaLaFormer's Table 5; the mixers in :mod:`attnbench.models.mixers`), with SwiGLU MLPs
and RMSNorm, pre-norm blocks as flash-linear-attention's models (a Mamba block is norm and mixer only).

The delta-rule layers take any registered q/k feature map (SiLU, the published baseline; NaLa, NaLaFormer's
Table 5); GLA and RetNet take one optionally (none by default, as FLA's layers); the Transformer takes any causal
attention mechanism of the registry (softmax by default).

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
recurrent state (the Transformer's keys and values), so feeding a sequence token by token equals one forward pass
over it (tested). Feature maps that pool over the sequence (MirrorLA's variance) are not carried token by token.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from attnbench.core.errors import AttnbenchError
from attnbench.models.mixers import MIXERS, ShortConv

LAYER_KINDS = tuple(MIXERS)
DELTA_LAYERS = ("deltanet", "gated_deltanet")
QK_NORMS = ("l2", "k", "none")
KEY_WIDTHS = ("double", "match")


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """The model. Names follow FLA's configs (``hidden_size`` -> ``hidden``, ``num_hidden_layers`` -> ``layers``,
    ``num_heads`` -> ``heads``, the per-head key size ``head_dim``; value heads are ``head_dim * expand_v``; FLA's
    GLA / RetNet ``expand_k`` is ``heads * head_dim / hidden``). ``intermediate_size = 0`` takes FLA's rule:
    ``2/3 * hidden * hidden_ratio`` rounded up to a multiple of 256. ``feature_map`` None is the layer's own
    (SiLU for the delta rules, none for GLA and RetNet; the Transformer and Mamba have no q/k map). Mamba's
    ``ssm_state`` (N), ``ssm_expand`` and ``dt_rank`` (0: ``ceil(hidden / 16)``) are FLA's ``state_size``,
    ``expand`` and ``dt_rank``; the Transformer's mechanism is ``attention`` with ``attention_options``.
    ``block_conv`` > 0 puts one causal depthwise convolution of that kernel before every block's mixer, whatever
    the mixer (Zoology's short convolution, given to every mixer alike for fairness); 0: none, as FLA's models."""

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
    feature_map: Optional[str] = None
    feature_options: dict = dataclasses.field(default_factory=dict)
    attention: str = "softmax"
    attention_options: dict = dataclasses.field(default_factory=dict)
    rope_theta: float = 10000.0
    ssm_state: int = 16
    ssm_expand: int = 2
    dt_rank: int = 0
    qk_norm: str = "l2"
    key_width: str = "double"
    chunk_size: int = 64
    delta_impl: str = "auto"
    block_conv: int = 0

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
        if self.feature_map and self.layer in ("transformer", "mamba"):
            bad(f"{self.layer} has no q/k feature map (got feature_map={self.feature_map!r}); the Transformer's "
                f"mechanism is `attention`")
        if self.layer == "transformer" and self.heads * self.head_dim != self.hidden:
            bad(f"transformer needs heads * head_dim == hidden, got {self.heads} * {self.head_dim} != {self.hidden}")
        if self.block_conv < 0:
            bad(f"block_conv must be >= 0 (0: none), got {self.block_conv}")
        for k in ("ssm_state", "ssm_expand"):
            if getattr(self, k) < 1:
                bad(f"{k} must be >= 1, got {getattr(self, k)}")

    @property
    def qk_map(self) -> str:
        """The q/k feature map the mixer applies ("" for none)."""
        if self.feature_map is not None:
            return self.feature_map
        return "silu" if self.layer in DELTA_LAYERS else ""

    @property
    def ssm_inner(self) -> int:
        return self.ssm_expand * self.hidden

    @property
    def ssm_dt_rank(self) -> int:
        return self.dt_rank or math.ceil(self.hidden / 16)

    @property
    def value_head_dim(self) -> int:
        return int(self.head_dim * self.expand_v)

    @property
    def mlp_size(self) -> int:
        """The SwiGLU's inner size; 0 (``hidden_ratio = 0``, no ``intermediate_size``): blocks without an MLP,
        mixers only (Zoology's MQAR models)."""
        if self.intermediate_size:
            return self.intermediate_size
        if not self.hidden_ratio:
            return 0
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
    """Pre-norm: ``x + mixer(conv(norm x))``, then ``x + mlp(norm x)`` (no MLP in a Mamba block; the convolution
    only with ``cfg.block_conv``)."""
    def __init__(self, cfg: LMConfig):
        super().__init__()
        mixer, with_mlp = MIXERS[cfg.layer]
        self.attn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        if cfg.block_conv:
            # only the mixer's linear projections read its output: contiguous once, not copied by each of them
            self.block_conv = ShortConv(cfg.hidden, cfg.block_conv, activation=False, contiguous=True)
        self.attn = mixer(cfg)
        if with_mlp and cfg.mlp_size:
            self.mlp_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
            self.mlp = SwiGLU(cfg.hidden, cfg.mlp_size)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.mlp_norm(x)) if hasattr(self, "mlp") else x

    def forward(self, x: torch.Tensor, cache: Optional[dict] = None, impl: Optional[str] = None):
        h = self.attn_norm(x)
        window = None
        if hasattr(self, "block_conv"):
            h, window = self.block_conv(h, None if cache is None else cache.get("block_conv"))
        if cache is None:
            return self._mlp(x + self.attn(h, impl=impl))
        y, new = self.attn(h, cache, impl=impl)
        if window is not None:
            new = {**new, "block_conv": window}
        return self._mlp(x + y), new


class LanguageModel(nn.Module):
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
        # FLA's _init_weights: N(0, initializer_range) for every linear and the embedding, zero biases; then what
        # a mixer initialises its own way (Mamba's dt projection), as FLA's _no_reinit parameters
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, mean=0.0, std=self.cfg.init_std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for m in self.modules():
            if hasattr(m, "reset_dt"):
                m.reset_dt()

    def init_caches(self) -> list[dict]:
        return [{} for _ in self.blocks]

    def forward(self, input_ids: torch.Tensor, caches: Optional[list[dict]] = None, impl: Optional[str] = None):
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.int64, torch.int32):
            raise AttnbenchError(f"LanguageModel: input_ids must be an integer tensor [B, T], got "
                                 f"{input_ids.dtype} {tuple(input_ids.shape)}")
        if caches is None:
            return self.lm_head(self.features(input_ids, impl=impl))
        x = self.embed(input_ids)
        out = []
        for block, cache in zip(self.blocks, caches):
            x, cache = block(x, cache, impl=impl)
            out.append(cache)
        return self.lm_head(self.norm(x)), out

    def features(self, input_ids: torch.Tensor, impl: Optional[str] = None) -> torch.Tensor:
        """The final normalised hidden states ``[B, T, hidden]`` (what the LM head reads)."""
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, impl=impl)
        return self.norm(x)

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


def build_lm(cfg: LMConfig, device: torch.device | str | None = None) -> LanguageModel:
    """:class:`LanguageModel` of ``cfg`` (``device="meta"`` instantiates without memory, for counting parameters)."""
    if device is None:
        return LanguageModel(cfg)
    with torch.device(device):
        return LanguageModel(cfg)


__all__ = ["LMConfig", "LanguageModel", "LMBlock", "SwiGLU", "build_lm", "LAYER_KINDS", "DELTA_LAYERS", "QK_NORMS",
           "KEY_WIDTHS"]
