"""The delta rule op: chunked WY form vs the token-by-token recurrence, vs FLA's naive references, and errors."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from attnbench.ops.delta import (
    _delta_rule_fla,
    delta_rule,
    delta_rule_chunked,
    delta_rule_recurrent,
    resolve_delta_impl,
)
from attnbench.core.protocol import ShapeError, UnknownNameError, UnsupportedError

from .helpers import assert_matches_fp64, assert_within_policy, load_file, max_err, scale_of


def make(B=2, H=2, N=45, Dk=8, Dv=5, *, gate=False, state=False, dtype=torch.float64, grad=False):
    """Stable delta-rule inputs: L2-normalised k, beta in (0, 1), log-gates <= 0."""
    q = torch.randn(B, H, N, Dk, dtype=dtype)
    k = F.normalize(torch.randn(B, H, N, Dk, dtype=dtype), dim=-1)
    v = torch.randn(B, H, N, Dv, dtype=dtype)
    beta = torch.rand(B, H, N, dtype=dtype)
    g = F.logsigmoid(torch.randn(B, H, N, dtype=dtype) + 2.0) if gate else None
    s0 = torch.randn(B, H, Dk, Dv, dtype=dtype) if state else None
    ts = dict(q=q, k=k, v=v, beta=beta, g=g, initial_state=s0)
    if grad:
        for t in ts.values():
            if t is not None:
                t.requires_grad_(True)
    return ts


def run(fn, ts, **kw):
    return fn(ts["q"], ts["k"], ts["v"], ts["beta"], ts["g"], initial_state=ts["initial_state"], **kw)


def grads(o, s, ts):
    """Gradients of a fixed random functional of (o, final state) w.r.t. every input that has one."""
    gen = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum()
    if s is not None:
        loss = loss + (s * torch.randn(s.shape, generator=gen, dtype=s.dtype)).sum()
    names = [n for n, t in ts.items() if t is not None]
    return dict(zip(names, torch.autograd.grad(loss, [ts[n] for n in names])))


# ------------------------------------------------------------------------------------------------------------
# chunked == recurrent, float64, forward and backward
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N", [1, 7, 45, 130])
@pytest.mark.parametrize("chunk_size", [16, 64])
@pytest.mark.parametrize("gate", [False, True], ids=["deltanet", "gated"])
@pytest.mark.parametrize("state", [False, True], ids=["zero_state", "initial_state"])
def test_chunked_matches_recurrent_fp64(N, chunk_size, gate, state):
    ts = make(N=N, gate=gate, state=state, grad=True)
    o_ref, s_ref = run(delta_rule_recurrent, ts, output_final_state=True)
    o, s = run(delta_rule_chunked, ts, output_final_state=True, chunk_size=chunk_size)
    assert o.shape == (2, 2, N, 5) and s.shape == (2, 2, 8, 5)
    assert_matches_fp64(o, o_ref, "o")
    assert_matches_fp64(s, s_ref, "final state")
    g_ref, g_fast = grads(o_ref, s_ref, ts), grads(o, s, ts)
    assert set(g_fast) == {"q", "k", "v", "beta"} | ({"g"} if gate else set()) | ({"initial_state"} if state else set())
    for name in g_ref:
        assert_matches_fp64(g_fast[name], g_ref[name], f"d{name}")


@pytest.mark.parametrize("N", [1, 7, 64])
@pytest.mark.parametrize("gate", [False, True], ids=["deltanet", "gated"])
def test_one_chunk_matches_recurrent_with_less_work(N, gate):
    """A sequence of one chunk from no state, and no final state asked (a recall-tiny step) takes the one-chunk
    form: the recurrence's output and gradients in float64, for fewer counted FLOPs than the chunked form
    that carries the state (asked for here by output_final_state)."""
    from torch.utils.flop_counter import FlopCounterMode

    ts = make(N=N, Dk=16, Dv=8, gate=gate, grad=True)
    o_ref, _ = run(delta_rule_recurrent, ts)
    with FlopCounterMode(display=False) as one:
        o, s = run(delta_rule_chunked, ts, chunk_size=64)
    with FlopCounterMode(display=False) as carried:
        run(delta_rule_chunked, ts, chunk_size=64, output_final_state=True)
    assert s is None and o.shape == (2, 2, N, 8)
    assert one.get_total_flops() < carried.get_total_flops()
    assert_matches_fp64(o, o_ref, "o")
    g_ref, g_fast = grads(o_ref, None, ts), grads(o, None, ts)
    assert set(g_fast) == {"q", "k", "v", "beta"} | ({"g"} if gate else set())
    for name in g_ref:
        assert_matches_fp64(g_fast[name], g_ref[name], f"d{name}")


@pytest.mark.parametrize("N", [64, 130], ids=["one-chunk", "chunked"])
@pytest.mark.parametrize("heads_first", [True, False], ids=["contiguous", "transposed-view"])
def test_gradients_come_back_in_the_inputs_layout(N, heads_first):
    """q, k and v get their gradients in their own layout (contiguous, or the [B, T, H, D] -> [B, H, T, D] view a
    model hands in): the ops multiply by k^T and q^T, whose gradients would come back transposed, and an
    elementwise backward before the op (SiLU's) with operands in two layouts runs several times slower."""
    ts = make(N=N, Dk=16, Dv=8, dtype=torch.float32, gate=True)
    if not heads_first:
        for n in ("q", "k", "v"):
            ts[n] = ts[n].transpose(1, 2).contiguous().transpose(1, 2)
    for t in ts.values():
        if t is not None:
            t.requires_grad_(True)
    o, _ = run(delta_rule_chunked, ts, chunk_size=64)
    g = grads(o, None, ts)
    for n in ("q", "k", "v"):
        assert g[n].stride() == ts[n].stride(), n
    plain = {n: (None if t is None else t.detach().clone().requires_grad_(True)) for n, t in ts.items()}
    o_ref, _ = run(delta_rule_recurrent, plain)
    g_ref = grads(o_ref, None, plain)
    for n in g_ref:  # and the same values (the layout is all that changed)
        assert max_err(g[n], g_ref[n]) <= 1e-4 * scale_of(g_ref[n]), f"d{n}"


@pytest.mark.parametrize("N", [7, 130])
@pytest.mark.parametrize("gate", [False, True], ids=["deltanet", "gated"])
@pytest.mark.parametrize("block_bytes", [1, 1 << 20], ids=["4-chunk-blocks", "one-block"])
@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
def test_streamed_blocks_match_recurrent(N, gate, block_bytes, grad):
    """The sequence is streamed in blocks of whole chunks (block_bytes=1 gives the minimum, 4 chunks: N = 130
    at C = 16 is blocks of 4, 4 and 1 chunks); the in-place path (no autograd) and the autograd path agree
    with the recurrence across block boundaries, with a carried initial state."""
    ts = make(N=N, gate=gate, state=True, grad=grad)
    o_ref, s_ref = run(delta_rule_recurrent, ts, output_final_state=True)
    with torch.set_grad_enabled(grad):
        o, s = run(delta_rule_chunked, ts, output_final_state=True, chunk_size=16, block_bytes=block_bytes)
    assert_matches_fp64(o, o_ref, "o")
    assert_matches_fp64(s, s_ref, "final state")
    assert o.requires_grad == grad
    if grad:
        g_ref, g_fast = grads(o_ref, s_ref, ts), grads(o, s, ts)
        for name in g_ref:
            assert_matches_fp64(g_fast[name], g_ref[name], f"d{name}")


def test_strong_decay_stays_finite():
    """Gates of -4 per token make exp(G_i - G_j) overflow fp32 above the diagonal of a 64-chunk (e^{+250});
    the chunked form masks before the exp, so neither the output nor any gradient sees an inf or a NaN."""
    ts = make(N=130, gate=True, state=True, dtype=torch.float32)
    ts["g"] = torch.full_like(ts["g"], -4.0)
    for t in ts.values():
        t.requires_grad_(True)
    o_ref, s_ref = run(delta_rule_recurrent, ts, output_final_state=True)
    o, s = run(delta_rule_chunked, ts, output_final_state=True, chunk_size=64)
    assert max_err(o, o_ref) <= 1e-5 * scale_of(o_ref) and max_err(s, s_ref) <= 1e-5 * scale_of(s_ref)
    g_ref, g_fast = grads(o_ref, s_ref, ts), grads(o, s, ts)
    for name in g_ref:
        assert torch.isfinite(g_fast[name]).all(), f"d{name} has non-finite entries"
        assert max_err(g_fast[name], g_ref[name]) <= 1e-4 * scale_of(g_ref[name]), f"d{name}"


@pytest.mark.parametrize("gate", [False, True], ids=["deltanet", "gated"])
def test_inplace_path_matches_autograd_path(gate):
    """Without autograd the chunked form writes in place; it must agree with the autograd path and leave the
    caller's tensors (initial_state above all) untouched."""
    ts = make(N=77, gate=gate, state=True)
    before = {n: t.clone() for n, t in ts.items() if t is not None}
    with torch.no_grad():
        o_fast, s_fast = run(delta_rule_chunked, ts, output_final_state=True, chunk_size=16)
    for name, t in before.items():
        assert torch.equal(ts[name], t), f"{name} was modified in place"
    tg = {n: (None if t is None else t.clone().requires_grad_(True)) for n, t in ts.items()}
    o, s = run(delta_rule_chunked, tg, output_final_state=True, chunk_size=16)
    assert o.grad_fn is not None and o_fast.grad_fn is None
    assert_matches_fp64(o_fast, o.detach())
    assert_matches_fp64(s_fast, s.detach(), "final state")


@pytest.mark.parametrize("gate", [False, True], ids=["deltanet", "gated"])
def test_no_final_state_and_scale(gate):
    ts = make(N=20, gate=gate)
    o, s = run(delta_rule_chunked, ts, chunk_size=16, scale=0.3)
    assert s is None
    o_ref, _ = run(delta_rule_recurrent, ts, scale=0.3)
    assert_matches_fp64(o, o_ref)
    # scale only multiplies q
    o1, _ = delta_rule_recurrent(ts["q"] * 0.3, ts["k"], ts["v"], ts["beta"], ts["g"], scale=1.0)
    assert_matches_fp64(o1, o_ref)


def test_state_carries_across_calls():
    """Running two halves with the first half's final state as the second's initial state == one run."""
    ts = make(N=50, gate=True)
    o_all, s_all = run(delta_rule_chunked, ts, output_final_state=True, chunk_size=16)
    cut = lambda t, sl: t[:, :, sl]  # noqa: E731
    a = dict(ts, **{n: cut(ts[n], slice(0, 23)) for n in ("q", "k", "v", "beta", "g")})
    b = dict(ts, **{n: cut(ts[n], slice(23, 50)) for n in ("q", "k", "v", "beta", "g")})
    o_a, s_a = run(delta_rule_chunked, a, output_final_state=True, chunk_size=16)
    b["initial_state"] = s_a
    o_b, s_b = run(delta_rule_chunked, b, output_final_state=True, chunk_size=16)
    assert_matches_fp64(torch.cat([o_a, o_b], dim=2), o_all)
    assert_matches_fp64(s_b, s_all)


@pytest.mark.parametrize("gate", [False, True], ids=["deltanet", "gated"])
def test_nala_like_features(gate):
    """NaLa inside DeltaNet / GDN: a 2d-sized feature map on q and k, then L2 norm; Dk = 2d != Dv = d."""
    d = 6
    raw = make(N=70, Dk=d, Dv=d, gate=gate, grad=True)

    def phi(x):  # norm-aware power of the positive and negative parts, size 2d
        p = 1.0 + torch.tanh(x.norm(dim=-1, keepdim=True))                    # [B, H, N, 1]
        return F.normalize(torch.cat([F.relu(x), F.relu(-x)], dim=-1).pow(p) + 1e-6, dim=-1)  # [B, H, N, 2d]

    def feats():
        return dict(raw, q=phi(raw["q"]), k=phi(raw["k"]))

    o_ref, s_ref = run(delta_rule_recurrent, feats(), output_final_state=True)
    o, s = run(delta_rule_chunked, feats(), output_final_state=True, chunk_size=16)
    assert s.shape == (2, 2, 2 * d, d)
    assert_matches_fp64(o, o_ref)
    assert_matches_fp64(s, s_ref, "final state")
    g_ref, g_fast = grads(o_ref, s_ref, raw), grads(o, s, raw)
    for name in g_ref:  # gradients reach the raw q, k through the feature map
        assert_matches_fp64(g_fast[name], g_ref[name], f"d{name}")


# ------------------------------------------------------------------------------------------------------------
# against flash-linear-attention's naive references (fp32)
# ------------------------------------------------------------------------------------------------------------

FLA_TOL = 1e-5


def fla_naive(sub: str):
    """FLA's ``fla/ops/<sub>/naive.py``, loaded from its file: it needs only torch and einops, while importing
    the ``fla`` package pulls in triton, its layers and transformers (tens of seconds on these CPUs)."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("flash-linear-attention is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / sub / "naive.py"
    return load_file(f"_attnbench_test_fla_{sub}_naive", path)


def _close(a, b, what):
    err = max_err(a, b)
    assert err <= FLA_TOL * scale_of(b), f"{what}: max error {err:.3e} against FLA's naive reference"


def test_matches_fla_naive_delta_rule():
    naive = fla_naive("delta_rule")
    ts = make(N=96, Dk=16, Dv=12, state=True, dtype=torch.float32)
    o, s = run(delta_rule_chunked, ts, output_final_state=True, chunk_size=32)
    # FLA's delta_rule/naive.py is head-first [B, H, T, D] (unlike its kernels), scale fixed at Dk ** -0.5
    o_fla, s_fla = naive.delta_rule_recurrence(ts["q"], ts["k"], ts["v"], ts["beta"],
                                               initial_state=ts["initial_state"], output_final_state=True)
    _close(o, o_fla, "o vs delta_rule_recurrence")
    _close(s, s_fla, "state vs delta_rule_recurrence")
    # the chunkwise reference takes no initial state and needs N % chunk == 0
    ts["initial_state"] = None
    o, s = run(delta_rule_chunked, ts, output_final_state=True, chunk_size=32)
    o_fla, s_fla = naive.delta_rule_chunkwise(ts["q"], ts["k"], ts["v"], ts["beta"], chunk_size=32)
    _close(o, o_fla, "o vs delta_rule_chunkwise")
    _close(s, s_fla, "state vs delta_rule_chunkwise")


@pytest.mark.parametrize("N", [45, 128])
def test_matches_fla_naive_gated_delta_rule(N):
    naive = fla_naive("gated_delta_rule")
    ts = make(N=N, Dk=16, Dv=12, gate=True, state=True, dtype=torch.float32)
    o, s = run(delta_rule_chunked, ts, output_final_state=True, scale=0.2)
    # FLA's gated naive references are [B, T, H, D]: convert once each way
    bt = {n: t.transpose(1, 2) for n, t in ts.items() if n in ("q", "k", "v", "beta", "g")}
    o_fla, s_fla = naive.naive_recurrent_gated_delta_rule(
        bt["q"], bt["k"], bt["v"], bt["beta"], bt["g"], scale=0.2,
        initial_state=ts["initial_state"], output_final_state=True)
    _close(o, o_fla.transpose(1, 2), "o vs naive_recurrent_gated_delta_rule")
    _close(s, s_fla, "state vs naive_recurrent_gated_delta_rule")
    o_fla, s_fla = naive.naive_chunk_gated_delta_rule(
        bt["q"], bt["k"], bt["v"], bt["g"], bt["beta"], chunk_size=64, scale=0.2,
        initial_state=ts["initial_state"], output_final_state=True)
    _close(o, o_fla.transpose(1, 2), "o vs naive_chunk_gated_delta_rule")
    _close(s, s_fla, "state vs naive_chunk_gated_delta_rule")


# ------------------------------------------------------------------------------------------------------------
# dispatch, dtypes, the FLA path's plumbing
# ------------------------------------------------------------------------------------------------------------

def test_resolve_delta_impl():
    assert resolve_delta_impl("cpu", "auto") == "torch"
    assert resolve_delta_impl(torch.device("cuda"), "auto") == "fla"
    assert resolve_delta_impl("cpu", "recurrent") == "recurrent"
    assert resolve_delta_impl("cpu", "torch") == "torch"
    assert resolve_delta_impl("cuda:0", "fla") == "fla"
    with pytest.raises(UnsupportedError, match="impl='fla' needs a CUDA device.*impl='torch'"):
        resolve_delta_impl("cpu", "fla")
    with pytest.raises(UnknownNameError, match="unknown impl 'trch'; did you mean 'torch'"):
        resolve_delta_impl("cpu", "trch")


def test_fla_impl_on_cpu_is_a_clear_error():
    ts = make(N=8, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedError, match="needs a CUDA device"):
        run(delta_rule, ts, impl="fla")


@pytest.mark.parametrize("gate", [False, True], ids=["deltanet", "gated"])
def test_delta_rule_dispatch(gate):
    ts = make(N=33, gate=gate, state=True)
    o_ref, s_ref = run(delta_rule_recurrent, ts, output_final_state=True)
    for impl in ("auto", "torch", "recurrent"):
        o, s = run(delta_rule, ts, impl=impl, output_final_state=True, chunk_size=16)
        assert_matches_fp64(o, o_ref, f"o ({impl})")
        assert_matches_fp64(s, s_ref, f"state ({impl})")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_within_policy(dtype):
    ts64 = make(N=100, gate=True, state=True)
    o64, _ = run(delta_rule_recurrent, ts64)
    ts = {n: (None if t is None else t.to(dtype)) for n, t in ts64.items()}
    o_ref, s_ref = run(delta_rule_recurrent, ts, output_final_state=True)
    o, s = run(delta_rule, ts, output_final_state=True)
    assert o.dtype == dtype and s.dtype == torch.float32  # o in v's dtype; state accumulated in fp32
    assert_within_policy(o, o_ref, o64)


def test_fla_path_rejects_fp32_with_advice():
    ts = make(N=8, dtype=torch.float32)
    with pytest.raises(UnsupportedError, match="bfloat16 or float16 only.*torch.bfloat16.*impl='torch'"):
        _delta_rule_fla(ts["q"], ts["k"], ts["v"], ts["beta"], None, scale=1.0, initial_state=None,
                        output_final_state=False, chunk_size=64)
    ts = make(N=8, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedError, match="chunk_size in"):
        _delta_rule_fla(ts["q"], ts["k"], ts["v"], ts["beta"], None, scale=1.0, initial_state=None,
                        output_final_state=False, chunk_size=48)


@pytest.mark.parametrize("gate", [False, True], ids=["deltanet", "gated"])
def test_fla_path_plumbing(gate, monkeypatch):
    """The CUDA path's layout conversion and argument order, with FLA's kernels stood in for by its naive code."""
    naive = fla_naive("gated_delta_rule")
    seen = {}

    def fake_gated(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, chunk_size=64):
        seen.update(q=q.shape, g=g.shape, beta=beta.shape, chunk_size=chunk_size, h0=initial_state.dtype)
        return naive.naive_recurrent_gated_delta_rule(q, k, v, beta, g, scale=scale, initial_state=initial_state,
                                                      output_final_state=output_final_state)

    def fake(q, k, v, beta, **kw):
        return fake_gated(q, k, v, torch.zeros_like(beta, dtype=torch.float32), beta, **kw)

    # stand-ins for the two fla.ops modules the CUDA path imports from (without importing fla itself)
    monkeypatch.setitem(sys.modules, "fla.ops.delta_rule", types.SimpleNamespace(chunk_delta_rule=fake))
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule",
                        types.SimpleNamespace(chunk_gated_delta_rule=fake_gated))
    ts = make(B=2, H=3, N=20, gate=gate, state=True, dtype=torch.float16)
    o, s = _delta_rule_fla(ts["q"], ts["k"], ts["v"], ts["beta"], ts["g"], scale=0.4,
                           initial_state=ts["initial_state"], output_final_state=True, chunk_size=32)
    assert seen == dict(q=(2, 20, 3, 8), g=(2, 20, 3), beta=(2, 20, 3), chunk_size=32, h0=torch.float32)
    o_ref, s_ref = run(delta_rule_recurrent, ts, output_final_state=True, scale=0.4)
    assert o.shape == o_ref.shape and o.dtype == torch.float16
    assert max_err(o, o_ref) < 1e-2 * scale_of(o_ref) and max_err(s, s_ref) < 1e-2 * scale_of(s_ref)


# ------------------------------------------------------------------------------------------------------------
# errors name the bad argument
# ------------------------------------------------------------------------------------------------------------

def _bad(**over):
    ts = make(N=10, gate=True, dtype=torch.float32)
    ts.update(over)
    return ts


@pytest.mark.parametrize("over, match", [
    (dict(beta=torch.rand(2, 2, 10, 1)), r"'beta' must be \[B=2, H=2, N=10\].*shape \(2, 2, 10, 1\)"),
    (dict(beta=torch.rand(2, 10, 2)), r"'beta' must be \[B=2, H=2, N=10\]"),
    (dict(beta=torch.ones(2, 2, 10, dtype=torch.int64)), r"'beta' must be a floating tensor.*int64"),
    (dict(g=torch.rand(2, 2, 9)), r"'g' must be \[B=2, H=2, N=10\] \(one log-space decay per token\)"),
    (dict(k=torch.rand(2, 2, 10, 7)), r"'k' must match q's shape \(2, 2, 10, 8\)"),
    (dict(v=torch.rand(2, 2, 11, 5)), r"'v' must be \[B=2, H=2, N=10, Dv\]"),
    (dict(q=torch.rand(2, 10, 8)), r"'q' must have rank 4 \[B, H, N, D\], got rank 3"),
    (dict(q=torch.ones(2, 2, 10, 8, dtype=torch.int32)), r"'q' must be a floating tensor"),
    (dict(v=torch.rand(2, 2, 10, 5, dtype=torch.float64)), r"q, k and v must share one dtype"),
    (dict(initial_state=torch.rand(2, 2, 5, 8)), r"'initial_state' must be \[B, H, Dk, Dv\] = \(2, 2, 8, 5\)"),
    (dict(beta=None), r"'beta' must be a torch.Tensor"),
])
@pytest.mark.parametrize("fn", [delta_rule, delta_rule_recurrent, delta_rule_chunked],
                         ids=["delta_rule", "recurrent", "chunked"])
def test_errors_name_the_argument(over, match, fn):
    with pytest.raises(ShapeError, match=match):
        run(fn, _bad(**over))


def test_errors_scalars():
    ts = _bad()
    with pytest.raises(ShapeError, match="'chunk_size' must be a positive integer"):
        run(delta_rule, ts, chunk_size=0)
    with pytest.raises(ShapeError, match="'scale' must be a real number"):
        run(delta_rule, ts, scale="0.5")
    with pytest.raises(ShapeError, match="'block_bytes' must be a positive integer, got 0"):
        run(delta_rule_chunked, ts, block_bytes=0)
    with pytest.raises(UnknownNameError, match="unknown impl 'recurent'; did you mean 'recurrent'"):
        run(delta_rule, ts, impl="recurent")
