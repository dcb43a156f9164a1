"""The shared linear-attention op: fast forms against the quadratic reference and the token-by-token recurrence."""

import pytest
import torch

from attnbench.ops import (
    linear_attention,
    linear_attention_blocked,
    linear_attention_chunked,
    linear_attention_recurrent,
    linear_attention_reference,
)

from .helpers import assert_matches_fp64


def features(b, h, n, m, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    fq = torch.rand(b, h, n, m, generator=g, dtype=torch.float64)
    fk = torch.rand(b, h, n, m, generator=g, dtype=torch.float64)
    v = torch.randn(b, h, n, d, generator=g, dtype=torch.float64)
    return fq, fk, v


@pytest.mark.parametrize("n", [1, 7, 64, 65, 129])
@pytest.mark.parametrize("chunk", [1, 16, 64])
@pytest.mark.parametrize("normalize", [True, False])
def test_chunked_equals_reference_and_recurrence(n, chunk, normalize):
    fq, fk, v = features(2, 3, n, 12, 5)   # feature size != value size
    ref = linear_attention_reference(fq, fk, v, causal=True, normalize=normalize)
    rec = linear_attention_recurrent(fq, fk, v, normalize=normalize)
    out = linear_attention_chunked(fq, fk, v, normalize=normalize, chunk_size=chunk)
    assert_matches_fp64(rec, ref, "recurrence")
    assert_matches_fp64(out, ref, "chunked")


@pytest.mark.parametrize("n", [1, 7, 129])
@pytest.mark.parametrize("causal", [False, True])
def test_backward_matches_reference(n, causal):
    fq, fk, v = (t.requires_grad_(True) for t in features(1, 2, n, 6, 4, seed=2))
    w = torch.randn(1, 2, n, 4, dtype=torch.float64)
    grads = torch.autograd.grad((linear_attention(fq, fk, v, causal=causal, chunk_size=16) * w).sum(), (fq, fk, v))
    ref = torch.autograd.grad((linear_attention_reference(fq, fk, v, causal=causal) * w).sum(), (fq, fk, v))
    for g, r, label in zip(grads, ref, "qkv"):
        assert_matches_fp64(g, r, f"grad {label}")


def test_bidirectional_normaliser_is_a_weighted_mean_of_values():
    """With phi >= 0 and eps -> 0 the output is a convex combination of the values."""
    fq, fk, v = features(1, 1, 50, 4, 3)
    out = linear_attention(fq, fk, v, eps=0.0)
    assert (out <= v.max(dim=2, keepdim=True).values + 1e-12).all()
    assert (out >= v.min(dim=2, keepdim=True).values - 1e-12).all()


@pytest.mark.parametrize("n", [1, 7, 130])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("normalize", [True, False])
def test_blocked_equals_reference(n, causal, normalize):
    fq, fk, v = features(2, 2, n, 10, 3, seed=3)
    ref = linear_attention_reference(fq, fk, v, causal=causal, normalize=normalize)
    out = linear_attention_blocked(lambda s, e: fq[:, :, s:e], lambda s, e: fk[:, :, s:e], v, causal=causal,
                                   normalize=normalize, chunk_size=16, block_size=48)
    assert_matches_fp64(out, ref, "blocked")


@pytest.mark.parametrize("n", [7, 130])
@pytest.mark.parametrize("causal", [False, True])
def test_blocked_grouped_queries(n, causal):
    """map_q returning G query features: v splits in G groups, each attended with its own queries against the
    shared keys and normalised on its own (PolaFormer's streams), forward and backward, across blocks."""
    fq1, fk, v = (t.requires_grad_(True) for t in features(2, 2, n, 10, 6, seed=5))
    fq2 = features(2, 2, n, 10, 6, seed=6)[0].requires_grad_(True)
    ref = torch.cat([linear_attention_reference(fq1, fk, v[..., :3], causal=causal),
                     linear_attention_reference(fq2, fk, v[..., 3:], causal=causal)], dim=-1)
    out = linear_attention_blocked(lambda s, e: (fq1[:, :, s:e], fq2[:, :, s:e]), lambda s, e: fk[:, :, s:e], v,
                                   causal=causal, chunk_size=16, block_size=48)
    assert_matches_fp64(out, ref, "grouped blocked")
    w = torch.randn_like(ref)
    for g_out, g_ref in zip(torch.autograd.grad(out, (fq1, fq2, fk, v), w),
                            torch.autograd.grad(ref, (fq1, fq2, fk, v), w)):
        assert_matches_fp64(g_out, g_ref, "grouped blocked grad")


def test_chunked_state_continues_a_sequence():
    fq, fk, v = features(1, 2, 70, 6, 4, seed=4)
    whole = linear_attention_chunked(fq, fk, v, chunk_size=16)
    first, state = linear_attention_chunked(fq[:, :, :33], fk[:, :, :33], v[:, :, :33], chunk_size=16,
                                            output_final_state=True)
    second = linear_attention_chunked(fq[:, :, 33:], fk[:, :, 33:], v[:, :, 33:], chunk_size=16,
                                      initial_state=state, offset=33)
    assert_matches_fp64(torch.cat([first, second], dim=2), whole, "continued")
