"""Every feature-map mechanism equals its paper's formula written without eps (issue 22, part 1).

The papers' normalised linear attention (Katharopoulos et al. 2020 Eq. 6, causal Eq. 9; NaLaFormer Eq. 14,
MirrorLA Eq. 2, PolaFormer's two streams, FLatten Eq. 4, FAVOR+ Eqs. 4-5, cosFormer Eq. 9, Hedgehog Eq. 2) is

    o_t = phi_q(q_t) S_t / phi_q(q_t) z_t,   S_t = sum_{i in I_t} phi_k(k_i)^T v_i,   z_t = sum_{i in I_t} phi_k(k_i)

with I_t every token (bidirectional) or i <= t (causal). It is written here once more, from the mechanism's feature
maps alone and with plain prefix sums, with no eps; in float64 every implementation that runs on the CPU (the
reference, the blocked / chunked torch forms with and without a gradient, the recomputing backward) must equal it
to ``REL`` relative, output and gradients, on Gaussian inputs and on inputs whose features are nearly orthogonal
(low-variance tokens whose query and key ReLU supports barely overlap), where a guard relative to the
Cauchy-Schwarz bound ``||phi_q|| ||z||`` instead of the score was far from negligible. In float32 the same holds to
the tolerance policy, the Triton kernel included (under the interpreter).

``nala`` with ``sign_split=True`` is the released NaLaFormer code, whose normaliser adds a fixed 1e-6 to the mean
score: its formula carries that eps, and it matches the released core itself.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import attnbench
from attnbench.api import registry
from attnbench.attention.base import FeatureMapAttention
from attnbench.kernels import kernels_available

from .helpers import assert_within_policy

B, H, N, D = 2, 2, 37, 16
BLOCK, CHUNK = 16, 5          # blocks of 16, 16, 5 tokens; chunks of 5 (the last one of 2): every edge ragged
REL = 1e-10

# registered mechanisms with no data-dependent normaliser phi_q . z (nothing here to check)
NOT_NORMALISED = {"softmax", "linformer", "nystromformer", "skyformer", "laplacian", "relu_quadratic", "stella"}

# (name, options) beyond the registry's defaults: every option that changes the features or the normaliser
VARIANTS = [("nala", {"sign_split": True}), ("nala", {"sign_split": True, "den_eps": 0.0}),
            ("nala", {"tau": 0.0, "lam": 1.5}), ("mirrorla", {"variance_aware": False}),
            ("mirrorla", {"cross_head": False}), ("hedgehog", {"tie_qk": True})]


def special_streams(attn, q, k, v):
    """The (phi_q, phi_k, v) streams of the normalised mechanisms that are not a :class:`FeatureMapAttention`,
    written from their papers."""
    if attn.name == "polaformer":  # two streams: same-sign [q+, q-] . [k+, k-], opposite-sign [q-, q+] . [k+, k-]
        s = F.softplus(attn.scale)                                                   # [H, 1, D]
        p = 1.0 + attn.alpha * torch.sigmoid(attn.power)
        qp, qn, kp, kn = (F.relu(x / s) ** p for x in (q, -q, k, -k))
        kf = torch.cat([kp, kn], -1)
        v1, v2 = v.chunk(2, -1)
        return [(torch.cat([qp, qn], -1), kf, v1), (torch.cat([qn, qp], -1), kf, v2)]
    if attn.name == "performer":  # FAVOR+ positive features, unstabilised (the stabilisers cancel exactly)
        fmap = attn.feature_map
        return [(fmap.phi(q), fmap.phi(k), v)]
    raise KeyError(attn.name)


SPECIAL = {"polaformer", "performer"}


def streams(attn, q, k, v):
    if isinstance(attn, FeatureMapAttention):
        fmap = attn.feature_map
        return [(fmap.phi_q_reference(q), fmap.phi_k_reference(k), v)]
    return special_streams(attn, q, k, v)


def formula(fq, fk, v, causal, eps=0.0):
    """``(phi_q . S_t / phi_q . z_t, defined)`` by explicit prefix sums (causal) or sums; ``eps`` > 0 only for a
    released normaliser ``(num / c_t) / (den / c_t + eps)``. Where the denominator is exactly zero (every score
    0) the formula is undefined: 0 there, and ``defined`` False."""
    if causal:
        S = torch.cumsum(fk.unsqueeze(-1) * v.unsqueeze(-2), dim=2)                  # [B, H, N, M, D]
        z = torch.cumsum(fk, dim=2)                                                  # [B, H, N, M]
        num = torch.einsum("bhnm,bhnmd->bhnd", fq, S)
        den = (fq * z).sum(-1, keepdim=True)                                         # [B, H, N, 1]
        c = torch.arange(1, fq.shape[2] + 1, dtype=fq.dtype).unsqueeze(-1)
    else:
        num = fq @ (fk.transpose(-1, -2) @ v)
        den = fq @ fk.sum(-2).unsqueeze(-1)
        c = float(fq.shape[2])
    if eps:
        num, den = num / c, den / c + eps
    zero = den == 0
    return torch.where(zero, 0.0, num / torch.where(zero, 1.0, den)), (~zero).expand_as(num)


def expected(attn, q, k, v):
    """The formula on every stream, and where it is defined (a mask like the output)."""
    eps = getattr(attn, "eps", 0.0)
    outs, defined = zip(*(formula(fq, fk, vg, attn.causal, eps) for fq, fk, vg in streams(attn, q, k, v)))
    return torch.cat(outs, -1), torch.cat(defined, -1)


def cases():
    out = []
    for name in attnbench.names():
        cls = attnbench.get_attention(name)
        if name in NOT_NORMALISED:
            continue
        for opts in [{}] + [o for n, o in VARIANTS if n == name]:
            label = name + "".join(f":{key}={val}" for key, val in opts.items())
            if cls.bidirectional:
                out.append(pytest.param(name, opts, False, id=f"{label}-bidir"))
            if cls.causal_form:
                out.append(pytest.param(name, opts, True, id=f"{label}-causal"))
    return out


def test_every_mechanism_is_classified():
    """A new mechanism is either a FeatureMapAttention (covered below by its map), has its formula here, or is
    listed as having no normaliser: nothing is skipped silently."""
    for name in attnbench.names():
        cls = attnbench.get_attention(name)
        assert issubclass(cls, FeatureMapAttention) or name in SPECIAL or name in NOT_NORMALISED, (
            f"{name}: add its feature-map formula to tests/test_exact_float64.py or list it in NOT_NORMALISED")


def make(name, opts, causal, dtype=torch.float64):
    torch.manual_seed(0)
    attn = registry.build_for_length(name, seq_len=N, heads=H, head_dim=D, causal=causal, **opts).to(dtype)
    with torch.no_grad():  # away from the initialisation (identity maps, zero scales): every parameter matters
        for p in attn.parameters():
            p.add_(0.3 * torch.randn(p.shape, dtype=p.dtype))
    for attr, val in (("block_size", BLOCK), ("chunk_size", CHUNK)):
        if hasattr(attn, attr):
            setattr(attn, attr, val)
    return attn


def inputs(kind, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda: torch.randn(B, H, N, D, generator=g, dtype=torch.float64)  # noqa: E731
    if kind == "gaussian":
        q, k, v = rnd(), rnd(), rnd()
    else:  # "orthogonal": low-variance tokens around opposite means: ReLU supports of q and k barely overlap
        mu = torch.randn(B, H, 1, D, generator=g, dtype=torch.float64)
        q, k, v = mu + 0.05 * rnd(), -mu + 0.05 * rnd(), rnd()
    return [t.to(dtype) for t in (q, k, v)]


def rel_err(a, b, defined=None):
    """max |a - b| / max |b| where ``defined``; a non-finite ``a`` anywhere is infinitely wrong."""
    if not torch.isfinite(a).all():
        return math.inf
    diff = (a.double() - b.double()).abs()
    if defined is not None:
        diff = diff * defined
    return (diff.max() / b.double().abs().max()).item()


def forms(attn):
    """(label, run(q, k, v)) of every CPU form: the reference, the torch form with no gradient (in-place maps),
    with a gradient (autograd through the blocked op, or the recomputing backward where it applies)."""
    def torch_form(recompute):
        def run(q, k, v):
            old = getattr(attn, "recompute_backward", None)
            if old is not None:
                attn.recompute_backward = recompute
            try:
                return attn.run("torch", q, k, v)
            finally:
                if old is not None:
                    attn.recompute_backward = old
        return run
    out = [("reference", lambda q, k, v: attn.run("reference", q, k, v)), ("torch", torch_form(False))]
    if hasattr(attn, "recompute_backward") and not attn.causal:
        out.append(("torch-recomputed", torch_form(True)))
    return out


@pytest.mark.parametrize("kind", ["gaussian", "orthogonal"])
@pytest.mark.parametrize("name,opts,causal", cases())
def test_forward_and_gradients_equal_the_formula_without_eps(name, opts, causal, kind):
    attn = make(name, opts, causal)
    q, k, v = inputs(kind)
    ref, defined = expected(attn, q, k, v)
    with torch.no_grad():
        for label, run in forms(attn):
            err = rel_err(run(q, k, v), ref, defined)
            assert err < REL, f"{name} {opts} causal={causal} {kind}: {label} (no grad) off by {err:.1e} relative"
    if kind != "orthogonal":  # gradients on the inputs where the old guard was furthest off
        return
    params = [p for p in attn.parameters()]
    xs = [t.clone().requires_grad_() for t in (q, k, v)]
    # rows where the formula is undefined (no score at all) do not enter the loss
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * defined
    wrt = xs + params
    ref_grads = torch.autograd.grad((expected(attn, *xs)[0] * w).sum(), wrt, allow_unused=True)
    for label, run in forms(attn):
        out = run(*xs)
        err = rel_err(out, ref, defined)
        assert err < REL, f"{name} {opts} causal={causal} {kind}: {label} off by {err:.1e} relative"
        grads = torch.autograd.grad((out * w).sum(), wrt, allow_unused=True)
        for i, (g, r) in enumerate(zip(grads, ref_grads)):
            if r is None:
                continue
            what = "qkv"[i] if i < 3 else f"parameter {i - 3}"
            err = rel_err(g, r)
            assert err < REL, f"{name} {opts} causal={causal} {kind}: {label} d{what} off by {err:.1e} relative"


@pytest.mark.parametrize("name,opts,causal", [c for c in cases() if c.values[1] == {}])
def test_float32_within_policy_of_the_formula(name, opts, causal):
    """float32, every CPU form: the formula's own float32 error is the ruler (attnbench.checks.tolerance)."""
    attn64, attn32 = make(name, opts, causal), make(name, opts, causal, torch.float32)
    for kind in ("gaussian", "orthogonal"):
        q, k, v = inputs(kind)
        ref64, defined = expected(attn64, q, k, v)
        ref32, _ = expected(attn32, *(t.float() for t in (q, k, v)))
        with torch.no_grad():
            for label, run in forms(attn32):
                out = run(*(t.float() for t in (q, k, v)))
                assert torch.isfinite(out).all(), f"{name} {kind} {label}: not finite"
                assert_within_policy(out * defined, ref32 * defined, ref64, f"{name} {kind} {label}")


