"""What the doctor times: each form with its exact reference (the gate) and its nominal FLOPs.

Kernel forms, all causal, on ``[B, H, N, d]``: SDPA (softmax), attnbench's Triton ``chunk_linear_attn`` and FLA's
``chunk_linear_attn`` (the same normalised linear attention on ELU+1 features), attnbench's chunked PyTorch delta
rule and FLA's ``chunk_delta_rule`` / ``chunk_gated_delta_rule`` (through :func:`attnbench.ops.delta.delta_rule`,
which converts FLA's ``[B, T, H, D]`` layout once). Mechanism forms: each registered mechanism's ``auto`` form
(causal where it has one) and, with ``compile``, the same module under ``torch.compile``.

Every form's reference is exact and runs in float64 on the CPU: the softmax, the normalised linear attention and
the token-by-token delta-rule recurrence of ``attnbench.ops``, a mechanism's ``reference``. Nominal FLOPs count the
algorithm's matmul work (forward; forward + backward counted as 3x forward): SDPA causal ``2 B H N^2 d``; chunked
linear attention ``B H N (4 d dv + 2 C (d + dv))`` with chunk ``C = 64``; the delta rule that plus ``B H N C d``
for its chunk's triangular solve. A mechanism's FLOPs are counted by ``torch.utils.flop_counter`` on its forward
(matmul-class work only). TFLOP/s figures are these counts over the median time: a stated convention, not a
hardware counter.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F

from attnbench.api import registry
from attnbench.api.spec import Spec
from attnbench.attention.base import triton_usable
from attnbench.measure.flops import count_flops
from attnbench.ops.delta import delta_rule, delta_rule_recurrent
from attnbench.ops.linear_attn import linear_attention_reference

CHUNK = 64


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    head_dim: int


@dataclasses.dataclass
class Form:
    """A timed form. ``inputs(n)``: float64 CPU tensors (seeded); ``fast(*x)``: the form on ``x`` (already cast and
    moved); ``reference(*x)``: the exact form, run in float64 on the CPU for the gate; ``flops(n)``: nominal
    forward FLOPs; ``needs``: what must be present (``cuda``, ``triton``, ``fla``)."""

    name: str
    family: str                      # "kernel", "mechanism" or "compiled"
    op: str                          # what it computes: softmax, linear, delta_rule, gated_delta_rule, a mechanism
    shape: Shape
    needs: tuple[str, ...]          # "cuda", "fla", "triton" (CUDA, or the CPU under Triton's interpreter)
    inputs: Callable[[int], list[torch.Tensor]]
    fast: Callable[..., torch.Tensor]
    reference: Callable[..., torch.Tensor]
    flops: Callable[[int], float]
    module: Any = None               # a mechanism's module (its gate judges parameters' gradients too)
    causal: bool = True
    first_call_s: float = 2.0        # a guess of the first call's cost (JIT, autotune, compile) for the budget


def _randn(shape: tuple, seed: int, n: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(n)]


# --- kernel forms --------------------------------------------------------------------------------------------------
def _softmax_ref(q, k, v):
    n = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


def _linear_ref(fq, fk, v):
    return linear_attention_reference(fq, fk, v, causal=True)


def _positive_inputs(shape: Shape, seed: int) -> Callable[[int], list[torch.Tensor]]:
    def inputs(n: int) -> list[torch.Tensor]:
        q, k, v = _randn((shape.batch, shape.heads, n, shape.head_dim), seed)
        return [F.elu(q) + 1, F.elu(k) + 1, v]  # ELU+1 features: what the linear-attention kernels take
    return inputs


def _delta_inputs(shape: Shape, seed: int, gated: bool) -> Callable[[int], list[torch.Tensor]]:
    def inputs(n: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        full = (shape.batch, shape.heads, n, shape.head_dim)
        q, k, v = (torch.randn(full, generator=g, dtype=torch.float64) for _ in range(3))
        out = [q, F.normalize(k, dim=-1), v, torch.rand(full[:3], generator=g, dtype=torch.float64)]
        if gated:
            out.append(F.logsigmoid(torch.randn(full[:3], generator=g, dtype=torch.float64) + 2))
        return out
    return inputs


def _delta(impl: str):
    return lambda *x: delta_rule(*x, impl=impl)[0]


def _delta_ref(*x):
    return delta_rule_recurrent(*x)[0]


def _fla_linear(fq, fk, v):
    from fla.ops.linear_attn import chunk_linear_attn

    o, _ = chunk_linear_attn(*(t.transpose(1, 2) for t in (fq, fk, v)), scale=1.0, normalize=True)
    return o.transpose(1, 2)


def _ab_linear(fq, fk, v):
    from attnbench.kernels import chunk_linear_attn

    return chunk_linear_attn(fq, fk, v, normalize=True)[0]


def kernel_forms(attn_shape: Shape, delta_shape: Shape, seed: int = 0) -> list[Form]:
    """The kernel-level forms, attnbench's beside FLA's and SDPA, at the preset's shapes."""
    a, dl = attn_shape, delta_shape

    def linear_flops(n: int, s: Shape = a) -> float:
        return s.batch * s.heads * n * (4 * s.head_dim ** 2 + 2 * CHUNK * 2 * s.head_dim)

    def delta_flops(n: int) -> float:
        return linear_flops(n, dl) + dl.batch * dl.heads * n * CHUNK * dl.head_dim

    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    return [
        Form("sdpa", "kernel", "softmax", a, (), lambda n: _randn((a.batch, a.heads, n, a.head_dim), seed), sdpa,
             _softmax_ref, lambda n: 2.0 * a.batch * a.heads * n * n * a.head_dim, first_call_s=0.5),
        Form("attnbench.chunk_linear_attn", "kernel", "linear", a, ("triton",), _positive_inputs(a, seed),
             _ab_linear, _linear_ref, linear_flops),
        Form("fla.chunk_linear_attn", "kernel", "linear", a, ("cuda", "fla"), _positive_inputs(a, seed),
             _fla_linear, _linear_ref, linear_flops, first_call_s=5.0),
        Form("attnbench.delta_rule", "kernel", "delta_rule", dl, (), _delta_inputs(dl, seed, False), _delta("torch"),
             _delta_ref, delta_flops, first_call_s=0.5),
        Form("fla.chunk_delta_rule", "kernel", "delta_rule", dl, ("cuda", "fla"), _delta_inputs(dl, seed, False),
             _delta("fla"), _delta_ref, delta_flops, first_call_s=5.0),
        Form("attnbench.gated_delta_rule", "kernel", "gated_delta_rule", dl, (), _delta_inputs(dl, seed, True),
             _delta("torch"), _delta_ref, delta_flops, first_call_s=0.5),
        Form("fla.chunk_gated_delta_rule", "kernel", "gated_delta_rule", dl, ("cuda", "fla"),
             _delta_inputs(dl, seed, True), _delta("fla"), _delta_ref, delta_flops, first_call_s=5.0),
    ]


