"""``attnbench check``: every implementation of every mechanism against its reference, forward and backward.

The same comparison the test suite makes, as a library function (the scaling suite's correctness gate uses it
too): odd lengths, float64 by default, gradients with respect to q, k, v and every parameter. The delta-rule op
of the LM suite is checked the same way (``delta_rule``, ``gated_delta_rule``: every impl against the
token-by-token recurrence).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rich.table import Table

from . import registry
from .attention.base import triton_usable
from .protocol import AttnbenchError, UnsupportedError

CHECK_LENGTHS = (1, 7, 129)
TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-4, torch.bfloat16: 5e-2}
DELTA_OPS = {"delta_rule": False, "gated_delta_rule": True}   # name -> gated


@dataclass
class CheckResult:
    name: str
    causal: bool
    impl: str
    seq_len: int
    dtype: str
    fwd_err: float | None
    bwd_err: float | None
    tol: float
    status: str            # "ok", "mismatch", "skipped", "error"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("ok", "skipped")


def max_error(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """``(max |a - b|, max |b|)`` in float64: the two numbers every comparison here is made of."""
    a64, b64 = a.detach().double(), b.detach().double()
    return (a64 - b64).abs().max().item(), b64.abs().max().item()


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


def _relative_err(a: torch.Tensor, b: torch.Tensor) -> float:
    err, scale = max_error(a, b)
    return err / (scale + 1.0)


def compare_to_reference(module, impl: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[float, float]:
    """(forward, backward) error of ``impl`` against ``module.reference``, relative to the reference's magnitude.

    Backward compares the gradients of a fixed random projection of the output with respect to q, k, v and
    every parameter.
    """
    params = [p for p in module.parameters() if p.requires_grad]
    weight = torch.randn(q.shape[:-1] + (v.shape[-1],), generator=torch.Generator().manual_seed(0),
                         dtype=v.dtype).to(v.device)
    out, *grads = forward_backward(lambda *x: module.run(impl, *x), [q, k, v], weight, params)
    ref, *ref_grads = forward_backward(module.reference, [q, k, v], weight, params)
    bwd = 0.0
    for g, r in zip(grads, ref_grads):
        if (g is None) != (r is None):
            return _relative_err(out, ref), float("inf")
        if g is not None:
            bwd = max(bwd, _relative_err(g, r))
    return _relative_err(out, ref), bwd


def runnable_impls(cls, causal: bool) -> list[str]:
    return [i for i in cls.impls_for(causal) if i != "reference"]


def check_one(name: str, *, causal: bool, impl: str, seq_len: int, dtype: torch.dtype = torch.float64,
              heads: int = 2, head_dim: int = 8, batch: int = 2, seed: int = 0) -> CheckResult:
    cls = registry.get_attention(name)
    if impl in cls.gpu_only_impls and dtype == torch.float64:
        dtype = torch.float32  # Triton kernels compute in fp32 at most
    tol = TOLERANCE[dtype]
    label = str(dtype).replace("torch.", "")
    if impl in cls.gpu_only_impls and not triton_usable(torch.device("cpu")) and not torch.cuda.is_available():
        return CheckResult(name, causal, impl, seq_len, label, None, None, tol, "skipped", "needs CUDA")
    device = "cuda" if impl in cls.gpu_only_impls and torch.cuda.is_available() else "cpu"
    torch.manual_seed(seed)
    try:
        module = registry.build_for_length(name, seq_len=seq_len, heads=heads, head_dim=head_dim,
                                           causal=causal, impl=impl).to(device=device, dtype=dtype)
        gen = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(batch, heads, seq_len, head_dim, generator=gen, dtype=dtype).to(device)
                   for _ in range(3))
        fwd, bwd = compare_to_reference(module, impl, q, k, v)
    except UnsupportedError as e:
        return CheckResult(name, causal, impl, seq_len, label, None, None, tol, "skipped", str(e))
    except Exception as e:  # a crash is a failed check, reported in the table, not a traceback
        return CheckResult(name, causal, impl, seq_len, label, None, None, tol, "error", f"{type(e).__name__}: {e}")
    status = "ok" if fwd <= tol and bwd <= tol else "mismatch"
    return CheckResult(name, causal, impl, seq_len, label, fwd, bwd, tol, status)


def check_delta(name: str, *, impl: str, seq_len: int, dtype: torch.dtype = torch.float64, heads: int = 2,
                head_dim: int = 8, batch: int = 2, seed: int = 0) -> CheckResult:
    """``attnbench.ops.delta_rule(impl=...)`` against :func:`~attnbench.ops.delta.delta_rule_recurrent`, forward
    and the gradients with respect to q, k, v, beta (and g), at stable inputs (L2-normalised k, beta in (0, 1));
    chunks of 16 so that the longer lengths span several. FLA's kernels (``fla``) need CUDA and run in bf16."""
    from .ops.delta import delta_rule, delta_rule_recurrent

    if impl == "fla":
        if not torch.cuda.is_available():
            return CheckResult(name, True, impl, seq_len, "bfloat16", None, None, TOLERANCE[torch.bfloat16],
                               "skipped", "needs CUDA")
        dtype, device = torch.bfloat16, "cuda"
    else:
        device = "cpu"
    tol = TOLERANCE[dtype]
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, heads, seq_len, head_dim)
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.rand(shape[:3], generator=gen, dtype=torch.float64)
    inputs = [q, k, v, beta]
    if DELTA_OPS[name]:
        inputs.append(torch.nn.functional.logsigmoid(torch.randn(shape[:3], generator=gen, dtype=torch.float64) + 2))
    weight = torch.randn(shape, generator=gen, dtype=torch.float64)
    label = str(dtype).replace("torch.", "")
    try:
        fast = forward_backward(lambda *x: delta_rule(*x, impl=impl, chunk_size=16)[0],
                                [t.to(device, dtype) for t in inputs], weight.to(device))
        ref = forward_backward(lambda *x: delta_rule_recurrent(*x)[0], inputs, weight)
    except UnsupportedError as e:
        return CheckResult(name, True, impl, seq_len, label, None, None, tol, "skipped", str(e))
    except Exception as e:  # a crash is a failed check, reported in the table, not a traceback
        return CheckResult(name, True, impl, seq_len, label, None, None, tol, "error", f"{type(e).__name__}: {e}")
    fwd = _relative_err(fast[0], ref[0])
    bwd = max(_relative_err(g, r) for g, r in zip(fast[1:], ref[1:]))
    status = "ok" if fwd <= tol and bwd <= tol else "mismatch"
    return CheckResult(name, True, impl, seq_len, label, fwd, bwd, tol, status)


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


def render_checks(rows: list[CheckResult]) -> Table:
    table = Table(title="attnbench check: fast forms vs reference (error relative to the reference's magnitude)")
    for col in ("attention", "form", "impl", "N", "dtype", "fwd err", "bwd err", "tol", "status"):
        table.add_column(col, justify="right" if col in ("N", "fwd err", "bwd err", "tol") else "left")
    style = {"ok": "green", "skipped": "yellow", "mismatch": "bold red", "error": "bold red"}
    for r in rows:
        fmt = (lambda x: "-" if x is None else f"{x:.1e}")
        status = f"[{style[r.status]}]{r.status}[/]" + (f" ({r.detail})" if r.detail else "")
        table.add_row(r.name, "causal" if r.causal else "bidir", r.impl, str(r.seq_len), r.dtype,
                      fmt(r.fwd_err), fmt(r.bwd_err), f"{r.tol:.0e}", status)
    return table