@pytest.mark.skipif(not kernels_available("cpu"), reason="needs triton with TRITON_INTERPRET=1")
@pytest.mark.parametrize("name", [n for n in attnbench.names() if "triton" in attnbench.get_attention(n).impls
                                  and issubclass(attnbench.get_attention(n), FeatureMapAttention)])
def test_triton_form_within_policy_of_the_formula(name):
    """The causal Triton form (features, the chunk kernel, the normaliser) in float32 under the interpreter,
    output and input gradients."""
    attn64, attn32 = make(name, {}, True), make(name, {}, True, torch.float32)
    attn32.chunk_size = 16  # the kernel's chunks are powers of two >= 16; 37 tokens: a ragged last chunk
    x64 = [t.requires_grad_() for t in inputs("orthogonal")]
    x32 = [t.detach().float().requires_grad_() for t in x64]
    x32t = [t.detach().float().requires_grad_() for t in x64]
    ref64, defined = expected(attn64, *x64)
    ref32, _ = expected(attn32, *x32)
    out = attn32.run("triton", *x32t)
    assert torch.isfinite(out).all()
    assert_within_policy(out * defined, ref32 * defined, ref64, f"{name} triton")
    w = torch.randn(ref64.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64) * defined
    g64 = torch.autograd.grad((ref64 * w).sum(), x64)
    g32 = torch.autograd.grad((ref32 * w.float()).sum(), x32)
    gt = torch.autograd.grad((out * w.float()).sum(), x32t)
    for label, a, b, c in zip("qkv", gt, g32, g64):
        assert_within_policy(a, b, c, f"{name} triton d{label}")


