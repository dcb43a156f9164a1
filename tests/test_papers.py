"""Per-paper properties: what each paper claims of its mechanism, checked on the implementation."""

from __future__ import annotations

import math

import pytest
import torch

import attnbench
from attnbench.attention.laplacian import laplace_kernel
from attnbench.ops.nystrom import newton_schulz_pinv


def randn(*shape, seed=0, scale=1.0):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- MirrorLA -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("variance_aware", [False, True])
def test_mirrorla_reflections_preserve_inner_products_before_relu(variance_aware):
    """Householder reflections are isometries (Eq. 3): with one set of angles, <Hq, Hk> = <q, k>."""
    fmap = attnbench.build_feature_map("mirrorla", heads=3, head_dim=8, variance_aware=variance_aware).double()
    x = randn(2, 3, 17, 8, seed=1)
    reflected = fmap.reflect_heads(x)
    angles = fmap.modulate(fmap.block_variance(reflected)) if variance_aware else fmap.theta.double()[None, :, None]
    y = fmap.reflect_blocks(reflected, angles)
    # every token pair in a head shares the angles: the Gram matrix per head is unchanged
    gram_x = x @ x.transpose(-1, -2)
    gram_y = y @ y.transpose(-1, -2)
    if fmap.cross_head:  # the cross-head mirror mixes heads: compare the full-channel Gram matrix instead
        flat = lambda t: t.transpose(1, 2).reshape(2, 17, 24)
        gram_x, gram_y = flat(x) @ flat(x).transpose(-1, -2), flat(y) @ flat(y).transpose(-1, -2)
    torch.testing.assert_close(gram_y, gram_x, rtol=1e-12, atol=1e-12)


def test_mirrorla_block_reflection_is_the_householder_matrix():
    """Algorithm 1's x - 2<x,u>u equals (I - 2uu^T)x, i.e. [[-cos2t, -sin2t], [-sin2t, cos2t]] (Eq. 6 up to sign)."""
    fmap = attnbench.build_feature_map("mirrorla", heads=1, head_dim=2, variance_aware=False, cross_head=False)
    fmap = fmap.double()
    t = fmap.theta.detach().double()[0, 0]
    Hm = torch.tensor([[-math.cos(2 * t), -math.sin(2 * t)], [-math.sin(2 * t), math.cos(2 * t)]],
                      dtype=torch.float64)
    x = randn(1, 1, 5, 2, seed=3)
    y = fmap.reflect_blocks(x, fmap.theta.double()[None, :, None])
    torch.testing.assert_close(y, x @ Hm.T)


def test_mirrorla_variance_modulation_band_and_causal_prefix():
    """Delta alpha lies in (alpha_max/2, alpha_max] (Eq. 14 with lam > 0); the causal variance of token t is the
    variance of tokens 1..t."""
    fmap = attnbench.build_feature_map("mirrorla", heads=2, head_dim=4, causal=True).double()
    x = randn(1, 2, 30, 4, seed=4)
    var = fmap.block_variance(x)
    torch.testing.assert_close(var, fmap.block_variance_reference(x))
    full = attnbench.build_feature_map("mirrorla", heads=2, head_dim=4).double().block_variance(x)
    torch.testing.assert_close(var[:, :, -1:], full)   # the last prefix is the whole sequence
    delta = fmap.modulate(var) - fmap.theta.double()[None, :, None]
    assert (delta > fmap.alpha_max / 2).all() and (delta <= fmap.alpha_max).all()


