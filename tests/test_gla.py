"""Gated linear attention and retention: the chunked form vs the token-by-token recurrence and FLA's naive
references, in float64, forward and backward; the FLA path's plumbing; errors."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnbench.core.protocol import ShapeError, UnknownNameError, UnsupportedError
from attnbench.ops.gla import _gla_fla, gated_linear_attention, gla_chunked, gla_recurrent, resolve_gla_impl, \
    retention_decay

from .helpers import max_err, scale_of

REL = 1e-10


def make(B=2, H=3, N=45, Dk=6, Dv=5, *, per_feature=True, state=False, dtype=torch.float64, grad=False,
         strength=1.0):
    q, k = torch.randn(B, H, N, Dk, dtype=dtype), torch.randn(B, H, N, Dk, dtype=dtype)
    v = torch.randn(B, H, N, Dv, dtype=dtype)
    shape = (B, H, N, Dk) if per_feature else (B, H, N)
    g = F.logsigmoid(torch.randn(shape, dtype=dtype) + 1.0) * strength     # log decays <= 0
    s0 = torch.randn(B, H, Dk, Dv, dtype=dtype) if state else None
    ts = dict(q=q, k=k, v=v, g=g, initial_state=s0)
    for t in ts.values():
        if grad and t is not None:
            t.requires_grad_(True)
    return ts


def run(fn, ts, **kw):
    return fn(ts["q"], ts["k"], ts["v"], ts["g"], initial_state=ts["initial_state"], **kw)


def grads(o, s, ts):
    gen = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum()
    if s is not None:
        loss = loss + (s * torch.randn(s.shape, generator=gen, dtype=s.dtype)).sum()
    names = [n for n, t in ts.items() if t is not None and t.requires_grad]
    return dict(zip(names, torch.autograd.grad(loss, [ts[n] for n in names])))


def close(a, b, what, rel=REL):
    err = max_err(a, b)
    assert err <= rel * scale_of(b), f"{what}: max error {err:.3e} (scale {scale_of(b):.3e})"


@pytest.mark.parametrize("N", [1, 7, 45, 130])
@pytest.mark.parametrize("chunk_size", [8, 16])
@pytest.mark.parametrize("per_feature", [True, False], ids=["gla", "per_head"])
@pytest.mark.parametrize("state", [False, True], ids=["zero_state", "initial_state"])
def test_chunked_matches_recurrent_fp64_forward_and_backward(N, chunk_size, per_feature, state):
    ts = make(N=N, per_feature=per_feature, state=state, grad=True)
    o1, s1 = run(gla_recurrent, ts, output_final_state=True, scale=0.3)
    o2, s2 = run(gla_chunked, ts, output_final_state=True, scale=0.3, chunk_size=chunk_size)
    close(o2, o1, "o")
    close(s2, s1, "final state")
    g1, g2 = grads(o1, s1, ts), grads(o2, s2, ts)
    for name in g1:
        close(g2[name], g1[name], f"d{name}")


def test_strong_decay_stays_finite_and_exact():
    """Log decays of -60 per token: exp(G) underflows over a chunk, and no form may form exp(-G)."""
    ts = make(N=40, strength=60.0, grad=True)
    o1, s1 = run(gla_recurrent, ts, output_final_state=True)
    o2, s2 = run(gla_chunked, ts, output_final_state=True, chunk_size=16)
    assert torch.isfinite(o2).all() and torch.isfinite(s2).all()
    close(o2, o1, "o")
    g2 = grads(o2, s2, ts)
    assert all(torch.isfinite(t).all() for t in g2.values())


def test_state_carries_across_calls():
    ts = make(N=50, state=True)
    o, s = run(gla_chunked, ts, output_final_state=True)
    first = {n: (t[:, :, :23] if n != "initial_state" else t) for n, t in ts.items()}
    o_a, s_a = run(gla_chunked, first, output_final_state=True)
    rest = {n: (t[:, :, 23:] if n != "initial_state" else s_a) for n, t in ts.items()}
    o_b, s_b = run(gla_chunked, rest, output_final_state=True)
    close(torch.cat([o_a, o_b], dim=2), o, "o in two calls")
    close(s_b, s, "state in two calls")


# --- FLA's naive references, run in float64 ------------------------------------------------------------------
def fla_naive_fp64(sub: str):
    """FLA's ``fla/ops/<sub>/naive.py`` with its float32 casts turned into float64 ones, loaded from its file
    (importing the ``fla`` package pulls in triton and transformers): the same algorithm, in the precision the
    comparison needs."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / sub / "naive.py"
    name = f"_attnbench_test_fla_{sub}_naive_fp64"
    if name not in sys.modules:
        text = path.read_text()
        for a, b in ((".float()", ".double()"), ("torch.float32", "torch.float64"), ("dtype=torch.float)",
                                                                                    "dtype=torch.float64)")):
            text = text.replace(a, b)
        module = types.ModuleType(name)
        exec(compile(text, str(path), "exec"), module.__dict__)
        sys.modules[name] = module
    return sys.modules[name]


def bthd(t):
    return t.transpose(1, 2)


@pytest.mark.parametrize("N", [9, 64])
def test_matches_fla_naive_recurrent_gla(N):
    naive = fla_naive_fp64("gla")
    ts = make(N=N, state=True, grad=True)
    o, s = run(gated_linear_attention, ts, output_final_state=True)       # FLA's naive fixes scale = Dk ** -0.5
    o_f, s_f = naive.naive_recurrent_gla(bthd(ts["q"]), bthd(ts["k"]), bthd(ts["v"]), bthd(ts["g"]),
                                         initial_state=ts["initial_state"], output_final_state=True)
    close(o, bthd(o_f), "o vs naive_recurrent_gla")
    close(s, s_f, "state vs naive_recurrent_gla")
    mine, theirs = grads(o, s, ts), grads(bthd(o_f), s_f, ts)
    for name in mine:
        close(mine[name], theirs[name], f"d{name} vs naive_recurrent_gla")