@pytest.mark.parametrize("causal", [False, True])
def test_a_query_with_no_score_gives_zero_and_finite_gradients(causal):
    """The one guard left: a denominator that is exactly zero (an all-zero ReLU query) gives 0 and finite
    gradients in every form, the chunk kernel's own normalised mode included."""
    attn = make("relu_linear", {}, causal)
    q, k, v = inputs("gaussian")
    q[:, :, 3] = -1.0                                                                # ReLU(q_3) = 0
    for label, run in forms(attn):
        xs = [t.clone().requires_grad_() for t in (q, k, v)]
        out = run(*xs)
        assert (out[:, :, 3] == 0).all(), label
        assert all(torch.isfinite(g).all() for g in torch.autograd.grad(out.sum(), xs)), label
    if causal and kernels_available("cpu"):
        from attnbench.kernels import chunk_linear_attn

        xs = [F.relu(q).float().requires_grad_(), F.relu(k).float().requires_grad_(), v.float().requires_grad_()]
        out, _ = chunk_linear_attn(*xs, chunk_size=16)
        assert (out[:, :, 3] == 0).all()
        assert all(torch.isfinite(g).all() for g in torch.autograd.grad(out.sum(), xs))


@pytest.mark.parametrize("causal", [False, True])
def test_scaling_the_features_changes_nothing(causal):
    """phi_q * c and phi_k * c' give the same output to rounding, for c, c' from 1e-30 to 1e30 (float64), on every
    mechanism's features: the normaliser has no scale of its own."""
    from attnbench.ops import linear_attn as la

    q, k, v = inputs("gaussian")
    for name in sorted({c.values[0] for c in cases()}):
        attn = make(name, {}, causal)
        fq, fk, vg = streams(attn, q, k, v)[0]
        base = la.linear_attention(fq, fk, vg, causal=causal, chunk_size=CHUNK)
        for cq, ck in ((1e-30, 1e30), (1e-12, 1e-12)):
            for label, out in (("ref", la.linear_attention_reference(fq * cq, fk * ck, vg, causal=causal)),
                               ("fast", la.linear_attention(fq * cq, fk * ck, vg, causal=causal, chunk_size=CHUNK))):
                err = rel_err(out, base)
                assert err < REL, f"{name} causal={causal}: features x ({cq}, {ck}) moved {label} by {err:.1e}"


