"""The one verification: a fast form against its reference, forward and backward, under the one tolerance policy.

Every place that asks "does this form compute its mechanism?" asks it here: ``attnbench check``
(:func:`verify_all`), the timing gate before any timing (:func:`verify_resolved`, called by the scaling suite's
point and ``benchmarks/``), the contract tests and the benchmarks (:func:`verify`, :func:`agreement`,
:func:`forward_backward`).

One comparison (:func:`agreement`): the fast form and the reference in the precision under test against the
reference in float64 (the module's float64 copy) on the same inputs; the output and the gradients of a fixed
projection of it with respect to q, k, v and every parameter, judged by :func:`attnbench.checks.tolerance.compare`
(the fast form's error may be at most ``MULTIPLE`` times the reference's own error in the same precision, plus a
floor; in float64 the bound is the floor). One result type, :class:`Verdict`. The delta-rule op of the LM suite
is verified the same way (``delta_rule``, ``gated_delta_rule``: every impl against the token-by-token recurrence).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from attnbench.api import registry
from attnbench.api.spec import Spec
from attnbench.attention.base import triton_usable
from attnbench.checks.tolerance import MULTIPLE, Agreement, compare, floor_for
from attnbench.core.protocol import AttnbenchError, UnsupportedError
from attnbench.ops.delta import delta_rule, delta_rule_recurrent

CHECK_LENGTHS = (1, 7, 129)
DELTA_OPS = {"delta_rule": False, "gated_delta_rule": True}   # name -> gated


@dataclass
class Verdict:
    """One form of one mechanism at one length and precision, as the policy judged it."""
    name: str
    causal: bool
    impl: str
    seq_len: int
    dtype: str
    fwd_err: float | None  # the output's error, relative to max|float64 reference| + 1
    bwd_err: float | None  # the worst gradient's error, the same way
    bound: float           # the bound of the worst tensor (see attnbench.checks.tolerance)
    status: str            # "ok", "mismatch", "skipped", "error"
    detail: str = ""
    ref_err: float | None = None  # the reference's own error in dtype, for the worst tensor
    worst: str = ""               # which tensor was worst (closest to or furthest past its bound)
    err: float | None = None      # the worst tensor's error (the one held to ``bound``)

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "skipped")

    def as_metrics(self) -> dict[str, Any]:
        """The gate's numbers as a timed record stores them."""
        return {"check_err": self.err, "check_tol": self.bound, "check_ref_err": self.ref_err,
                "check_seq_len": self.seq_len}


def forward_backward(fn, inputs: list[torch.Tensor], weight: torch.Tensor | None = None,
                     params: list[torch.Tensor] = ()) -> list[torch.Tensor | None]:
    """``[out]``, and with ``weight`` also the gradients of ``<out, weight>`` with respect to each input and each
    of ``params`` (None where one is unused): ``fn(*inputs)`` on fresh leaf copies of the inputs."""
    xs = [t.detach().clone().requires_grad_(weight is not None) for t in inputs]
    with torch.set_grad_enabled(weight is not None):  # callers may be inside no_grad (gates before timing)
        out = fn(*xs)
        if weight is None:
            return [out.detach()]
        grads = torch.autograd.grad((out * weight.to(out.dtype)).sum(), xs + list(params), allow_unused=True)
    return [out.detach(), *grads]


