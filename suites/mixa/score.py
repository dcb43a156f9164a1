"""MixA's layer significance score (Ahmed et al., ICCV 2025, Sec. 5.1, Eq. 3), the top-k selection, and the mixed
spec lists it implies (ReLU quadratic attention, Eqs. 4-5, in the selected layers; SteLLA, Eqs. 6-7, elsewhere).

What :func:`layer_scores` computes, exactly (the paper leaves the batch reduction, the loss and the scale of A'
open; these are this implementation's choices, recorded with every result):

- The teacher is the pretrained softmax ViT in eval mode. Each layer's attention (``blocks[l].attn.mech``) is
  swapped for :class:`ProbeAttention`, which re-implements the softmax layer with an explicit matrix:
  ``A = softmax(Q K^T * scale)`` (``[B, H, N, N]``, the teacher's own scale, 1/sqrt(d) by default), then
  ``O = (A + delta) V`` with ``delta`` a zero tensor that requires grad. The forward is the teacher's (checked in
  the tests); ``d loss / d delta`` is ``∇_A L`` (Eq. 3's gradient) *including* the paths through later layers'
  queries and keys (A is not cut from the graph).
- The loss ``L`` is the mean cross-entropy of the teacher's logits against the labels of a batch.
- ``A'`` (the matrix of the layer once linear, Eq. 7) is computed from the same layer's Q and K of the same
  (unmodified) forward, i.e. one layer at a time: ``linear_matrix = "effective"`` (default) uses the matrix that
  SteLLA applies to V, ``A' = ReLU(Q) ReLU(K)^T / (sqrt(d) * N)`` (Eq. 7 with β'_L = 1, divided by α_L = N of
  Eq. 6 with α'_L = 1), so that ``ΔA V`` is the change in the layer's output and ``Tr(∇_A L^T ΔA)`` is the
  first-order change of the loss; ``"eq7"`` uses Eq. 7's ``A_L = ReLU(Q) ReLU(K)^T / sqrt(d)`` as printed
  (without 1/α_L; its entries are ~N times larger than a softmax row's).
- Per head h and batch b: ``t[b, h] = Tr(G_h^T ΔA_h) = Σ_{images, rows, cols} G ⊙ ΔA`` (the batch summed inside
  the trace; G is the gradient of the batch *mean* loss). Over the ``batches`` scored batches the trace terms
  are averaged (the first-order change of the mean loss over all scored images), then Eq. 3:
  ``I_A = (1/H) Σ_h |mean_b t[b, h]|``.
- Selection: ``S = top-k(I_A)`` (ties to the earlier layer); layers in S -> ``relu_quadratic``, others ->
  ``stella`` (both with learnable α', β' initialised to 1, the teacher's qkv / proj weights).
"""

from __future__ import annotations

import dataclasses
import math
import random
from contextlib import contextmanager
from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.core.errors import AttnbenchError
from attnbench.api.spec import AttentionSpec, parse_spec

LINEAR_MATRICES = ("effective", "eq7")


def linear_matrix(q: torch.Tensor, k: torch.Tensor, form: str = "effective") -> torch.Tensor:
    """``A'`` of the layer made linear (SteLLA, Eq. 7, β'_L = α'_L = 1) from ``q, k [B, H, N, d]``:
    ``[B, H, N, N]``. ``effective``: ``ReLU(Q) ReLU(K)^T / (sqrt(d) N)`` (what multiplies V, Eq. 6);
    ``eq7``: ``ReLU(Q) ReLU(K)^T / sqrt(d)``."""
    if form not in LINEAR_MATRICES:
        raise AttnbenchError(f"linear_matrix must be one of {', '.join(LINEAR_MATRICES)}, got {form!r}")
    n, d = q.shape[-2], q.shape[-1]
    a = F.relu(q) @ F.relu(k).transpose(-1, -2) / math.sqrt(d)  # [B, H, N, N]
    return a / n if form == "effective" else a


