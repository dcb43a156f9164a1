"""``attnbench check``: every implementation of every mechanism against its reference, forward and backward.

The same comparison the test suite makes, as a library function: odd lengths, float64 by default, gradients with
respect to q, k, v and every parameter, judged by the one tolerance policy of :mod:`attnbench.tolerance` (the
fast form's error against the float64 reference may be at most ``MULTIPLE`` times the reference's own error in the
same precision, plus a floor; in float64 the bound is the floor). The delta-rule op of the LM suite is checked the
same way (``delta_rule``, ``gated_delta_rule``: every impl against the token-by-token recurrence).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from rich.table import Table

from . import registry
from .attention.base import triton_usable
from .protocol import AttnbenchError, UnsupportedError
from .tolerance import MULTIPLE, Agreement, compare, floor_for, relative_error

CHECK_LENGTHS = (1, 7, 129)
DELTA_OPS = {"delta_rule": False, "gated_delta_rule": True}   # name -> gated


@dataclass
class CheckResult:
    name: str
    causal: bool
    impl: str
    seq_len: int
    dtype: str
    fwd_err: float | None  # the output's error, relative to max|float64 reference| + 1
    bwd_err: float | None  # the worst gradient's error, the same way
    bound: float           # the bound of the worst tensor (see attnbench.tolerance)
    status: str            # "ok", "mismatch", "skipped", "error"
    detail: str = ""
    ref_err: float | None = None  # the reference's own error in dtype, for the worst tensor
    worst: str = ""               # which tensor was worst (closest to or furthest past its bound)

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "skipped")


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


def compare_to_reference(module, impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[float, float]:
    """(forward, backward) error of ``impl`` against ``module.reference`` in the inputs' precision, relative to
    the reference's magnitude (:func:`attnbench.tolerance.relative_error`): a measurement, no verdict.

    Backward compares the gradients of a fixed random projection of the output with respect to q, k, v and
    every parameter (``inf`` if one form has a gradient the other lacks).
    """
    out, *grads = forward_backward(lambda *x: module.run(impl, *x), [q, k, v], _weight(q, v), _params(module))
    ref, *ref_grads = forward_backward(module.reference, [q, k, v], _weight(q, v), _params(module))
    bwd = 0.0
    for g, r in zip(grads, ref_grads):
        if (g is None) != (r is None):
            return relative_error(out, ref), float("inf")
        if g is not None:
            bwd = max(bwd, relative_error(g, r))
    return relative_error(out, ref), bwd


def _weight(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The fixed random projection of the output whose gradients are compared, in float64."""
    return torch.randn(q.shape[:-1] + (v.shape[-1],), generator=torch.Generator().manual_seed(0),
                       dtype=torch.float64).to(v.device)


def _params(module) -> list[torch.Tensor]:
    return [p for p in module.parameters() if p.requires_grad]


def _result(name: str, causal: bool, impl: str, seq_len: int, a: Agreement) -> CheckResult:
    """A :class:`CheckResult` from the policy's verdict: the output's and the worst gradient's errors, and the
    worst tensor's bound."""
    out = a.tensors[0].err if a.tensors else None
    grads = [t.err for t in a.tensors[1:]]
    bwd = max(grads, key=lambda e: float("inf") if e != e else e) if grads else None
    return CheckResult(name, causal, impl, seq_len, a.dtype, out, bwd, a.bound, "ok" if a.ok else "mismatch",
                       "" if a.ok else a.describe(), a.ref_err, a.worst)


def runnable_impls(cls, causal: bool) -> list[str]:
    return [i for i in cls.impls_for(causal) if i != "reference"]


def check_one(name: str, *, causal: bool, impl: str, seq_len: int, dtype: torch.dtype = torch.float64,
              heads: int = 2, head_dim: int = 8, batch: int = 2, seed: int = 0) -> CheckResult:
    """``impl`` of ``name`` against its reference under the tolerance policy: the fast form and the reference in
    ``dtype`` against the reference in float64 (the module's float64 copy) on the same inputs, forward and
    the gradients with respect to q, k, v and every parameter."""
    cls = registry.get_attention(name)
    if impl in cls.gpu_only_impls and dtype == torch.float64:
        dtype = torch.float32  # Triton kernels compute in fp32 at most
    label = str(dtype).replace("torch.", "")
    if impl in cls.gpu_only_impls and not triton_usable(torch.device("cpu")) and not torch.cuda.is_available():
        return CheckResult(name, causal, impl, seq_len, label, None, None, floor_for(dtype), "skipped",
                           "needs CUDA")
    device = "cuda" if impl in cls.gpu_only_impls and torch.cuda.is_available() else "cpu"
    torch.manual_seed(seed)
    try:
        module = registry.build_for_length(name, seq_len=seq_len, heads=heads, head_dim=head_dim,
                                           causal=causal, impl=impl).to(device=device, dtype=dtype)
        gen = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=gen, dtype=torch.float64).to(device)
                   for _ in range(3))
        weight, low = _weight(q, v), [t.to(dtype) for t in (q, k, v)]
        fast = forward_backward(lambda *x: module.run(impl, *x), low, weight, _params(module))
        ref_low = forward_backward(module.reference, low, weight, _params(module))
        if dtype == torch.float64:
            ref64 = ref_low  # the reference in the same precision is the ground truth: the bound is the floor
        else:
            module64 = copy.deepcopy(module).double()
            ref64 = forward_backward(module64.reference, [q, k, v], weight, _params(module64))
    except UnsupportedError as e:
        return CheckResult(name, causal, impl, seq_len, label, None, None, floor_for(dtype), "skipped", str(e))
    except Exception as e:  # a crash is a failed check, reported in the table, not a traceback
        return CheckResult(name, causal, impl, seq_len, label, None, None, floor_for(dtype), "error",
                           f"{type(e).__name__}: {e}")
    names = ["output", "grad q", "grad k", "grad v"] + [f"grad {n}" for n, p in module.named_parameters()
                                                        if p.requires_grad]
    return _result(name, causal, impl, seq_len, compare(fast, ref_low, ref64, names=names, dtype=dtype))


