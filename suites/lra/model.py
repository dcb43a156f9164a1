"""The LRA classifier of the PyTorch "Skyformer / Nyströmformer" setting, with the attention taken from the registry.

Source of the setting: ``mlpen/Nystromformer`` ``LRA/code/{model.py, model_wrapper.py, attention.py,
lra_config.py}`` (reused unchanged by ``pkuzengqi/Skyformer`` ``code/models/model_LRA.py`` and its
``src/config.py``), which is the setting NaLaFormer's Table 14 and PolaFormer's LRA table report in:

- token embedding + *learned* positional embedding (both ``N(0, 0.02)``), dropout;
- ``layers`` **pre-LN** blocks, exactly as ``Transformer.forward`` in ``LRA/code/model.py``::

      X = dropout(mha(norm1(X))) + X
      X = mlpblock(norm2(X)) + X          # mlpblock = Linear -> GELU -> Dropout -> Linear -> Dropout

  then a final ``LayerNorm`` over the tokens;
- ``mha`` = q/k/v projections ``Linear(dim, heads * head_dim)`` (with bias), the attention, and an output
  projection ``Linear(heads * head_dim, dim)``;
- mean pooling, then the head ``Linear(dim, ffn_dim) -> ReLU -> Linear(ffn_dim, classes)`` (``SCHead``);
- Retrieval: one encoder with shared weights applied to both documents, features ``[u, v, u*v, u-v]`` and the
  head ``Linear(4 * dim, ffn_dim) -> ReLU -> Linear(ffn_dim, 2)`` (``SCHeadDual``).

Published sizes: 2 layers, dim 64, FFN 128, 2 heads of head_dim 32, dropout 0.1 (:class:`ModelConfig` in
``suites/lra/config.py`` carries them; the presets set them).

**Padding — read this before comparing with the reference.** The attention protocol is ``attention(q, k, v)``
with no mask, so a registered mechanism cannot exclude padded keys the way the reference code does (its softmax
adds ``-1e6`` to padded keys' scores; its ``LinearAttention`` multiplies ``phi(K)`` and ``V`` by the mask).
Here, for tasks with a pad id (ListOps, Text, Retrieval):

- the **value rows of padded positions are zeroed** before every attention call, so pads add nothing to any
  numerator ``sum_j a_ij v_j``;
- padded *keys* still enter each mechanism's normaliser (softmax: ``exp(q.k_pad)`` in the denominator; linear
  attentions: ``phi(k_pad)`` in ``z``), and mechanisms that pool statistics over the sequence (e.g. MirrorLA)
  see the padded positions. Pads carry the pad-token embedding plus their position, which the model can learn
  to make harmless, but the result is *not* the exactly masked model of the reference;
- pooling is a mean over non-pad tokens only (the reference zeroes padded outputs and then divides by the full
  length, i.e. a mean scaled by ``n_real / N``; the classifier is the same up to that per-example scale).

Pixel tasks (Image, Pathfinder) have no padding (every id 0..255 is a pixel). Note the reference's
``mask = (input_ids != 0)`` also treats *black pixels* as padding in those tasks; we do not.

The reference applies attention-probability dropout (``attention_dropout=0.1``) inside its softmax attention
only; the protocol has no such hook, so no attention-probability dropout is applied for any mechanism.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from attnbench.models import TransformerStack
from attnbench.api.spec import AttentionSpec, as_specs


class Encoder(nn.Module):
    """Embeddings, then :class:`attnbench.models.TransformerStack` (``layers`` pre-LN blocks of the reference
    ``Transformer``: q/k/v projections with bias, the attention, output projection; GELU MLP; final LayerNorm):
    ``ids [B, N] -> [B, N, dim]``. ``specs``: one attention spec for every layer, or one per layer."""

    def __init__(self, specs: AttentionSpec | Sequence[AttentionSpec], *, vocab_size: int, seq_len: int, dim: int,
                 ffn_dim: int, heads: int, head_dim: int, layers: int, dropout: float):
        super().__init__()
        self.seq_len = seq_len
        self.tok = nn.Embedding(vocab_size, dim)
        self.pos = nn.Embedding(seq_len, dim)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos.weight, std=0.02)
        self.dropout = nn.Dropout(dropout)
        self.stack = TransformerStack(specs, layers=layers, dim=dim, ffn_dim=ffn_dim, heads=heads, head_dim=head_dim,
                                      seq_len=seq_len, dropout=dropout)

    def forward(self, ids: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        n = ids.shape[1]
        if n > self.seq_len:
            raise ValueError(f"input length {n} exceeds the model's seq_len {self.seq_len}")
        pos = torch.arange(n, device=ids.device)  # [N]
        x = self.dropout(self.tok(ids) + self.pos(pos)[None])  # [B, N, dim]
        return self.stack(x, mask)  # [B, N, dim]


def masked_mean(x: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Mean over the tokens of ``x [B, N, dim]`` where ``mask [B, N]`` is true (all tokens if None) -> ``[B, dim]``."""
    if mask is None:
        return x.mean(dim=1)
    m = mask.to(x.dtype)[..., None]  # [B, N, 1]
    return (x * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)


