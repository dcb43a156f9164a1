"""The registry's contract as a library: what the registry-wide tests hold every built-in to, for any mechanism.

A plug-in's own test suite checks its mechanism in one line::

    import attnbench.checks.contract

    def test_my_attention():
        attnbench.checks.contract.check_attention("mine")      # fails the test with one line per broken clause

``attnbench check --plugin my_attn.py --attn mine`` runs the same (:func:`contract`). The clauses:

- every impl against the reference (:func:`attnbench.checks.verify.verify`: forward and the gradients with respect to q,
  k, v and every parameter) at odd lengths in float64 (the float64 floor) and in float32 (the tolerance policy of
  :mod:`attnbench.checks.tolerance`: a multiple of the reference's own error in float32); the CPU impls again in float64
  with blocks of 32 tokens, so that a blocked form crosses block boundaries at small N;
- the same under ``torch.no_grad`` (a fast form's inference path may differ from its training path), with the
  parameters moved off their initial values;
- the same with each option moved off its default (one at a time: an int by one, a float by half, a bool flipped;
  a value the mechanism refuses is skipped), so a fast form cannot ignore an option its reference honours;
- each form builds with its declared options' defaults, and ``impl="auto"`` resolves to a form that runs on a CPU;
- output shape ``[B, H, N, Dv]`` in v's dtype and finite, in float32, float64 and bfloat16, with ``Dv != Dk``;
- one batch element's output does not depend on the others;
- a causal form's output at position t does not change when tokens after t do (fast form and reference);
- gradients reach q, k, v and every parameter, finite;
- a wrong input shape is an :class:`attnbench.AttnbenchError` naming the argument, not a traceback from deep inside.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from attnbench.api import registry
from attnbench.api.spec import Spec
from attnbench.core.errors import AttnbenchError, UnsupportedError
from attnbench.checks.tolerance import compare
from attnbench.checks.verify import CHECK_LENGTHS, Verdict, agreement, runnable_impls, verify

H, D = 2, 8
POLICY_LENGTH = 97   # float32 policy check: long enough for several chunks of a chunked form


@dataclasses.dataclass
class Failure:
    """One broken clause of the contract: which mechanism, form and clause, and what went wrong."""

    name: str
    form: str      # "bidir" or "causal"
    clause: str
    detail: str

    def line(self) -> str:
        return f"{self.name} [{self.form}] {self.clause}: {self.detail}"


def _forms(cls) -> list[bool]:
    return [c for c, ok in ((False, cls.bidirectional), (True, cls.causal_form)) if ok]


def _qkv(b: int, n: int, dtype: torch.dtype, seed: int = 1, dv: int = D):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, H, n, D, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(b, H, n, D, generator=g, dtype=torch.float64).to(dtype),
            torch.randn(b, H, n, dv, generator=g, dtype=torch.float64).to(dtype))


def _make(name: str, causal: bool, n: int, dtype: torch.dtype = torch.float64, impl: str = "auto"):
    torch.manual_seed(0)
    return Spec.make(name).build(seq_len=n, heads=H, head_dim=D, causal=causal, impl=impl).to(dtype)


def _same64(a: torch.Tensor, b: torch.Tensor, what: str) -> Optional[str]:
    """None when ``a`` equals ``b`` under the float64 policy (both float64), else what differs."""
    if a.shape != b.shape:
        return f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    verdict = compare(a, b, b, names=[what], dtype=torch.float64)
    return None if verdict.ok else verdict.describe()


def _verdict_failure(v: Verdict) -> Optional[Failure]:
    if v.ok:
        return None
    form = "causal" if v.causal else "bidir"
    what = "disagrees with its reference" if v.status == "mismatch" else "fails"
    return Failure(v.name, form, f"impl {v.impl!r} vs reference, N={v.seq_len}, {v.dtype}", f"{what}: {v.detail}")


def _clause(failures: list[Failure], name: str, form: str, clause: str, fn: Callable[[], Optional[str]]) -> None:
    """Run one clause; a returned message or an exception is a failure line."""
    try:
        problem = fn()
    except UnsupportedError as e:
        problem = f"unsupported: {e}"
    except Exception as e:  # noqa: BLE001 - a crash is a broken clause, reported in one line
        problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if problem:
        failures.append(Failure(name, form, clause, problem))


def contract(name: str, *, lengths: tuple[int, ...] = CHECK_LENGTHS, verdicts: Optional[list[Verdict]] = None
             ) -> list[Failure]:
    """Every clause of the contract (module docstring) on the attention ``name``; the empty list when it holds.
    ``verdicts``, if given, receives the :class:`~attnbench.checks.verify.Verdict` of every reference comparison."""
    cls = registry.get_attention(name)
    failures: list[Failure] = []
    rows: list[Verdict] = []
    for causal in _forms(cls):
        form = "causal" if causal else "bidir"
        for impl in runnable_impls(cls, causal):
            for dtype, ns in ((torch.float64, lengths), (torch.float32, (POLICY_LENGTH,))):
                for n in ns:
                    v = verify(name, causal=causal, impl=impl, seq_len=n, dtype=dtype)
                    rows.append(v)
                    f = _verdict_failure(v)
                    if f is not None:
                        failures.append(f)
        for n in lengths:
            _clause(failures, name, form, f"CPU impls vs reference across blocks, N={n}, float64",
                    lambda n=n: several_blocks_match_fp64(name, causal, n))
        _clause(failures, name, form, "CPU impls vs reference under no_grad, moved parameters, float64",
                lambda: inference_matches_fp64(name, causal))
        _clause(failures, name, form, "CPU impls vs reference with options off their defaults, float64",
                lambda: options_match_fp64(name, causal))
        _clause(failures, name, form, "builds with its options' defaults and impl='auto' runs on a CPU",
                lambda: auto_runs_on_cpu(name, causal))
        for dtype in (torch.float32, torch.float64, torch.bfloat16):
            _clause(failures, name, form, f"shape, dtype and finiteness in {str(dtype).replace('torch.', '')}",
                    lambda dtype=dtype: shape_dtype_finite(name, causal, dtype))
        _clause(failures, name, form, "batch invariance", lambda: batch_invariance(name, causal))
        if causal:
            _clause(failures, name, form, "no look-ahead", lambda: no_look_ahead(name))
        _clause(failures, name, form, "gradients reach q, k, v and every parameter",
                lambda: gradients_reach(name, causal))
        _clause(failures, name, form, "bad input shape is a clear error", lambda: rejects_bad_shape(name, causal))
    if verdicts is not None:
        verdicts.extend(rows)
    return failures


# --- the clauses: each returns None when it holds, else what is wrong (tests/test_contract.py asserts each on every
# built-in; contract() runs them all on one mechanism) ------------------------------------------------------------------
def cpu_impls(name: str, causal: bool) -> list[str]:
    """The forms of ``name`` that run on a CPU (every impl but the reference and the GPU-only ones)."""
    cls = registry.get_attention(name)
    return [i for i in runnable_impls(cls, causal) if i not in cls.gpu_only_impls]


def _fp64_agreement(attn, impl: str, n: int):
    """``impl`` of ``attn`` (a float64 module) against its reference in float64 at length ``n``, with blocks of 32
    tokens: the output and the gradients with respect to q, k, v and every parameter."""
    if hasattr(attn, "block_size"):
        attn.block_size = 32
    q, k, v = _qkv(2, n, torch.float64)
    weight = torch.randn(q.shape[:-1] + (v.shape[-1],), generator=torch.Generator().manual_seed(0),
                         dtype=torch.float64)
    names = ["output", "grad q", "grad k", "grad v"] + [f"grad {pn}" for pn, p in attn.named_parameters()
                                                        if p.requires_grad]
    return agreement(lambda *x: attn.run(impl, *x), attn.reference, [q, k, v], dtype=torch.float64, weight=weight,
                     params=[p for p in attn.parameters() if p.requires_grad], names=names)


def several_blocks_match_fp64(name: str, causal: bool, n: int) -> Optional[str]:
    """Every CPU impl equals the reference in float64 at length ``n`` (the float64 floor), forward and the gradients
    with respect to q, k, v and every parameter, with a block size of 32 so that a blocked form (features block by
    block, the recomputing backward) crosses block boundaries even at small N."""
    for impl in cpu_impls(name, causal):
        a = _fp64_agreement(_make(name, causal, n, impl=impl), impl, n)
        if not a.ok:
            return f"impl {impl!r} at N={n} with blocks of 32: {a.describe()}"
    return None


def _moved_parameters(attn: torch.nn.Module) -> None:
    """Move every parameter off its initial value (seeded), so a fast form cannot lean on an initial zero or one."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype))