def released_nala_core(q, k, v):
    """The attention core of the released NaLaFormer code (``NormAwareLinearAttn.forward`` in ``NALA.py``, without
    RoPE, LePE, gate and projections): k cubed, sign split, the query direction to the power 3 (0.5 + tanh||q||),
    ``z = 1 / (q . mean_j k_j + 1e-6)``, ``kv = sum_j k_j^T v_j / N``, ``o = (q kv) z``. Written from its math."""
    n = q.shape[-2]
    k = k ** 3
    qn = q.norm(dim=-1, keepdim=True)
    power = 3 * (0.5 + torch.tanh(qn))
    qf = torch.cat([(F.relu(q) / qn) ** power, (F.relu(-q) / qn) ** power], -1)
    kf = torch.cat([F.relu(k), F.relu(-k)], -1)
    z = 1 / (qf @ kf.mean(dim=-2, keepdim=True).transpose(-2, -1) + 1e-6)
    kv = (kf.transpose(-2, -1) * n ** -0.5) @ (v * n ** -0.5)
    return qf @ kv * z


@pytest.mark.parametrize("kind", ["gaussian", "orthogonal"])
def test_nala_sign_split_is_the_released_core(kind):
    """``sign_split=True`` computes the released code's function: in float64 to rounding, in float32 (the released
    code's precision) to 1e-5 relative."""
    attn = attnbench.build("nala", heads=H, head_dim=D, sign_split=True).double()
    attn.block_size, attn.chunk_size = BLOCK, CHUNK
    q, k, v = inputs(kind)
    ref = released_nala_core(q, k, v)
    for impl in ("reference", "torch"):
        assert rel_err(attn.run(impl, q, k, v), ref) < REL, impl
        out32 = attn.float().run(impl, q.float(), k.float(), v.float())
        attn.double()
        assert rel_err(out32, ref) < 1e-5, f"{impl} float32"