class LRAClassifier(nn.Module):
    """Single-sequence LRA model (ListOps, Text, Image, Pathfinder): ``forward(ids [B, N]) -> logits [B, C]``.

    ``pad_id`` None means no padding (pixel tasks); otherwise positions equal to ``pad_id`` are padding (see the
    module docstring for exactly what that does and does not exclude).
    """

    def __init__(self, attention: str | AttentionSpec | Sequence[AttentionSpec], *, vocab_size: int,
                 num_classes: int, seq_len: int, dim: int = 64, ffn_dim: int = 128, heads: int = 2,
                 head_dim: int = 32, layers: int = 2, dropout: float = 0.1, pad_id: Optional[int] = 0):
        super().__init__()
        self.pad_id = pad_id
        specs = as_specs([attention] if isinstance(attention, (str, AttentionSpec)) else attention)
        self.encoder = Encoder(specs, vocab_size=vocab_size, seq_len=seq_len, dim=dim, ffn_dim=ffn_dim,
                               heads=heads, head_dim=head_dim, layers=layers, dropout=dropout)
        self.head = nn.Sequential(nn.Linear(dim, ffn_dim), nn.ReLU(), nn.Linear(ffn_dim, num_classes))

    def _mask(self, ids: torch.Tensor) -> Optional[torch.Tensor]:
        return None if self.pad_id is None else ids != self.pad_id  # [B, N] bool

    def resolve_impl(self, device: torch.device | str) -> str:
        """The implementation the model's attentions run on ``device`` (what a result records)."""
        return self.encoder.stack.resolve_impl(device)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        """Pooled features ``[B, dim]``."""
        mask = self._mask(ids)
        return masked_mean(self.encoder(ids, mask), mask)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.encode(ids))  # [B, C]


class LRADualClassifier(LRAClassifier):
    """Retrieval (AAN): both documents through one encoder, ``[u, v, u*v, u-v] -> MLP -> 2`` (``SCHeadDual``).

    ``forward(ids [B, N], ids2 [B, N]) -> logits [B, C]``.
    """

    def __init__(self, attention: str | AttentionSpec | Sequence[AttentionSpec], *, vocab_size: int,
                 num_classes: int = 2, seq_len: int, dim: int = 64, ffn_dim: int = 128, heads: int = 2,
                 head_dim: int = 32, layers: int = 2, dropout: float = 0.1, pad_id: Optional[int] = 0):
        super().__init__(attention, vocab_size=vocab_size, num_classes=num_classes, seq_len=seq_len, dim=dim,
                         ffn_dim=ffn_dim, heads=heads, head_dim=head_dim, layers=layers, dropout=dropout,
                         pad_id=pad_id)
        self.head = nn.Sequential(nn.Linear(4 * dim, ffn_dim), nn.ReLU(), nn.Linear(ffn_dim, num_classes))

    def forward(self, ids: torch.Tensor, ids2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        u, v = self.encode(ids), self.encode(ids2)  # [B, dim] each
        return self.head(torch.cat([u, v, u * v, u - v], dim=-1))  # [B, C]


def build_model(attention: str | AttentionSpec | Sequence[AttentionSpec], *, vocab_size: int, num_classes: int,
                seq_len: int, pair: bool, pad_id: Optional[int], dim: int, ffn_dim: int, heads: int, head_dim: int,
                layers: int, dropout: float) -> LRAClassifier:
    """The single or dual (``pair=True``) classifier for one task."""
    cls = LRADualClassifier if pair else LRAClassifier
    return cls(attention, vocab_size=vocab_size, num_classes=num_classes, seq_len=seq_len, dim=dim, ffn_dim=ffn_dim,
               heads=heads, head_dim=head_dim, layers=layers, dropout=dropout, pad_id=pad_id)