def _weight(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The fixed random projection of the output whose gradients are compared, in float64."""
    return torch.randn(q.shape[:-1] + (v.shape[-1],), generator=torch.Generator().manual_seed(0),
                       dtype=torch.float64).to(v.device)


def _params(module) -> list[torch.Tensor]:
    return [p for p in module.parameters() if p.requires_grad]


def agreement(fast, reference, inputs: list[torch.Tensor], *, dtype: torch.dtype, weight: torch.Tensor | None = None,
              params: list[torch.Tensor] = (), names: list[str] | None = None, reference64=None,
              params64: list[torch.Tensor] = (), floor: float | None = None,
              device: torch.device | str | None = None) -> Agreement:
    """The comparison every verification makes: ``fast`` and ``reference`` on the same ``inputs`` cast to ``dtype``
    against ``reference64`` on the float64 ``inputs`` (in float64 the reference itself is the ground truth), under
    :func:`attnbench.checks.tolerance.compare`. With ``weight``, also the gradients of ``<out, weight>`` with respect to
    the inputs and ``params`` (``params64``: the same parameters of the float64 copy). The benchmarks hold a fast
    form to a plain form or to a peer library with this too. ``floor`` replaces the dtype's floor; ``device``: where
    the forms in ``dtype`` run (the ground truth runs where ``inputs`` are)."""
    low = [t.to(device or t.device, dtype) for t in inputs]
    low_weight = None if weight is None else weight.to(low[0].device)
    fast_out = forward_backward(fast, low, low_weight, params)
    ref_low = forward_backward(reference, low, low_weight, params)
    if dtype == torch.float64 or reference64 is None:
        ref64 = ref_low
    else:
        ref64 = forward_backward(reference64, inputs, weight, params64)
    if names is None:
        names = ["output"] + [f"grad {i}" for i in range(len(fast_out) - 1)]
    return compare(fast_out, ref_low, ref64, names=names, dtype=dtype, floor=floor)


def judge_module(module, fast, inputs: list[torch.Tensor], weight: torch.Tensor | None, dtype: torch.dtype, *,
                  floor: float | None = None) -> Agreement:
    """:func:`agreement` for an attention module: ``fast`` and ``module.reference`` in ``dtype`` against the
    reference of the module's float64 copy on the float64 ``inputs``; gradients with respect to q, k, v and every
    parameter."""
    module64 = copy.deepcopy(module).double()

    def reference64(*x):
        try:
            return module64.reference(*x)
        except (RuntimeError, TypeError):  # a reference that cannot run in float64: ground truth in float32
            return module64.float().reference(*(t.float() for t in x)).double()

    names = ["output", "grad q", "grad k", "grad v"] + [f"grad {n}" for n, p in module.named_parameters()
                                                        if p.requires_grad]
    return agreement(fast, module.reference, inputs, dtype=dtype, weight=weight, params=_params(module),
                     names=names, reference64=reference64, params64=_params(module64), floor=floor)


def _verdict(name: str, causal: bool, impl: str, seq_len: int, a: Agreement) -> Verdict:
    """A :class:`Verdict` from the policy's agreement: the output's and the worst gradient's errors, and the
    worst tensor's error and bound."""
    out = a.tensors[0].err if a.tensors else None
    grads = [t.err for t in a.tensors[1:]]
    bwd = max(grads, key=lambda e: float("inf") if e != e else e) if grads else None
    return Verdict(name, causal, impl, seq_len, a.dtype, out, bwd, a.bound, "ok" if a.ok else "mismatch",
                   "" if a.ok else a.describe(), a.ref_err, a.worst, a.err)


def runnable_impls(cls, causal: bool) -> list[str]:
    return [i for i in cls.impls_for(causal) if i != "reference"]


def _not_run(name: str, causal: bool, impl: str, seq_len: int, dtype: torch.dtype, status: str,
             detail: str) -> Verdict:
    return Verdict(name, causal, impl, seq_len, str(dtype).replace("torch.", ""), None, None, floor_for(dtype),
                   status, detail)


def verify(name: str, *, causal: bool, impl: str, seq_len: int, dtype: torch.dtype = torch.float64,
           heads: int = 2, head_dim: int = 8, batch: int = 2, seed: int = 0, device: str | None = None) -> Verdict:
    """``impl`` of ``name`` against its reference under the tolerance policy: the fast form and the reference in
    ``dtype`` against the reference in float64 (the module's float64 copy) on the same inputs, forward and
    the gradients with respect to q, k, v and every parameter. ``device``: where every form runs (default: the
    CPU, and CUDA for a GPU-only impl when there is one). A form that cannot run here is ``skipped``, a crash is
    ``error`` (a row of ``attnbench check``, not a traceback)."""
    cls = registry.get_attention(name)
    if impl in cls.gpu_only_impls and dtype == torch.float64:
        dtype = torch.float32  # Triton kernels compute in fp32 at most
    if device is None:
        device = "cuda" if impl in cls.gpu_only_impls and torch.cuda.is_available() else "cpu"
    if impl in cls.gpu_only_impls and not triton_usable(torch.device(device)):
        return _not_run(name, causal, impl, seq_len, dtype, "skipped", "needs CUDA")
    torch.manual_seed(seed)
    try:
        module = Spec.make(name).build(seq_len=seq_len, heads=heads, head_dim=head_dim, causal=causal,
                                       impl=impl).to(device=device, dtype=dtype)
        gen = torch.Generator().manual_seed(seed)
        qkv = [torch.randn(batch, heads, seq_len, head_dim, generator=gen, dtype=torch.float64).to(device)
               for _ in range(3)]
        a = judge_module(module, lambda *x: module.run(impl, *x), qkv, _weight(qkv[0], qkv[2]), dtype)
    except UnsupportedError as e:
        return _not_run(name, causal, impl, seq_len, dtype, "skipped", str(e))
    except Exception as e:  # a crash is a failed check, reported in the table, not a traceback
        return _not_run(name, causal, impl, seq_len, dtype, "error", f"{type(e).__name__}: {e}")
    return _verdict(name, causal, impl, seq_len, a)


def verify_resolved(name: str, *, heads: int, head_dim: int, causal: bool, dtype: torch.dtype = torch.float32,
                    device: str = "cpu", grads: bool = False, seq_len: int = 128, batch: int = 1,
                    options: dict | None = None, impl: str = "auto", floor: float | None = None,
                    seed: int = 0) -> Verdict:
    """The timing gate: the form ``impl`` resolves to on ``device`` (``auto``: the one a timed run uses), built
    with ``options`` as the timed module is (parameters in their default precision, inputs in ``dtype``),
    against ``module.reference`` at ``[batch, heads, seq_len, head_dim]``, forward and (``grads``) the gradients
    with respect to q, k, v and every parameter, under the tolerance policy (``floor``, if given, replaces the
    dtype's floor). A failure's ``detail`` names the tensor, the length and the form. Raises
    :class:`UnsupportedError` if the mechanism cannot be built this way (a point that is not timed either)."""
    module = Spec.make(name, options).build(seq_len=seq_len, heads=heads, head_dim=head_dim, causal=causal,
                                            impl=impl).to(device)
    resolved = module.resolve_impl(device)
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seq_len, head_dim)
    base = [torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3)]
    g64 = torch.randn(shape, generator=gen, dtype=torch.float64).to(device)
    a = judge_module(module, module, [t.to(device) for t in base], g64 if grads else None, dtype, floor=floor)
    v = _verdict(name, causal, resolved, seq_len, a)
    if not a.ok:
        v.detail = f"{a.describe()} at N={seq_len} (impl={resolved})"
    return v


