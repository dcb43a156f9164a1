"""Mamba's selective scan: the chunked form against the token-by-token recurrence in float64, forward and backward,
at odd lengths and with a carried state; errors name the argument."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnbench.core.protocol import ShapeError
from attnbench.ops.ssm import selective_scan_chunked, selective_scan_recurrent

from .helpers import max_err, scale_of


def make(B=2, T=19, E=5, N=4, *, state=True, strength=1.0):
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    ts = dict(u=r(B, T, E), dt=F.softplus(r(B, T, E)) * strength, A=-torch.rand(E, N, generator=g,
                                                                                 dtype=torch.float64) * 3,
              Bm=r(B, T, N), Cm=r(B, T, N), D=r(E), initial_state=r(B, E, N) if state else None)
    for t in ts.values():
        if t is not None:
            t.requires_grad_(True)
    return ts


def run(fn, ts, **kw):
    return fn(ts["u"], ts["dt"], ts["A"], ts["Bm"], ts["Cm"], ts["D"], initial_state=ts["initial_state"],
              output_final_state=True, **kw)


@pytest.mark.parametrize("T", [1, 7, 19, 40])
@pytest.mark.parametrize("chunk_size", [4, 8])
@pytest.mark.parametrize("state", [False, True], ids=["zero_state", "initial_state"])
def test_chunked_matches_recurrent_fp64_forward_and_backward(T, chunk_size, state):
    ts = make(T=T, state=state)
    y1, h1 = run(selective_scan_recurrent, ts)
    y2, h2 = run(selective_scan_chunked, ts, chunk_size=chunk_size)
    assert max_err(y2, y1) <= 1e-10 * scale_of(y1) and max_err(h2, h1) <= 1e-10 * scale_of(h1)
    w = torch.linspace(-1, 1, y1.numel(), dtype=torch.float64).reshape(y1.shape)
    names = [n for n, t in ts.items() if t is not None]
    g1 = torch.autograd.grad((y1 * w).sum() + h1.sum(), [ts[n] for n in names])
    g2 = torch.autograd.grad((y2 * w).sum() + h2.sum(), [ts[n] for n in names])
    for name, a, b in zip(names, g2, g1):
        assert max_err(a, b) <= 1e-10 * scale_of(b), f"d{name}"


def test_strong_decay_stays_finite():
    ts = make(T=24, strength=50.0)
    y1, _ = run(selective_scan_recurrent, ts)
    y2, _ = run(selective_scan_chunked, ts, chunk_size=8)
    assert torch.isfinite(y2).all() and max_err(y2, y1) <= 1e-10 * scale_of(y1)


@pytest.mark.parametrize("over, match", [
    (dict(dt=torch.rand(2, 18, 5)), "argument 'dt' must match"),
    (dict(A=torch.rand(4, 4)), "argument 'A' must be"),
    (dict(Cm=torch.rand(2, 19, 3)), "argument 'C' must be"),
    (dict(initial_state=torch.rand(2, 5, 3)), "argument 'initial_state' must be"),
])
def test_errors_name_the_argument(over, match):
    ts = {n: (t.detach() if t is not None else None) for n, t in make().items()}
    ts.update(over)
    with pytest.raises(ShapeError, match=match):
        run(selective_scan_recurrent, ts)
