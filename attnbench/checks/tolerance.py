"""The one correctness policy: how far a fast form may be from its reference.

Applied by the one verification module, :mod:`attnbench.checks.verify` (``attnbench check``, the gate before any
timing, the benchmarks), and by the test helpers.

Three computations of the same thing, on the same inputs:

- ``fast``    the fast form (chunked, fused, Triton, ...) in the precision under test;
- ``ref_low`` the reference form in that *same* precision;
- ``ref64``   the reference in float64, the ground truth.

Per tensor (the output and each gradient), with ``scale = max|ref64| + 1``::

    error     = max|fast    - ref64| / scale
    ref_error = max|ref_low - ref64| / scale
    ok       <=> error <= MULTIPLE * ref_error + FLOOR[dtype]

and the comparison as a whole is ok when every tensor is (a NaN or inf anywhere is never ok).

Why a multiple of the reference's own error and not a fixed tolerance: machines differ. The rounding error of
a float32 computation depends on the order of its sums, and that order depends on the CPU's vector width and
the library's blocking: on an AMD EPYC with AVX2 only, float32 errors are measurably larger than on an Intel
Xeon with AVX-512, and a fixed ``2e-4`` that passed on one failed on the other (laplacian, N = 7, gradients:
``2.2e-4``). The reference in the same precision, run on the same machine, is the ruler: when the machine's
arithmetic is coarser, the reference's error grows and the bound grows with it. A fast form that is correct
is about as accurate as the plain math (a small multiple of its error); a broken one is off by orders of
magnitude, far outside any multiple.

The floor is for tensors that the reference happens to get exactly (or almost exactly) right in low precision,
where ``MULTIPLE * ref_error`` is ~0 and the fast form still has rounding to spend. Per dtype, relative to the
scale:

- float32 ``1e-4`` (about four correct digits; eps is ``1.2e-7``): some fast forms are factorised in ways that
  amplify rounding where the plain math is exact by structure. LaplacianFormer at N = 1: the reference's column
  variance is exactly 0 and its output exactly v, while the factorised form divides a difference of two equal
  products by ``sqrt(0 + 1e-6)``, i.e. multiplies its rounding by 1000 (errors from 4e-6 to 9e-5 over 60 input
  seeds, median 1.1e-5; seed 0: 5e-6). Everywhere the reference is not exact, the ``MULTIPLE * ref_error`` term
  is the one that judges; a wrong mask, scale or chunk boundary is off by far more than either.
- float16 ``1e-3`` and bfloat16 ``1e-2`` (about one eps: ``9.8e-4``, ``7.8e-3``): in these precisions the rounding
  of the inputs alone makes the reference's error large, so the floor rarely binds.
- float64 ``1e-9``: the reference in the same precision *is* the ground truth, so ``ref_error`` is 0 and the
  bound is the floor alone. ``1e-9`` is millions of float64 ulps (eps ``2.2e-16``): room for any reordering of
  sums, even through the Newton–Schulz inverses of the Nyström-type mechanisms, yet a hundred times below the
  ``~1e-7`` that a single float32 intermediate leaking into a float64 path causes, and far below any real bug.

The scale is ``max|ref64| + 1``: relative for tensors of magnitude >= 1 and absolute for small ones, so a
gradient that is tiny or exactly zero is not divided by ~0. Errors of all tensors are measured the same way, so
the scale changes nothing but the weight of the floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, Union

import torch

MULTIPLE = 4.0
FLOOR = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-3, torch.bfloat16: 1e-2}

Tensors = Union[torch.Tensor, None, Sequence[Union[torch.Tensor, None]]]


@dataclass(frozen=True)
class TensorError:
    """One tensor's numbers: its error, the reference's own error and the bound, all relative to the scale."""

    name: str
    err: float
    ref_err: float
    bound: float

    @property
    def ok(self) -> bool:
        return self.err <= self.bound  # False for NaN in either

    @property
    def ratio(self) -> float:
        """``err / bound``: above 1 fails; NaN counts as infinitely bad."""
        if math.isnan(self.err) or math.isnan(self.bound):
            return math.inf
        return self.err / self.bound if self.bound > 0 else (0.0 if self.err == 0 else math.inf)


@dataclass(frozen=True)
class Agreement:
    """The verdict of :func:`compare`: the worst tensor's error, bound and reference error, and whether every
    tensor is within its bound. ``tensors`` holds every tensor's numbers; ``detail`` says what failed."""

    ok: bool
    err: float
    bound: float
    ref_err: float
    worst: str
    dtype: str
    floor: float
    tensors: tuple[TensorError, ...] = ()
    detail: str = ""

    def describe(self) -> str:
        return (f"{self.worst}: error {self.err:.2e} vs bound {self.bound:.2e} = {MULTIPLE:g} x reference error "
                f"{self.ref_err:.2e} + floor {self.floor:.0e} ({self.dtype})"
                + (f"; {self.detail}" if self.detail else ""))


