"""Base classes: :class:`Attention` (the protocol), :class:`FeatureMap`, :class:`FeatureMapAttention`.

An attention has a *reference* implementation (the plain quadratic or token-by-token math of its paper, the
ground truth of the tests) and one or more efficient implementations behind the same call, chosen by
``impl=``. ``"auto"`` resolves from the input's device (``resolve_impl``); the resolved name is what results
record. Nothing falls back silently: an impl that cannot run here is an error.
"""

from __future__ import annotations

import os
from typing import ClassVar, Optional

import torch
from torch import nn

from attnbench.ops import linear_attn as la
from attnbench.core.protocol import AttnbenchError, UnsupportedError, validate_qkv

HALF = (torch.float16, torch.bfloat16)


def triton_usable(device: torch.device) -> bool:
    """Whether a Triton kernel can run on ``device``: a CUDA device, or the CPU under TRITON_INTERPRET=1."""
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


class Attention(nn.Module):
    """An attention mechanism: ``forward(q, k, v)`` on ``[B, H, N, D]``, returns ``[B, H, N, Dv]`` in v's dtype.

    Subclasses set the class attributes below and implement ``forward_<impl>`` for each name in ``impls``.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    bidirectional: ClassVar[bool] = True
    causal_form: ClassVar[bool] = True
    impls: ClassVar[tuple[str, ...]] = ("reference", "torch")
    cpu_impl: ClassVar[str] = "torch"          # what "auto" resolves to on a CPU
    gpu_impl: ClassVar[str] = "torch"          # what "auto" resolves to on a CUDA device
    gpu_only_impls: ClassVar[tuple[str, ...]] = ("triton", "fla")
    upcast_half: ClassVar[bool] = True          # compute fp16/bf16 inputs in fp32 (powers and sums overflow)

    def __init__(self, *, heads: int, head_dim: int, causal: bool = False, impl: str = "auto"):
        super().__init__()
        if not isinstance(heads, int) or heads < 1:
            raise AttnbenchError(f"{self.name}: argument 'heads' must be a positive int, got {heads!r}")
        if not isinstance(head_dim, int) or head_dim < 1:
            raise AttnbenchError(f"{self.name}: argument 'head_dim' must be a positive int, got {head_dim!r}")
        if causal and not self.causal_form:
            raise UnsupportedError(f"{self.name}: argument 'causal=True' is not supported: {self.name} has no "
                                   f"causal form (bidirectional only)")
        if not causal and not self.bidirectional:
            raise UnsupportedError(f"{self.name}: argument 'causal=False' is not supported: {self.name} is causal only")
        if impl != "auto" and impl not in self.impls_for(causal):
            raise AttnbenchError(f"{self.name}: argument 'impl' must be 'auto' or one of "
                                 f"{list(self.impls_for(causal))} (causal={bool(causal)}), got {impl!r}")
        self.heads, self.head_dim, self.causal, self.impl = heads, head_dim, bool(causal), impl

    def recurrent_state_size(self) -> Optional[int]:
        """Numbers the causal form carries from one token to the next, per sequence (all heads; the model's state
        size in Zoology's sense), or None when it keeps every past key and value (softmax: the KV cache grows
        with the length). Mechanisms with a fixed-size recurrent state override this."""
        return None

    @classmethod
    def impls_for(cls, causal: bool) -> tuple[str, ...]:
        """The implementations of the causal or the bidirectional form."""
        return tuple(cls.impls)

    @classmethod
    def shape_options(cls, seq_len: int) -> dict:
        """Options a mechanism needs to know about the sequence length at build time (e.g. Linformer's fixed
        length). Generic drivers (check, scaling, the contract tests) build through
        :func:`attnbench.api.registry.build_for_length`, which merges these in."""
        return {}

    # --- dispatch -------------------------------------------------------------------------------------------
    def resolve_impl(self, device: torch.device | str = "cpu") -> str:
        """The implementation a forward on ``device`` runs; errors if an explicit impl cannot run there."""
        device = torch.device(device)
        impl = self.impl
        if impl == "auto":
            impl = self.gpu_impl if device.type == "cuda" else self.cpu_impl
        if impl in self.gpu_only_impls and not triton_usable(device):
            raise UnsupportedError(f"{self.name}: impl={impl!r} needs a CUDA device (or TRITON_INTERPRET=1 for "
                                   f"Triton on the CPU), but the input is on {device}; use impl='auto' or "
                                   f"one of {[i for i in self.impls if i not in self.gpu_only_impls]}")
        return impl

    def check_inputs(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        validate_qkv(q, k, v, heads=self.heads, head_dim=self.head_dim, name=self.name)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.check_inputs(q, k, v)
        return self.run(self.resolve_impl(q.device), q, k, v)

    def reference(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The paper's math, quadratic or token by token: the ground truth of the tests."""
        self.check_inputs(q, k, v)
        return self.run("reference", q, k, v)

    def run(self, impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out_dtype = v.dtype
        if self.upcast_half and q.dtype in HALF and impl not in self.gpu_only_impls:
            q, k, v = q.float(), k.float(), v.float()
        out = getattr(self, f"forward_{impl}")(q, k, v)
        return out.to(out_dtype)

    def extra_repr(self) -> str:
        return f"heads={self.heads}, head_dim={self.head_dim}, causal={self.causal}, impl={self.impl!r}"


class FeatureMap(nn.Module):
    """A feature map phi: ``phi_q(q)`` and ``phi_k(k)`` map ``[B, H, N, D] -> [B, H, N, M]``.

    Maps whose query and key sides differ (NaLa) override ``phi_q``/``phi_k``; symmetric maps implement ``phi``.
    ``causal`` is passed at build time for maps that pool over the sequence (MirrorLA): their causal form must
    use only the past.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""

    def __init__(self, *, heads: int, head_dim: int, causal: bool = False):
        super().__init__()
        self.heads, self.head_dim, self.causal = heads, head_dim, causal

    @property
    def feature_dim(self) -> int:
        return self.head_dim

    def carried_size(self) -> int:
        """Numbers per head the causal map itself carries from token to token (prefix statistics; 0 for a map of
        each token alone)."""
        return 0

    def phi(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def phi_q(self, q: torch.Tensor) -> torch.Tensor:
        return self.phi(q)

    def phi_k(self, k: torch.Tensor) -> torch.Tensor:
        return self.phi(k)

    def features_triton(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The features fed to the Triton chunk kernel; maps with a fused kernel (NaLa) override this."""
        return self.phi_q(q), self.phi_k(k)

    def block_maps(self, q: torch.Tensor, k: torch.Tensor, block_size: int):
        """``(map_q, map_k)``: callables giving the features of tokens ``start:stop`` (for
        :func:`attnbench.ops.linear_attention_blocked` with this ``block_size``). Maps with sequence statistics
        (MirrorLA) or positions (cosFormer) override this. Symmetric maps with :meth:`phi_into` write every block
        into one reused buffer per side when no gradient is needed (the op consumes a block before asking for
        the next): no allocation, no fresh pages to fault in per block."""
        q_block, k_block = la.token_blocks(q, block_size), la.token_blocks(k, block_size)
        if type(self).phi_into is not FeatureMap.phi_into and not self.needs_grad(q, k):
            return la.scratch_map(self.phi_into, q_block), la.scratch_map(self.phi_into, k_block)
        return (lambda s, e: self.phi_q(q_block(s, e))), (lambda s, e: self.phi_k(k_block(s, e)))

    # hand-written gradients ``vjp(x, feats, dfeats) -> dx`` of phi_q / phi_k, for parameter-free maps (see
    # attnbench.ops.TokenMap); None: autograd through the map, block by block
    vjp_q: ClassVar = None
    vjp_k: ClassVar = None

    def block_functions(self, n: int):
        """``(TokenMap q, TokenMap k)`` (:class:`attnbench.ops.linear_attn.TokenMap`) for a sequence of ``n``:
        each token's features from that token (and its position) alone; or None where a token's features depend
        on other tokens (MirrorLA's sequence statistics). For the recomputing backward of
        :func:`attnbench.ops.linear_attention_recomputed`; maps with positions (cosFormer) override this."""
        return (la.TokenMap(lambda x, start: self.phi_q(x), self.vjp_q),
                la.TokenMap(lambda x, start: self.phi_k(x), self.vjp_k))

    def phi_into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``phi(x)`` written into ``out`` (no autograd), for maps that have such a form (see :meth:`block_maps`)."""
        return out.copy_(self.phi(x))

    def needs_grad(self, *xs: torch.Tensor) -> bool:
        return torch.is_grad_enabled() and (any(x.requires_grad for x in xs)
                                            or any(p.requires_grad for p in self.parameters()))

    # The reference forms default to the same maps; a map whose fast form differs (a prefix statistic computed
    # by cumulative sums, a fused kernel) overrides these with the plain math.
    def phi_q_reference(self, q: torch.Tensor) -> torch.Tensor:
        return self.phi_q(q)

    def phi_k_reference(self, k: torch.Tensor) -> torch.Tensor:
        return self.phi_k(k)


class FeatureMapAttention(Attention):
    """Linear attention from a feature map: ``o_t = phi(q_t) S_t / phi(q_t) z_t`` (Katharopoulos et al. 2020,
    Eq. 6; causal, Eq. 9), ``S_t = sum_i phi(k_i)^T v_i``, ``z_t = sum_i phi(k_i)`` over i <= t when causal.

    No eps: every form equals this formula to rounding wherever it is defined; a denominator that is exactly
    zero (every score zero, e.g. an all-zero ReLU query) gives 0 (:mod:`attnbench.ops.linear_attn`). ``eps``
    (default 0) adds a fixed eps to the mean score, ``phi(q_t) z_t / c_t + eps``: a released code's normaliser
    that a mechanism may reproduce as an explicit option (``nala:sign_split=true``), never the default.
    ``reference`` materialises the N x N scores; ``torch`` runs the associative (bidirectional) or chunked
    (causal) form of :mod:`attnbench.ops.linear_attn`, computing the features block by block
    (:func:`~attnbench.ops.linear_attn.linear_attention_blocked`); ``triton`` (causal, GPU) the chunk kernel for
    the numerator and the same normaliser.
    """

    feature_map_cls: ClassVar[type[FeatureMap]]
    impls = ("reference", "torch", "triton")
    eps: float = 0.0            # a fixed eps on the mean score (a released code's normaliser); 0: the papers
    chunk_size: int = 64        # causal chunk (the masked quadratic part)
    block_size: int = 1024      # tokens whose features are computed at once (cache-sized; tests make it small)
    recompute_backward: bool = True  # bidirectional training over several blocks: ops.linear_attention_recomputed

    def make_feature_map(self, **options) -> FeatureMap:
        return self.feature_map_cls(heads=self.heads, head_dim=self.head_dim, causal=self.causal, **options)

    @classmethod
    def impls_for(cls, causal: bool) -> tuple[str, ...]:
        # the Triton kernel is the causal (recurrent) form; the bidirectional form is two matmuls
        return tuple(cls.impls) if causal else tuple(i for i in cls.impls if i != "triton")

    @property
    def gpu_impl(self) -> str:
        return "triton" if self.causal else "torch"

    def recurrent_state_size(self) -> int:
        """Per head ``S = sum phi(k)^T v`` (``feature_dim x head_dim``), ``z = sum phi(k)`` and what the map
        carries (Katharopoulos et al. 2020, Eqs. 10-11)."""
        fm = self.feature_map
        return self.heads * (fm.feature_dim * self.head_dim + fm.feature_dim + fm.carried_size())

    def forward_reference(self, q, k, v):
        fq, fk = self.feature_map.phi_q_reference(q), self.feature_map.phi_k_reference(k)
        return la.linear_attention_reference(fq, fk, v, causal=self.causal, eps=self.eps)

    def forward_torch(self, q, k, v):
        n = q.shape[-2]
        several = n > self.block_size and self.recompute_backward
        fns = self.feature_map.block_functions(n) if several and not self.causal else None
        if fns is not None and self.feature_map.needs_grad(q, k, v):
            # training, bidirectional, several blocks: the hand-written backward recomputes each block's features
            # (no autograd graph over the blocks, no features kept); the forward uses the in-place inference
            # maps. With one block autograd is faster: there is no graph over blocks to save, and the
            # recomputation would only add a map pass
            fmap = self.feature_map
            with torch.no_grad():
                maps = fmap.block_maps(q.detach(), k.detach(), self.block_size)
            return la.linear_attention_recomputed(*fns, q, k, v, eps=self.eps, block_size=self.block_size,
                                                  tensors=tuple(p for p in fmap.parameters() if p.requires_grad),
                                                  inference_maps=maps)
        map_q, map_k = self.feature_map.block_maps(q, k, self.block_size)
        return la.linear_attention_blocked(map_q, map_k, v, causal=self.causal, eps=self.eps,
                                           chunk_size=self.chunk_size, block_size=self.block_size)

    def forward_triton(self, q, k, v):
        """Causal: the features, then ``attnbench.kernels.chunk_linear_attn`` for the numerator (unnormalised);
        the normaliser from the prefix sums of the key features (elementwise, fp32), as in the other forms."""
        from attnbench.kernels import chunk_linear_attn  # lazy: triton is optional

        fq, fk = self.feature_map.features_triton(q, k)
        num, _ = chunk_linear_attn(fq, fk, v, normalize=False, chunk_size=self.chunk_size)    # [B, H, N, D]
        c = torch.arange(1, q.shape[-2] + 1, device=q.device, dtype=torch.float32).unsqueeze(-1)  # [N, 1]
        z_mean = fk.float().cumsum(-2) / c                                     # [B, H, N, M]
        den = (fq.float() * z_mean).sum(-1, keepdim=True)                      # [B, H, N, 1] mean score
        return (num.float() / c) / la.safe_den(den, self.eps)
