"""Contract tests over the whole registry: a new mechanism is covered by its registration line alone."""

from __future__ import annotations

import pytest
import torch

import attnbench
from attnbench import registry
from attnbench.verify import compare_to_reference, runnable_impls

from .helpers import assert_matches_fp64, assert_within_policy

H, D = 2, 8


def forms():
    """(name, causal) for every registered mechanism and every form it has."""
    out = []
    for name in attnbench.names():
        cls = attnbench.get_attention(name)
        if cls.bidirectional:
            out.append(pytest.param(name, False, id=f"{name}-bidir"))
        if cls.causal_form:
            out.append(pytest.param(name, True, id=f"{name}-causal"))
    return out


def make(name, causal, n, dtype=torch.float64, impl="auto", **options):
    torch.manual_seed(0)
    return registry.build_for_length(name, seq_len=n, heads=H, head_dim=D, causal=causal, impl=impl,
                                     **options).to(dtype)


def qkv(b, n, dtype=torch.float64, seed=1, dv=D):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, H, n, D, generator=g, dtype=dtype), torch.randn(b, H, n, D, generator=g, dtype=dtype),
            torch.randn(b, H, n, dv, generator=g, dtype=dtype))


def cpu_impls(name, causal):
    cls = attnbench.get_attention(name)
    return [i for i in runnable_impls(cls, causal) if i not in cls.gpu_only_impls]


@pytest.mark.parametrize("name,causal", forms())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_shape_dtype_finite(name, causal, dtype):
    n = 33
    attn = make(name, causal, n, torch.float32 if dtype == torch.bfloat16 else dtype)
    q, k, v = qkv(3, n, dtype)
    out = attn(q, k, v)
    assert out.shape == v.shape and out.dtype == v.dtype
    assert torch.isfinite(out.float()).all(), f"{name}: non-finite output"


@pytest.mark.parametrize("name,causal", forms())
@pytest.mark.parametrize("n", [1, 7, 129])
def test_fast_forms_match_reference_fp64(name, causal, n):
    """Every CPU impl == reference in float64 at odd lengths, forward and backward (q, k, v, every parameter)."""
    for impl in cpu_impls(name, causal):
        attn = make(name, causal, n, impl=impl)
        if hasattr(attn, "block_size"):  # several blocks even at small N
            attn.block_size = 32
        q, k, v = qkv(2, n)
        out, ref = attn(q, k, v), attn.reference(q, k, v)
        assert_matches_fp64(out, ref, f"{name}/{impl} forward N={n}")
        fwd, bwd = compare_to_reference(attn, impl, q, k, v)
        assert bwd <= 1e-9, f"{name}/{impl} backward N={n}: relative gradient error {bwd:.2e}"


@pytest.mark.parametrize("name,causal", forms())
def test_fast_forms_within_tolerance_policy_fp32(name, causal):
    n = 97
    for impl in cpu_impls(name, causal):
        attn64 = make(name, causal, n, impl=impl)
        attn32 = make(name, causal, n, torch.float32, impl=impl)
        q, k, v = qkv(2, n)
        ref64 = attn64.reference(q, k, v)
        low = [t.float() for t in (q, k, v)]
        assert_within_policy(attn32(*low), attn32.reference(*low), ref64, f"{name}/{impl} fp32")


@pytest.mark.parametrize("name,causal", forms())
def test_batch_invariance(name, causal):
    n = 20
    attn = make(name, causal, n)
    q, k, v = qkv(3, n)
    together = attn(q, k, v)
    for b in range(3):
        alone = attn(q[b:b + 1], k[b:b + 1], v[b:b + 1])
        assert_matches_fp64(together[b:b + 1], alone, f"{name} batch element {b}")


@pytest.mark.parametrize("name,causal", [p for p in forms() if p.values[1]])
def test_causal_forms_do_not_look_ahead(name, causal):
    n, cut = 40, 23
    attn = make(name, causal, n)
    q, k, v = qkv(2, n)
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    g = torch.Generator().manual_seed(9)
    for t in (q2, k2, v2):
        t[:, :, cut:] = 5 * torch.randn(t[:, :, cut:].shape, generator=g, dtype=t.dtype)
    for form in (attn, attn.reference):
        a, b = form(q, k, v), form(q2, k2, v2)
        assert_matches_fp64(a[:, :, :cut], b[:, :, :cut], f"{name}: past outputs changed with the future")


@pytest.mark.parametrize("name,causal", forms())
def test_gradients_reach_inputs_and_every_parameter(name, causal):
    n = 24
    attn = make(name, causal, n)
    q, k, v = (t.requires_grad_(True) for t in qkv(2, n))
    out = attn(q, k, v)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
    (out * w).sum().backward()
    for label, t in (("q", q), ("k", k), ("v", v)):
        assert t.grad is not None and t.grad.abs().sum() > 0, f"{name}: no gradient reaches {label}"
        assert torch.isfinite(t.grad).all()
    for pname, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}: parameter {pname} gets no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: parameter {pname} has a non-finite gradient"


@pytest.mark.parametrize("name,causal", forms())
def test_resolved_impl_is_recorded_and_cpu_runnable(name, causal):
    attn = make(name, causal, 8)
    impl = attn.resolve_impl("cpu")
    assert impl in attn.impls and impl not in attn.gpu_only_impls


def test_registry_lists_every_seed_mechanism():
    expected = {"softmax", "linear", "relu_linear", "nala", "mirrorla", "polaformer", "flatten", "laplacian",
                "stella", "relu_quadratic"}
    assert expected <= set(attnbench.names())
    assert {"elu", "relu", "nala", "mirrorla", "focused"} <= set(attnbench.feature_map_names())


@pytest.mark.parametrize("name", attnbench.feature_map_names())
def test_feature_maps_build_and_match_declared_size(name):
    fmap = attnbench.build_feature_map(name, heads=H, head_dim=D)
    q, k, _ = qkv(2, 11, torch.float64)
    fmap = fmap.double()
    assert fmap.phi_q(q).shape == (2, H, 11, fmap.feature_dim)
    assert fmap.phi_k(k).shape == (2, H, 11, fmap.feature_dim)


def triton_forms():
    return [p for p in forms() if "triton" in attnbench.get_attention(p.values[0]).impls_for(p.values[1])]


@pytest.mark.parametrize("name,causal", triton_forms())
def test_triton_impl_matches_reference_interpreted(name, causal):
    """Each form's Triton path, run by Triton's interpreter in fp32 (conftest sets TRITON_INTERPRET=1),
    forward and backward."""
    from attnbench.verify import verify

    for n in (7, 45):
        r = verify(name, causal=causal, impl="triton", seq_len=n, dtype=torch.float32)
        assert r.status == "ok", f"{name} triton N={n}: {r.status} {r.detail} fwd={r.fwd_err} bwd={r.bwd_err}"
