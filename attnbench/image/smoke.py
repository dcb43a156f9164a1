"""A preset's smoke run: its real pipeline on the CPU before a user's GPU run, on a few images written in the
preset's real format, with the training shortened.

The data: CIFAR's python pickles (``cifar-10-batches-py/`` or ``cifar-100-python/``) or an ImageFolder of JPEGs at
the preset's resolution under the real class names (ImageNet-100: the CMC list in ``classlists/``; ImageNet-1k:
the 1000 ILSVRC-2012 synsets timm ships; a class-list file: its names); the offline ``digits`` needs none.
What the smoke shortens (:func:`smoke_preset`): 2 steps at a batch of 2 (float32 on the CPU, the preset's precision on
a GPU), data-loader workers at most 1, evaluations on the first 4 images, the resolution sweep at the first of the
preset's resolutions other than the training one (the position embedding resampled) at batch 1, a validation carve of
1 image per class (2 images for CIFAR). :func:`full_run_cost`: the full run's cost
(:class:`attnbench.engine.smoke.FullRunCost`).
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from attnbench.engine.smoke import FullRunCost, smoke_precision, train_flops
from attnbench.engine.train.config import TrainConfig
from attnbench.image import data as vd
from attnbench.image.classify import build_classifier

SMOKE_STEPS = 2
SMOKE_BATCH = 2
EVAL_LIMIT = 4
CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


# ------------------------------------------------------------------------------- files in the real formats
def _smooth_images(n: int, size: int, seed: int = 0) -> list[np.ndarray]:
    """``n`` smooth RGB ``uint8 [size, size, 3]`` images (upsampled noise: small JPEGs, not incompressible)."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        low = Image.fromarray(rng.integers(0, 256, (6, 6, 3), dtype=np.uint8))
        out.append(np.asarray(low.resize((size, size), Image.BICUBIC)))
    return out


def imagefolder_classes(classes) -> list[str]:
    """The class folder names a preset's ``classes`` asks for: a shipped list or a file (its names), a count N
    (the first N ILSVRC-2012 synsets, sorted, as ``train/`` would sort them), ``None`` (all 1000), or a list."""

    if isinstance(classes, str) and classes.strip().isdigit():
        classes = int(classes)
    if classes is None or isinstance(classes, int):
        from timm.data import ImageNetInfo

        wnids = sorted(ImageNetInfo().label_names())
        return wnids if classes is None else wnids[:classes]
    if isinstance(classes, str):
        return [w for w, _ in vd.read_class_list(vd.SHIPPED_CLASSLISTS.get(classes, Path(classes)))]
    return list(classes)


def write_imagefolder(root: Path, wnids: Sequence[str], size: int, *, train_per_class: int = 2,
                      val_per_class: int = 1) -> Path:
    """``root/train/<wnid>/*.JPEG`` and ``root/val/<wnid>/*.JPEG``: ``size x size`` JPEGs (a few encoded once,
    their bytes written into every class folder)."""
    from PIL import Image

    blobs = []
    for arr in _smooth_images(4, size):
        buf = io.BytesIO()
        Image.fromarray(arr).save(buf, format="JPEG", quality=90)
        blobs.append(buf.getvalue())
    for split, n in (("train", train_per_class), ("val", val_per_class)):
        for c, w in enumerate(wnids):
            d = root / split / w
            d.mkdir(parents=True, exist_ok=True)
            for i in range(n):
                (d / f"{w}_{split}_{i}.JPEG").write_bytes(blobs[(c + i) % len(blobs)])
    return root


