"""``run vision --smoke`` for every vision preset: its real model, resolution, augmentation, loss, schedule,
evaluation, checkpoint and resume on a few images written in its real format, then the full run's cost line;
nothing written into the project."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from attnbench.cli.main import app
from attnbench.suites.vision.config import load_preset, preset_names
from attnbench.image.smoke import imagefolder_classes, smoke_preset
from attnbench.suites.vision.smoke import run_smoke


def in_project(monkeypatch, tmp_path):
    """cwd = a fresh project root: anything written to the default store or work directory would land in
    ``tmp_path/results``."""
    (tmp_path / "pyproject.toml").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path / "results"


@pytest.mark.parametrize("name", [n for n in preset_names() if n != "tiny"])
def test_each_presets_smoke(name, monkeypatch, tmp_path):
    results = in_project(monkeypatch, tmp_path)
    buf = io.StringIO()
    rc = run_smoke(attentions=["softmax"], preset=name, console=Console(file=buf, width=300))
    out = buf.getvalue()
    assert rc == 0, out[-3000:]
    assert "planned stop in step 2" in out and "attempt 2" in out and "smoke ok" in out
    pre = load_preset(name)
    cost = re.search(r"full run: ([\d,]+) steps x ([\d,]+) images", out)
    assert cost and int(cost[1].replace(",", "")) == pre.train.steps
    assert int(cost[2].replace(",", "")) == pre.train.batch_size
    assert not results.exists()


def test_the_tiny_smoke_through_the_cli_and_its_refusals(monkeypatch, tmp_path):
    results = in_project(monkeypatch, tmp_path)
    r = CliRunner().invoke(app, ["run", "vision", "--smoke", "--attn", "nala"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output[-3000:]
    assert r.output.lstrip().startswith("machine: ") and "GFLOP/s" in r.output.splitlines()[0]  # as every run
    assert "resumes from its checkpoint" in r.output and "nala: full run: 600 steps x 64 images" in r.output
    assert not results.exists()
    r = CliRunner().invoke(app, ["run", "vision", "--smoke", "--data-dir", str(tmp_path)])
    assert r.exit_code != 0 and "drop --data-dir" in r.output


def test_the_smoke_keeps_the_preset_and_shortens_only_the_run():
    for name in preset_names():
        pre = load_preset(name)
        s = smoke_preset(pre)
        assert s.model == pre.model and s.data.image_size == pre.data.image_size and s.data.kind == pre.data.kind
        assert (s.recipe.mixup, s.recipe.cutmix, s.recipe.augment, s.recipe.label_smoothing) == \
            (pre.recipe.mixup, pre.recipe.cutmix, pre.recipe.augment, pre.recipe.label_smoothing)
        assert (s.train.schedule, s.train.optimizer, s.train.lr, s.train.ema_decay) == \
            (pre.train.schedule, pre.train.optimizer, pre.train.lr, pre.train.ema_decay)
        assert s.train.steps == 2 and s.train.checkpoint_every == 1 and s.train.precision == "fp32"
    # the class names of the ImageFolders written: ImageNet-100's CMC list, ImageNet-1k's first synsets
    assert len(imagefolder_classes("imagenet100")) == 100 and "n02869837" in imagefolder_classes("imagenet100")
    assert imagefolder_classes(1000)[:2] == ["n01440764", "n01443537"] and len(imagefolder_classes(None)) == 1000
