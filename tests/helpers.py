"""The one tolerance policy of the test suite, and small shared helpers.

A fast form is compared with the reference in float64 (tight absolute bound, scaled by the output's size), or,
in low precision, may be off the float64 reference by at most ``MULTIPLE`` times the error the reference itself
makes in that precision (plus a small floor for outputs the reference happens to get exactly right).
"""

from __future__ import annotations

import torch

MULTIPLE = 4.0
FP64_RTOL = 1e-9
FLOOR = {torch.float64: 1e-12, torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def scale_of(ref: torch.Tensor) -> float:
    return ref.double().abs().max().item() + 1.0


def assert_matches_fp64(fast: torch.Tensor, ref: torch.Tensor, what: str = "output") -> None:
    """Both computed in float64: agree to FP64_RTOL relative to the reference's magnitude."""
    assert fast.shape == ref.shape, f"{what}: shape {tuple(fast.shape)} != reference {tuple(ref.shape)}"
    err, tol = max_err(fast, ref), FP64_RTOL * scale_of(ref)
    assert err <= tol, f"{what}: max error {err:.3e} > {tol:.3e} against the float64 reference"


def assert_within_policy(fast: torch.Tensor, ref_low: torch.Tensor, ref64: torch.Tensor, what: str = "output") -> None:
    """Low precision: error(fast) <= MULTIPLE * error(reference in the same precision) + floor."""
    floor = FLOOR.get(fast.dtype, 1e-6) * scale_of(ref64)
    e_fast, e_ref = max_err(fast, ref64), max_err(ref_low, ref64)
    assert e_fast <= MULTIPLE * e_ref + floor, (
        f"{what}: fast-form error {e_fast:.3e} exceeds {MULTIPLE} x reference error {e_ref:.3e} + floor {floor:.1e}")
