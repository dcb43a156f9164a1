"""The LRA baselines: performer, nystromformer, linformer, cosformer, skyformer, hedgehog.

Per mechanism: the efficient form against the reference in float64 at odd lengths (forward and backward, also
with non-default options), causal forms that do not look ahead and agree on prefixes, the error cases, the
Nyström pseudo-inverse against ``torch.linalg.pinv``, and FAVOR+'s kernel estimate against the softmax kernel.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnbench
from attnbench import AttnbenchError, ShapeError, UnsupportedError
from attnbench.api import registry
from attnbench.attention.performer import PerformerAttention
from attnbench.attention.skyformer import gaussian_kernel
from attnbench.ops.nystrom import (iterative_pinv, pinv_reference, segment_bounds, segment_means,
                                   segment_means_reference)

from .helpers import assert_matches_fp64

H, D, DV = 2, 8, 5
BASELINES = ("performer", "nystromformer", "linformer", "cosformer", "skyformer", "hedgehog")

# (name, causal, options): defaults, plus the options that change the code path.
CASES = [
    ("performer", False, {}), ("performer", True, {}), ("performer", True, {"features": 16, "seed": 3}),
    ("nystromformer", False, {}), ("nystromformer", False, {"landmarks": 4}),
    ("nystromformer", False, {"landmarks": 3, "pinv_iters": 2, "conv_kernel": 3}),
    ("linformer", False, {}), ("linformer", False, {"proj_dim": 4, "share_kv": True}),
    ("cosformer", False, {}), ("cosformer", True, {}),  # M = the built length (shape_options)
    ("cosformer", False, {"max_len": None}), ("cosformer", True, {"max_len": None}),  # M = N / 4096
    ("cosformer", False, {"max_len": 200}),
    ("skyformer", False, {}), ("skyformer", False, {"landmarks": 6}),
    ("skyformer", False, {"landmarks": 5, "sampling": "uniform"}),
    ("hedgehog", False, {}), ("hedgehog", True, {}), ("hedgehog", True, {"tie_qk": True}),
]


def case_id(case):
    name, causal, opts = case
    return f"{name}-{'causal' if causal else 'bidir'}" + "".join(f"-{k}={v}" for k, v in opts.items())


def make(name, causal, n, dtype=torch.float64, **opts):
    torch.manual_seed(0)
    attn = registry.build_for_length(name, seq_len=n, heads=H, head_dim=D, causal=causal, impl="torch", **opts)
    attn = attn.to(dtype)
    if hasattr(attn, "block_size"):  # several feature blocks even at small N (FeatureMapAttention)
        attn.block_size = 32
    with torch.no_grad():  # move trainable maps off their symmetric init so every path is exercised
        for p in attn.parameters():
            p.add_(0.1 * torch.randn(p.shape, dtype=p.dtype))
    return attn


def qkv(b, n, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, H, n, D, generator=g, dtype=dtype), torch.randn(b, H, n, D, generator=g, dtype=dtype),
            torch.randn(b, H, n, DV, generator=g, dtype=dtype))


def run_with_grads(fn, attn, q, k, v, weight):
    """Output and gradients (q, k, v, every parameter) of ``sum(fn(q, k, v) * weight)``; reseeds first so forms
    that draw random landmarks (skyformer sampling='uniform') draw the same ones."""
    torch.manual_seed(123)
    inputs = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    params = list(attn.parameters())
    out = fn(*inputs)
    grads = torch.autograd.grad((out * weight).sum(), inputs + params)
    return out.detach(), grads


@pytest.mark.parametrize("case", CASES, ids=case_id)
@pytest.mark.parametrize("n", [1, 7, 129])
def test_torch_matches_reference_fp64(case, n):
    name, causal, opts = case
    attn = make(name, causal, n, **opts)
    q, k, v = qkv(2, n)
    weight = torch.randn(2, H, n, DV, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    out, grads = run_with_grads(attn, attn, q, k, v, weight)
    ref, ref_grads = run_with_grads(attn.reference, attn, q, k, v, weight)
    assert torch.isfinite(out).all()
    assert_matches_fp64(out, ref, f"{case_id(case)} forward N={n}")
    labels = ["q", "k", "v"] + [p for p, _ in attn.named_parameters()]
    for label, g, r in zip(labels, grads, ref_grads):
        assert_matches_fp64(g, r, f"{case_id(case)} d/d{label} N={n}")


def test_every_baseline_is_registered_with_its_forms():
    assert set(BASELINES) <= set(attnbench.names())
    assert {"performer", "hedgehog"} <= set(attnbench.feature_map_names())
    for name in ("nystromformer", "linformer", "skyformer"):
        assert attnbench.describe(name)["causal"] is False
    for name in ("performer", "cosformer", "hedgehog"):
        assert attnbench.describe(name)["causal"] is True


# --- causality -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", [c for c in CASES if c[1]], ids=case_id)
def test_causal_forms_ignore_the_future_and_agree_on_prefixes(case):
    """Huge future keys would move a global stabiliser (performer) or a length-based period (cosformer):
    past outputs must not change, and a prefix run alone must give the same outputs."""
    name, causal, opts = case
    n, cut = 80, 37
    attn = make(name, causal, n, **opts)
    q, k, v = qkv(2, n)
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    for t in (q2, k2, v2):
        t[:, :, cut:] *= 40.0
    for form in (attn, attn.reference):
        full = form(q, k, v)
        assert_matches_fp64(form(q2, k2, v2)[:, :, :cut], full[:, :, :cut], f"{case_id(case)}: future leaked")
        assert_matches_fp64(form(q[:, :, :cut], k[:, :, :cut], v[:, :, :cut]), full[:, :, :cut],
                            f"{case_id(case)}: prefix run differs")


def test_performer_bidirectional_is_batch_and_scale_stable():
    attn = make("performer", False, 50)
    q, k, v = qkv(3, 50)
    k = k * 30.0  # logits in the hundreds: exp without a stabiliser would overflow even in float64 sums of fp32
    out = attn(q.float(), k.float(), v.float())
    assert torch.isfinite(out).all()
    alone = attn(q[1:2], k[1:2], v[1:2])
    assert_matches_fp64(attn(q, k, v)[1:2], alone, "performer batch element 1")


# --- errors ------------------------------------------------------------------------------------------------------

def test_linformer_rejects_another_length_and_needs_seq_len():
    attn = attnbench.build("linformer", heads=H, head_dim=D, seq_len=7)
    q, k, v = qkv(1, 5, torch.float32)
    with pytest.raises(ShapeError, match=r"N=5.*seq_len=7"):
        attn(q, k, v)
    with pytest.raises(ShapeError, match=r"N=5.*seq_len=7"):
        attn.reference(q, k, v)
    with pytest.raises(AttnbenchError, match=r"option 'seq_len' is required"):
        attnbench.build("linformer", heads=H, head_dim=D)
    assert attnbench.get_attention("linformer").shape_options(33) == {"seq_len": 33}


def test_linformer_projection_sizes():
    short = attnbench.build("linformer", heads=H, head_dim=D, seq_len=20)
    assert short.proj_dim == 20 and tuple(short.E.shape) == (20, 20)
    shared = attnbench.build("linformer", heads=H, head_dim=D, seq_len=300, proj_dim=16, share_kv=True)
    assert [name for name, _ in shared.named_parameters()] == ["E"] and tuple(shared.E.shape) == (16, 300)


@pytest.mark.parametrize("name", ["nystromformer", "skyformer", "linformer"])
def test_bidirectional_only_baselines_refuse_causal(name):
    with pytest.raises(UnsupportedError, match=rf"{name}: argument 'causal=True' is not supported"):
        attnbench.build(name, heads=H, head_dim=D, causal=True, **({"seq_len": 8} if name == "linformer" else {}))


def test_cosformer_longer_than_max_len():
    attn = attnbench.build("cosformer", heads=H, head_dim=D, causal=True, max_len=16)
    with pytest.raises(ShapeError, match=r"N=17.*max_len=16"):
        attn(*qkv(1, 17, torch.float32))
    assert attnbench.build("cosformer", heads=H, head_dim=D, causal=True).max_len == 4096
    assert attnbench.build("cosformer", heads=H, head_dim=D).max_len is None


@pytest.mark.parametrize("name,opts,match", [
    ("nystromformer", {"landmarks": 0}, "landmarks"), ("nystromformer", {"conv_kernel": 4}, "conv_kernel"),
    ("nystromformer", {"pinv_iters": -1}, "pinv_iters"), ("skyformer", {"sampling": "random"}, "sampling"),
    ("skyformer", {"landmarks": 1}, "landmarks"), ("performer", {"features": 0}, "features"),
    ("cosformer", {"max_len": 0}, "max_len"), ("linformer", {"seq_len": 8, "proj_dim": 0}, "proj_dim"),
])
def test_bad_options_are_named(name, opts, match):
    with pytest.raises(AttnbenchError, match=rf"{name}: option '{match}'"):
        attnbench.build(name, heads=H, head_dim=D, **opts)


# --- Nyström helpers ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,m", [(12, 4), (129, 64), (7, 4), (10, 3), (5, 5)])
def test_segment_means_fast_equals_loop(n, m):
    x = torch.randn(2, 3, n, 4, dtype=torch.float64)
    assert_matches_fp64(segment_means(x, m), segment_means_reference(x, m), f"segment means n={n} m={m}")
    bounds = segment_bounds(n, m)
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(s < e and e - s <= -(-n // m) + 1 for s, e in bounds)
    if n % m == 0:  # the paper's equal, disjoint segments
        assert_matches_fp64(segment_means(x, m), x.reshape(2, 3, m, n // m, 4).mean(-2), "divisible case")


def _errors_to_pinv(a, init, iters=10):
    exact = pinv_reference(a)
    return [((iterative_pinv(a, j, init=init) - exact).norm() / exact.norm()).item() for j in range(iters + 1)]


def test_nystromformer_pinv_converges_to_torch_pinv():
    """A~ = softmax(landmark scores): row-stochastic, here well conditioned."""
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(3.0 * torch.eye(16, dtype=torch.float64)
                      + 0.5 * torch.randn(2, 2, 16, 16, generator=g, dtype=torch.float64), dim=-1)
    assert torch.linalg.cond(a).max() < 50
    errs = _errors_to_pinv(a, "norm1inf")
    assert all(b <= a_ * (1 + 1e-9) + 1e-14 for a_, b in zip(errs, errs[1:])), errs
    assert errs[0] > 0.1 and errs[6] < 1e-3 and errs[-1] < 1e-12, errs


def test_skyformer_pinv_converges_to_torch_pinv():
    """The Gaussian kernel matrix of spread landmarks, + gamma I, symmetrically normalised (Sec. 4.4)."""
    g = torch.Generator().manual_seed(1)
    lm = 0.8 * torch.randn(2, 2, 16, D, generator=g, dtype=torch.float64)
    mg = gaussian_kernel(lm, lm) + 0.1 * torch.eye(16, dtype=torch.float64)
    d = mg.sum(-1).rsqrt()
    a = d[..., :, None] * mg * d[..., None, :]
    assert torch.linalg.cond(a).max() < 100
    errs = _errors_to_pinv(a, "norm1")
    assert all(b <= a_ * (1 + 1e-9) + 1e-14 for a_, b in zip(errs, errs[1:])), errs
    assert errs[0] > 0.1 and errs[-1] < 1e-12, errs
    # and the mechanism's core is then the regularised inverse (M + gamma I)^-1
    attn = attnbench.build("skyformer", heads=2, head_dim=D, pinv_iters=12)
    assert_matches_fp64(attn._core(lm), torch.linalg.inv(mg), "skyformer core vs (M + gamma I)^-1")


def test_nystromformer_is_exact_softmax_up_to_landmarks_and_close_beyond():
    q, k, v = qkv(1, 48)
    exact = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D), -1) @ v
    assert_matches_fp64(attnbench.build("nystromformer", heads=H, head_dim=D, landmarks=48)(q, k, v), exact,
                        "N <= landmarks")
    err = [(attnbench.build("nystromformer", heads=H, head_dim=D, landmarks=m, pinv_iters=20)(q, k, v)
            - exact).abs().mean().item() for m in (4, 24)]
    assert err[1] < err[0], err


def test_skyformer_short_sequences_are_exact_kernelized_attention():
    q, k, v = qkv(1, 7)
    s = D ** -0.25
    diff = (q[..., :, None, :] - k[..., None, :, :]) * s                      # [B, H, N, N, D]
    exact = torch.exp(-0.5 * (diff * diff).sum(-1)) @ v
    attn = attnbench.build("skyformer", heads=H, head_dim=D, landmarks=14)
    assert_matches_fp64(attn(q, k, v), exact, "N <= landmarks // 2")
    assert_matches_fp64(attn.reference(q, k, v), exact, "N <= landmarks // 2 (reference)")


# --- Performer -----------------------------------------------------------------------------------------------------

def test_performer_kernel_estimate_approaches_softmax_kernel():
    """E[phi(q).phi(k)] = exp(q.k / sqrt(d)); the mean relative error shrinks like 1/sqrt(m)."""
    d = 16
    g = torch.Generator().manual_seed(0)
    q = 0.5 * torch.randn(1, 1, 200, d, generator=g, dtype=torch.float64)
    k = 0.5 * torch.randn(1, 1, 200, d, generator=g, dtype=torch.float64)
    exact = torch.exp((q * k).sum(-1) / math.sqrt(d))
    errs = {}
    for m in (16, 4096):
        fmap = attnbench.build_feature_map("performer", heads=1, head_dim=d, features=m, seed=0).double()
        est = (fmap.phi(q) * fmap.phi(k)).sum(-1)
        errs[m] = ((est - exact).abs() / exact).mean().item()
    assert errs[4096] < 0.08 and errs[4096] < errs[16] / 4, errs


def test_performer_features_are_a_fixed_seeded_buffer():
    a = attnbench.build("performer", heads=H, head_dim=D, features=20, seed=7)
    b = attnbench.build("performer", heads=H, head_dim=D, features=20, seed=7)
    c = attnbench.build("performer", heads=H, head_dim=D, features=20, seed=8)
    assert list(a.parameters()) == []
    w = a.feature_map.projection
    assert tuple(w.shape) == (20, D) and "feature_map.projection" in a.state_dict()
    assert torch.equal(w, b.feature_map.projection) and not torch.equal(w, c.feature_map.projection)
    before = w.clone()
    q, k, v = qkv(1, 9, torch.float32)
    a(q, k, v)
    a(q, k, v)
    assert torch.equal(before, a.feature_map.projection)  # not redrawn
    block = w[:D].double()
    gram = block @ block.T
    off = gram - torch.diag(torch.diagonal(gram))
    assert off.abs().max() < 1e-6 * torch.diagonal(gram).max()  # orthogonal rows (stored in float32)
    assert isinstance(a, PerformerAttention)


# --- Hedgehog ------------------------------------------------------------------------------------------------------

def test_hedgehog_feature_map_is_a_positive_distribution_of_size_2d():
    fmap = attnbench.build_feature_map("hedgehog", heads=H, head_dim=D).double()
    q, k, _ = qkv(2, 11)
    for f in (fmap.phi_q(q), fmap.phi_k(k)):
        assert f.shape == (2, H, 11, 2 * D) and (f > 0).all()
        assert_matches_fp64(f.sum(-1), torch.ones(2, H, 11, dtype=torch.float64), "features sum to 1")
    # identity init: phi(x) = softmax([x, -x])
    assert_matches_fp64(fmap.phi_q(q), torch.softmax(torch.cat([q, -q], -1), -1), "identity initialisation")
    assert {n for n, _ in fmap.named_parameters()} == {"weight_q", "bias_q", "weight_k", "bias_k"}
    tied = attnbench.build_feature_map("hedgehog", heads=H, head_dim=D, tie_qk=True)
    assert {n for n, _ in tied.named_parameters()} == {"weight_q", "bias_q"}
