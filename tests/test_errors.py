"""Bad input gets a clear error that names what was wrong."""

import pytest
import torch

import attnbench
from attnbench import AttnbenchError, ShapeError, UnknownNameError, UnsupportedError


def qkv(shape=(1, 2, 5, 8), dtype=torch.float32):
    return tuple(torch.randn(shape, dtype=dtype) for _ in range(3))


def test_unknown_name_suggests_closest():
    with pytest.raises(UnknownNameError, match=r"unknown attention 'nalla'.*did you mean 'nala'"):
        attnbench.build("nalla", heads=2, head_dim=8)
    with pytest.raises(KeyError):  # also catchable as a KeyError
        attnbench.build("mirrorLA", heads=2, head_dim=8)


def test_unknown_option_is_named_with_suggestion():
    with pytest.raises(AttnbenchError, match=r"unknown option\(s\) 'lamda' \(did you mean 'lam'\?\)"):
        attnbench.build("nala", heads=2, head_dim=8, lamda=3)


def test_causal_request_to_bidirectional_only_mechanism():
    with pytest.raises(UnsupportedError, match=r"laplacian: argument 'causal=True' is not supported"):
        attnbench.build("laplacian", heads=2, head_dim=8, causal=True)


def test_unknown_impl_names_the_argument():
    with pytest.raises(AttnbenchError, match=r"argument 'impl' must be 'auto' or one of"):
        attnbench.build("linear", heads=2, head_dim=8, impl="cuda")


def test_gpu_impl_without_cuda_is_an_error_not_a_fallback(monkeypatch):
    attn = attnbench.build("softmax", heads=2, head_dim=8)
    monkeypatch.setattr(type(attn), "impls", ("reference", "sdpa", "triton"))
    attn.impl = "triton"
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(UnsupportedError, match=r"impl='triton' needs a CUDA device"):
        attn.resolve_impl("cpu")


@pytest.mark.parametrize("name", ["softmax", "nala", "laplacian"])
def test_wrong_rank(name):
    attn = attnbench.build(name, heads=2, head_dim=8)
    q, k, v = qkv()
    with pytest.raises(ShapeError, match=r"argument 'q' must have rank 4 \[B, H, N, D\], got rank 3"):
        attn(q[0], k, v)


def test_mismatched_shapes_and_heads_and_dtype():
    attn = attnbench.build("linear", heads=2, head_dim=8)
    q, k, v = qkv()
    with pytest.raises(ShapeError, match=r"argument 'k' must match q's shape \(1, 2, 5, 8\), got shape \(1, 2, 6, 8\)"):
        attn(q, torch.randn(1, 2, 6, 8), v)
    with pytest.raises(ShapeError, match=r"argument 'v' must be \[B=1, H=2, N=5, Dv\]"):
        attn(q, k, torch.randn(1, 2, 4, 8))
    with pytest.raises(ShapeError, match=r"argument 'q' has 3 heads .* heads=2"):
        attn(*qkv((1, 3, 5, 8)))
    with pytest.raises(ShapeError, match=r"argument 'q' has head size 4 .* head_dim=8"):
        attn(*qkv((1, 2, 5, 4)))
    with pytest.raises(ShapeError, match=r"q, k and v must share one dtype"):
        attn(q, k, v.double())
    with pytest.raises(ShapeError, match=r"argument 'q' must be a floating tensor"):
        attn(q.long(), k.long(), v.long())


def test_mechanism_specific_constraints():
    with pytest.raises(AttnbenchError, match=r"mirrorla: argument 'head_dim' must be even"):
        attnbench.build("mirrorla", heads=2, head_dim=7)
    attn = attnbench.build("polaformer", heads=2, head_dim=8)
    q, k, _ = qkv()
    with pytest.raises(ShapeError, match=r"argument 'v' must have an even value size"):
        attn(q, k, torch.randn(1, 2, 5, 7))
    with pytest.raises(AttnbenchError, match=r"option 'ns_scaling' must be one of"):
        attnbench.build("laplacian", heads=2, head_dim=8, ns_scaling="svd")
    with pytest.raises(AttnbenchError, match=r"argument 'heads' must be a positive int"):
        attnbench.build("linear", heads=0, head_dim=8)