# --- mechanism forms ------------------------------------------------------------------------------------------------
def mechanism_forms(names: list[str], shape: Shape, *, compile: Sequence[str] = (), seed: int = 0) -> list[Form]:
    """Each mechanism's ``auto`` form (causal where it has one), and for those named in ``compile`` its
    ``torch.compile``d module too.
    The module is built at the gate's length; a mechanism whose build depends on the length (landmarks, a
    projection of N) is rebuilt by :func:`for_length`."""
    out = []
    for name in names:
        cls = registry.get_attention(name)
        causal = bool(cls.causal_form)
        inputs = (lambda n, s=shape: _randn((s.batch, s.heads, n, s.head_dim), seed))
        base = Form(name, "mechanism", name, shape, (), inputs, None, None, None, causal=causal, first_call_s=0.5)
        out.append(base)
        if name in compile:
            out.append(dataclasses.replace(base, name=f"{name}+compile", family="compiled", first_call_s=20.0))
    return out


_BUILT: dict[tuple, Form] = {}


def for_length(form: Form, n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> Form:
    """A mechanism form made concrete at length ``n`` on ``device`` in ``dtype`` (its module built and cast as the
    contract casts it, its fast form and reference bound, its FLOPs counted), built once per length and reused by
    the gate and both modes, so a compiled form compiles once per length; a kernel form as it is."""
    if form.family == "kernel":
        return form
    key = (form.name, n, str(device), dtype)
    if key in _BUILT:
        return _BUILT[key]
    s = form.shape
    module = Spec.make(form.op).build(seq_len=n, heads=s.heads, head_dim=s.head_dim, causal=form.causal,
                                      impl="auto").to(device, dtype)
    fast = torch.compile(module) if form.family == "compiled" else module
    x = [t.to(device, dtype) for t in form.inputs(n)]
    with torch.no_grad():
        flops = float(count_flops(lambda: module(*x)))
    made = dataclasses.replace(form, fast=fast, reference=module.reference, module=module,
                               flops=lambda _n, f=flops: f)
    _BUILT[key] = made
    return made


def forget() -> None:
    """Drop the built modules: each run builds its own (a plug-in reloaded under the same name must not meet its
    predecessor's module)."""
    _BUILT.clear()


def available(form: Form, device: torch.device) -> Optional[str]:
    """Why ``form`` cannot run on ``device`` here (None: it can)."""
    import importlib.util

    if "cuda" in form.needs and device.type != "cuda":
        return "needs CUDA"
    if "triton" in form.needs and importlib.util.find_spec("triton") is None:
        return "needs triton (pip install 'attnbench[gpu]')"
    if "triton" in form.needs and not triton_usable(device):
        return "needs CUDA (or TRITON_INTERPRET=1 on the CPU)"
    if "fla" in form.needs and importlib.util.find_spec("fla") is None:
        return "needs flash-linear-attention (pip install 'attnbench[gpu]')"
    if form.family == "compiled" and device.type == "cuda" and importlib.util.find_spec("triton") is None:
        return "torch.compile on CUDA needs triton"
    return None