def verify_delta_rule(name: str, *, impl: str, seq_len: int, dtype: torch.dtype = torch.float64, heads: int = 2,
                      head_dim: int = 8, batch: int = 2, seed: int = 0, device: str | None = None) -> Verdict:
    """``attnbench.ops.delta_rule(impl=...)`` against :func:`~attnbench.ops.delta.delta_rule_recurrent`, forward
    and the gradients with respect to q, k, v, beta (and g), at stable inputs (L2-normalised k, beta in (0, 1));
    chunks of 16 so that the longer lengths span several. Under the tolerance policy: the recurrence in ``dtype``
    is the ruler, the recurrence in float64 the ground truth (in float64 they are one: the bound is the floor).
    FLA's kernels (``fla``) need CUDA and run in bf16 (fp16 too where asked); ``device``: where the torch forms
    run (default: the CPU)."""

    if impl == "fla":
        if not torch.cuda.is_available():
            return _not_run(name, True, impl, seq_len, torch.bfloat16, "skipped", "needs CUDA")
        dtype, device = (dtype if dtype in (torch.float16, torch.bfloat16) else torch.bfloat16), "cuda"
    else:
        device = device or "cpu"
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seq_len, head_dim)
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.rand(shape[:3], generator=gen, dtype=torch.float64)
    inputs = [q, k, v, beta]
    names = ["output", "grad q", "grad k", "grad v", "grad beta"]
    if DELTA_OPS[name]:
        inputs.append(torch.nn.functional.logsigmoid(torch.randn(shape[:3], generator=gen, dtype=torch.float64) + 2))
        names.append("grad g")
    weight = torch.randn(shape, generator=gen, dtype=torch.float64)
    recurrence = (lambda *x: delta_rule_recurrent(*x)[0])
    try:
        a = agreement(lambda *x: delta_rule(*x, impl=impl, chunk_size=16)[0], recurrence, inputs, dtype=dtype,
                      weight=weight, names=names, reference64=recurrence, device=device)
    except UnsupportedError as e:
        return _not_run(name, True, impl, seq_len, dtype, "skipped", str(e))
    except Exception as e:  # a crash is a failed check, reported in the table, not a traceback
        return _not_run(name, True, impl, seq_len, dtype, "error", f"{type(e).__name__}: {e}")
    return _verdict(name, True, impl, seq_len, a)


