"""Triton kernels against their PyTorch references, run on the CPU under Triton's interpreter (conftest sets
TRITON_INTERPRET=1). Forward and backward in float32 (float16 forward where sensible) at small odd shapes.

Tolerance: the one policy of ``tests/helpers.py`` -- a kernel's error against the float64 reference may be at most
a fixed multiple of the reference's own error in the kernel's precision.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest
import torch

from attnbench.kernels import (HAS_TRITON, chunk_linear_attn, chunk_linear_attn_reference, kernels_available,
                               l1_distance, l1_distance_reference, nala_feature_map, nala_feature_map_reference,
                               newton_schulz_step, newton_schulz_step_reference)
from attnbench.ops.linear_attn import linear_attention_chunked
from attnbench.ops.nala_map import nala_feature_map_blocked

from .helpers import assert_matches_fp64, assert_within_policy

needs_kernels = pytest.mark.skipif(not kernels_available("cpu"), reason="needs triton with TRITON_INTERPRET=1")
KERNELS = pathlib.Path(__file__).resolve().parents[1] / "kernels"


def _grads(out, inputs, weights):
    """Gradients of sum(out_i * w_i) w.r.t. inputs (None for inputs that get no gradient)."""
    loss = sum((o.double() * w).sum() for o, w in zip(out, weights) if o is not None)
    return torch.autograd.grad(loss, inputs, allow_unused=True)


def _low(ts, dtype):
    return [t.detach().to(dtype).requires_grad_() if t is not None else None for t in ts]


def _three_ways(reference, fast, inputs64, dtype=torch.float32):
    """``reference`` in float64 and in ``dtype`` and ``fast`` in ``dtype`` on copies of ``inputs64`` (None entries
    pass through), each with the gradients of one fixed random weighting of its outputs (a tensor or a list).
    Returns ``(fast, reference in dtype, reference in float64)``, each an ``(outputs, gradients)`` pair of lists."""
    def run(fn, ts, weights=None):
        out = fn(*ts)
        out = list(out) if isinstance(out, (list, tuple)) else [out]
        weights = weights if weights is not None else [torch.randn_like(o.double()) for o in out]
        return out, list(_grads(out, [t for t in ts if t is not None], weights)), weights

    ref64 = [t.detach().requires_grad_() if t is not None else None for t in inputs64]
    r64, g64, weights = run(reference, ref64)
    r_lo, g_lo, _ = run(reference, _low(ref64, dtype), weights)
    out, g_out, _ = run(fast, _low(ref64, dtype), weights)
    return (out, g_out), (r_lo, g_lo), (r64, g64)


def _assert_finite(*ts):
    for t in ts:
        if t is not None:
            assert torch.isfinite(t).all(), "NaN or inf in a kernel output"


# ----------------------------------------------------------------------------------------------- linear attention


def _la_inputs(b, h, n, m, d, init, seed=0):
    g = torch.Generator().manual_seed(seed)
    fq = torch.rand(b, h, n, m, generator=g, dtype=torch.float64)
    fk = torch.rand(b, h, n, m, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    S0 = torch.randn(b, h, m, d, generator=g, dtype=torch.float64) if init else None
    z0 = torch.rand(b, h, m, generator=g, dtype=torch.float64) * n if init else None
    return [fq, fk, v, S0, z0]


def _la_run(fn, ts, normalize, chunk, offset):
    fq, fk, v, S0, z0 = ts
    kw = dict(normalize=normalize, initial_state=(S0, z0) if S0 is not None else None, output_final_state=True,
              offset=offset)
    if fn is chunk_linear_attn:
        kw["chunk_size"] = chunk
    o, (S, z) = fn(fq, fk, v, **kw)
    return [o, S, z]


@needs_kernels
@pytest.mark.parametrize("n", [1, 7, 45])
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("init", [False, True])
def test_chunk_linear_attn_matches_reference_fwd_bwd(n, normalize, init):
    offset = 5 if init else 0
    (out, gk), (r32, g32), (r64, g64) = _three_ways(
        lambda *ts: _la_run(chunk_linear_attn_reference, ts, normalize, 16, offset),
        lambda *ts: _la_run(chunk_linear_attn, ts, normalize, 16, offset), _la_inputs(2, 1, n, 12, 6, init))
    _assert_finite(*out, *gk)
    for name, a, b, c in zip(["o", "S_N", "z_N"], out, r32, r64):
        assert a.dtype == torch.float32
        assert_within_policy(a.float(), b, c, name)
    for name, a, b, c in zip(["dfq", "dfk", "dv", "dS0", "dz0"], gk, g32, g64):
        assert_within_policy(a, b, c, name)


@needs_kernels
@pytest.mark.parametrize("m,d,chunk", [(130, 70, 32), (6, 17, 16)])
def test_chunk_linear_attn_multi_block_tiles(m, d, chunk):
    """Feature and value sizes that need several kernel tiles (M > 64, D > 64) or D > M."""
    (out, gk), (r32, g32), (r64, g64) = _three_ways(
        lambda *ts: _la_run(chunk_linear_attn_reference, ts, True, chunk, 2),
        lambda *ts: _la_run(chunk_linear_attn, ts, True, chunk, 2), _la_inputs(1, 1, 37, m, d, True, seed=3))
    assert_within_policy(out[0], r32[0], r64[0], "o")
    for name, a, b, c in zip(["dfq", "dfk", "dv", "dS0", "dz0"], gk, g32, g64):
        assert_within_policy(a, b, c, name)


@needs_kernels
@pytest.mark.parametrize("normalize", [True, False])
def test_chunk_linear_attn_equals_attnbench_op(normalize):
    """Same semantics as attnbench.ops.linear_attn.linear_attention_chunked (mean-score eps, 1-based counts)."""
    fq, fk, v, _, _ = _la_inputs(1, 2, 45, 12, 6, False, seed=1)
    ref64 = linear_attention_chunked(fq, fk, v, normalize=normalize, chunk_size=16)
    ref32 = linear_attention_chunked(fq.float(), fk.float(), v.float(), normalize=normalize, chunk_size=16)
    out, state = chunk_linear_attn(fq.float(), fk.float(), v.float(), normalize=normalize, chunk_size=16)
    assert state is None
    assert_within_policy(out, ref32, ref64, "o vs attnbench op")


@needs_kernels
def test_chunk_linear_attn_continues_from_state():
    """prefix (final state out) + rest (initial state in, offset = prefix length) == one call on everything."""
    fq, fk, v, _, _ = (t.float() if t is not None else None for t in _la_inputs(1, 2, 45, 12, 6, False, seed=2))
    whole, (S, z) = chunk_linear_attn(fq, fk, v, chunk_size=16, output_final_state=True)
    a, st = chunk_linear_attn(fq[:, :, :20], fk[:, :, :20], v[:, :, :20], chunk_size=16, output_final_state=True)
    b, (S2, z2) = chunk_linear_attn(fq[:, :, 20:], fk[:, :, 20:], v[:, :, 20:], chunk_size=16, initial_state=st,
                                    offset=20, output_final_state=True)
    torch.testing.assert_close(torch.cat([a, b], dim=2), whole, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(S2, S, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(z2, z, rtol=1e-5, atol=1e-5)


@needs_kernels
@pytest.mark.parametrize("init", [False, True])
def test_chunk_linear_attn_float16_forward(init):
    ts = _la_inputs(1, 2, 45, 12, 6, init, seed=4)
    r64 = _la_run(chunk_linear_attn_reference, ts, True, 16, 3)
    ts16 = [t.half() if t is not None else None for t in ts]
    r16 = _la_run(chunk_linear_attn_reference, ts16, True, 16, 3)
    out = _la_run(chunk_linear_attn, ts16, True, 16, 3)
    assert out[0].dtype == torch.float16
    _assert_finite(*out)
    assert_within_policy(out[0], r16[0], r64[0], "o (fp16)")


@needs_kernels
def test_chunk_linear_attn_low_precision_dot_path(monkeypatch):
    """The bfloat16 code path (tiles dotted in their own dtype) cannot run under the interpreter in bfloat16, so it
    is run here in float16: forward and backward within the policy of the float16 reference."""
    import attnbench.kernels._util as util

    monkeypatch.setattr(util, "LOWP_DTYPES", (torch.float16,))
    (out, gk), (r16, g16), (r64, g64) = _three_ways(
        lambda *ts: _la_run(chunk_linear_attn_reference, ts, True, 16, 3),
        lambda *ts: _la_run(chunk_linear_attn, ts, True, 16, 3), _la_inputs(1, 2, 45, 12, 6, True, seed=5),
        torch.float16)
    _assert_finite(*out, *gk)
    assert_within_policy(out[0], r16[0], r64[0], "o (fp16 operands)")
    for name, a, b, c in zip(["dfq", "dfk", "dv", "dS0", "dz0"], gk, g16, g64):
        assert_within_policy(a, b, c, f"{name} (fp16 operands)")


@needs_kernels
def test_chunk_linear_attn_bad_arguments():
    fq = torch.rand(1, 2, 7, 12)
    v = torch.randn(1, 2, 7, 6)
    with pytest.raises(ValueError, match="fk"):
        chunk_linear_attn(fq, fq[..., :5], v)
    with pytest.raises(ValueError, match="v must be"):
        chunk_linear_attn(fq, fq, v[:, :, :3])
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_linear_attn(fq, fq, v, chunk_size=24)
    with pytest.raises(ValueError, match="S0"):
        chunk_linear_attn(fq, fq, v, initial_state=torch.zeros(1, 2, 6, 12))
    with pytest.raises(ValueError, match="z0"):
        chunk_linear_attn(fq, fq, v, initial_state=(torch.zeros(1, 2, 12, 6), torch.zeros(1, 2, 6)))
    with pytest.raises(ValueError, match="M = fq.shape"):
        chunk_linear_attn(torch.rand(1, 1, 3, 300), torch.rand(1, 1, 3, 300), torch.rand(1, 1, 3, 4))
    with pytest.raises(TypeError, match="dtype"):
        chunk_linear_attn(fq, fq, v.double())


# ----------------------------------------------------------------------------------------------- NaLa


def _nala_input(shape, seed=0):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    x[0, 0, 0] = 0.0        # a zero token: norm clamped at eps, every |.|^p at 0
    x[0, 0, 1, 2] = 0.0     # one zero coordinate: gradient of |u|^p defined as 0 there
    return x


@needs_kernels
@pytest.mark.parametrize("is_query", [True, False])
@pytest.mark.parametrize("shape,lam,tau", [((2, 3, 7, 6), 3.0, 0.5), ((1, 2, 5, 33), 2.0, 1.0)])
def test_nala_kernel_matches_reference_fwd_bwd(is_query, shape, lam, tau):
    kw = dict(is_query=is_query, lam=lam, tau=tau)
    ([out], [gk]), ([r32], [g32]), ([r64], [g64]) = _three_ways(
        lambda x: nala_feature_map_reference(x, **kw), lambda x: nala_feature_map(x, **kw), [_nala_input(shape)])
    assert r64.shape[-1] == 2 * shape[-1]
    _assert_finite(out, gk)
    assert_within_policy(out, r32, r64, "phi")
    assert_within_policy(gk, g32, g64, "dx")


@needs_kernels
def test_nala_maps_into_causal_linear_attention():
    """NaLa features (M = 2D) through the causal kernel, end to end, forward and backward into q, k, v."""
    g = torch.Generator().manual_seed(7)
    q64, k64, v64 = (torch.randn(1, 2, 45, 6, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))

    def run(q, k, v, fast):
        phi = nala_feature_map if fast else nala_feature_map_reference
        attn = chunk_linear_attn if fast else chunk_linear_attn_reference
        kw = dict(chunk_size=16) if fast else {}
        return attn(phi(q, is_query=True), phi(k, is_query=False), v, **kw)[0]

    ([out], gk), ([r32], g32), ([r64], g64) = _three_ways(lambda *x: run(*x, False), lambda *x: run(*x, True),
                                                        [q64, k64, v64])
    _assert_finite(out, *gk)
    assert_within_policy(out, r32, r64, "nala attention")
    for name, a, b, c in zip(["dq", "dk", "dv"], gk, g32, g64):
        assert_within_policy(a, b, c, name)


@needs_kernels
@pytest.mark.parametrize("is_query", [True, False])
def test_nala_kernel_float16_forward(is_query):
    x64 = _nala_input((1, 2, 9, 6), seed=1)
    r64 = nala_feature_map_reference(x64, is_query=is_query)
    r16 = nala_feature_map_reference(x64.half(), is_query=is_query)
    out = nala_feature_map(x64.half(), is_query=is_query)
    assert out.dtype == torch.float16
    _assert_finite(out)
    assert_within_policy(out, r16, r64, "phi (fp16)")


@pytest.mark.parametrize("is_query", [True, False])
@pytest.mark.parametrize("lam,tau,threads", [(3.0, 0.5, 1), (2.5, 1.0, 2)])
def test_nala_blocked_torch_path_matches_reference(is_query, lam, tau, threads, monkeypatch):
    """The CPU fast path: exact in float64 (forward and hand-written backward), policy in float32, over several
    row blocks, the last one short (5 rows per block per thread)."""
    import attnbench.ops.nala_map as nala

    monkeypatch.setattr(nala, "_BLOCK_ELEMS", 5 * 6)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    x64 = _nala_input((2, 3, 7, 6), seed=2).requires_grad_()
    kw = dict(is_query=is_query, lam=lam, tau=tau)
    r64 = nala_feature_map_reference(x64, **kw)
    w = torch.randn_like(r64)
    (g64,) = torch.autograd.grad(r64, x64, w)
    xf = x64.detach().clone().requires_grad_()
    out = nala_feature_map_blocked(xf, **kw)
    (gf,) = torch.autograd.grad(out, xf, w)
    x32 = x64.detach().float().requires_grad_()
    out32 = nala_feature_map_blocked(x32, **kw)
    (gf32,) = torch.autograd.grad(out32, x32, w.float())
    assert_matches_fp64(out, r64, "phi (blocked, fp64)")
    assert_matches_fp64(gf, g64, "dx (blocked, fp64)")
    xr = x64.detach().float().requires_grad_()
    r32 = nala_feature_map_reference(xr, **kw)
    (g32,) = torch.autograd.grad(r32, xr, w.float())
    assert_within_policy(out32, r32, r64, "phi (blocked, fp32)")
    assert_within_policy(gf32, g32, g64, "dx (blocked, fp32)")


def test_nala_bad_arguments():
    with pytest.raises(ValueError, match="eps"):
        nala_feature_map_blocked(torch.randn(2, 4), is_query=True, eps=0.0)
    with pytest.raises(TypeError, match="floating"):
        nala_feature_map_blocked(torch.ones(2, 4, dtype=torch.long), is_query=False)


# ----------------------------------------------------------------------------------------------- Laplace


def _l1_inputs(b, h, n, m, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    y = torch.randn(b, h, m, d, generator=g, dtype=torch.float64)
    y[0, 0, 0, : d // 2 + 1] = x[0, 0, min(3, n - 1), : d // 2 + 1]  # exact ties: sign(0) = 0
    return x, y


@needs_kernels
@pytest.mark.parametrize("b,h,n,m,d", [(2, 1, 45, 9, 7), (1, 1, 1, 1, 1), (1, 2, 33, 40, 19)])
def test_l1_distance_matches_reference_fwd_bwd(b, h, n, m, d):
    x64, y64 = _l1_inputs(b, h, n, m, d)
    ([out], gk), ([r32], g32), ([r64], g64) = _three_ways(l1_distance_reference, l1_distance, [x64, y64])
    _assert_finite(out, *gk)
    assert_matches_fp64(torch.cdist(x64, y64, p=1), r64, "cdist reference")
    assert_within_policy(out, r32, r64, "L1 distance")
    for name, a, r, c in zip(["dx", "dy"], gk, g32, g64):
        assert_within_policy(a, r, c, name)


@needs_kernels
def test_l1_distance_float16_forward():
    x64, y64 = _l1_inputs(1, 2, 21, 10, 9, seed=1)
    out = l1_distance(x64.half(), y64.half())
    assert out.dtype == torch.float16
    assert_within_policy(out, l1_distance_reference(x64.half(), y64.half()), l1_distance_reference(x64, y64), "L1")


@needs_kernels
@pytest.mark.parametrize("m", [5, 17, 40])
def test_newton_schulz_step_matches_reference_fwd_bwd(m):
    g = torch.Generator().manual_seed(m)
    W64 = torch.randn(2, 3, m, m, generator=g, dtype=torch.float64) / m ** 0.5
    X64 = torch.randn(2, 3, m, m, generator=g, dtype=torch.float64) / m ** 0.5
    ([out], gk), ([r32], g32), ([r64], g64) = _three_ways(newton_schulz_step_reference, newton_schulz_step,
                                                        [X64, W64])
    _assert_finite(out, *gk)
    assert_within_policy(out, r32, r64, "NS step")
    for name, a, r, c in zip(["dX", "dW"], gk, g32, g64):
        assert_within_policy(a, r, c, name)


@needs_kernels
@pytest.mark.parametrize("m,steps", [(128, 2), (24, 14)])
def test_newton_schulz_steps_invert(m, steps):
    """SOFT's start X0 = alpha P, steps by the kernel track the reference (m = 128 is the size limit); with
    enough steps they reach P^{-1}."""
    A = torch.randn(1, 1, m, m, generator=torch.Generator().manual_seed(0)) / m ** 0.5
    P = A @ A.transpose(-1, -2) + 0.5 * torch.eye(m)                          # [1, 1, m, m] SPD
    X = 1.8 / P.abs().sum(-1).amax(-1)[..., None, None] ** 2 * P
    Xr = X.clone()
    for _ in range(steps):
        X, Xr = newton_schulz_step(X, P), newton_schulz_step_reference(Xr, P)
    torch.testing.assert_close(X, Xr, rtol=1e-4, atol=1e-5)
    if m == 24:
        assert (X @ P - torch.eye(m)).abs().max() < 1e-4


@needs_kernels
def test_laplace_bad_arguments():
    with pytest.raises(ValueError, match="y must be"):
        l1_distance(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 3, 5))
    with pytest.raises(ValueError, match="W must"):
        newton_schulz_step(torch.randn(1, 4, 4), torch.randn(1, 5, 5))
    with pytest.raises(ValueError, match="m = X.shape"):
        newton_schulz_step(torch.randn(130, 130), torch.randn(130, 130))


# ----------------------------------------------------------------------------------------------- package


def test_kernels_is_a_leaf():
    """kernels/ never imports attnbench (the dependency runs one way: attnbench -> kernels)."""
    for path in KERNELS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""] if node.level == 0 else []
            else:
                continue
            assert not any(mod.split(".")[0] == "attnbench" for mod in mods), f"{path.name} imports {mods}"


def test_kernels_import_without_triton():
    """With triton unimportable the package still imports, references and the blocked CPU path work, and a kernel
    entry point raises a clear error."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import torch, attnbench.kernels as k\n"
        "assert not k.HAS_TRITON and not k.kernels_available()\n"
        "x = torch.randn(3, 4)\n"
        "from attnbench.ops.nala_map import nala_feature_map_blocked\n"
        "torch.testing.assert_close(nala_feature_map_blocked(x, is_query=True),"
        " k.nala_feature_map_reference(x, is_query=True))\n"
        "try:\n"
        "    k.chunk_linear_attn(torch.rand(1, 1, 3, 4), torch.rand(1, 1, 3, 4), torch.rand(1, 1, 3, 2))\n"
        "except RuntimeError as e:\n"
        "    assert 'triton is not installed' in str(e), e\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_availability_flags():
    assert isinstance(HAS_TRITON, bool)
    assert kernels_available("cpu") == (HAS_TRITON and __import__("os").environ.get("TRITON_INTERPRET") == "1")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_kernels_on_gpu_bf16_forward():
    """Real GPU: bf16 forward of each kernel within the policy of the bf16 reference."""
    dev = "cuda"
    fq, fk, v, _, _ = (t.to(dev) if t is not None else None for t in _la_inputs(2, 2, 200, 32, 16, False))
    out, _ = chunk_linear_attn(fq.bfloat16(), fk.bfloat16(), v.bfloat16())
    ref16, _ = chunk_linear_attn_reference(fq.bfloat16(), fk.bfloat16(), v.bfloat16())
    assert_within_policy(out, ref16, chunk_linear_attn_reference(fq, fk, v)[0], "o (bf16)")
    x = torch.randn(2, 2, 200, 32, device=dev, dtype=torch.float64)
    assert_within_policy(nala_feature_map(x.bfloat16(), is_query=True),
                         nala_feature_map_reference(x.bfloat16(), is_query=True),
                         nala_feature_map_reference(x, is_query=True), "nala (bf16)")
    y = torch.randn(2, 2, 20, 32, device=dev, dtype=torch.float64)
    assert_within_policy(l1_distance(x.float(), y.float()), l1_distance_reference(x.float(), y.float()),
                         l1_distance_reference(x, y), "L1 (fp32)")
