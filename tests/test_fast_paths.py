"""The CPU fast paths of issue 16 beside their references: a normaliser with no scale of its own, log-scaled key blocks,
Performer's blocked form (accuracy against exact softmax, memory), the ELU+1 backward, SteLLA's scaled state, the
recomputing backward of the bidirectional op (gradients by autograd per block and by hand).

Every fast form is also covered by the registry-wide contract tests (fp64 at odd lengths, fp32 under the policy);
these are the properties those do not see.
"""

from __future__ import annotations

import math

import pytest
import torch

import attnbench
from attnbench.checks import contract as testing
from attnbench.api import registry
from attnbench.measure.memory import TensorMemory
from attnbench.ops import (linear_attention_bidirectional, linear_attention_blocked, linear_attention_chunked,
                           linear_attention_recomputed, linear_attention_recurrent, linear_attention_reference)
from attnbench.ops.linear_attn import TokenMap

from .helpers import assert_matches_fp64

def gaussian(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def features(n, m=6, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(1, 2, n, m, generator=g, dtype=torch.float64),
            torch.rand(1, 2, n, m, generator=g, dtype=torch.float64),
            torch.randn(1, 2, n, d, generator=g, dtype=torch.float64))


def all_forms(fq, fk, v, causal):
    """Every form of the shared op on the same features (several blocks and chunks at n = 50)."""
    out = {"reference": linear_attention_reference(fq, fk, v, causal=causal),
           "blocked": linear_attention_blocked(lambda s, e: fq[:, :, s:e], lambda s, e: fk[:, :, s:e], v,
                                               causal=causal, chunk_size=8, block_size=16)}
    if causal:
        out["chunked"] = linear_attention_chunked(fq, fk, v, chunk_size=8)
        out["recurrent"] = linear_attention_recurrent(fq, fk, v)
    else:
        out["bidirectional"] = linear_attention_bidirectional(fq, fk, v)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_output_does_not_depend_on_the_features_scale_in_every_form(causal):
    """Features scaled by 1e-6 (scores 1e-12: Performer-like tiny scores) give the same output as unscaled ones in
    every form (the normaliser has no eps); a fixed eps = 1e-6 against the mean score would move it by ~100%."""
    fq, fk, v = features(50)
    base = all_forms(fq, fk, v, causal)
    tiny = all_forms(fq * 1e-6, fk * 1e-6, v, causal)
    for form, out in base.items():
        assert_matches_fp64(tiny[form], out, f"{form} with features * 1e-6")
        assert_matches_fp64(out, base["reference"], form)
    if not causal:  # for contrast, the old fixed eps against the mean score on the scaled features: far off
        sq, sk = fq * 1e-6, fk * 1e-6
        fixed = (sq @ (sk.transpose(-1, -2) @ v) / 50) / (sq @ sk.mean(-2, keepdim=True).transpose(-1, -2) + 1e-6)
        assert (fixed - base["reference"]).abs().max() > 0.1


def test_all_zero_query_gives_zero_output_and_finite_gradients():
    """A ReLU map can zero a query's features: its denominator is exactly 0 and replaced by 1, so the output is
    0 / 1 = 0 and the gradients stay finite."""
    fq, fk, v = features(20)
    fq = fq.clone()
    fq[:, :, 3] = 0.0
    for causal in (False, True):
        xs = [t.clone().requires_grad_() for t in (fq, fk, v)]
        out = linear_attention_blocked(lambda s, e: xs[0][:, :, s:e], lambda s, e: xs[1][:, :, s:e], xs[2],
                                       causal=causal, chunk_size=8, block_size=8)
        assert (out[:, :, 3] == 0).all()
        out.sum().backward()
        assert all(torch.isfinite(t.grad).all() for t in xs)


@pytest.mark.parametrize("n", [7, 50])
def test_log_scaled_key_blocks(n):
    """map_k returning (fk, shift) with shifts hundreds apart (exp(shift) overflows any float): the output equals
    the reference on the rescaled features (computed where they fit), forward and backward."""
    fq, fk, v = features(n, seed=3)
    shifts = torch.tensor([0.0, 300.0, -200.0, 5.0], dtype=torch.float64)    # per block of 2 ... 16 tokens
    block = -(-n // 4)
    per_token = shifts.repeat_interleave(block)[:n].view(1, 1, n, 1)
    true_fk = fk * torch.exp(per_token - 300.0)                              # the common factor e^-300 cancels
    ref = linear_attention_reference(fq, true_fk, v)
    xs = [t.clone().requires_grad_() for t in (fq, fk, v)]

    def map_k(s, e):
        return xs[1][:, :, s:e], shifts[s // block].expand(1, 2, 1, 1)
    out = linear_attention_blocked(lambda s, e: xs[0][:, :, s:e], map_k, xs[2], block_size=block)
    assert_matches_fp64(out, ref, "log-scaled blocks")
    w = gaussian(*out.shape, seed=9)
    grads = torch.autograd.grad((out * w).sum(), xs)
    ys = [fq.clone().requires_grad_(), fk.clone().requires_grad_(), v.clone().requires_grad_()]
    ref_grads = torch.autograd.grad((linear_attention_reference(ys[0], ys[1] * torch.exp(per_token - 300.0), ys[2])
                                     * w).sum(), ys)
    for g, r, label in zip(grads, ref_grads, "qkv"):
        assert_matches_fp64(g, r, f"grad {label}")
    with pytest.raises(ValueError, match="bidirectional only"):
        linear_attention_blocked(lambda s, e: fq[:, :, s:e], lambda s, e: (fk[:, :, s:e], shifts[0]), v, causal=True)


# --- Performer -------------------------------------------------------------------------------------------------

def test_performer_error_against_softmax_falls_with_the_feature_count():
    """FAVOR+ estimates softmax attention: its error against the exact output falls as m grows (mean over three
    seeds of the random features), and with many features it is far below an all-zero output's."""
    d, n = 16, 128
    q, k, v = (gaussian(1, 2, n, d, seed=s) for s in range(3))
    q, k = 0.5 * q, 0.5 * k
    exact = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), -1) @ v
    errs = []
    for m in (8, 64, 512, 4096):
        e = [(attnbench.build("performer", heads=2, head_dim=d, features=m, seed=s).double()(q, k, v) - exact)
             .abs().mean().item() for s in range(3)]
        errs.append(sum(e) / 3)
    assert all(b < a for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 0.15 * exact.abs().mean().item(), errs


def test_performer_blocked_is_exact_and_scale_stable():
    """The blocked form with blocks of very different key maxima equals the reference; huge keys stay finite."""
    attn = attnbench.build("performer", heads=2, head_dim=8, features=16).double()
    attn.block_size = 16
    q, k, v = (gaussian(2, 2, 70, 8, seed=s) for s in range(3))
    k = k * torch.linspace(0.1, 6.0, 70, dtype=torch.float64).view(1, 1, 70, 1)   # key logits differ by ~100
    assert_matches_fp64(attn(q, k, v), attn.reference(q, k, v), "performer blocked")
    out32 = attn.float()(q.float() * 5, k.float() * 5, v.float())
    assert torch.isfinite(out32).all()


def test_performer_memory_is_linear_in_n():
    """Bidirectional forward: tensors created beyond the output stay O(block), not O(N m)."""
    attn = attnbench.build("performer", heads=2, head_dim=16, features=64)
    attn.block_size = 128
    extra = {}
    for n in (512, 2048):
        q, k, v = (gaussian(1, 2, n, 16, seed=s, dtype=torch.float32) for s in range(3))
        with torch.no_grad(), TensorMemory() as mem:
            out = attn(q, k, v)
        extra[n] = mem.peak - out.numel() * out.element_size()
    full = 2 * 2048 * 64 * 4                                                   # one [B, H, N, m] fp32 tensor
    assert extra[2048] <= 1.1 * extra[512] + 4096 and extra[2048] < full / 4, extra


# --- ELU + 1, SteLLA ----------------------------------------------------------------------------------------------

def test_elu_plus_one_gradient_is_min_phi_one():
    fmap = attnbench.build_feature_map("elu", heads=1, head_dim=5).double()
    x = torch.tensor([[-30.0, -1.0, -1e-9, 0.0, 1e-9, 2.0, 50.0]], dtype=torch.float64).requires_grad_()
    y = fmap.phi(x)
    (g,) = torch.autograd.grad(y, x, torch.ones_like(y))
    x2 = x.detach().clone().requires_grad_()
    (g_ref,) = torch.autograd.grad(torch.nn.functional.elu(x2) + 1, x2, torch.ones_like(y))
    assert_matches_fp64(y, torch.nn.functional.elu(x.detach()) + 1, "phi")
    assert_matches_fp64(g, g_ref, "d phi / dx")


def test_stella_scaled_state_across_blocks():
    attn = attnbench.build("stella", heads=2, head_dim=8).double()
    attn.block_size = 16
    with torch.no_grad():
        attn.alpha.fill_(1.7)
        attn.beta.fill_(0.6)
    q, k, v = (gaussian(2, 2, 45, 8, seed=s) for s in range(3))
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attn(*xs)
    assert_matches_fp64(out, attn.reference(q, k, v), "stella blocked")
    grads = torch.autograd.grad(out.sum(), xs + [attn.alpha, attn.beta])
    ys = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = torch.autograd.grad(attn.reference(*ys).sum(), ys + [attn.alpha, attn.beta])
    for g, r in zip(grads, ref):
        assert_matches_fp64(g, r, "stella gradient")


# --- inference paths ------------------------------------------------------------------------------------------------

def _forms():
    for name in attnbench.names():
        cls = attnbench.get_attention(name)
        for causal, ok in ((False, cls.bidirectional), (True, cls.causal_form)):
            if ok:
                yield pytest.param(name, causal, id=f"{name}-{'causal' if causal else 'bidir'}")


@pytest.mark.parametrize("name,causal", list(_forms()))
def test_inference_path_matches_reference_fp64(name, causal):
    """Under no_grad the fast forms take other paths (features in place into reused block buffers, per-query
    factors dropped, permuted states): the same function as the reference, across several blocks (the contract's
    clause, :func:`attnbench.checks.contract.inference_matches_fp64`)."""
    problem = testing.inference_matches_fp64(name, causal)
    assert problem is None, problem


# --- the recomputing backward (ops.linear_attention_recomputed) ------------------------------------------------


def _positional_map(w):
    """A map with a parameter and positions: phi(x)_t = exp(w x_t) * (1 + t / 10), M = D."""
    def phi(x, start):
        pos = torch.arange(start, start + x.shape[-2], dtype=x.dtype).unsqueeze(-1)
        return torch.exp(x * w) * (1 + pos / 10)
    return TokenMap(phi)


@pytest.mark.parametrize("normalize", [True, False])
def test_recomputed_gradcheck_with_parameters_positions_and_a_scale(normalize):
    """Every gradient (q, k, v, the map's parameter, the scale) by finite differences, in fp64, at 13 tokens in
    blocks of 5; the output equals the plain quadratic form."""
    q, k, v = (gaussian(1, 2, 13, 3, seed=s) for s in (1, 2, 3))
    w = gaussian(3, seed=4).mul(0.3)
    scale = None if normalize else torch.tensor(0.7, dtype=torch.float64)
    leaves = [t.requires_grad_() for t in (q, k, v, w)] + ([] if normalize else [scale.requires_grad_()])

    def f(q, k, v, w, *scale):
        tmap = _positional_map(w)
        return linear_attention_recomputed(tmap, tmap, q, k, v, tensors=(w,), normalize=normalize, block_size=5,
                                           scale=scale[0] if scale else None)
    assert torch.autograd.gradcheck(f, leaves)
    with torch.no_grad():
        fq = _positional_map(w).phi(q, 0)
        fk = _positional_map(w).phi(k, 0)
        ref = linear_attention_reference(fq, fk, v, normalize=normalize) * (1 if normalize else scale)
        assert_matches_fp64(f(q, k, v, w, *([] if normalize else [scale])), ref, "recomputed vs reference")


def test_recomputed_permuted_query_streams_gradcheck():
    """G = 3 query streams (:class:`Permuted`: group g's features are the columns in order perms[g], each with its
    own normaliser over its third of v): every gradient by finite differences (fp64, 11 tokens in blocks of 4),
    the output equal to each stream attended on its own by the plain quadratic form."""
    q, k, v = gaussian(1, 2, 11, 4, seed=1), gaussian(1, 2, 11, 4, seed=2), gaussian(1, 2, 11, 6, seed=3)
    w = gaussian(4, seed=4).mul(0.3)
    perms = (torch.arange(4), torch.tensor([2, 3, 0, 1]), torch.tensor([3, 1, 0, 2]))

    def f(q, k, v, w):
        tmap = _positional_map(w)
        return linear_attention_recomputed(tmap, tmap, q, k, v, tensors=(w,), block_size=4, perms=perms)
    leaves = [t.requires_grad_() for t in (q, k, v, w)]
    assert torch.autograd.gradcheck(f, leaves)
    with torch.no_grad():
        fq, fk = _positional_map(w).phi(q, 0), _positional_map(w).phi(k, 0)
        ref = torch.cat([linear_attention_reference(fq[..., p], fk, vg) for p, vg in zip(perms, v.chunk(3, -1))], -1)
        assert_matches_fp64(f(q, k, v, w), ref, "recomputed with perms vs reference")


@pytest.mark.parametrize("need", ["q", "k", "v", "qkv"])
def test_recomputed_hand_written_map_gradients_equal_autograd(need):
    """ELU + 1 with its hand-written vjp = the same map through autograd = the autograd blocked path, for any
    subset of inputs needing a gradient (one tensor needing none)."""
    from attnbench.attention.linear import EluFeatureMap

    elu = lambda x, start: torch.nn.functional.elu(x) + 1  # noqa: E731
    by_hand, by_autograd = TokenMap(elu, EluFeatureMap.vjp_q), TokenMap(elu)
    xs = [gaussian(2, 2, 23, 4, seed=s) for s in (5, 6, 7)]
    g = gaussian(2, 2, 23, 4, seed=8)
    grads = []
    for run in ("hand", "autograd", "blocked"):
        leaves = [x.clone().requires_grad_(name in need) for x, name in zip(xs, "qkv")]
        if run == "blocked":
            out = linear_attention_blocked(lambda s, e: elu(leaves[0][:, :, s:e], s),
                                           lambda s, e: elu(leaves[1][:, :, s:e], s), leaves[2], block_size=7)
        else:
            tmap = by_hand if run == "hand" else by_autograd
            out = linear_attention_recomputed(tmap, tmap, *leaves, block_size=7)
        grads.append(torch.autograd.grad(out, [x for x in leaves if x.requires_grad], g))
    for a, b in zip(grads[0], grads[2]):
        assert_matches_fp64(a, b, f"hand-written vs blocked autograd ({need})")
    for a, b in zip(grads[1], grads[2]):
        assert_matches_fp64(a, b, f"per-block autograd vs blocked autograd ({need})")


@pytest.mark.parametrize("name", ["nala", "polaformer"])
def test_recomputed_keeps_no_features_for_the_backward(name):
    """What the forward keeps for the backward is q, k, v, the output and O(M D): a bidirectional linear
    attention's autograd graph grows by less than one more [N, D] tensor over its inputs and output."""
    attn = registry.build(name, heads=2, head_dim=8)
    attn.block_size = 64
    q, k, v = (gaussian(1, 2, 1024, 8, seed=s, dtype=torch.float32).requires_grad_() for s in (1, 2, 3))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        out = attn(q, k, v)
    io = {x.data_ptr() for x in (q, k, v, out)}
    extra = sum(t.numel() for t in saved if t.data_ptr() not in io)
    assert extra < q[0].numel(), f"saved {extra} elements beyond q, k, v and the output (one [H, N, D]: {q[0].numel()})"


@pytest.mark.parametrize("name", ["linear", "relu_linear", "stella", "nala", "flatten", "hedgehog", "cosformer",
                                  "polaformer"])
def test_recompute_backward_flag_changes_no_gradient(name):
    """Both training paths of a mechanism (recomputing backward on and off) give the same output and gradients,
    parameters included, at 77 tokens in blocks of 16 (fp64)."""
    results = []
    for recompute in (True, False):
        torch.manual_seed(0)
        attn = registry.build_for_length(name, seq_len=77, heads=2, head_dim=4).double()
        attn.block_size, attn.recompute_backward = 16, recompute
        xs = [gaussian(2, 2, 77, 4, seed=s).requires_grad_() for s in (1, 2, 3)]
        out = attn(*xs)
        wrt = xs + [p for p in attn.parameters() if p.requires_grad]
        results.append([out, *torch.autograd.grad(out, wrt, gaussian(2, 2, 77, 4, seed=9))])
    for a, b in zip(*results):
        assert_matches_fp64(a, b, f"{name}: recompute_backward on vs off")


def test_polarity_features_are_exactly_relus_zeros_and_powers():
    """PolaFormer's fused map: where ``x / s`` is <= 0 the feature is exactly 0 (ReLU's value; a tiny stand-in
    such as e^-80 would turn the matmuls' products into subnormals), elsewhere the plain power to rounding."""
    from attnbench.attention.polaformer import _PolarityFeatures, polarity_split

    torch.manual_seed(0)
    x = torch.randn(2, 3, 17, 8)
    x[..., 0] = 0.0
    inv_s, p = torch.rand(3, 1, 8) + 0.5, 1 + 3 * torch.rand(3, 1, 8)
    f = _PolarityFeatures.apply(x, inv_s, p)
    pos, neg = polarity_split(x * inv_s, p)
    assert torch.equal(f == 0, torch.cat([pos, neg], -1) == 0) and (f[..., 0] == 0).all()
    assert (f[f != 0].abs() >= torch.finfo(f.dtype).tiny).all()        # no subnormal anywhere
    torch.testing.assert_close(f, torch.cat([pos, neg], -1), rtol=1e-5, atol=0)