@pytest.mark.parametrize("N", [9, 64])
def test_matches_fla_naive_simple_gla(N):
    naive = fla_naive_fp64("simple_gla")
    ts = make(N=N, per_feature=False, state=True, grad=True)
    o, s = run(gated_linear_attention, ts, output_final_state=True, scale=0.7)
    args = (bthd(ts["q"]), bthd(ts["k"]), bthd(ts["v"]), bthd(ts["g"]))
    o_r, s_r = naive.naive_recurrent_simple_gla(*args, scale=0.7, initial_state=ts["initial_state"],
                                                output_final_state=True)
    o_c, s_c = naive.naive_chunk_simple_gla(*args, scale=0.7, initial_state=ts["initial_state"],
                                            output_final_state=True, chunk_size=16)
    mine = grads(o, s, ts)
    for what, o_f, s_f in (("naive_recurrent_simple_gla", o_r, s_r), ("naive_chunk_simple_gla", o_c, s_c)):
        close(o, bthd(o_f), f"o vs {what}")
        close(s, s_f, f"state vs {what}")
        theirs = grads(bthd(o_f), s_f, ts)
        for name in mine:
            close(mine[name], theirs[name], f"d{name} vs {what}")


def test_retention_is_per_head_constant_decay_as_fla_naive_retention():
    naive = fla_naive_fp64("retention")
    B, H, N, D = 2, 4, 33, 8
    ts = make(B=B, H=H, N=N, Dk=D, Dv=D, per_feature=False, grad=True)
    ts["g"] = retention_decay(H).double()[None, :, None].expand(B, H, N)
    o, _ = run(gated_linear_attention, ts)
    o_f = naive.naive_retention(ts["q"], ts["k"], ts["v"])                    # [B, H, T, D], its own decays
    close(o, o_f, "o vs naive_retention")
    mine, theirs = grads(o, None, ts), grads(o_f, None, ts)
    for name in ("q", "k", "v"):
        close(mine[name], theirs[name], f"d{name} vs naive_retention")


# --- dispatch, the FLA path, errors ---------------------------------------------------------------------------
def test_dispatch_and_impl_names():
    assert resolve_gla_impl("cpu") == "torch" and resolve_gla_impl("cuda") == "fla"
    with pytest.raises(UnsupportedError, match="impl='fla' needs a CUDA device"):
        resolve_gla_impl("cpu", "fla")
    with pytest.raises(UnknownNameError, match="did you mean 'torch'"):
        resolve_gla_impl("cpu", "torhc")
    ts = make(N=20)
    a, _ = run(gated_linear_attention, ts, impl="recurrent")
    b, _ = run(gated_linear_attention, ts, impl="torch", chunk_size=8)
    close(b, a, "torch vs recurrent")


@pytest.mark.parametrize("per_feature", [True, False], ids=["chunk_gla", "chunk_simple_gla"])
def test_fla_path_plumbing(per_feature, monkeypatch):
    """The CUDA path's layout and arguments, with FLA's kernels stood in for by the recurrence."""
    seen = {}

    def fake(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
        seen.update(q=tuple(q.shape), g=tuple(g.shape), g_dtype=g.dtype, h0=initial_state.dtype, scale=scale)
        o, s = gla_recurrent(*(t.transpose(1, 2) for t in (q, k, v, g)), scale=scale, initial_state=initial_state,
                             output_final_state=output_final_state)
        return o.transpose(1, 2), s

    monkeypatch.setitem(sys.modules, "fla.ops.gla", types.SimpleNamespace(chunk_gla=fake))
    monkeypatch.setitem(sys.modules, "fla.ops.simple_gla", types.SimpleNamespace(chunk_simple_gla=fake))
    ts = make(B=2, H=3, N=20, per_feature=per_feature, state=True, dtype=torch.float16)
    o, s = _gla_fla(ts["q"], ts["k"], ts["v"], ts["g"], scale=0.4, initial_state=ts["initial_state"],
                    output_final_state=True)
    assert seen == dict(q=(2, 20, 3, 6), g=(2, 20, 3, 6) if per_feature else (2, 20, 3), g_dtype=torch.float32,
                        h0=torch.float32, scale=0.4)
    o_ref, s_ref = run(gla_recurrent, ts, output_final_state=True, scale=0.4)
    assert o.dtype == torch.float16 and max_err(o, o_ref) < 1e-2 * scale_of(o_ref)
    with pytest.raises(UnsupportedError, match="bfloat16 or float16 only"):
        _gla_fla(*(t.float() for t in (ts["q"], ts["k"], ts["v"], ts["g"])), scale=None, initial_state=None,
                 output_final_state=False)


@pytest.mark.parametrize("over, match", [
    (dict(k=torch.randn(2, 3, 44, 6)), "argument 'k' must match"),
    (dict(v=torch.randn(2, 3, 44, 5)), "argument 'v' must be"),
    (dict(g=torch.randn(2, 3, 45, 5)), "argument 'g' \\(log-space decay\\)"),
    (dict(initial_state=torch.randn(2, 3, 5, 6)), "argument 'initial_state' must be"),
])
def test_errors_name_the_argument(over, match):
    ts = make(dtype=torch.float32)
    ts.update(over)
    with pytest.raises(ShapeError, match=match):
        run(gated_linear_attention, ts)
    with pytest.raises(ShapeError, match="chunk_size"):
        run(gated_linear_attention, make(dtype=torch.float32), chunk_size=0)
