"""Contract tests over the whole registry: a new mechanism is covered by its registration line alone.

The clauses live in :mod:`attnbench.checks.contract` (one place: ``attnbench check`` runs the same on a plug-in, and a
plug-in's own tests call ``attnbench.checks.contract.check_attention``); here each clause is one test per mechanism and form.
"""

from __future__ import annotations

import pytest
import torch

import attnbench
from attnbench.checks import contract as testing


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


def holds(problem):
    assert problem is None, problem


@pytest.mark.parametrize("name,causal", forms())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_shape_dtype_finite(name, causal, dtype):
    holds(testing.shape_dtype_finite(name, causal, dtype))


@pytest.mark.parametrize("name,causal", forms())
@pytest.mark.parametrize("n", [1, 7, 129])
def test_fast_forms_match_reference_fp64(name, causal, n):
    """Every CPU impl == reference in float64 at odd lengths, forward and backward (q, k, v, every parameter)."""
    holds(testing.several_blocks_match_fp64(name, causal, n))


@pytest.mark.parametrize("name,causal", forms())
def test_fast_forms_match_reference_with_options_off_their_defaults(name, causal):
    holds(testing.options_match_fp64(name, causal))


@pytest.mark.parametrize("name,causal", forms())
def test_fast_forms_within_tolerance_policy_fp32(name, causal):
    holds(testing.fp32_within_policy(name, causal))


@pytest.mark.parametrize("name,causal", forms())
def test_batch_invariance(name, causal):
    holds(testing.batch_invariance(name, causal))


@pytest.mark.parametrize("name,causal", [p for p in forms() if p.values[1]])
def test_causal_forms_do_not_look_ahead(name, causal):
    holds(testing.no_look_ahead(name))


@pytest.mark.parametrize("name,causal", forms())
def test_gradients_reach_inputs_and_every_parameter(name, causal):
    holds(testing.gradients_reach(name, causal))


@pytest.mark.parametrize("name,causal", forms())
def test_resolved_impl_is_recorded_and_cpu_runnable(name, causal):
    holds(testing.auto_runs_on_cpu(name, causal))


@pytest.mark.parametrize("name,causal", forms())
def test_bad_input_shape_is_a_clear_error(name, causal):
    holds(testing.rejects_bad_shape(name, causal))


def test_registry_lists_every_seed_mechanism():
    expected = {"softmax", "linear", "relu_linear", "nala", "mirrorla", "polaformer", "flatten", "laplacian",
                "stella", "relu_quadratic"}
    assert expected <= set(attnbench.names())
    assert {"elu", "relu", "nala", "mirrorla", "focused"} <= set(attnbench.feature_map_names())


@pytest.mark.parametrize("name", attnbench.feature_map_names())
def test_feature_maps_build_and_match_declared_size(name):
    holds(testing.feature_map_shapes(name))


def test_the_clauses_catch_what_they_are_for(monkeypatch):
    """A clause that cannot fail is no test: break softmax's fast form three ways and watch the clauses say so."""
    from attnbench.attention.softmax import SoftmaxAttention

    impl = testing.cpu_impls("softmax", True)[0]
    good = getattr(SoftmaxAttention, f"forward_{impl}")

    def unmasked(self, q, k, v):  # forgets the causal mask
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    monkeypatch.setattr(SoftmaxAttention, f"forward_{impl}", unmasked)
    assert "with blocks of 32" in testing.several_blocks_match_fp64("softmax", True, 7)
    assert testing.fp32_within_policy("softmax", True) is not None
    assert "future tokens" in testing.no_look_ahead("softmax")

    def mixes_batch(self, q, k, v):  # the batch elements leak into each other
        return good(self, q, k, v) + good(self, q, k, v).mean(0, keepdim=True)

    monkeypatch.setattr(SoftmaxAttention, f"forward_{impl}", mixes_batch)
    assert "depends on the others" in testing.batch_invariance("softmax", False)

    def detached(self, q, k, v):  # no gradient reaches q
        return good(self, q.detach(), k, v)

    monkeypatch.setattr(SoftmaxAttention, f"forward_{impl}", detached)
    assert "no gradient reaches q" in testing.gradients_reach("softmax", False)

    def wrong_without_grad(self, q, k, v):  # an inference path that differs from the training path
        out = good(self, q, k, v)
        return out if torch.is_grad_enabled() else out.flip(-2)

    monkeypatch.setattr(SoftmaxAttention, f"forward_{impl}", wrong_without_grad)
    assert testing.several_blocks_match_fp64("softmax", False, 7) is None
    assert "no_grad output" in testing.inference_matches_fp64("softmax", False)


def triton_forms():
    return [p for p in forms() if "triton" in attnbench.get_attention(p.values[0]).impls_for(p.values[1])]


@pytest.mark.parametrize("name,causal", triton_forms())
def test_triton_impl_matches_reference_interpreted(name, causal):
    """Each form's Triton path, run by Triton's interpreter in fp32 (conftest sets TRITON_INTERPRET=1),
    forward and backward."""
    from attnbench.checks.verify import verify

    for n in (7, 45):
        r = verify(name, causal=causal, impl="triton", seq_len=n, dtype=torch.float32)
        assert r.status == "ok", f"{name} triton N={n}: {r.status} {r.detail} fwd={r.fwd_err} bwd={r.bwd_err}"