def inference_matches_fp64(name: str, causal: bool, lengths: tuple[int, ...] = (7, 129)) -> Optional[str]:
    """Under ``torch.no_grad`` every CPU impl equals the reference in float64 (fast forms may take another path
    there: features in place, buffers reused), with moved parameters and blocks of 32 tokens."""
    for impl in cpu_impls(name, causal):
        for n in lengths:
            attn = _make(name, causal, n, impl=impl)
            if hasattr(attn, "block_size"):
                attn.block_size = 32
            _moved_parameters(attn)
            q, k, v = _qkv(2, n, torch.float64)
            with torch.no_grad():
                problem = _same64(attn.run(impl, q, k, v), attn.reference(q, k, v), f"no_grad output, N={n}")
            if problem:
                return f"impl {impl!r}: {problem}"
    return None


def _moved_option(value):
    """An option's default moved off it (None: this kind of option is not moved)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 if value else 0.5
    return None


def options_match_fp64(name: str, causal: bool, n: int = 41) -> Optional[str]:
    """With each option moved off its default (:func:`_moved_option`; one at a time), every CPU impl equals the
    reference in float64, forward and backward. An option value the mechanism refuses (at build, or in the
    reference's forward) is skipped: the clause is about options the reference honours."""
    cls = registry.get_attention(name)
    for option, default in registry.options_of(cls).items():
        value = _moved_option(default)
        if value is None or option in cls.shape_options(n):
            continue
        for impl in cpu_impls(name, causal):
            try:
                torch.manual_seed(0)
                attn = Spec.make(name, {option: value}).build(seq_len=n, heads=H, head_dim=D, causal=causal,
                                                              impl=impl).double()
            except (AttnbenchError, ValueError, TypeError):
                break  # the mechanism refuses this value: nothing to hold its forms to
            _moved_parameters(attn)
            try:
                attn.reference(*_qkv(1, n, torch.float64))
            except (AttnbenchError, ValueError):
                break  # the reference refuses it at this length
            a = _fp64_agreement(attn, impl, n)
            if not a.ok:
                return f"impl {impl!r} with {option}={value!r}: {a.describe()}"
    return None


def fp32_within_policy(name: str, causal: bool, n: int = POLICY_LENGTH) -> Optional[str]:
    """Every CPU impl in float32 within the tolerance policy of the float64 reference, forward and backward."""
    for impl in cpu_impls(name, causal):
        v = verify(name, causal=causal, impl=impl, seq_len=n, dtype=torch.float32)
        if not v.ok:
            return f"impl {impl!r} at N={n}: {v.status} {v.detail}"
    return None


def auto_runs_on_cpu(name: str, causal: bool) -> Optional[str]:
    attn = _make(name, causal, 8)
    impl = attn.resolve_impl("cpu")
    if impl not in attn.impls or impl in attn.gpu_only_impls:
        return f"impl='auto' resolves to {impl!r} on a CPU; expected one of its CPU impls"
    return None


def shape_dtype_finite(name: str, causal: bool, dtype: torch.dtype) -> Optional[str]:
    n, dv = 33, D + 4  # a value size other than the key size
    attn = _make(name, causal, n, torch.float32 if dtype == torch.bfloat16 else dtype)
    q, k, v = _qkv(3, n, dtype, dv=dv)
    try:
        out = attn(q, k, v)
    except AttnbenchError as e:  # a mechanism that needs Dv == Dk says so; then check with Dv == Dk
        v = v[..., :D].contiguous()
        out = attn(q, k, v)
        del e
    if out.shape != v.shape:
        return f"output shape {tuple(out.shape)}, expected v's {tuple(v.shape)}"
    if out.dtype != v.dtype:
        return f"output dtype {out.dtype}, expected v's {v.dtype}"
    if not torch.isfinite(out.float()).all():
        return "non-finite output"
    return None


def batch_invariance(name: str, causal: bool) -> Optional[str]:
    n = 20
    attn = _make(name, causal, n)
    q, k, v = _qkv(3, n, torch.float64)
    together = attn(q, k, v)
    for b in range(3):
        problem = _same64(together[b:b + 1], attn(q[b:b + 1], k[b:b + 1], v[b:b + 1]), f"batch element {b}")
        if problem:
            return f"the output of one element depends on the others ({problem})"
    return None


def no_look_ahead(name: str) -> Optional[str]:
    n, cut = 40, 23
    attn = _make(name, True, n)
    q, k, v = _qkv(2, n, torch.float64)
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    g = torch.Generator().manual_seed(9)
    for t in (q2, k2, v2):
        t[:, :, cut:] = 5 * torch.randn(t[:, :, cut:].shape, generator=g, dtype=t.dtype)
    for label, form in (("fast form", attn), ("reference", attn.reference)):
        problem = _same64(form(q, k, v)[:, :, :cut], form(q2, k2, v2)[:, :, :cut], f"outputs before t={cut}")
        if problem:
            return f"the {label}'s past outputs change when future tokens do ({problem})"
    return None


def gradients_reach(name: str, causal: bool) -> Optional[str]:
    n = 24
    attn = _make(name, causal, n)
    q, k, v = (t.requires_grad_(True) for t in _qkv(2, n, torch.float64))
    out = attn(q, k, v)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    (out * w).sum().backward()
    for label, t in (("q", q), ("k", k), ("v", v)):
        if t.grad is None or not t.grad.abs().sum() > 0:
            return f"no gradient reaches {label}"
        if not torch.isfinite(t.grad).all():
            return f"non-finite gradient of {label}"
    for pname, p in attn.named_parameters():
        if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0):
            return f"parameter {pname} gets no gradient"
        if p.grad is not None and not torch.isfinite(p.grad).all():
            return f"parameter {pname} has a non-finite gradient"
    return None


