"""The block around an attention and a pre-norm transformer stack built from attention specs.

An attention (the protocol's ``Attention(q, k, v)``) knows nothing of projections, positional information or
convolutions: those belong here. :class:`BlockOptions` holds the optional pieces the vision linear-attention
papers put around the attention, off by default and recorded with every result when on:

- ``dwc_kernel``: a depthwise convolution on V added to the attention output (FLatten's DWC, PolaFormer's and
  NaLaFormer's blocks): ``out = attn(q, k, v) + DWC(v)``, over the token grid (``grid=(h, w)``: a 2-D conv) or
  over the sequence (1-D) when the block has no grid.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
from torch import nn

from attnbench.api.spec import AttentionSpec


@dataclasses.dataclass(frozen=True)
class BlockOptions:
    """Optional pieces around the attention (all off by default)."""

    dwc_kernel: int = 0  # depthwise conv on V (0: none)

    def __post_init__(self) -> None:
        if self.dwc_kernel < 0 or (self.dwc_kernel and self.dwc_kernel % 2 == 0):
            raise ValueError(f"block option dwc_kernel must be 0 or odd, got {self.dwc_kernel}")

    def active(self) -> dict:
        """The options that are on (what a result records)."""
        default = BlockOptions()
        return {k: v for k, v in dataclasses.asdict(self).items() if v != getattr(default, k)}


def layer_specs(specs: AttentionSpec | Sequence[AttentionSpec], layers: int) -> list[AttentionSpec]:
    """One spec for every layer, or a list of exactly ``layers`` specs (a mixed model)."""
    if isinstance(specs, AttentionSpec):
        return [specs] * layers
    specs = list(specs)
    if len(specs) == 1:
        return specs * layers
    if len(specs) != layers:
        raise ValueError(f"{len(specs)} attention specs for {layers} layers: give one spec or one per layer")
    return specs


class AttentionBlock(nn.Module):
    """q/k/v projections, the attention built from ``spec``, the output projection (+ the optional pieces).

    ``forward(x [B, N, dim], mask [B, N] bool | None) -> [B, N, dim]``. With a ``mask``, value rows of masked
    positions are zeroed before the attention (the protocol has no mask: padded keys still enter normalisers).
    """

    def __init__(self, spec: AttentionSpec, *, dim: int, heads: int, head_dim: int, seq_len: Optional[int] = None,
                 causal: bool = False, options: BlockOptions = BlockOptions(), grid: Optional[tuple[int, int]] = None):
        super().__init__()
        self.heads, self.head_dim, self.grid = heads, head_dim, grid
        inner = heads * head_dim
        # creation order fixes the initialisation drawn from the seed: keep it (results are compared across ports)
        self.w_q = nn.Linear(dim, inner)
        self.w_k = nn.Linear(dim, inner)
        self.w_v = nn.Linear(dim, inner)
        self.attn = spec.build(heads=heads, head_dim=head_dim, seq_len=seq_len, causal=causal)
        self.out = nn.Linear(inner, dim)
        self.dwc = None
        if options.dwc_kernel:
            k = options.dwc_kernel
            conv = nn.Conv2d if grid is not None else nn.Conv1d
            with torch.random.fork_rng(devices=[]):  # the rest of the model initialises as without it
                self.dwc = conv(inner, inner, k, padding=k // 2, groups=inner)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.reshape(b, n, self.heads, self.head_dim).transpose(1, 2)  # [B, H, N, Dh]

    def _dwc(self, v: torch.Tensor) -> torch.Tensor:
        b, n, c = v.shape  # [B, N, inner]
        if self.grid is not None:
            h, w = self.grid
            if h * w != n:
                raise ValueError(f"depthwise conv over a {h}x{w} grid got {n} tokens")
            return self.dwc(v.transpose(1, 2).reshape(b, c, h, w)).reshape(b, c, n).transpose(1, 2)
        return self.dwc(v.transpose(1, 2)).transpose(1, 2)  # [B, N, inner]

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        q, k, v = self._split(self.w_q(x)), self._split(self.w_k(x)), self._split(self.w_v(x))  # [B, H, N, Dh]
        if mask is not None:
            v = v * mask[:, None, :, None].to(v.dtype)  # [B, H, N, Dh]: padded value rows are zero
        o = self.attn(q, k, v)  # [B, H, N, Dh]
        b, h, n, d = o.shape
        o = o.transpose(1, 2).reshape(b, n, h * d)  # [B, N, inner]
        if self.dwc is not None:
            o = o + self._dwc(v.transpose(1, 2).reshape(b, n, h * v.shape[-1]))
        return self.out(o)  # [B, N, dim]


class PreNormBlock(nn.Module):
    """``x + drop(attn(norm1(x)))`` then ``x + mlp(norm2(x))`` with a GELU MLP (the LRA reference's block)."""

    def __init__(self, spec: AttentionSpec, *, dim: int, ffn_dim: int, heads: int, head_dim: int,
                 seq_len: Optional[int] = None, dropout: float = 0.0, causal: bool = False,
                 options: BlockOptions = BlockOptions(), grid: Optional[tuple[int, int]] = None):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.mha = AttentionBlock(spec, dim=dim, heads=heads, head_dim=head_dim, seq_len=seq_len, causal=causal,
                                  options=options, grid=grid)
        self.dropout1 = nn.Dropout(dropout)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ffn_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(ffn_dim, dim),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        x = self.dropout1(self.mha(self.norm1(x), mask)) + x  # [B, N, dim]
        return self.mlp(self.norm2(x)) + x  # [B, N, dim]


class TransformerStack(nn.Module):
    """``layers`` pre-norm blocks, then a final LayerNorm; layer ``i`` uses ``specs[i]`` (one spec: all layers)."""

    def __init__(self, specs: AttentionSpec | Sequence[AttentionSpec], *, layers: int, dim: int, ffn_dim: int,
                 heads: int, head_dim: int, seq_len: Optional[int] = None, dropout: float = 0.0,
                 causal: bool = False, options: BlockOptions = BlockOptions(),
                 grid: Optional[tuple[int, int]] = None):
        super().__init__()
        self.specs = layer_specs(specs, layers)
        self.blocks = nn.ModuleList(
            PreNormBlock(s, dim=dim, ffn_dim=ffn_dim, heads=heads, head_dim=head_dim, seq_len=seq_len,
                         dropout=dropout, causal=causal, options=options, grid=grid) for s in self.specs)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x, mask)
        return self.norm(x)  # [B, N, dim]

    def resolve_impl(self, device) -> str:
        """The implementations the attentions run on ``device`` (what a result records)."""
        return ",".join(sorted({b.mha.attn.resolve_impl(device) for b in self.blocks}))
