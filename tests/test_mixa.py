"""MixA (suites/mixa): the Eq. 3 score against a finite-difference loss change, the top-k selection and the mixed
ViT it implies, KD, and the tiny pipeline end to end (teacher, MixA, controls) into the store."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import pytest
import torch
from rich.console import Console

from attnbench.core.errors import AttnbenchError
from attnbench.models.vit import build_vit, load_pretrained
from attnbench.api.spec import parse_spec
from attnbench.results.store import Store
from attnbench.suites.mixa import score as S
from attnbench.suites.mixa.config import load_preset
from attnbench.suites.mixa.train import kd_loss, run_mixa

QUIET = Console(file=open(os.devnull, "w"), width=200)


def tiny_teacher(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return build_vit(parse_spec("softmax"), size="cpu", img_size=16, patch_size=4, num_classes=10).to(dtype).eval()


def data(n=4, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g, dtype=dtype), torch.randint(0, 10, (n,), generator=g)


# --- Eq. 3 ------------------------------------------------------------------------------------------------------
def test_the_probe_is_the_teachers_forward_and_leaves_it_unchanged():
    model = tiny_teacher()
    x, _ = data()
    with torch.no_grad():
        ref = model(x)
        with S.probed(model) as probes:
            out = model(x)
            assert all(p.A.shape == (4, 2, 17, 17) for p in probes)
            torch.testing.assert_close(probes[0].A.sum(-1), torch.ones(4, 2, 17, dtype=torch.float64))
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        assert [b.attn.mech.name for b in model.blocks] == ["softmax"] * 4  # restored
        torch.testing.assert_close(model(x), ref, rtol=0, atol=0)


@pytest.mark.parametrize("form", ["effective", "eq7"])
def test_the_score_is_the_first_order_loss_change_of_moving_a_layers_matrix_toward_stella(form):
    """Tr(∇_A L^T ΔA) summed over heads (before |.|) = d/dε L(A + ε ΔA) at ε = 0, per layer, and per head."""
    model = tiny_teacher()
    x, y = data()
    sc = S.layer_scores(model, [(x, y)], form=form)
    assert len(sc.scores) == 4 and all(len(t) == 2 for t in sc.traces)
    for layer in range(4):
        dA = S.attention_change(model, x, layer, form)  # [B, H, N, N]
        eps = 1e-4 if form == "effective" else 1e-6  # eq7's ΔA is ~N times larger
        fd = (S.loss_with_delta(model, x, y, layer, eps * dA) - S.loss_with_delta(model, x, y, layer, -eps * dA)) / (2 * eps)
        assert sum(sc.traces[layer]) == pytest.approx(fd, rel=1e-5, abs=1e-9), layer
        for h in range(2):  # one head's matrix moved alone: that head's trace term
            only = torch.zeros_like(dA)
            only[:, h] = dA[:, h]
            fd_h = (S.loss_with_delta(model, x, y, layer, eps * only)
                    - S.loss_with_delta(model, x, y, layer, -eps * only)) / (2 * eps)
            assert sc.traces[layer][h] == pytest.approx(fd_h, rel=1e-5, abs=1e-9), (layer, h)
        assert sc.scores[layer] == pytest.approx(sum(abs(t) for t in sc.traces[layer]) / 2)  # Eq. 3's |.| mean
    # over several batches: the mean of the per-batch trace terms (the mean loss's first-order change)
    x2, y2 = data(seed=2)
    a, b = S.layer_scores(model, [(x, y)], form=form), S.layer_scores(model, [(x2, y2)], form=form)
    both = S.layer_scores(model, [(x, y), (x2, y2)], form=form)
    assert both.batches == 2 and both.images == 8
    for layer in range(4):
        for h in range(2):
            assert both.traces[layer][h] == pytest.approx((a.traces[layer][h] + b.traces[layer][h]) / 2)
    assert all(p.grad is None for p in model.parameters())  # the teacher got no gradients


def test_the_linear_matrix_is_stellas_own():
    """The 'effective' A' times V is SteLLA's output (Eqs. 6-7, α' = β' = 1) on the same q, k, v."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 9, 8, dtype=torch.float64) for _ in range(3))
    mech = parse_spec("stella").build(heads=2, head_dim=8).double()
    torch.testing.assert_close(S.linear_matrix(q, k) @ v, mech(q, k, v))
    torch.testing.assert_close(S.linear_matrix(q, k, "eq7"), 9 * S.linear_matrix(q, k))
    with pytest.raises(AttnbenchError, match="linear_matrix must be one of"):
        S.linear_matrix(q, k, "rowsum")