def _dtype_of(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return getattr(torch, dtype)


def floor_for(dtype: torch.dtype | str) -> float:
    """The absolute floor (relative to the scale) of ``dtype``; a clear error for a dtype the policy lacks."""
    d = _dtype_of(dtype)
    try:
        return FLOOR[d]
    except KeyError:
        raise ValueError(f"tolerance policy: no floor for dtype {d}; expected one of "
                         f"{', '.join(str(k).replace('torch.', '') for k in FLOOR)}") from None


def relative_error(a: torch.Tensor, ref: torch.Tensor) -> float:
    """``max|a - ref| / (max|ref| + 1)`` in float64 (NaN if either has a NaN or inf)."""
    a64, r64 = a.detach().double(), ref.detach().double()
    if a64.numel() == 0:
        return 0.0
    if not (torch.isfinite(a64).all() and torch.isfinite(r64).all()):
        return math.nan
    return (a64 - r64.to(a64.device)).abs().max().item() / (r64.abs().max().item() + 1.0)


def _as_list(x: Tensors) -> list:
    return [x] if x is None or isinstance(x, torch.Tensor) else list(x)


def compare(fast: Tensors, ref_low: Tensors, ref64: Tensors, *, names: Sequence[str] | None = None,
            dtype: torch.dtype | str | None = None, floor: float | None = None) -> Agreement:
    """The policy, applied to one tensor or to matching lists of them (output, then gradients; ``None`` entries,
    e.g. a gradient that does not exist, must be ``None`` in all three lists).

    ``dtype`` is the precision under test (whose floor applies; default: the first fast tensor's dtype);
    ``floor`` overrides the floor. Never raises for bad numbers: NaN, inf, a shape mismatch or a missing
    gradient are a failed :class:`Agreement` with a ``detail``.
    """
    fast, ref_low, ref64 = _as_list(fast), _as_list(ref_low), _as_list(ref64)
    if not len(fast) == len(ref_low) == len(ref64):
        raise ValueError(f"tolerance policy: {len(fast)} fast tensors, {len(ref_low)} low-precision reference "
                         f"tensors and {len(ref64)} float64 reference tensors; expected the same number")
    names = list(names) if names is not None else (["output"] if len(fast) == 1 else
                                                   [f"tensor {i}" for i in range(len(fast))])
    if dtype is None:
        dtype = next((t.dtype for t in fast if t is not None), torch.float64)
    label = str(_dtype_of(dtype)).replace("torch.", "")
    fl = floor_for(dtype) if floor is None else floor
    rows: list[TensorError] = []
    problems: list[str] = []
    for name, f, rl, r in zip(names, fast, ref_low, ref64):
        if f is None and rl is None and r is None:
            continue
        if f is None or rl is None or r is None:
            problems.append(f"{name}: missing in " + ", ".join(w for w, t in (("the fast form", f),
                            ("the low-precision reference", rl), ("the float64 reference", r)) if t is None))
            rows.append(TensorError(name, math.nan, math.nan, math.nan))
            continue
        if f.shape != r.shape or rl.shape != r.shape:
            problems.append(f"{name}: shapes {tuple(f.shape)} (fast), {tuple(rl.shape)} (reference, {label}) "
                            f"and {tuple(r.shape)} (float64 reference) differ")
            rows.append(TensorError(name, math.nan, math.nan, math.nan))
            continue
        e, e_ref = relative_error(f, r), relative_error(rl, r)
        if math.isnan(e):
            problems.append(f"{name}: NaN or inf in the fast form or the float64 reference")
        elif math.isnan(e_ref):
            problems.append(f"{name}: NaN or inf in the reference in {label}")
        rows.append(TensorError(name, e, e_ref, MULTIPLE * e_ref + fl))
    if not rows:
        return Agreement(True, 0.0, fl, 0.0, "-", label, fl, (), "no tensors to compare")
    worst = max(rows, key=lambda t: t.ratio)
    return Agreement(ok=all(t.ok for t in rows), err=worst.err, bound=worst.bound, ref_err=worst.ref_err,
                     worst=worst.name, dtype=label, floor=fl, tensors=tuple(rows), detail="; ".join(problems))