def check_delta(name: str, *, impl: str, seq_len: int, dtype: torch.dtype = torch.float64, heads: int = 2,
                head_dim: int = 8, batch: int = 2, seed: int = 0) -> CheckResult:
    """``attnbench.ops.delta_rule(impl=...)`` against :func:`~attnbench.ops.delta.delta_rule_recurrent`, forward
    and the gradients with respect to q, k, v, beta (and g), at stable inputs (L2-normalised k, beta in (0, 1));
    chunks of 16 so that the longer lengths span several. Under the tolerance policy: the recurrence in ``dtype``
    is the ruler, the recurrence in float64 the ground truth (in float64 they are one: the bound is the floor).
    FLA's kernels (``fla``) need CUDA and run in bf16."""
    from .ops.delta import delta_rule, delta_rule_recurrent

    if impl == "fla":
        if not torch.cuda.is_available():
            return CheckResult(name, True, impl, seq_len, "bfloat16", None, None, floor_for(torch.bfloat16),
                               "skipped", "needs CUDA")
        dtype, device = torch.bfloat16, "cuda"
    else:
        device = "cpu"
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
    label = str(dtype).replace("torch.", "")
    low = [t.to(device, dtype) for t in inputs]
    try:
        fast = forward_backward(lambda *x: delta_rule(*x, impl=impl, chunk_size=16)[0], low, weight.to(device))
        ref_low = forward_backward(lambda *x: delta_rule_recurrent(*x)[0], low, weight.to(device))
        ref64 = ref_low if dtype == torch.float64 else forward_backward(
            lambda *x: delta_rule_recurrent(*x)[0], inputs, weight)
    except UnsupportedError as e:
        return CheckResult(name, True, impl, seq_len, label, None, None, floor_for(dtype), "skipped", str(e))
    except Exception as e:  # a crash is a failed check, reported in the table, not a traceback
        return CheckResult(name, True, impl, seq_len, label, None, None, floor_for(dtype), "error",
                           f"{type(e).__name__}: {e}")
    return _result(name, True, impl, seq_len, compare(fast, ref_low, ref64, names=names, dtype=dtype))


def check_all(names: list[str] | None = None, *, dtype: str = "float64",
              lengths: tuple[int, ...] = CHECK_LENGTHS) -> list[CheckResult]:
    """Every impl of the named mechanisms (default: all, then the delta-rule ops) at ``lengths``."""
    torch_dtype = {"float64": torch.float64, "float32": torch.float32}.get(dtype)
    if torch_dtype is None:
        raise AttnbenchError(f"check: argument 'dtype' must be float64 or float32, got {dtype!r}")
    rows = []
    for name in names or registry.names() + list(DELTA_OPS):
        if name in DELTA_OPS:
            rows += [check_delta(name, impl=impl, seq_len=n, dtype=torch_dtype)
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
                    rows.append(check_one(name, causal=causal, impl=impl, seq_len=n, dtype=torch_dtype))
    return rows


def check_table(rows: list[CheckResult]):
    """The rows of ``attnbench check`` as one :data:`attnbench.report.TableData` (printed by
    :func:`attnbench.report.render_tables`, in any ``--format``)."""
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


def render_checks(rows: list[CheckResult]) -> Table:
    from .report import rich_tables

    return rich_tables([check_table(rows)])[0]


def summarize(rows: list[CheckResult]) -> tuple[str, bool]:
    """The summary line of ``attnbench check`` and whether anything failed: agreed, skipped (with the reasons),
    disagreed and errored are counted apart, so a skipped check is never reported as an agreeing one."""
    from collections import Counter

    count = Counter(r.status for r in rows)
    reasons = Counter(r.detail or "no reason given" for r in rows if r.status == "skipped")
    why = "; ".join(reason if len(reasons) == 1 else f"{reason}: {n}" for reason, n in reasons.items())
    line = (f"{count['ok']} agree with their references, {count['skipped']} skipped" + (f" ({why})" if why else "")
            + f", {count['mismatch']} disagree, {count['error']} errored")
    return line, bool(count["mismatch"] or count["error"])
