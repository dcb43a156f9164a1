"""A CPU user's own images: ``run vision --data-dir DIR`` on the tiny recipe reads an ImageFolder or CIFAR's
python release (detected), and a folder it cannot read gets one line saying what it found and what to do."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from attnbench.cli.main import app

from attnbench.results.store import Store
from attnbench.image import data as vd
from attnbench.image.smoke import write_cifar
from attnbench.suites.vision.config import load_preset, with_folder

ENV = {**os.environ, "COLUMNS": "200", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def digits_folder(root, classes=(0, 1, 7), train=12, val=4, ext=".png"):
    """``root/{train,val}/<digit name>/*.png``: scikit-learn's digits as 16x16 grey PNGs (a user's folder)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    names = {0: "zero", 1: "one", 7: "seven"}
    for c in classes:
        imgs = d.images[d.target == c]
        for split, part in (("train", imgs[:train]), ("val", imgs[train:train + val])):
            out = root / split / names.get(c, str(c))
            out.mkdir(parents=True, exist_ok=True)
            for i, a in enumerate(part):
                Image.fromarray((a * 255 / 16).astype(np.uint8)).resize((16, 16)).save(out / f"{i}{ext}")
    return root


def short_tiny(tmp_path, steps=16, batch_size=None, val_size=None):
    """The tiny preset's file with fewer steps (the same kind, model, size and recipe); ``batch_size`` /
    ``val_size`` (the validation carve of a CIFAR folder): set if given."""
    text = (resources.files("attnbench.suites.vision") / "presets" / "tiny.toml").read_text()
    text = text.replace("steps = 600", f"steps = {steps}").replace("warmup = 60", "warmup = 2")
    text = text.replace("eval_every = 100", f"eval_every = {steps // 2}")
    text = text.replace("resolutions = [32, 64, 128, 256]", "resolutions = [32]")
    if batch_size is not None:
        text = text.replace("batch_size = 64", f"batch_size = {batch_size}")
    if val_size is not None:
        text = text.replace('kind = "digits"', f'kind = "digits"\nval_size = {val_size}')
    assert text.count("val_size") == (val_size is not None) and f"batch_size = {batch_size or 64}" in text
    p = tmp_path / "tiny.toml"
    p.write_text(text)
    return p


def test_an_imagefolder_trains_on_the_cpu_from_one_command_and_lands_in_the_table(tmp_path):
    data = digits_folder(tmp_path / "my_digits")
    p = subprocess.run([sys.executable, "-m", "attnbench.cli.main", "run", "vision", "--attn", "softmax", "--preset",
                        str(short_tiny(tmp_path)), "--data-dir", str(data), "--db", str(tmp_path / "v.db"),
                        "--out", str(tmp_path / "w")], env=ENV, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    with Store(tmp_path / "v.db") as s:
        (m,) = s.measurements(suite="vision")
    assert m.status == "ok" and m.task == "imagenet" and m.setting == "vision/tiny/my_digits"
    assert m.metrics["num_classes"] == 3 and m.metrics["n_test"] == 12 and m.metrics["n_val"] == 3
    assert "ImageFolder" in m.metrics["data"] and "augment cifar" in m.metrics["data"]
    assert "vision — vision/tiny/my_digits" in p.stdout and "softmax" in p.stdout


def test_a_cifar_folder_trains_on_the_cpu_from_one_command_and_lands_in_the_table(tmp_path):
    """The CIFAR route of ``--data-dir`` on the tiny recipe: CIFAR-10's python pickles written here (20 training
    images, 8 test), trained a few steps in this process, recorded and tabled. The preset is tiny's file with 4
    steps at batch 8; the validation carve is the default, a tenth of the training images (the release's 5000)."""
    data = write_cifar(tmp_path / "my_cifar", 10, per_file=4, n_test=8)
    preset = short_tiny(tmp_path, steps=4, batch_size=8)
    r = CliRunner().invoke(app, ["run", "vision", "--attn", "softmax", "--preset", str(preset), "--data-dir",
                                 str(data), "--db", str(tmp_path / "v.db"), "--out", str(tmp_path / "w")],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output[-3000:]
    with Store(tmp_path / "v.db") as s:
        (m,) = s.measurements(suite="vision")
    assert m.status == "ok" and m.task == "cifar10" and m.setting == "vision/tiny/my_cifar", (m.status, m.error)
    assert m.metrics["num_classes"] == 10 and m.metrics["n_test"] == 8 and m.metrics["n_val"] == 2
    assert "CIFAR-10" in m.metrics["data"] and "augment cifar" in m.metrics["data"], m.metrics["data"]
    assert r.output.lstrip().startswith("machine: ")
    assert "vision — vision/tiny/my_cifar" in r.output and "softmax" in r.output


def test_the_folder_recipe_keeps_the_cpu_model_and_detects_cifar(tmp_path):
    tiny = load_preset("tiny")
    assert with_folder(tiny, None) is tiny and with_folder(load_preset("cifar10"), str(tmp_path)).data.kind == \
        "cifar10"
    (tmp_path / "c" / "cifar-10-batches-py").mkdir(parents=True)
    pre = with_folder(tiny, str(tmp_path / "c"))
    assert pre.data.kind == "cifar10" and pre.recipe.augment == "cifar" and pre.model == tiny.model
    assert pre.data.image_size == 32 and pre.train == tiny.train and pre.key == "vision/tiny/c"
    assert vd.detect_folder(tmp_path / "c" / "cifar-10-batches-py")[0] == "cifar10"
    folder = with_folder(tiny, str(digits_folder(tmp_path / "f", train=30)))
    assert folder.data.kind == "imagenet" and folder.data.val_per_class == 3 and folder.data.classes is None


@pytest.mark.parametrize("layout, found, todo", [
    ("missing", "does not exist", "expected an ImageFolder"),
    ("classes", "found 3 folder(s) (one, seven, zero) and 0 image file(s)", "split them into"),
    ("train_only", "found 1 folder(s) (train)", "add "),
    ("images", "found 0 folder(s) and 2 image file(s)", "point --data-dir at a folder holding train/ and val/"),
])
def test_a_folder_it_cannot_read_says_what_it_found_and_what_to_do(tmp_path, layout, found, todo):
    root = tmp_path / "d"
    if layout == "classes":
        digits_folder(tmp_path / "x")
        (tmp_path / "x" / "train").rename(root)
    elif layout == "train_only":
        digits_folder(tmp_path / "x")
        root.mkdir()
        (tmp_path / "x" / "train").rename(root / "train")
    elif layout == "images":
        root.mkdir()
        for i in range(2):
            Image.new("RGB", (8, 8)).save(root / f"{i}.png")
    r = CliRunner().invoke(app, ["run", "vision", "--attn", "softmax", "--data-dir", str(root), "--db",
                                 str(tmp_path / "v.db"), "--out", str(tmp_path / "w")], env={"COLUMNS": "400"})
    out = " ".join(r.output.split())  # the error line may be wrapped
    assert r.exit_code != 0 and (r.exception is None or isinstance(r.exception, SystemExit)), (r.exception, out)
    assert found in out and todo in out, out
    assert not (tmp_path / "v.db").exists()


def test_digits_given_a_folder_through_the_api_names_the_folder_and_no_root():
    with pytest.raises(ValueError, match="reads no folder, but one was given") as e:
        vd.build_splits("digits", root="/some/dir")
    assert "drop root" not in str(e.value)