def write_cifar(root: Path, which: int = 10, *, per_file: int = 2, n_test: int = 4, seed: int = 0) -> Path:
    """CIFAR's python release under ``root``: ``cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``
    or ``cifar-100-python/{train,test,meta}``; bytes keys, ``data`` uint8 ``[n, 3072]`` in R, G, B planes."""
    rng = np.random.default_rng(seed)
    if which == 10:
        d, files, label_key = root / "cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], b"labels"
        meta, names = {"batches.meta": b"label_names"}, [n.encode() for n in CIFAR10_NAMES]
    else:  # the fine labels' names are not shipped with anything installed here: placeholders in their place
        d, files, label_key = root / "cifar-100-python", ["train"], b"fine_labels"
        meta, names = {"meta": b"fine_label_names"}, [f"class_{i:02d}".encode() for i in range(100)]
    d.mkdir(parents=True, exist_ok=True)

    def dump(name: str, n: int) -> None:
        planes = np.stack([a.transpose(2, 0, 1).reshape(-1) for a in _smooth_images(n, 32, int(rng.integers(1e6)))])
        payload = {b"batch_label": name.encode(), label_key: [int(x) for x in rng.integers(0, which, n)],
                   b"data": planes.astype(np.uint8), b"filenames": [f"smoke_{name}_{i}.png".encode() for i in range(n)]}
        with open(d / name, "wb") as f:
            pickle.dump(payload, f, protocol=2)

    for name in files:
        dump(name, per_file * (5 if which == 100 else 1))
    dump("test_batch" if which == 10 else "test", n_test)
    ((meta_name, key),) = meta.items()
    with open(d / meta_name, "wb") as f:
        pickle.dump({key: names}, f, protocol=2)
    return root


def write_data(pre, root: Path) -> Optional[Path]:
    """The preset's data in its real format under ``root`` (``--data-dir``); None for the bundled digits."""
    kind = pre.data.kind
    if kind == "digits":
        return None
    root.mkdir(parents=True, exist_ok=True)
    if kind in ("cifar10", "cifar100"):
        return write_cifar(root, 10 if kind == "cifar10" else 100)
    return write_imagefolder(root, imagefolder_classes(pre.data.classes), pre.data.image_size)


# ------------------------------------------------------------------------------------------- smoke preset
def smoke_train(cfg: TrainConfig) -> TrainConfig:
    """A training config shortened for a smoke run: :data:`SMOKE_STEPS` steps at a batch of :data:`SMOKE_BATCH`
    (float32 on the CPU, the preset's own precision on a GPU), a checkpoint every step, one evaluation at the end;
    the schedule's kind and the rest kept."""
    return dataclasses.replace(cfg, steps=SMOKE_STEPS, batch_size=SMOKE_BATCH, micro_batch_size=1 if
                               cfg.micro_batch_size else 0, precision=smoke_precision(cfg.precision),
                               warmup=1 if cfg.warmup else 0,
                               eval_every=SMOKE_STEPS, checkpoint_every=1, patience=0, min_steps=0)


def smoke_preset(pre):
    """The preset with the smoke's shortenings (module docstring); everything else is the preset's."""
    train = smoke_train(pre.train)
    data = pre.data
    if data.kind == "imagenet":
        data = dataclasses.replace(data, val_per_class=1)
    elif data.kind != "digits":
        data = dataclasses.replace(data, val_size=2)
    return dataclasses.replace(
        pre, train=train, data=data,
        recipe=dataclasses.replace(pre.recipe, eval_batch_size=SMOKE_BATCH, workers=min(pre.recipe.workers, 1)),
        sweep=dataclasses.replace(pre.sweep, resolutions=[r for r in pre.sweep.resolutions
                                                           if r != pre.data.image_size][:1], batch=1),
        setting=f"{pre.key}-smoke")


def full_run_cost(pre, spec, num_classes: int):
    """:class:`attnbench.engine.smoke.FullRunCost` of ``pre``'s full run with ``spec``: its steps x batch images, at the
    training FLOPs of one image (forward + backward) of its ViT."""
    import torch

    model = build_classifier(spec, pre, num_classes)
    x = torch.randn(1, 3, pre.data.image_size, pre.data.image_size)
    flops = train_flops(lambda: model(x).float().sum().backward())
    return FullRunCost(steps=pre.train.steps, items_per_step=pre.train.batch_size, unit="images",
                       train_flops_per_item=float(flops))