CHECK_DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
                "bfloat16": torch.bfloat16}


def verify_all(names: list[str] | None = None, *, dtype: str = "float64",
               lengths: tuple[int, ...] = CHECK_LENGTHS, device: str | None = None) -> list[Verdict]:
    """``attnbench check``: every impl of the named mechanisms (default: all, then the delta-rule ops) at
    ``lengths``; ``device`` as :func:`verify` takes it (``attnbench doctor``: CUDA, in each half precision too)."""
    torch_dtype = CHECK_DTYPES.get(dtype)
    if torch_dtype is None:
        raise AttnbenchError(f"check: argument 'dtype' must be one of {', '.join(CHECK_DTYPES)}, got {dtype!r}")
    rows = []
    for name in names or registry.names() + list(DELTA_OPS):
        if name in DELTA_OPS:
            rows += [verify_delta_rule(name, impl=impl, seq_len=n, dtype=torch_dtype, device=device)
                     for impl in ("torch", "fla") for n in lengths]
            continue
        if name not in registry.names():
            raise registry._unknown("attention or op", name, {**dict.fromkeys(registry.names()),
                                                               **dict.fromkeys(DELTA_OPS)})
        cls = registry.get_attention(name)
        forms = [c for c, ok in ((False, cls.bidirectional), (True, cls.causal_form)) if ok]
        for causal in forms:
            for impl in runnable_impls(cls, causal):
                for n in lengths:
                    rows.append(verify(name, causal=causal, impl=impl, seq_len=n, dtype=torch_dtype, device=device))
    return rows


def check_table(rows: list[Verdict]):
    """The rows of ``attnbench check`` as one :data:`attnbench.views.render.TableData` (printed by
    :func:`attnbench.views.render.render_tables`, in any ``--format``)."""
    from rich.text import Text

    style = {"ok": "green", "skipped": "yellow", "mismatch": "bold red", "error": "bold red"}
    fmt = (lambda x: "-" if x is None else f"{x:.1e}")
    cells = [[r.name, "causal" if r.causal else "bidir", r.impl, str(r.seq_len), r.dtype, fmt(r.fwd_err),
              fmt(r.bwd_err), fmt(r.ref_err), fmt(None if r.fwd_err is None else r.bound), r.worst or "-",
              Text(r.status + (f" ({r.detail})" if r.detail else ""), style=style[r.status])] for r in rows]
    return ("attnbench check: fast forms vs reference",
            ["attention", "form", "impl", "N", "dtype", "fwd err", "bwd err", "ref err", "bound", "worst", "status"],
            cells, f"Error relative to max|float64 reference| + 1; bound = {MULTIPLE:g} x the reference's own error "
                   f"in the same dtype + floor; worst tensor.")


def summarize(rows: list[Verdict]) -> tuple[str, bool]:
    """The summary line of ``attnbench check`` and whether anything failed: agreed, skipped (with the reasons),
    disagreed and errored are counted apart, so a skipped check is never reported as an agreeing one."""
    from collections import Counter

    count = Counter(r.status for r in rows)
    reasons = Counter(r.detail or "no reason given" for r in rows if r.status == "skipped")
    why = "; ".join(reason if len(reasons) == 1 else f"{reason}: {n}" for reason, n in reasons.items())
    line = (f"{count['ok']} agree with their references, {count['skipped']} skipped" + (f" ({why})" if why else "")
            + f", {count['mismatch']} disagree, {count['error']} errored")
    return line, bool(count["mismatch"] or count["error"])