def rejects_bad_shape(name: str, causal: bool) -> Optional[str]:
    attn = _make(name, causal, 8)
    q, k, v = _qkv(1, 8, torch.float64)
    try:
        attn(q[..., :-1], k, v)
    except AttnbenchError:
        return None
    except Exception as e:  # noqa: BLE001
        return f"q with the wrong head size raised {type(e).__name__}, not an AttnbenchError naming the argument"
    return "q with the wrong head size was accepted"


def feature_map_shapes(name: str) -> Optional[str]:
    """The feature map's ``phi_q`` and ``phi_k`` give ``[B, H, N, feature_dim]``, finite, in float64."""
    fmap = registry.build_feature_map(name, heads=H, head_dim=D).double()
    q, k, _ = _qkv(2, 11, torch.float64)
    for side, x in (("phi_q", fmap.phi_q(q)), ("phi_k", fmap.phi_k(k))):
        if tuple(x.shape) != (2, H, 11, fmap.feature_dim):
            return f"{side} gives {tuple(x.shape)}, expected [2, {H}, 11, feature_dim={fmap.feature_dim}]"
        if not torch.isfinite(x).all():
            return f"{side} gives non-finite features"
    return None


def feature_map_contract(name: str, *, verdicts: Optional[list[Verdict]] = None) -> list[Failure]:
    """A feature map's own clauses (its features have ``feature_dim`` columns, in float64, finite), then the
    contract of the attention built on it (a plug-in's map is registered as an attention of the same name)."""
    failures: list[Failure] = []
    _clause(failures, name, "map", "features [B, H, N, feature_dim], finite", lambda: feature_map_shapes(name))
    if name in registry.names():
        failures += contract(name, verdicts=verdicts)
    return failures


def _fail(failures: list[Failure], what: str) -> None:
    if not failures:
        return
    message = f"{what}: {len(failures)} clause(s) of the attnbench contract broken:\n" + \
        "\n".join(f.line() for f in failures)
    try:
        import pytest
    except ImportError:  # pragma: no cover - outside pytest
        raise AssertionError(message) from None
    pytest.fail(message, pytrace=False)


def check_attention(name: str) -> None:
    """Fail the calling test (one line per broken clause) unless the attention ``name`` meets the contract."""
    _fail(contract(name), f"attention {name!r}")


def check_feature_map(name: str) -> None:
    """Fail the calling test unless the feature map ``name`` (and the attention built on it) meets the contract."""
    _fail(feature_map_contract(name), f"feature map {name!r}")
