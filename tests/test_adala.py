"""ViT-AdaLA pipeline (suites/adala): stage 1 starts from the teacher's W_Q, W_K, W_V and trains nothing else;
each stage lowers its own objective on the tiny teacher; ``attnbench run adala`` runs end to end (teacher trained
first, from-scratch row, records, leaderboard). A smaller variant of the tiny preset (16x16 digits, a 150-step
teacher, 20-step stages) keeps the whole file under a minute on two CPU cores."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

VISION = """
name = "tiny-test"
setting = "vision/tiny-test"
[data]
kind = "digits"
image_size = 16
[model]
size = "cpu"
patch_size = 4
drop_path = 0.0
[train]
steps = 150
batch_size = 64
lr = 3e-3
weight_decay = 0.05
schedule = "cosine"
warmup = 15
eval_every = 50
metric = "top1"
mode = "max"
[recipe]
eval_batch_size = 512
[sweep]
resolutions = []
batch = 4
"""

ADALA = """
name = "tiny-test"
setting = "adala/tiny-test"
vision = "vision.toml"
[adala]
lam = 1.0
ablation = ["3", "1,2,3"]
[stage1]
steps = 20
batch_size = 32
lr = 1e-2
schedule = "constant"
eval_every = 10
metric = "loss"
mode = "min"
[stage2]
steps = 20
batch_size = 32
lr = 1e-3
schedule = "constant"
eval_every = 10
metric = "loss"
mode = "min"
[stage3]
steps = 20
batch_size = 32
lr = 3e-3
schedule = "constant"
eval_every = 10
metric = "top1"
mode = "max"
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Preset files, and one CLI run (``--stages 1,2,3``) that trains the teacher and the from-scratch model."""
    from typer.testing import CliRunner

    from attnbench.cli.main import app

    d = tmp_path_factory.mktemp("adala")
    (d / "vision.toml").write_text(VISION)
    (d / "adala.toml").write_text(ADALA)
    db, out = str(d / "r.db"), str(d / "out")
    res = CliRunner().invoke(app, ["run", "adala", "--preset", str(d / "adala.toml"), "--attn", "linear",
                                   "--db", db, "--out", out])
    return {"dir": d, "db": db, "out": out, "result": res}


@pytest.fixture(scope="module")
def parts(env):
    from attnbench.image.classify import load_splits
    from attnbench.image.teacher import get_teacher
    from attnbench.suites.adala.config import load_preset

    pre = load_preset(env["dir"] / "adala.toml")
    vpre = pre.load_vision()
    splits = load_splits(vpre, None)
    t = get_teacher(vpre, splits, db=env["db"], work=Path(env["out"]) / "vision")
    assert t.origin == "trained before"  # trained by the CLI run, found again
    return pre, vpre, splits, t.model


def _student(parts, name="linear"):
    from attnbench.api.spec import parse_spec
    from attnbench.suites.adala.pipeline import build_student

    pre, vpre, splits, teacher = parts
    return build_student(parse_spec(name), vpre, splits.num_classes, teacher)


def _stage(parts, k, student, tmp_path, **kw):
    from attnbench.engine.train.dist import Dist
    from attnbench.suites.adala.pipeline import run_stage

    pre, vpre, splits, teacher = parts
    return run_stage(k, student, teacher, pre, vpre, splits, seed=0, device=torch.device("cpu"), dist=Dist(),
                     identity=f"t{k}", checkpoint=tmp_path / f"s{k}.pt", **kw)


def test_end_to_end_cli_records(env):
    from attnbench.results.store import Store

    res = env["result"]
    assert res.exit_code == 0, res.output
    assert "adala/tiny-test" in res.output
    with Store(env["db"]) as store:
        recs = {(m.task, m.attention): m for m in store.measurements(suite="adala") if m.status == "ok"}
        vision = [m for m in store.measurements(suite="vision") if m.status == "ok"]
    assert set(recs) == {("teacher", "softmax"), ("scratch", "linear"), ("stages 1+2+3", "linear")}
    assert vision == []  # the teacher and the from-scratch model are trained by attnbench.image, kept in WORK/vision
    kept = sorted(p.name.split("-")[0] for p in (Path(env["out"]) / "vision" / "models").rglob("*.pt"))
    assert kept == ["linear", "softmax"]
    m = recs[("stages 1+2+3", "linear")].metrics
    assert set(m["stages"]) == {"1", "2", "3"}
    for k in "123":
        s = m["stages"][k]
        assert len(s["train_loss"]) == 20 and s["val_history"] and 0 <= s["test_top1"] <= 1
    assert m["stages"]["1"]["metric"] == "loss" and m["stages"]["3"]["metric"] == "top1"
    for rec in recs.values():
        for key in ("score", "infer_images_per_s", "infer_peak_mem_bytes", "flops_per_image", "n_params"):
            assert rec.metrics[key] is not None, key
    assert recs[("scratch", "linear")].params["steps"] == 60  # the pipeline's budget


def test_ablation_reuses_teacher_and_records_stage_sets(env):
    from typer.testing import CliRunner

    from attnbench.cli.main import app
    from attnbench.results.store import Store

    res = CliRunner().invoke(app, ["run", "adala", "--preset", str(env["dir"] / "adala.toml"), "--attn", "linear",
                                   "--ablation", "--no-scratch", "--db", env["db"], "--out", env["out"]])
    assert res.exit_code == 0, res.output
    assert "training it" not in res.output and "no softmax teacher" not in res.output
    with Store(env["db"]) as store:
        tasks = {m.task for m in store.measurements(suite="adala") if m.status == "ok"}
    assert {"stages 3", "stages 1+2+3", "teacher"} <= tasks
    assert "after 1 / 2" in res.output  # the leaderboard


def test_stage1_starts_from_teacher_qkv_and_trains_only_qkv(parts, tmp_path):
    pre, vpre, splits, teacher = parts
    student = _student(parts)
    t_sd = {k: v.clone() for k, v in teacher.state_dict().items()}
    for i, blk in enumerate(student.blocks):  # W_Q, W_K, W_V (fused qkv) equal to the teacher's block's
        assert torch.equal(blk.attn.qkv.weight, teacher.blocks[i].attn.qkv.weight)
        assert torch.equal(blk.attn.qkv.bias, teacher.blocks[i].attn.qkv.bias)
    rec = _stage(parts, 1, student, tmp_path)
    n_qkv = sum(p.numel() for b in student.blocks for p in b.attn.qkv.parameters())
    assert rec["n_trainable"] == n_qkv
    s_sd = student.state_dict()
    changed = [k for k in t_sd if not torch.equal(t_sd[k], s_sd[k])]
    assert changed and all(".attn.qkv." in k for k in changed), changed
    assert all(any(f"blocks.{i}.attn.qkv.weight" == k for k in changed) for i in range(len(student.blocks)))
    assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in t_sd.items())  # the teacher is untouched


def test_attention_loss_is_eq3_with_teacher_forcing(parts):
    """Eq. 3 by hand: block i's student attention on the teacher's norm1 output, MSE to the teacher attention,
    summed over layers."""
    from attnbench.suites.adala.pipeline import AlignNet, attention_loss

    pre, vpre, splits, teacher = parts
    student = _student(parts)
    x = torch.stack([splits.val[i][0] for i in range(8)])
    with torch.no_grad():
        h = teacher.patch_embed(x)
        h = teacher.norm_pre(teacher.patch_drop(teacher._pos_embed(h)))
        want = 0.0
        for tb, sb in zip(teacher.blocks, student.blocks):
            xi = tb.norm1(h)
            want += torch.mean((sb.attn(xi) - tb.attn(xi)) ** 2).item()
            h = tb(h)
        got = attention_loss(AlignNet(student, "proj"), teacher, x, "proj").item()
    assert got == pytest.approx(want, rel=1e-4)
    assert want > 0


@pytest.mark.parametrize("k", [1, 2, 3])
def test_each_stage_lowers_its_own_loss(parts, tmp_path, k):
    from attnbench.engine.train.dist import Dist
    from attnbench.image.classify import evaluate
    from attnbench.suites.adala.pipeline import AlignNet, FeatureNet, attention_loss, feature_loss, mean_loss

    pre, vpre, splits, teacher = parts
    student = _student(parts)
    dev, dist = torch.device("cpu"), Dist()
    if k == 1:
        obj = lambda: mean_loss(lambda x: attention_loss(AlignNet(student, "proj"), teacher, x, "proj"),  # noqa
                                splits.val, 512, dist, dev)
    elif k == 2:
        obj = lambda: mean_loss(lambda x: feature_loss(FeatureNet(student, "tokens"), teacher, x, "tokens", 1.0),  # noqa
                                splits.val, 512, dist, dev)
    else:
        from attnbench.suites.adala.pipeline import new_head

        new_head(student, 0)
        obj = lambda: evaluate(student, splits.val, 512, dist, dev)["loss"]  # noqa: E731
    before = obj()
    rec = _stage(parts, k, student, tmp_path)
    after = obj()
    if k < 3:
        assert after < 0.9 * before, (k, before, after)
    else:  # cross-entropy of a new head from ln(10)
        assert after < before - 0.05, (k, before, after)
    assert rec["stage"] == k and len(rec["train_loss"]) == pre.stage(k).steps


def test_stage_options_and_presets(parts, tmp_path):
    from attnbench.engine.presets import PresetError
    from attnbench.suites.adala.config import load_preset, parse_stages
    from attnbench.suites.adala.pipeline import final_features, stage1_frozen, stage3_config

    pre, vpre, splits, teacher = parts
    assert parse_stages("2,3") == (2, 3) and parse_stages("1+2+3") == (1, 2, 3)
    with pytest.raises(ValueError, match="not a stage"):
        parse_stages("4")
    tiny = load_preset("tiny")
    assert tiny.budget() == tiny.load_vision().train.steps  # from-scratch = run vision's own tiny model
    assert tiny.adala.ablation_sets() == [(3,), (1, 3), (2, 3), (1, 2, 3)]
    assert "attns.*.mech.*" in stage1_frozen(False) and "attns.*.mech.*" not in stage1_frozen(True)
    cfg = stage3_config(tiny.stage3, 0.1)
    assert cfg.groups[0].patterns == ("head.*",) and cfg.groups[1].lr_scale == 0.1
    x = torch.stack([splits.val[i][0] for i in range(2)])
    with torch.no_grad():
        assert final_features(teacher, x, "tokens").shape == (2, 17, 64)
        assert final_features(teacher, x, "pooled").shape == (2, 64)
        pn = final_features(teacher, x, "prenorm")
        assert torch.allclose(teacher.norm(pn), final_features(teacher, x, "tokens"))
    bad = tmp_path / "bad.toml"
    bad.write_text(ADALA.replace('lam = 1.0', 'lam = 1.0\nfeatures = "cls"'))
    (tmp_path / "vision.toml").write_text(VISION)
    with pytest.raises(PresetError, match="features"):
        load_preset(bad)


def test_other_feature_map_student_and_heads_option(parts, tmp_path):
    """Any registered linear attention is a student (nala here); Eq. 3 before W_O trains too."""
    from attnbench.engine.train.dist import Dist
    from attnbench.suites.adala.pipeline import AlignNet, attention_loss, mean_loss

    pre, vpre, splits, teacher = parts
    student = _student(parts, "nala")
    pre2 = dataclasses.replace(pre, adala=dataclasses.replace(pre.adala, attn_output="heads"),
                               stage1=dataclasses.replace(pre.stage1, steps=10, eval_every=5))
    obj = lambda: mean_loss(lambda x: attention_loss(AlignNet(student, "heads"), teacher, x, "heads"),  # noqa
                            splits.val, 512, Dist(), torch.device("cpu"))
    before = obj()
    _stage((pre2, vpre, splits, teacher), 1, student, tmp_path)
    assert obj() < before


# --- the smoke: the whole pipeline of each preset on the CPU ---------------------------------------------------
def _in_project(monkeypatch, tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "results"


@pytest.mark.parametrize("name", __import__("attnbench.suites.adala.config", fromlist=["x"]).preset_names())
def test_each_presets_smoke_runs_every_stage_and_resumes_each(name, monkeypatch, tmp_path):
    """Teacher and from-scratch model trained first, stages 1-3 each stopped once and resumed from
    its step-1 checkpoint, the cost lines; nothing written into the project."""
    import io
    import re

    from rich.console import Console

    from attnbench.suites.adala.config import load_preset
    from attnbench.suites.adala.smoke import run_smoke

    results = _in_project(monkeypatch, tmp_path)
    buf = io.StringIO()
    rc = run_smoke(attentions=["linear"], preset=name, console=Console(file=buf, width=300))
    out = buf.getvalue()
    assert rc == 0, out[-3000:]
    assert out.count("planned stop in step 2") == 3 and "attempt 4" in out and "smoke ok" in out
    pre = load_preset(name)
    for k in (1, 2, 3):
        m = re.search(rf"linear stage {k}: full run: ([\d,]+) steps x ([\d,]+) images", out)
        assert m and int(m[1].replace(",", "")) == pre.stage(k).steps, out[-2000:]
    assert "teacher (trained first): full run" in out and "linear from scratch: full run" in out
    assert not results.exists()