@pytest.mark.parametrize("variance_aware", [True, False])
@pytest.mark.parametrize("cross_head", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_mirrorla_fast_map_matches_the_definition(variance_aware, cross_head, causal, monkeypatch):
    """The fast form's reflections as one block-diagonal matmul plus a rank-1 update, and the whole-sequence
    variance from shifted sums accumulated over several blocks (stat blocks of 7 tokens), equal Algorithm 1 with
    Eq. 12's centred variance, features and attention output, in float64; the pair matrix is the reflection."""
    import attnbench.attention.mirrorla as mirrorla

    monkeypatch.setattr(mirrorla, "_STAT_BLOCK", 7)
    attn = attnbench.build("mirrorla", heads=2, head_dim=6, causal=causal, variance_aware=variance_aware,
                           cross_head=cross_head).double()
    attn.block_size = 16
    q, k, v = (randn(2, 2, 45, 6, seed=s, scale=3.0).add(1.0) for s in (11, 12, 13))  # mean far from 0
    fmap = attn.feature_map
    map_q, _ = fmap.block_maps(q, k, 16)
    torch.testing.assert_close(torch.cat([map_q(s, min(s + 16, 45)) for s in range(0, 45, 16)], 2),
                               fmap.phi_q_reference(q))
    torch.testing.assert_close(attn.run("torch", q, k, v), attn.run("reference", q, k, v))
    angles = fmap.theta.double()[None, :, None]
    torch.testing.assert_close(q @ fmap.pair_reflections(angles), fmap.reflect_blocks(q, angles))


# --- NaLaFormer -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [0.1, 1.0, 5.0])
@pytest.mark.parametrize("sign_split", [False, True])
def test_nala_scores_are_non_negative(scale, sign_split):
    """Eq. 10: sum_i |a_i||b_i| cos(theta_qi - theta_ki) >= 0 because |theta| < pi/4."""
    fmap = attnbench.build_feature_map("nala", heads=2, head_dim=16, sign_split=sign_split).double()
    q, k = randn(2, 2, 64, 16, seed=5, scale=scale), randn(2, 2, 64, 16, seed=6, scale=scale)
    scores = fmap.phi_q(q) @ fmap.phi_k(k).transpose(-1, -2)
    assert (scores >= 0).all()
    if not sign_split:  # the sin halves themselves take both signs: the map is not element-wise non-negative
        assert (fmap.phi_q(q)[..., 16:] < 0).any()


def test_nala_exponent_range_and_norm_awareness():
    """f(||q||) = lam (tau + tanh||q||) lies in [lam tau, lam (tau + 1)) and grows with the query norm."""
    fmap = attnbench.build_feature_map("nala", heads=1, head_dim=8, lam=3.0, tau=0.5).double()
    q = randn(1, 1, 200, 8, seed=7) * torch.logspace(-3, 0.3, 200, dtype=torch.float64).view(1, 1, 200, 1)
    p = fmap.exponent(q).flatten()
    assert (p >= 1.5).all() and (p < 4.5).all()
    u = q[:, :, :1] / q[:, :, :1].norm()                      # one direction, growing norm
    along = fmap.exponent(u * torch.linspace(0.01, 3.0, 50, dtype=torch.float64).view(1, 1, 50, 1)).flatten()
    assert (along.diff() > 0).all()
    # the feature depends on ||q|| (not only on dir(q)): scaling q changes the normalised attention pattern
    k = randn(1, 1, 10, 8, seed=8)
    qs = q[:, :, :1] / q[:, :, :1].norm()
    patterns = []
    for c in (0.05, 3.0):
        s = fmap.phi_q(c * qs) @ fmap.phi_k(k).transpose(-1, -2)
        patterns.append(s / s.sum(-1, keepdim=True))
    assert (patterns[0] - patterns[1]).abs().max() > 1e-3


def test_nala_sign_split_is_the_angle_extreme_of_the_cosine_map():
    """The released code's split [relu(x); relu(-x)] gives per-coordinate score |a||b| for equal signs and 0
    for opposite signs, i.e. cos(theta_q - theta_k) with theta in {0, pi/2}."""
    fmap = attnbench.build_feature_map("nala", heads=1, head_dim=4, sign_split=True).double()
    q, k = randn(1, 1, 1, 4, seed=9), randn(1, 1, 1, 4, seed=10)
    dq = q / q.norm()
    p = fmap.exponent(q)
    expected = ((dq.abs() ** p) * (k.abs() ** 3) * ((q > 0) == (k > 0))).sum()
    got = (fmap.phi_q(q) * fmap.phi_k(k)).sum()
    torch.testing.assert_close(got, expected)


# --- LaplacianFormer ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("symmetric", [True, False])
def test_newton_schulz_converges_to_pinv(symmetric):
    x = randn(3, 16, 4, seed=11, scale=0.3)
    y = x if symmetric else randn(3, 16, 4, seed=12, scale=0.3)
    W = laplace_kernel(x, y, 4.0)                                                   # [3, 16, 16]
    exact = torch.linalg.pinv(W)
    errors = [((newton_schulz_pinv(W, iters=i) - exact).norm() / exact.norm()).item() for i in (5, 15, 40)]
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-8, errors


def test_newton_schulz_soft_scaling_on_symmetric_psd():
    x = randn(2, 12, 4, seed=13, scale=0.5)
    W = laplace_kernel(x, x, 4.0)
    X = newton_schulz_pinv(W, iters=40, scaling="soft")
    torch.testing.assert_close(X, torch.linalg.pinv(W), rtol=1e-8, atol=1e-8)


def test_laplacian_with_all_tokens_as_landmarks_is_the_exact_kernel():
    """With m = N landmarks the Nyström form reproduces k(Q, K) exactly (up to the NS inverse)."""
    attn = attnbench.build("laplacian", heads=1, head_dim=4, landmarks=64, ns_iters=60, ns_ridge=0.0,
                           qk_scale="none").double()
    q, k = randn(1, 1, 9, 4, seed=14, scale=0.5), randn(1, 1, 9, 4, seed=15, scale=0.5)
    C, W_pinv, R = attn._nystrom(q, k)
    torch.testing.assert_close(C @ W_pinv @ R, laplace_kernel(q, k, 4.0), rtol=1e-6, atol=1e-6)


def test_laplacian_kernel_gradient_does_not_vanish_near_coincidence():
    """Sec. 3: d k / d x_i = -(1/lam) sign(x_i - y_i) k(x, y), of size 1/lam as x -> y (Gaussian: -> 0)."""
    y = torch.zeros(1, 1, 1, 3, dtype=torch.float64)
    x = torch.full((1, 1, 1, 3), 1e-6, dtype=torch.float64, requires_grad=True)
    (g,) = torch.autograd.grad(laplace_kernel(x, y, 4.0).sum(), x)
    torch.testing.assert_close(g.abs(), torch.full_like(g, 0.25), rtol=1e-4, atol=0)


def test_laplacian_pool2d_landmarks_are_block_means_of_the_patch_grid():
    """Sec. 4.2: r x r average pooling of the token map (PVTv2); the N - side^2 leading tokens (a ViT's class
    token) are not pooled."""
    for prefix in (0, 1):
        x = randn(2, 3, prefix + 36, 5, seed=21)                                    # 6 x 6 patches
        attn = attnbench.build("laplacian", heads=3, head_dim=5, landmark_pool="pool2d", landmarks=9)
        grid = x[:, :, prefix:].reshape(2, 3, 6, 6, 5)
        want = torch.stack([grid[:, :, 2 * i:2 * i + 2, 2 * j:2 * j + 2].mean((2, 3))
                            for i in range(3) for j in range(3)], dim=2)            # row-major 2 x 2 blocks
        torch.testing.assert_close(attn._landmarks(x), want, rtol=1e-12, atol=1e-12)


def test_laplacian_qk_scale_is_a_kernel_width():
    """exp(-||s q - s k||_1 / lam) = exp(-||q - k||_1 / (lam / s)): qk_scale = sqrt_d is lam * sqrt(d)."""
    q, k, v = (randn(2, 2, 19, 16, seed=s) for s in (31, 32, 33))
    a = attnbench.build("laplacian", heads=2, head_dim=16, landmarks=8, qk_scale="sqrt_d").double()
    b = attnbench.build("laplacian", heads=2, head_dim=16, landmarks=8, qk_scale="none", lam=a.lam * 4.0).double()
    torch.testing.assert_close(a(q, k, v), b(q, k, v), rtol=1e-10, atol=1e-10)


def test_newton_schulz_paper_scaling_diverges_where_ours_converges():
    """alpha = 2/||W||_2 (as printed) breaks ||I - alpha W W^T|| < 1 once ||W||_2 > 1 (a unit-diagonal kernel
    matrix); 1/(||W||_1 ||W||_inf) converges on the same matrices."""
    x = randn(3, 16, 4, seed=41, scale=0.3)
    W = laplace_kernel(x, x, 4.0)
    assert (torch.linalg.matrix_norm(W, ord=2) > 1).all()
    exact = torch.linalg.pinv(W)
    def err(X):
        return ((X - exact).norm() / exact.norm()).item()

    assert not err(newton_schulz_pinv(W, iters=40, scaling="paper")) < 1  # inf or nan: diverged
    assert err(newton_schulz_pinv(W, iters=40, scaling="norm1inf")) < 1e-8


READINGS = {"literal": {"lam": 4.0, "qk_scale": "none", "ns_iters": 20, "ns_grad": "unrolled",
                        "landmark_pool": "segment", "landmark_set": "untied", "landmarks": 8},
            "pool2d": {"landmark_pool": "pool2d", "landmarks": 9}}


@pytest.mark.parametrize("reading", list(READINGS))
def test_laplacian_readings_fast_forms_match_reference(reading):
    """The non-default readings kept as options: torch (float64) and Triton (interpreted, float32) against the
    reference, forward and backward, at an odd length (1 + 6 x 6 tokens: a class token and a patch grid)."""
    from attnbench.kernels import kernels_available

    from attnbench.checks.verify import forward_backward

    from .helpers import assert_matches_fp64, assert_within_policy

    n = 37
    q, k, v = (randn(2, 2, n, 8, seed=s, scale=2.0) for s in (51, 52, 53))  # a well-conditioned W
    w = randn(2, 2, n, 8, seed=54)
    attn = attnbench.build("laplacian", heads=2, head_dim=8, **READINGS[reading]).double()
    ref64 = forward_backward(attn.reference, [q, k, v], w)
    fast = forward_backward(lambda *x: attn.run("torch", *x), [q, k, v], w)
    for what, a, b in zip(("out", "dq", "dk", "dv"), fast, ref64):
        assert_matches_fp64(a, b, what)
    if kernels_available("cpu"):
        f32 = [t.float() for t in (q, k, v)]
        ref32 = forward_backward(attn.float().reference, f32, w.float())
        tri = forward_backward(lambda *x: attn.run("triton", *x), f32, w.float())
        for what, a, b, c in zip(("out", "dq", "dk", "dv"), tri, ref32, ref64):
            assert_within_policy(a, b, c, what)


# --- MixA / SteLLA --------------------------------------------------------------------------------------------
def output_stats(name, n, v_mean=0.0, trials=3):
    """Mean over trials of (Var(O), mean |O|) on random Gaussian q, k and values N(v_mean, 1)."""
    attn = attnbench.build(name, heads=4, head_dim=64).double()
    var, mag = 0.0, 0.0
    for t in range(trials):
        q, k, v = (randn(1, 4, n, 64, seed=100 * t + i) for i in range(3))
        out = attn(q, k, v + v_mean)
        var, mag = var + out.var().item() / trials, mag + out.abs().mean().item() / trials
    return var, mag


def test_stella_output_variance_does_not_grow_with_n():
    """Theorems 5.2-5.3: dividing by sqrt(d) and by N keeps the output O(1) as N grows. On zero-mean values the
    variance of a sum of N independent terms is O(N), so after /N^2 it shrinks; with correlated (mean-shifted)
    values, the case Theorem 5.2 bounds, the sum is O(N) and /N keeps it constant. The row-normalised ReLU
    baseline is reported beside it."""
    lengths = (64, 256, 1024, 4096)
    rows = {name: [output_stats(name, n) for n in lengths] for name in ("stella", "relu_linear")}
    shifted = {name: [output_stats(name, n, v_mean=1.0)[1] for n in lengths] for name in ("stella", "relu_linear")}
    # the figures, beside the baseline, in the failure message (a passing test prints nothing)
    table = "\n" + "N".ljust(30) + "  ".join(f"{n:>8d}" for n in lengths) + "".join(
        "\n" + f"{name} Var(O)".ljust(30) + "  ".join(f"{v:8.2e}" for v, _ in rows[name])
        + "\n" + f"{name} mean|O|, V~N(1,1)".ljust(30) + "  ".join(f"{m:8.2e}" for m in shifted[name]) for name in rows)
    stella_var = [v for v, _ in rows["stella"]]
    assert all(b <= a * 1.2 for a, b in zip(stella_var, stella_var[1:])), table
    mags = shifted["stella"]
    assert max(mags) / min(mags) < 1.5, table