class ProbeAttention(nn.Module):
    """Softmax attention with its matrix explicit: ``O = (softmax(Q K^T * scale) + delta) V``.

    Records (detached) the last forward's ``q``, ``k`` and ``A``; ``delta`` (``[B, H, N, N]`` or broadcastable,
    None: zero) is added to A: a zero leaf that requires grad gives ``∇_A L`` as its ``.grad``; a fixed
    ``ε ΔA`` moves the layer's attention matrix (the finite-difference check)."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.delta: Optional[torch.Tensor] = None
        self.q = self.k = self.A = None

    def forward(self, q, k, v):
        A = torch.softmax((q @ k.transpose(-1, -2)) * self.scale, dim=-1)  # [B, H, N, N]
        self.q, self.k, self.A = q.detach(), k.detach(), A.detach()
        if self.delta is not None:
            A = A + self.delta.to(A.dtype)
        return A @ v  # [B, H, N, Dv]


def _blocks(model: nn.Module):
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(getattr(b, "attn", None), "mech") for b in blocks):
        raise AttnbenchError("the model is not a ViT of attnbench.models.vit (blocks[i].attn.mech)")
    for i, b in enumerate(blocks):
        if b.attn.mech.name != "softmax":
            raise AttnbenchError(f"layer {i} of the teacher is {b.attn.mech.name!r}; the score needs softmax layers")
    return list(blocks)


@contextmanager
def probed(model: nn.Module):
    """Every layer's softmax mechanism replaced by a :class:`ProbeAttention` of the same scale (restored on
    exit); yields the probes, one per layer."""
    blocks = _blocks(model)
    saved = [b.attn.mech for b in blocks]
    probes = [ProbeAttention(m.scale) for m in saved]
    try:
        for b, p in zip(blocks, probes):
            b.attn.mech = p
        yield probes
    finally:
        for b, m in zip(blocks, saved):
            b.attn.mech = m


@dataclasses.dataclass
class LayerScores:
    """Eq. 3 per layer: ``scores[l] = I_A`` and the signed per-head trace terms ``traces[l][h]`` (averaged over
    the scored batches, before the absolute value); ``loss``: the teacher's mean loss on the scored batches."""

    scores: list[float]
    traces: list[list[float]]
    batches: int
    images: int
    loss: float
    linear_matrix: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def layer_scores(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *,
                 form: str = "effective") -> LayerScores:
    """I_A of Eq. 3 for every attention layer of the softmax ViT ``model`` over ``batches`` of ``(images,
    labels)`` (see the module docstring for exactly what is computed). The model's weights are unchanged and
    get no gradients."""
    if form not in LINEAR_MATRICES:
        raise AttnbenchError(f"linear_matrix must be one of {', '.join(LINEAR_MATRICES)}, got {form!r}")
    was = model.training
    model.eval()
    req = [p.requires_grad for p in model.parameters()]
    model.requires_grad_(False)
    dtype = next(model.parameters()).dtype
    sums: Optional[torch.Tensor] = None  # [L, H] float64
    n_batches = n_images = 0
    loss_sum = 0.0
    try:
        with probed(model) as probes:
            for x, y in batches:
                x = x.to(dtype)
                # the first forward fixes the shapes of the zero leaves; same x, same A
                for p in probes:
                    p.delta = None
                with torch.no_grad():
                    model(x)
                deltas = [torch.zeros_like(p.A, requires_grad=True) for p in probes]
                for p, dl in zip(probes, deltas):
                    p.delta = dl
                loss = _ce(model(x), y)
                loss.backward()
                rows = []
                for p, dl in zip(probes, deltas):
                    dA = linear_matrix(p.q, p.k, form) - p.A  # [B, H, N, N]
                    rows.append((dl.grad.double() * dA.double()).sum(dim=(0, 2, 3)))  # [H]: Tr(G_h^T ΔA_h)
                t = torch.stack(rows)  # [L, H]
                sums = t if sums is None else sums + t
                n_batches += 1
                n_images += len(y)
                loss_sum += loss.item()
                for p in probes:
                    p.delta = None
    finally:
        for p, r in zip(model.parameters(), req):
            p.requires_grad_(r)
        model.train(was)
    if not n_batches:
        raise AttnbenchError("no batches to score the layers on")
    traces = sums / n_batches  # [L, H]
    return LayerScores(scores=traces.abs().mean(dim=1).tolist(), traces=traces.tolist(), batches=n_batches,
                       images=n_images, loss=loss_sum / n_batches, linear_matrix=form)


def _ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in fp32 at least (fp64 stays fp64: the finite-difference check runs in it)."""
    return F.cross_entropy(logits if logits.dtype == torch.float64 else logits.float(), y)


@torch.no_grad()
def loss_with_delta(model: nn.Module, x: torch.Tensor, y: torch.Tensor, layer: int,
                    delta: torch.Tensor) -> float:
    """The teacher's mean cross-entropy on ``(x, y)`` when layer ``layer``'s attention matrix is ``A + delta``
    (every other layer as is): the finite-difference side of the first-order check of Eq. 3."""
    was = model.training
    model.eval()
    try:
        with probed(model) as probes:
            probes[layer].delta = delta
            return _ce(model(x.to(next(model.parameters()).dtype)), y).item()
    finally:
        model.train(was)


@torch.no_grad()
def attention_change(model: nn.Module, x: torch.Tensor, layer: int, form: str = "effective") -> torch.Tensor:
    """``ΔA = A' - A`` of layer ``layer`` on images ``x`` (``[B, H, N, N]``), as :func:`layer_scores` uses it."""
    with probed(model) as probes:
        model(x.to(next(model.parameters()).dtype))
        p = probes[layer]
        return linear_matrix(p.q, p.k, form) - p.A


# --- selection and the variants -------------------------------------------------------------------------------
def top_k(scores: Sequence[float], k: int) -> list[int]:
    """The indices of the ``k`` largest scores (ties to the earlier layer), sorted: MixA's S."""
    check_k(k, len(scores))
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return sorted(order[:k])


def last_k(depth: int, k: int) -> list[int]:
    check_k(k, depth)
    return list(range(depth - k, depth))


def random_k(depth: int, k: int, seed: int) -> list[int]:
    """``k`` layers drawn uniformly without replacement by ``random.Random(seed)``, sorted (Table 7's control)."""
    check_k(k, depth)
    return sorted(random.Random(seed).sample(range(depth), k))


def check_k(k: int, depth: int) -> None:
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= depth:
        raise AttnbenchError(f"k must be an integer from 0 to the number of layers ({depth}), got {k!r}")


def mixed_specs(depth: int, quadratic: Iterable[int], *, quadratic_spec: str | AttentionSpec = "relu_quadratic",
                linear_spec: str | AttentionSpec = "stella") -> list[AttentionSpec]:
    """One spec per layer: ``quadratic_spec`` (Eqs. 4-5) in the layers ``quadratic``, ``linear_spec`` (Eqs. 6-7)
    in the others."""
    quad = set(quadratic)
    bad = [i for i in quad if not 0 <= i < depth]
    if bad:
        raise AttnbenchError(f"layer(s) {bad} out of range for {depth} layers")
    qs = parse_spec(quadratic_spec) if isinstance(quadratic_spec, str) else quadratic_spec
    ls = parse_spec(linear_spec) if isinstance(linear_spec, str) else linear_spec
    return [qs if i in quad else ls for i in range(depth)]
