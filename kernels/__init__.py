"""Triton kernels and their autograd Functions. A leaf: never imports attnbench.

Dispatch-free: every fast form is its own function next to its PyTorch reference; choosing between them is the
caller's job (``attnbench.ops``). Importing this package never fails for want of triton: ``HAS_TRITON`` says
whether it imported, ``kernels_available(device)`` whether a kernel can run on that device now (CUDA, or CPU
tensors under ``TRITON_INTERPRET=1``), and the kernel entry points raise a clear error otherwise. The references
need only PyTorch (the fast CPU forms in PyTorch are in ``attnbench.ops``).

    chunk_linear_attn(fq, fk, v, *, normalize=True, eps=0.0, initial_state=None, output_final_state=False,
                      chunk_size=64, offset=0) -> (o, (S, z) or None)          causal, fwd + bwd
    nala_feature_map(x, *, is_query, lam=3.0, tau=0.5, eps=1e-6) -> [..., 2D]  fused NaLa map, fwd + bwd
    l1_distance(x, y) -> [B, H, N, m]                                          fwd + bwd, no N x m x d tensor
    newton_schulz_step(X, W) -> X (2I - W X)                                   [..., m, m], m <= 128
"""

from ._util import HAS_TRITON, interpreting, kernels_available
from .laplace import (L1DistanceFunction, NewtonSchulzStepFunction, l1_distance, l1_distance_reference,
                      newton_schulz_step, newton_schulz_step_reference)
from .linear_attn import ChunkLinearAttnFunction, chunk_linear_attn, chunk_linear_attn_reference
from .nala import NaLaFeatureMapFunction, nala_feature_map, nala_feature_map_reference

__all__ = [
    "HAS_TRITON",
    "interpreting",
    "kernels_available",
    "chunk_linear_attn",
    "chunk_linear_attn_reference",
    "ChunkLinearAttnFunction",
    "nala_feature_map",
    "nala_feature_map_reference",
    "NaLaFeatureMapFunction",
    "l1_distance",
    "l1_distance_reference",
    "L1DistanceFunction",
    "newton_schulz_step",
    "newton_schulz_step_reference",
    "NewtonSchulzStepFunction",
]