def test_scoring_a_non_softmax_model_is_a_clear_error():
    m = build_vit(parse_spec("stella"), size="cpu", img_size=16, patch_size=4, num_classes=10)
    with pytest.raises(AttnbenchError, match="layer 0 of the teacher is 'stella'"):
        S.layer_scores(m, [data(dtype=torch.float32)])


# --- selection ----------------------------------------------------------------------------------------------------
def test_top_k_picks_exactly_k_layers_and_builds_the_mixed_model_the_scores_imply(tmp_path):
    scores = [0.3, 0.9, 0.1, 0.9, 0.5]
    assert S.top_k(scores, 2) == [1, 3]
    assert S.top_k(scores, 3) == [1, 3, 4] and S.top_k(scores, 0) == [] and S.top_k(scores, 5) == [0, 1, 2, 3, 4]
    assert S.top_k([1.0, 1.0, 1.0], 2) == [0, 1]  # ties to the earlier layer
    with pytest.raises(AttnbenchError, match="k must be an integer from 0 to the number of layers"):
        S.top_k(scores, 6)

    teacher = tiny_teacher(torch.float32)
    path = tmp_path / "t.pt"
    torch.save(teacher.state_dict(), path)
    sc = S.layer_scores(teacher, [data(dtype=torch.float32)])
    chosen = S.top_k(sc.scores, 2)
    assert len(chosen) == 2 and min(sc.scores[i] for i in chosen) >= max(
        sc.scores[i] for i in range(4) if i not in chosen)
    specs = S.mixed_specs(4, chosen)
    mixed = build_vit(specs, size="cpu", img_size=16, patch_size=4, num_classes=10)
    missing = load_pretrained(mixed, path)
    names = [b.attn.mech.name for b in mixed.blocks]
    assert names == ["relu_quadratic" if i in chosen else "stella" for i in range(4)]
    assert sorted({k.split(".")[-1] for k in missing}) == ["alpha", "beta"]  # α', β' start at 1
    for b, t in zip(mixed.blocks, teacher.blocks):
        assert torch.equal(b.attn.qkv.weight, t.attn.qkv.weight) and b.attn.mech.alpha.item() == 1.0

    assert S.last_k(4, 2) == [2, 3]
    assert S.random_k(4, 2, 0) == S.random_k(4, 2, 0) and len(set(S.random_k(12, 6, 1))) == 6
    assert len({tuple(S.random_k(12, 6, s)) for s in range(5)}) > 1


def test_kd_loss_is_hintons():
    torch.manual_seed(0)
    s, t, y = torch.randn(5, 10), torch.randn(5, 10), torch.randint(0, 10, (5,))
    ce = torch.nn.CrossEntropyLoss()
    assert kd_loss(s, s, y, temperature=4.0, alpha=1.0, criterion=ce).item() == pytest.approx(0.0, abs=1e-6)
    assert kd_loss(s, t, y, temperature=4.0, alpha=0.0, criterion=ce).item() == pytest.approx(ce(s, y).item())
    T = 2.0
    p_t = torch.softmax(t / T, -1)
    kl = (p_t * (p_t.log() - torch.log_softmax(s / T, -1))).sum(-1).mean()
    got = kd_loss(s, t, y, temperature=T, alpha=0.3, criterion=ce).item()
    assert got == pytest.approx(0.3 * T * T * kl.item() + 0.7 * ce(s, y).item(), rel=1e-5)


# --- the pipeline ---------------------------------------------------------------------------------------------------
def small_preset():
    pre = load_preset("tiny")
    vp = pre.vision
    vp = dataclasses.replace(vp, data=dataclasses.replace(vp.data, image_size=8),  # 4 patches + class token
                             recipe=dataclasses.replace(vp.recipe, eval_batch_size=16))
    return dataclasses.replace(pre, vision=vp,
                               train=dataclasses.replace(pre.train, steps=2, warmup=1, eval_every=2, batch_size=16),
                               score=dataclasses.replace(pre.score, batches=2, batch_size=16),
                               controls=dataclasses.replace(pre.controls, random_seeds=[5]))


