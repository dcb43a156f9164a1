"""Each preset's train augmentation survives every RandAugment op at its extreme magnitudes and thousands of seeded
draws (timm 1.0.31 + Pillow 13: DeiT's ``rand-m9-mstd0.5-inc1`` asked posterize for 0 bits and crashed)."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from attnbench.suites.adala.config import load_preset as load_adala, preset_names as adala_presets
from attnbench.suites.mixa.config import load_preset as load_mixa, preset_names as mixa_presets
from attnbench.image import data as vd
from attnbench.suites.vision.config import load_preset, preset_names


def _vision_presets():
    """Every vision preset, the vision presets adala and mixa use, and the CPU folder recipe (tiny + a folder)."""
    out = {f"vision/{n}": load_preset(n) for n in preset_names()}
    for n in adala_presets():
        out[f"adala/{n}"] = load_adala(n).load_vision()
    for n in mixa_presets():
        out[f"mixa/{n}"] = load_mixa(n).vision
    return out


PRESETS = _vision_presets()
RNG = np.random.default_rng(0)
IMAGES = [Image.fromarray(RNG.integers(0, 256, (32, 32, 3), dtype=np.uint8)) for _ in range(8)]


def train_transform(pre):
    """The preset's train transform as its reader builds it (None for digits: tensors, no PIL augmentation)."""
    if pre.data.kind == "digits":
        return None
    return vd.recipe_transforms(pre.data.kind, pre.data.image_size, pre.recipe.augment)[1]


def test_the_presets_cover_deits_randaugment():
    """The test below is not vacuous: the CIFAR and ImageNet presets carry DeiT's RandAugment with the increasing
    posterize, and the tiny (digits) ones carry none."""
    kinds = {}
    for key, pre in PRESETS.items():
        t = train_transform(pre)
        ras = vd.rand_augments(t) if t is not None else []
        kinds[key] = [op.name for ra in ras for op in ra.ops]
    assert "PosterizeIncreasing" in kinds["vision/cifar10"] and "PosterizeIncreasing" in kinds["vision/imagenet100"]
    assert "PosterizeIncreasing" in kinds["vision/imagenet1k"]
    assert kinds["vision/tiny"] == [] and kinds["adala/tiny"] == [] and kinds["mixa/tiny"] == []


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


@pytest.mark.parametrize("key", ["vision/cifar10", "vision/imagenet100"])
def test_thousands_of_seeded_draws(key):
    """3000 seeded draws of the preset's RandAugment on 32x32 images; a spy on posterize shows the top magnitude
    (0 bits) was drawn, so the unguarded op would have raised. (imagenet1k's RandAugment is imagenet100's.)"""
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
