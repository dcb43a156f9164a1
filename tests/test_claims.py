"""The claims suite: every check on small inputs, each beside a constructed case that flips its verdict (so no check
can only ever pass), the verdict rule, and the command end to end (records, resume, table, bad input)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnbench.api.registry import build
from attnbench.api.spec import parse_spec
from attnbench.suites.claims import checks as claims_checks
from attnbench.suites.claims.criteria import Criterion, Statistic, spearman, spearman_pooled
from attnbench.suites.claims.inputs import TeacherRef

CHECKS = claims_checks.checks()


def measure(check: str, spec, inp: str, **kw):
    spec = parse_spec(spec) if isinstance(spec, str) else spec
    return CHECKS[check].measure(spec, inp, **kw)


class FakeSpec:
    """A mechanism the registry does not have, built by ``make(heads, head_dim, seq_len)``: the constructed cases."""

    def __init__(self, name, make, label=None):
        self.name, self.label, self.options, self._make = name, label or name, {}, make

    def build(self, *, heads, head_dim, seq_len=None, **_):
        return self._make(heads, head_dim, seq_len)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    """A softmax ViT of the vision/tiny preset (random weights: the checks' mechanics, not the paper's numbers)."""
    from attnbench.image.classify import build_classifier
    from attnbench.suites.vision.config import load_preset

    torch.manual_seed(0)
    model = build_classifier(parse_spec("softmax"), load_preset("tiny"), 10)
    path = tmp_path_factory.mktemp("teacher") / "softmax.pt"
    torch.save(model.state_dict(), path)
    return TeacherRef(path, None, "vision/tiny", "test-random")


# --- the verdict rule ---------------------------------------------------------------------------------------------
def test_verdict_rule_uses_the_whole_interval():
    c = Criterion("x", "<", 0.0, 0.0, "x < 0")
    assert c.verdict(Statistic(-0.5, -0.6, -0.4, "ci")) == "holds"
    assert c.verdict(Statistic(0.5, 0.4, 0.6, "ci")) == "fails"
    assert c.verdict(Statistic(-0.1, -0.3, 0.1, "ci")) == "inconclusive"  # within noise
    assert c.verdict(Statistic(float("nan"), float("nan"), float("nan"))) == "inconclusive"
    band = Criterion("x", ">", 1.0, 0.5, "x > 1")
    assert band.verdict(Statistic.exact(0.7)) == "inconclusive"  # between fails_at and holds_at
    assert band.verdict(Statistic(3.0, 3.0, math.inf, "censored")) == "holds"
    with pytest.raises(ValueError):
        Criterion("x", "<", 0.0, -1.0, "fails_at on the claimed side")


def test_a_statistic_is_shown_with_its_interval_or_why_it_has_no_value():
    from attnbench.suites.claims.leaderboard import st_short

    assert st_short(Statistic.exact(0.5).to_dict()) == "0.5"
    assert st_short(Statistic(1.73, 1.73, math.inf, "censored").to_dict()) == "1.73 [1.73, inf]"
    nan = float("nan")
    assert st_short(Statistic(nan, nan, nan, "neither converged").to_dict()) == "no value (neither converged)"
    assert st_short({"value": None}) == "-"


def test_spearman_interval_and_pooling():
    x = list(range(100))
    st, p = spearman(x, [-v for v in x])
    assert st.value == pytest.approx(-1.0) and p < 1e-10
    # ties take their average rank: ρ of (1, 2, 2, 3, 4) against (1, 2, 3, 4, 5) is Pearson's r of the ranks
    st, _ = spearman([1, 2, 2, 3, 4], [1, 2, 3, 4, 5])
    assert st.value == pytest.approx(float(np.corrcoef([1, 2.5, 2.5, 4, 5], [1, 2, 3, 4, 5])[0, 1]))
    rng = np.random.default_rng(0)
    st, p = spearman(rng.normal(size=500), rng.normal(size=500))
    assert st.lo < 0 < st.hi and p > 0.01
    # two groups each perfectly increasing, but offset so that pooled naively they would anti-correlate
    pooled, per = spearman_pooled([(x, [v + 1000 for v in x]), ([v + 100 for v in x], x)])
    assert per == pytest.approx([1.0, 1.0]) and pooled.lo > 0.9


# --- NaLaFormer ---------------------------------------------------------------------------------------------------
SMALL_ENTROPY = {}  # the defaults (2048 queries): fewer leave ReLU's ρ ≈ 0 within the ±0.1 band's noise


def test_nala_entropy_softmax_holds_and_a_norm_unaware_map_flips(monkeypatch):
    assert measure("nala-entropy", "softmax", "synthetic", **SMALL_ENTROPY).verdict == "holds"
    r = measure("nala-entropy", "relu_linear", "synthetic", **SMALL_ENTROPY)
    assert r.verdict == "holds"  # Theorem 2: ReLU is homogeneous, its entropy ignores ‖q‖
    from attnbench.suites.claims.checks import nala

    # the same norm-unaware map judged against the negative correlation the paper claims for NaLa: must fail
    monkeypatch.setattr(nala, "NEGATIVE", ("relu_linear",))
    assert measure("nala-entropy", "relu_linear", "synthetic", **SMALL_ENTROPY).verdict == "fails"


def test_attention_rows_are_the_mechanisms_matrix():
    from attnbench.suites.claims.checks.nala import attention_rows, pse

    q, k = torch.randn(1, 1, 16, 8), torch.randn(1, 1, 16, 8)
    A = attention_rows(parse_spec("softmax"), q, k)
    assert torch.allclose(A, torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8), -1), atol=1e-6)
    assert pse(torch.ones(3, 4)).tolist() == pytest.approx([math.log(4)] * 3)


def test_nala_nonneg_holds_and_a_signed_map_fails():
    assert measure("nala-nonneg", "nala", "synthetic", batch=1, tokens=128).verdict == "holds"

    class Identity(torch.nn.Module):  # raw q·k: negative scores
        def phi_q_reference(self, x):
            return x

        phi_k_reference = phi_q_reference

    class Holder:
        feature_map = Identity()

    r = measure("nala-nonneg", FakeSpec("identity-map", lambda h, d, n: Holder()), "synthetic", batch=1, tokens=64)
    assert r.verdict == "fails" and r.details["negative_fraction"] > 0.3


def test_real_inputs_come_from_the_teacher(teacher):
    r = measure("nala-entropy", "softmax", "real", teacher=teacher)
    assert r.details["queries"] == 4 * 64 * 2 * 65 and "real" in r.source
    with pytest.raises(claims_checks.Skip):
        measure("nala-entropy", "softmax", "real", teacher=None)


# --- MirrorLA -----------------------------------------------------------------------------------------------------
def test_mirrorla_isometry_holds_for_pure_reflections_and_fails_for_per_input_angles(teacher):
    plain = "mirrorla:cross_head=False:variance_aware=False"
    assert measure("mirrorla-isometry", plain, "synthetic", tokens=64).verdict == "holds"
    assert measure("mirrorla-isometry", plain, "real", teacher=teacher).verdict == "holds"
    # q and k reflected by different (variance-dependent) angles: not an isometry of the pair
    r = measure("mirrorla-isometry", "mirrorla:cross_head=False", "synthetic", tokens=64)
    assert r.verdict == "fails" and r.statistic.value > 1e-3
    # the cross-head mirror keeps the H*d inner product but not each head's
    r = measure("mirrorla-isometry", "mirrorla:variance_aware=False", "synthetic", tokens=64)
    assert r.verdict == "fails" and r.details["max_deviation_all_heads"] < 1e-12


def test_mirrorla_truncation_holds_when_energy_is_negative_and_fails_when_isotropic(tmp_path):
    small = {"steps": 40}
    r = measure("mirrorla-truncation", "mirrorla", "shifted", figure=tmp_path / "t.png", **small)
    assert r.verdict == "holds" and r.details["energy_no_reflection"] < 0.2 and Path(r.figure).is_file()
    # an orthogonal map cannot change the surviving energy of an isotropic input in expectation
    assert measure("mirrorla-truncation", "mirrorla", "isotropic", **small).verdict == "fails"


# --- LaplacianFormer ----------------------------------------------------------------------------------------------
def test_laplacian_distance_heavy_tails_hold_and_one_dimension_flips():
    small = {"tokens": 128, "pairs": 4000}
    assert measure("laplacian-distance", "laplacian", "student-t", **small).verdict == "holds"
    r = measure("laplacian-distance", "laplacian", "student-t", dim=1, **small)  # L1 = L2 in one dimension
    assert r.verdict == "fails" and r.statistic.value == pytest.approx(0.0, abs=1e-9)


SOLVER = {"batch": 2, "tokens": 128}


def test_newton_schulz_converges_and_a_solver_stopped_early_fails():
    r = measure("laplacian-ns", "laplacian", "tied", **SOLVER)
    assert r.verdict == "holds" and r.statistic.value < 1e-8
    assert measure("laplacian-ns", "laplacian:ns_iters=2", "tied", **SOLVER).verdict == "fails"


LITERAL = "laplacian:lam=4:qk_scale=none:ns_iters=20:ns_grad=unrolled:landmark_pool=segment:landmark_set=untied"


def test_laplacian_default_pseudo_inverse_converges_on_real_qk_and_the_literal_reading_does_not(teacher):
    """The default reading's Newton–Schulz inverse of the landmark matrices of a ViT's real q, k is within the
    tolerance of torch.linalg.pinv; the literal reading (no q/k scaling, 20 iterations) is not."""
    r = measure("laplacian-ns", "laplacian", "real", teacher=teacher)
    assert r.verdict == "holds", (r.statistic, r.details["error_by_iteration_worst"][:5])
    lit = measure("laplacian-ns", LITERAL, "real", teacher=teacher)
    assert lit.verdict == "fails" and lit.statistic.value > 10 * r.statistic.value


def test_ns_vs_cg_ns_wins_when_ill_conditioned_cg_when_eigenvalues_are_few():
    # untied landmarks: W not symmetric, CG on the normal equations
    assert measure("laplacian-ns-vs-cg", "laplacian:landmark_set=untied", "synthetic", **SOLVER).verdict == "holds"
    from attnbench.suites.claims.checks import laplacian

    # CG solves a matrix with two distinct eigenvalues in two iterations; NS needs its warm-up
    P = torch.diag(torch.tensor([1.0] * 8 + [100.0] * 8, dtype=torch.float64)).unsqueeze(0)
    exact = torch.linalg.pinv(P)
    cg, per = laplacian.cg_errors(P, exact, 4)
    ns = laplacian.ns_errors(P, exact, 2, "norm1inf")
    assert per == 1 and cg[2].max() < 1e-10 < ns[2].max()
    assert measure("laplacian-ns-vs-cg", "laplacian", "tied", **SOLVER).verdict == "fails"


def test_ns_vs_cg_reports_the_error_at_ns_iters_beyond_its_horizon():
    r = measure("laplacian-ns-vs-cg", "laplacian", "tied", batch=1, tokens=32, curve=2)
    assert r.details["ns_iters"] == 40 and r.details["ns_error_at_ns_iters"] < 1e-6


def test_nystrom_approaches_the_exact_attention_and_an_unsolved_inverse_does_not(teacher):
    small = {"batch": 1, "tokens": 64}
    # ridge 0.1: at 32 segment landmarks of 16 four-token clusters, neighbouring landmarks nearly coincide and the
    # converged inverse of W + 0.01 I amplifies that (the default's distances are then not monotone in m)
    r = measure("laplacian-nystrom", "laplacian:ns_ridge=0.1", "synthetic", **small)
    assert r.verdict == "holds" and r.details["distance"][-1] < 0.1 * r.details["distance"][0]
    assert measure("laplacian-nystrom", "laplacian:ns_ridge=0.1:ns_iters=0", "synthetic", **small).verdict != "holds"
    # the exact form is the mechanism's own math with the full kernel: m = N and an exact pseudo-inverse agree
    from attnbench.suites.claims.checks.laplacian import exact_laplacian_attention

    q, k, v = (torch.randn(1, 1, 16, 4, dtype=torch.float64) * 0.3 for _ in range(3))
    attn = build("laplacian", heads=1, head_dim=4, landmarks=16, ns_iters=60, ns_ridge=0.0)
    assert torch.allclose(attn.reference(q, k, v), exact_laplacian_attention(q, k, v, 4.0, 1e-6, attn.qk_scale),
                          atol=1e-6)


# --- MixA / SteLLA ------------------------------------------------------------------------------------------------
VAR = {"sizes": [64, 256, 1024], "draws": 2}


def test_stella_variance_bounded_and_without_the_1_over_n_it_grows():
    assert measure("stella-variance", "stella", "synthetic", **VAR).verdict == "holds"

    def unscaled(h, d, n):  # SteLLA with alpha * N = 1: Theorem 5.2's O(N^2) left in
        a = build("stella", heads=h, head_dim=d)
        a.alpha.data.fill_(1.0 / n)
        return a

    # judged by SteLLA's own claim (the name), measured without its 1/N
    r = measure("stella-variance", FakeSpec("stella", unscaled, "stella without 1/N"), "synthetic", **VAR)
    assert r.verdict == "fails" and r.statistic.value > 1.5


# --- memory -------------------------------------------------------------------------------------------------------
MEM = {"sizes": [256, 1024, 4096], "softmax_cap_bytes": 2 * 4096 * 4096 * 4}


def test_memory_linear_holds_and_a_quadratic_mechanism_fails():
    r = measure("memory", "nala", "synthetic", **MEM)
    assert r.verdict == "holds" and r.details["ratio_at_largest_common_n"] < 0.2
    quad = FakeSpec("softmax-eager", lambda h, d, n: build("softmax", heads=h, head_dim=d, impl="reference"))
    r = measure("memory", quad, "synthetic", **MEM)
    assert r.verdict == "fails" and r.statistic.value > 1.5
    r = measure("memory", "nala", "synthetic", sizes=[256, 1024], softmax_cap_bytes=2 * 256 * 256 * 4)
    assert r.details["softmax_size_limited"] == [1024]  # beyond the cap: recorded, not run


# --- ViT-AdaLA ----------------------------------------------------------------------------------------------------
ADALA = {"train_images": 32, "test_images": 16, "steps": 5, "batch": 8}


def test_adala_errors_accumulate_and_flip_when_later_blocks_are_identities(teacher, tmp_path):
    r = measure("adala-depth", "linear", "real", teacher=teacher, **ADALA)
    assert r.verdict == "holds" and r.details["layers"] == 4
    # blocks 2..4 add nothing to the residual stream: the error after the last block is the first block's
    state = torch.load(teacher.path)
    for i in (1, 2, 3):
        for key in (f"blocks.{i}.attn.proj.weight", f"blocks.{i}.attn.proj.bias", f"blocks.{i}.mlp.fc2.weight",
                    f"blocks.{i}.mlp.fc2.bias"):
            state[key].zero_()
    path = tmp_path / "flat.pt"
    torch.save(state, path)
    r = measure("adala-depth", "linear", "real", teacher=TeacherRef(path, None, "vision/tiny", "flat"), **ADALA)
    assert r.verdict == "fails" and r.statistic.value == pytest.approx(1.0)
    with pytest.raises(claims_checks.Skip):
        measure("adala-depth", "linear", "real", teacher=None, **ADALA)


# --- the command --------------------------------------------------------------------------------------------------
def test_checks_have_unique_names_defaults_that_build_and_settings_checked():
    from attnbench.suites.claims.leaderboard import ORDER

    assert list(CHECKS) == list(ORDER)
    for c in CHECKS.values():
        for m in c.defaults:
            assert c.accepts(parse_spec(m)), (c.name, m)
    with pytest.raises(TypeError, match="unknown setting"):
        measure("memory", "nala", "synthetic", sizez=[1])


def test_run_records_verdicts_skips_real_inputs_without_a_teacher_and_resumes(tmp_path):
    from rich.console import Console

    from attnbench.results.store import Store
    from attnbench.suites.claims.runner import run_claims

    db, out = str(tmp_path / "c.db"), tmp_path / "fig"
    console = Console(file=open(tmp_path / "log.txt", "w"), width=200)
    s = run_claims(only="nala-nonneg", db=db, out=str(out), console=console, progress=False)
    assert s.exit_code() == 0
    with Store(db) as st:
        recs = {r.params["input"]: r for r in st.measurements(suite="claims")}
    assert recs["synthetic"].status == "ok" and recs["synthetic"].metrics["verdict"] == "holds"
    assert Path(recs["synthetic"].metrics["figure"]).name == "nala-nonneg--nala--synthetic.png"
    assert (out / "nala-nonneg--nala--synthetic.png").is_file()
    assert recs["real"].status == "skipped" and "attnbench run vision" in recs["real"].metrics["reason"]
    again = run_claims(only="nala-nonneg", db=db, out=str(out), console=console, progress=False)
    assert all(o.skipped for o in again.outcomes)  # finished cells are not measured twice
    from attnbench.views import tables

    text = Console(record=True, width=250)
    tables.table("claims", db=db, console=text, fmt="markdown", committed=False)
    table = text.export_text()
    assert "| nala-nonneg | nala | synthetic | 1.9" in table and "| holds |" in table and "| skipped |" in table


def test_attn_filter_keeps_the_mechanisms_each_check_accepts():
    from attnbench.suites.claims.runner import plan_cells, select_checks

    cells = plan_cells(select_checks(None, None), [parse_spec("nala:lam=2")], seed=0, teacher=None)
    tasks = {c.task for c in cells}
    assert tasks == {"nala-entropy", "nala-nonneg", "memory", "adala-depth"}
    assert all(c.options == {"lam": 2.0} for c in cells)
    # softmax is the baseline inside every memory cell, and laplacian's whitened rows are no distribution
    assert {c.task for c in plan_cells(select_checks(None, None), [parse_spec("softmax")], seed=0, teacher=None)} \
        == {"nala-entropy", "adala-depth"}
    assert "nala-entropy" not in {c.task for c in plan_cells(select_checks(None, None), [parse_spec("laplacian")],
                                                              seed=0, teacher=None)}


def test_bad_names_are_one_line_errors():
    from typer.testing import CliRunner

    from attnbench.cli.main import app

    res = CliRunner().invoke(app, ["run", "claims", "--only", "nala-entropyy"])
    assert res.exit_code == 2 and "did you mean 'nala-entropy'" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["run", "claims", "--attn", "mirorla"])
    assert res.exit_code == 2 and "did you mean 'mirrorla'" in res.output