def test_the_tiny_pipeline_records_teacher_mixa_and_controls(tmp_path):
    from attnbench.suites.mixa.leaderboard import measured_tables
    from attnbench.image.classify import build_classifier

    pre = small_preset()
    torch.manual_seed(0)
    teacher = build_classifier(parse_spec("softmax"), pre.vision, 10)
    path = tmp_path / "teacher.pt"
    torch.save(teacher.state_dict(), path)
    db = str(tmp_path / "m.db")
    summary = run_mixa(preset=pre, teacher=str(path), db=db, out=str(tmp_path / "w"), console=QUIET,
                       progress=False)
    assert summary.exit_code() == 0
    with Store(db) as st:
        recs = {m.attention: m for m in st.measurements(suite="mixa")}
    assert set(recs) == {"teacher", "mixa", "all-stella", "last-k", "random-k:seed=5"}
    assert all(m.status == "ok" and m.setting == "mixa/tiny" for m in recs.values())
    scores = recs["mixa"].metrics["scores"]
    selected = S.top_k(scores, 2)
    for m in recs.values():  # the scores and the chosen layers are in every cell
        assert m.metrics["scores"] == scores and m.params["selected_layers"] == selected
        assert m.metrics["infer_images_per_s"] > 0 and m.metrics["infer_peak_mem_bytes"] > 0
        assert m.metrics["flops_per_image"] > 0 and 0.0 <= m.metrics["test_top1"] <= 1.0
    assert recs["mixa"].params["quadratic_layers"] == selected
    assert recs["mixa"].params["specs"] == [("relu_quadratic" if i in selected else "stella") for i in range(4)]
    assert recs["all-stella"].params["specs"] == ["stella"] * 4
    assert recs["last-k"].params["quadratic_layers"] == [2, 3]
    assert recs["random-k:seed=5"].params["quadratic_layers"] == S.random_k(4, 2, 5)
    assert recs["teacher"].params["specs"] == ["softmax"] * 4
    assert recs["mixa"].metrics["teacher_test_top1"] == recs["teacher"].metrics["test_top1"]
    assert recs["mixa"].metrics["steps_run"] == 2 and recs["mixa"].impl
    (title, header, rows, cap), = measured_tables(recs.values(), "measured")
    assert [r[0] for r in rows][:4] == ["teacher", "mixa", "all-stella", "last-k"] and "top-1" in header
    assert f"→ top-2 {selected}" in cap

    again = run_mixa(preset=pre, teacher=str(path), db=db, out=str(tmp_path / "w"), console=QUIET, progress=False)
    assert again.exit_code() == 0 and all(o.skipped for o in again.outcomes)  # finished cells are skipped


def test_the_cli_refuses_a_k_beyond_the_layers_in_one_line(tmp_path):
    env = {**os.environ, "COLUMNS": "200"}
    p = subprocess.run([sys.executable, "-m", "attnbench.cli.main", "run", "mixa", "--k", "5", "--db",
                        str(tmp_path / "m.db")], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "k must be an integer from 0 to the number of layers (4), got 5" in p.stdout
    assert "Traceback" not in p.stdout + p.stderr


# --- the smoke: the whole pipeline of each preset on the CPU ---------------------------------------------------
@pytest.mark.parametrize("name", __import__("attnbench.suites.mixa.config", fromlist=["x"]).preset_names())
def test_each_presets_smoke_runs_every_variant_and_resumes_each(name, monkeypatch, tmp_path):
    """Teacher trained by the vision suite, Eq. 3 scores, the mix and every control fine-tuned, each stopped once
    and resumed from its step-1 checkpoint, the cost lines; nothing written into the project."""
    import io
    import re

    from attnbench.suites.mixa.smoke import run_smoke

    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    buf = io.StringIO()
    rc = run_smoke(preset=name, console=Console(file=buf, width=300))
    out = buf.getvalue()
    assert rc == 0, out[-3000:]
    pre = load_preset(name)
    n_variants = 1 + pre.controls.all_stella + pre.controls.last_k + len(pre.controls.random_seeds)
    assert out.count("planned stop in step 2") == n_variants and "smoke ok" in out
    lines = re.findall(r"full run: ([\d,]+) steps x ([\d,]+) images", out)
    assert len(lines) == 1 + n_variants and lines[-1][0].replace(",", "") == str(pre.train.steps)
    assert not (tmp_path / "results").exists()
