"""Each preset's train augmentation survives every RandAugment op at its extreme magnitudes and thousands of seeded
draws (timm 1.0.31 + Pillow 13: DeiT's ``rand-m9-mstd0.5-inc1`` asked posterize for 0 bits and crashed)."""

from __future__ import annotations

import copy
import random
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from attnbench.suites.adala.config import load_preset as load_adala, preset_names as adala_presets
from attnbench.suites.mixa.config import load_preset as load_mixa, preset_names as mixa_presets
from attnbench.image import data as vd
from attnbench.suites.vision.config import load_preset, preset_names, with_folder

#: the CPU folder recipe: ``run vision --data-dir DIR`` on tiny, DIR an ImageFolder or a CIFAR-10 folder
FOLDERS = {"vision/tiny+imagefolder": ("images/train", "images/val"),
           "vision/tiny+cifar10-folder": ("cifar/cifar-10-batches-py",)}


def _vision_presets():
    """Every vision preset, the vision presets adala and mixa use, and the CPU folder recipe (tiny + a folder, as
    :func:`with_folder` builds it for ``run vision --data-dir``: an ImageFolder and a CIFAR-10 folder)."""
    out = {f"vision/{n}": load_preset(n) for n in preset_names()}
    for n in adala_presets():
        out[f"adala/{n}"] = load_adala(n).load_vision()
    for n in mixa_presets():
        out[f"mixa/{n}"] = load_mixa(n).vision
    with tempfile.TemporaryDirectory() as tmp:  # the layouts only: with_folder reads no image
        for key, dirs in FOLDERS.items():
            for d in dirs:
                (Path(tmp) / d).mkdir(parents=True)
            out[key] = with_folder(load_preset("tiny"), str(Path(tmp) / Path(dirs[0]).parts[0]))
    return out


PRESETS = _vision_presets()
RNG = np.random.default_rng(0)
IMAGES = [Image.fromarray(RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(8)]


def train_transform(pre):
    """The preset's train transform as its reader builds it (None for digits: tensors, no PIL augmentation)."""
    if pre.data.kind == "digits":
        return None
    return vd.recipe_transforms(pre.data.kind, pre.data.image_size, pre.recipe.augment)[1]


#: every preset whose train transform has a RandAugment
RANDAUGMENT = [k for k in sorted(PRESETS) if train_transform(PRESETS[k]) is not None
               and vd.rand_augments(train_transform(PRESETS[k]))]


def test_the_presets_cover_deits_randaugment():
    """The tests below are not vacuous: the CIFAR and ImageNet presets and the tiny recipe on a folder carry DeiT's
    RandAugment with the increasing posterize, and the tiny (digits) ones carry none."""
    kinds = {}
    for key, pre in PRESETS.items():
        t = train_transform(pre)
        ras = vd.rand_augments(t) if t is not None else []
        kinds[key] = [op.name for ra in ras for op in ra.ops]
    assert "PosterizeIncreasing" in kinds["vision/cifar10"] and "PosterizeIncreasing" in kinds["vision/imagenet100"]
    assert "PosterizeIncreasing" in kinds["vision/imagenet1k"]
    for key in FOLDERS:
        assert PRESETS[key].recipe.augment == "cifar" and "PosterizeIncreasing" in kinds[key], key
    assert PRESETS["vision/tiny+imagefolder"].data.kind == "imagenet"
    assert PRESETS["vision/tiny+cifar10-folder"].data.kind == "cifar10"
    assert kinds["vision/tiny"] == [] and kinds["adala/tiny"] == [] and kinds["mixa/tiny"] == []
    assert {"vision/cifar10", "vision/imagenet100", "vision/imagenet1k", *FOLDERS} <= set(RANDAUGMENT)


@pytest.mark.parametrize("key", sorted(PRESETS))
def test_every_op_at_its_extreme_magnitudes(key):
    """Each op of the preset's RandAugment, applied for sure (p = 1, no magnitude noise), at magnitude 0 and at
    the top of its range (where the increasing posterize keeps 0 bits)."""
    t = train_transform(PRESETS[key])
    if t is None:
        ds = vd.load_digits_splits(16, augment=PRESETS[key].recipe.augment)
        assert ds.train[0][0].shape == (3, 16, 16)
        return
    for ra in vd.rand_augments(t):
        for op in ra.ops:
            for magnitude in (0.0, float(op.magnitude_max or 10)):
                o = copy.copy(op)
                o.prob, o.magnitude_std, o.magnitude = 1.0, 0.0, magnitude
                for img in IMAGES[:2]:
                    out = o(img)
                    assert out.size == img.size and out.mode == img.mode, (op.name, magnitude)


def test_zero_bits_kept_is_a_black_image_and_others_are_pillows():
    img = IMAGES[0]
    assert not np.asarray(vd.keep_bits(img, 0)).any()
    for bits in (1, 4, 8):
        assert np.array_equal(np.asarray(vd.keep_bits(img, bits)), np.asarray(ImageOps.posterize(img, bits)))


@pytest.mark.parametrize("key", RANDAUGMENT)
def test_thousands_of_seeded_draws(key):
    """3000 seeded draws of the preset's RandAugment on 32x32 images, for every preset that has one (the tiny
    recipe on a folder too); a spy on posterize shows the top magnitude (0 bits) was drawn, so the unguarded op
    would have raised."""
    (ra,) = vd.rand_augments(train_transform(PRESETS[key]))
    zero = []
    ra = copy.deepcopy(ra)
    for op in ra.ops:
        if op.name.startswith("Posterize"):
            fn = op.aug_fn

            def spy(img, bits, _fn=fn, **kw):
                zero.append(bits <= 0)
                return _fn(img, bits, **kw)

            op.aug_fn = spy
    random.seed(0)
    np.random.seed(0)   # timm's RandAugment picks its ops with numpy's global generator, its magnitudes with random's
    for i in range(3000):
        assert ra(IMAGES[i % len(IMAGES)]).size == (32, 32)
    assert sum(zero) >= 1, f"no draw reached 0 bits in {len(zero)} posterize calls: the test would not fail"


@pytest.mark.parametrize("key", [k for k in sorted(PRESETS) if PRESETS[k].data.kind != "digits"])
def test_the_full_train_transform_on_small_images(key):
    pre = PRESETS[key]
    t = train_transform(pre)
    random.seed(1)
    torch.manual_seed(1)
    s = pre.data.image_size
    for img in IMAGES[:4]:
        x = t(img)
        assert x.shape == (3, s, s) and torch.isfinite(x).all()
