"""Image classification data: real readers of the real formats (no download anywhere), three sources.

Every loader returns an :class:`ImageSplits`: ``train`` / ``val`` / ``test`` torch datasets whose items are
``(image FloatTensor [3, S, S], label int)`` (so a ``DataLoader`` batches them with the default collate),
``num_classes``, ``class_names``, an honest ``origin`` (what data this exactly is, recorded with every result)
and a short ``fingerprint`` (result identity: the data, the split and the transforms, never the path).

Sources (``build_splits(kind, ...)`` dispatches on ``kind``):

- ``digits`` (the offline default): scikit-learn's bundled handwritten digits (1797 grey 8x8 images, levels
  0..16, 10 classes). Scaled to [0, 1], standardised by the train split's mean and std (one scalar each),
  upsampled bilinearly to ``S x S`` and repeated on 3 channels. The train / val / test split is stratified and
  fixed by ``seed`` (scikit-learn's ``train_test_split``; 1257 / 270 / 270 at the default fractions).
  Augmentation (train only): ``"none"`` (default) or ``"crop"``: pad by ``S // 8`` with the background value
  and crop ``S x S`` at a random offset. Nothing else: on 8x8 sources flips and colour changes are wrong.
- ``cifar10`` / ``cifar100``: the python release read straight from its pickles
  (``cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}``,
  ``cifar-100-python/{train,test,meta}``) by :mod:`attnbench.io.formats` (its safe unpickler: data, never code).
  ``test`` = the test file; ``val`` = ``val_size`` (5000 of the release's) training images chosen by a
  permutation fixed by ``seed``; ``train`` = the rest. Labels: CIFAR-100's fine labels.
- ``imagenet``: torchvision's ``ImageFolder`` reader on ``ROOT/train/<wnid>/*`` and ``ROOT/val/<wnid>/*``,
  restricted to a class subset: a class-list file (one wnid a line, ``#`` comments; ``"imagenet100"`` names
  the shipped CMC list, ``classlists/imagenet100.txt``), a list of wnids, a count N (the first N class
  folders of ``train/`` in sorted order) or ``None`` (every class folder). Labels follow the sorted order of
  the chosen wnids (ImageFolder's convention). ``test`` = ``val/``; ``val`` = ``val_per_class`` (50) images of
  each class carved from ``train/`` by a permutation fixed by ``seed``.

Transforms (from timm):

- ``"deit"``: DeiT's recipe. Train: ``timm.data.create_transform(S, is_training=True,
  auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, re_mode="pixel", interpolation="bicubic")`` = random
  resized crop (0.08..1), horizontal flip, RandAugment m9, normalise, random erasing 0.25. Eval:
  ``create_transform(S, is_training=False, crop_pct=0.875, interpolation="bicubic")`` = resize to S / 0.875,
  centre crop S. The default for ImageNet.
- ``"cifar"``: the size-appropriate variant for CIFAR near its native 32 px, where a random *resized* crop
  down to 8% of a 32 px image destroys it: (resize to S if S != 32), random crop S with ``S // 8`` reflect
  padding, horizontal flip, the same timm RandAugment (``rand-m9-mstd0.5-inc1``), normalise, the same random
  erasing. Eval: timm's ``create_transform(S, crop_pct=1.0)`` (the whole image; identity resize at 32 px).
  The default for CIFAR at ``S <= 64``; above that CIFAR uses ``"deit"`` with ``crop_pct=1.0`` for eval. On an
  ImageFolder (when asked: the CPU folder recipe) every image is first resized to S on its shorter side.
  Posterize is guarded (:func:`keep_bits`): 0 bits kept is a black image, not Pillow 13's ValueError.
- ``"basic"``: random crop with padding (CIFAR) or random resized crop (ImageNet) and a flip, no RandAugment,
  no erasing. ``"none"``: the eval transform on train too.
Normalisation: ImageNet's mean / std for ImageNet, each CIFAR's own channel statistics for CIFAR.

Errors are one line and name the path (and, for a class list, the line) and the expected layout:
:class:`~attnbench.core.errors.DataMissingError` (a ``FileNotFoundError``) for a missing folder or file,
:class:`~attnbench.core.errors.DataError` for a malformed one. An unreadable image is an error naming the file when it is
read (no skipping: a silently skipped image changes what is measured); ImageFolder's reader is lazy, so this
surfaces during the epoch that first reads it, not at construction.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import torch

from attnbench.core.errors import DataError, DataMissingError, UnknownNameError
from attnbench.io.formats import read_cifar_batch, read_cifar_meta

PathLike = Union[str, "os.PathLike[str]"]

KINDS = ("digits", "cifar10", "cifar100", "imagenet")
AUGMENTS = ("auto", "deit", "cifar", "basic", "none")
DEFAULT_IMAGE_SIZE = {"digits": 32, "cifar10": 32, "cifar100": 32, "imagenet": 224}

CLASSLIST_DIR = Path(__file__).resolve().parent / "classlists"
#: Names accepted for ``classes`` that mean a shipped class-list file.
SHIPPED_CLASSLISTS = {"imagenet100": CLASSLIST_DIR / "imagenet100.txt"}

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR_STATS = {10: ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
               100: ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))}

#: DeiT's training recipe (Touvron et al. 2021, ``deit/main.py`` defaults).
DEIT_AUTO_AUGMENT = "rand-m9-mstd0.5-inc1"
DEIT_RE_PROB = 0.25
DEIT_EVAL_CROP_PCT = 0.875


# ---------------------------------------------------------------------------------------------- the result


@dataclass(eq=False)
class ImageSplits:
    """The three splits of one image classification task, with what they are.

    ``origin`` says exactly which data this is (source, where, sizes, how split); ``fingerprint`` is a short
    hash of the data's identity (contents or file list, split, image size, transforms), independent of where
    the data lives on disk, for result identity.
    """

    train: torch.utils.data.Dataset
    val: torch.utils.data.Dataset
    test: torch.utils.data.Dataset
    num_classes: int
    class_names: list[str]
    origin: str
    fingerprint: str
    kind: str = ""
    image_size: int = 0
    augment: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def sizes(self) -> tuple[int, int, int]:
        return len(self.train), len(self.val), len(self.test)


def _fingerprint(identity: dict[str, Any]) -> str:
    blob = json.dumps(identity, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def _hash_arrays(*arrays: np.ndarray) -> str:
    h = hashlib.blake2b(digest_size=16)
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.data)
    return h.hexdigest()


def _check_size(image_size: int) -> int:
    if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < 8:
        raise ValueError(f"image_size must be an int >= 8, got {image_size!r}")
    return int(image_size)


def _check_augment(augment: str, allowed: Sequence[str]) -> str:
    if augment not in allowed:
        raise ValueError(f"augment must be one of {list(allowed)}, got {augment!r}")
    return augment


# ------------------------------------------------------------------------------------------------ transforms


def keep_bits(img, bits_to_keep: int, **kwargs):
    """Posterize that keeps ``bits_to_keep`` most significant bits of each channel, also for 0 bits (a black
    image). timm 1.0.31's ``PosterizeIncreasing`` (the ``inc1`` op set of DeiT's ``rand-m9-mstd0.5-inc1``) maps the
    top magnitude to 0 bits kept, which the magnitude noise (``mstd0.5`` around 9, clipped at 10) reaches;
    Pillow 13 refuses 0 bits (``ValueError: bits must be between or equal to 1 and 8``), while the Pillow releases
    DeiT was trained with computed the mask ``~(2**8 - 1) = 0`` for it: a black image. Returning that keeps the
    recipe as published instead of crashing (or changing the op to 1 bit)."""
    from PIL import Image
    from timm.data.auto_augment import posterize

    if bits_to_keep <= 0:
        return Image.new(img.mode, img.size)  # every channel 0: all bits dropped
    return posterize(img, bits_to_keep, **kwargs)


def rand_augments(transform) -> list:
    """The timm ``RandAugment`` instances in ``transform`` (one, or inside torchvision ``Compose`` objects)."""
    from timm.data.auto_augment import RandAugment

    if isinstance(transform, RandAugment):
        return [transform]
    return [ra for t in getattr(transform, "transforms", ()) for ra in rand_augments(t)]


def guard_posterize(transform):
    """``transform`` with every RandAugment's posterize ops calling :func:`keep_bits` (see there); returned."""
    for ra in rand_augments(transform):
        for op in ra.ops:
            if op.name.startswith("Posterize"):
                op.aug_fn = keep_bits
    return transform


def deit_transforms(image_size: int, *, mean=IMAGENET_MEAN, std=IMAGENET_STD, augment: str = "deit",
                    eval_crop_pct: float = DEIT_EVAL_CROP_PCT) -> tuple[Callable, Callable]:
    """(train, eval) transforms of DeiT from timm, for PIL images -> ``[3, S, S]`` (see the module docstring).

    ``augment``: ``"deit"`` (full recipe), ``"basic"`` (random resized crop + flip), ``"none"`` (eval on train).
    """
    from timm.data import create_transform

    _check_augment(augment, ("deit", "basic", "none"))
    evaluate = create_transform(image_size, is_training=False, crop_pct=eval_crop_pct, interpolation="bicubic",
                                mean=mean, std=std)
    if augment == "none":
        return evaluate, evaluate
    if augment == "basic":
        train = create_transform(image_size, is_training=True, interpolation="bicubic", color_jitter=None,
                                 mean=mean, std=std)
    else:
        train = guard_posterize(create_transform(image_size, is_training=True, auto_augment=DEIT_AUTO_AUGMENT,
                                                 re_prob=DEIT_RE_PROB, re_mode="pixel", re_count=1,
                                                 interpolation="bicubic", mean=mean, std=std))
    return train, evaluate


def cifar_transforms(image_size: int, *, mean, std, augment: str = "cifar",
                     resize: Optional[bool] = None) -> tuple[Callable, Callable]:
    """(train, eval) transforms for small images near CIFAR's native 32 px (see the module docstring).

    ``resize``: resize the shorter side to ``image_size`` first (default: only when ``image_size != 32``, CIFAR's
    own size; an ImageFolder of images of any size passes True)."""
    from timm.data import create_transform, rand_augment_transform
    from timm.data.random_erasing import RandomErasing
    from torchvision import transforms as T

    _check_augment(augment, ("cifar", "basic", "none"))
    evaluate = create_transform(image_size, is_training=False, crop_pct=1.0, interpolation="bicubic",
                                mean=mean, std=std)
    if augment == "none":
        return evaluate, evaluate
    ops: list[Callable] = []
    if image_size != 32 if resize is None else resize:
        ops.append(T.Resize(image_size, interpolation=T.InterpolationMode.BICUBIC))
    ops += [T.RandomCrop(image_size, padding=max(1, image_size // 8), padding_mode="reflect"),
            T.RandomHorizontalFlip()]
    if augment == "cifar":  # timm's RandAugment with the hyper-parameters create_transform gives it
        hparams = dict(translate_const=int(image_size * 0.45),
                       img_mean=tuple(min(255, round(255 * x)) for x in mean))
        ops.append(guard_posterize(rand_augment_transform(DEIT_AUTO_AUGMENT, hparams)))
    ops += [T.ToTensor(), T.Normalize(mean, std)]
    if augment == "cifar":
        ops.append(RandomErasing(DEIT_RE_PROB, mode="pixel", max_count=1, device="cpu"))
    return T.Compose(ops), evaluate


def recipe_transforms(kind: str, image_size: int, augment: str = "auto") -> tuple[str, Callable, Callable]:
    """``(recipe, train, eval)``: the transforms the ``cifar10`` / ``cifar100`` / ``imagenet`` (any ImageFolder)
    readers apply at ``image_size``. ``augment="auto"``: ``"deit"`` for an ImageFolder; for CIFAR ``"cifar"`` (the
    small-image recipe) at ``image_size <= 64``, else ``"deit"`` evaluating the whole image (crop 1.0)."""
    image_size = _check_size(image_size)
    _check_augment(augment, AUGMENTS)
    if kind not in ("cifar10", "cifar100", "imagenet"):
        raise ValueError(f"{kind!r} has no image-file transforms (cifar10, cifar100, imagenet do)")
    if augment == "auto":
        augment = "deit" if kind == "imagenet" or image_size > 64 else "cifar"
    recipe = augment
    if kind == "imagenet":
        mean, std, crop, resize = IMAGENET_MEAN, IMAGENET_STD, DEIT_EVAL_CROP_PCT, True
    else:
        (mean, std), crop, resize = CIFAR_STATS[int(kind[5:])], 1.0, None
    if recipe == "cifar" or (recipe == "basic" and kind != "imagenet"):
        tr, ev = cifar_transforms(image_size, mean=mean, std=std, augment=recipe, resize=resize)
    else:
        tr, ev = deit_transforms(image_size, mean=mean, std=std, augment=recipe, eval_crop_pct=crop)
    return recipe, tr, ev


def _transforms(kind: str, image_size: int, augment: str, train_transform: Optional[Callable],
                eval_transform: Optional[Callable]) -> tuple[str, Callable, Callable, list[str]]:
    """``(recipe name, train, eval, which are custom)``: :func:`recipe_transforms`, with a caller's own train /
    eval transform in place of the recipe's (named in the recipe, so it changes the data's fingerprint)."""
    recipe, tr, ev = recipe_transforms(kind, image_size, augment)
    custom = []
    if train_transform is not None:
        tr = train_transform
        custom.append("train")
    if eval_transform is not None:
        ev = eval_transform
        custom.append("eval")
    return recipe + (f" (custom {'+'.join(custom)} transform)" if custom else ""), tr, ev, custom


# -------------------------------------------------------------------------------------------------- digits


class DigitsDataset(torch.utils.data.Dataset):
    """scikit-learn digits, standardised and upsampled on the fly: items ``(FloatTensor [3, S, S], int)``.

    ``images``: ``[n, 8, 8]`` float32 grey levels 0..16; ``mean`` / ``std`` apply to ``images / 16``.
    ``augment="crop"``: pad ``S // 8`` with the background (level 0) and crop ``S x S`` at a random offset
    (torch's global generator, so DataLoader workers are seeded as usual).
    """

    def __init__(self, images: np.ndarray, labels: np.ndarray, image_size: int, *, mean: float, std: float,
                 augment: str = "none"):
        self.images = torch.as_tensor(np.asarray(images, dtype=np.float32)).reshape(-1, 1, 8, 8)  # [n, 1, 8, 8]
        self.targets = np.asarray(labels, dtype=np.int64)
        self.image_size = _check_size(image_size)
        self.mean, self.std = float(mean), float(std)
        self.augment = _check_augment(augment, ("none", "crop"))

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = (self.images[i : i + 1] / 16.0 - self.mean) / self.std  # [1, 1, 8, 8]
        s = self.image_size
        x = torch.nn.functional.interpolate(x, size=(s, s), mode="bilinear", align_corners=False)  # [1, 1, S, S]
        if self.augment == "crop":
            pad = max(1, s // 8)
            x = torch.nn.functional.pad(x, (pad, pad, pad, pad), value=-self.mean / self.std)  # [1, 1, S+2p, S+2p]
            dy, dx = (int(v) for v in torch.randint(0, 2 * pad + 1, (2,)))
            x = x[..., dy : dy + s, dx : dx + s]  # [1, 1, S, S]
        return x[0].expand(3, s, s).contiguous(), int(self.targets[i])  # [3, S, S]


def load_digits_splits(image_size: int = 32, seed: int = 0, val_frac: float = 0.15, test_frac: float = 0.15,
                       *, augment: str = "none") -> ImageSplits:
    """scikit-learn's bundled digits as an image task: stratified train / val / test fixed by ``seed``."""
    from sklearn import __version__ as sklearn_version
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    image_size = _check_size(image_size)
    augment = _check_augment("none" if augment == "auto" else augment, ("none", "crop"))
    if not (0 < val_frac < 1 and 0 < test_frac < 1 and val_frac + test_frac < 1):
        raise ValueError(f"val_frac and test_frac must be in (0, 1) with a sum below 1; "
                         f"got {val_frac!r} and {test_frac!r}")
    digits = load_digits()
    images = digits.images.astype(np.float32)  # [1797, 8, 8], levels 0..16
    labels = digits.target.astype(np.int64)  # [1797]
    n = len(labels)
    n_test, n_val = int(round(test_frac * n)), int(round(val_frac * n))
    idx = np.arange(n)
    rest, test_idx = train_test_split(idx, test_size=n_test, stratify=labels, random_state=seed)
    train_idx, val_idx = train_test_split(rest, test_size=n_val, stratify=labels[rest], random_state=seed)
    train_idx, val_idx, test_idx = np.sort(train_idx), np.sort(val_idx), np.sort(test_idx)
    scaled = images[train_idx] / 16.0
    mean, std = float(scaled.mean()), float(scaled.std())

    def make(ix: np.ndarray, aug: str) -> DigitsDataset:
        return DigitsDataset(images[ix], labels[ix], image_size, mean=mean, std=std, augment=aug)

    sizes = (len(train_idx), len(val_idx), len(test_idx))
    origin = (f"sklearn digits 8x8 upsampled (bilinear) to {image_size}x{image_size}, "
              f"{sizes[0]}/{sizes[1]}/{sizes[2]} train/val/test split (stratified) seed {seed}"
              + (", train augment: random crop" if augment == "crop" else ""))
    identity = {"kind": "digits", "data": _hash_arrays(images, labels), "image_size": image_size, "seed": seed,
                "split": _hash_arrays(train_idx, val_idx, test_idx), "augment": augment, "norm": [mean, std]}
    return ImageSplits(train=make(train_idx, augment), val=make(val_idx, "none"), test=make(test_idx, "none"),
                       num_classes=10, class_names=[str(d) for d in range(10)], origin=origin,
                       fingerprint=_fingerprint(identity), kind="digits", image_size=image_size, augment=augment,
                       details={"sizes": sizes, "sklearn": sklearn_version, "mean": mean, "std": std})


# --------------------------------------------------------------------------------------------------- CIFAR


class ArrayImageDataset(torch.utils.data.Dataset):
    """Images held in memory as ``uint8 [N, H, W, 3]``, seen through ``indices``: items ``(transform(PIL), int)``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, indices: np.ndarray, transform: Callable):
        self.images = images
        self.labels = labels
        self.indices = np.asarray(indices, dtype=np.int64)
        self.transform = transform

    @property
    def targets(self) -> np.ndarray:
        return self.labels[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        from PIL import Image

        j = int(self.indices[i])
        return self.transform(Image.fromarray(self.images[j])), int(self.labels[j])


CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
CIFAR_LAYOUT = {
    10: ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], "batches.meta",
         "cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta} (cifar-10-python.tar.gz unpacked)"),
    100: ("cifar-100-python", ["train"], ["test"], "meta",
          "cifar-100-python/{train,test,meta} (cifar-100-python.tar.gz unpacked)"),
}


def _cifar_dir(root: PathLike, which: int) -> Path:
    dirname, *_, layout = CIFAR_LAYOUT[which]
    root = Path(root)
    if root.name == dirname and root.is_dir():
        return root
    d = root / dirname
    if not d.is_dir():
        where = f"{root} does not exist" if not root.exists() else f"{d} is missing"
        raise DataMissingError(f"CIFAR-{which} not found: {where}; expected ROOT/{layout} from {CIFAR_URL}",
                                     path=None)
    return d


def load_cifar(root: PathLike, which: int = 10, image_size: int = 32, *, seed: int = 0,
               val_size: Optional[int] = None, augment: str = "auto", train_transform: Optional[Callable] = None,
               eval_transform: Optional[Callable] = None) -> ImageSplits:
    """CIFAR-10 / CIFAR-100 from the python release under ``root`` (or ``root`` is the release folder itself).

    ``val`` = ``val_size`` training images chosen by a permutation fixed by ``seed`` (default: a tenth of them, at
    most 5000, which is 5000 for the release and still leaves training images in a small folder of its format);
    ``test`` = the test file.
    ``augment``: ``"auto"`` = ``"cifar"`` for ``image_size <= 64`` else ``"deit"``; or ``"cifar"``, ``"deit"``,
    ``"basic"``, ``"none"``. Explicit ``train_transform`` / ``eval_transform`` replace the recipe's.
    """
    if which not in (10, 100):
        raise ValueError(f"which must be 10 or 100, got {which!r}")
    image_size = _check_size(image_size)
    _check_augment(augment, AUGMENTS)
    d = _cifar_dir(root, which)
    dirname, train_files, test_files, meta_file, layout = CIFAR_LAYOUT[which]
    for name in [*train_files, *test_files, meta_file]:
        if not (d / name).is_file():
            raise DataMissingError(f"{d / name}: missing; expected ROOT/{layout} from {CIFAR_URL}")
    class_names = read_cifar_meta(d / meta_file, which=which)
    parts = [read_cifar_batch(d / n, which=which) for n in train_files]
    train_x = np.concatenate([p[0] for p in parts])  # [N, 32, 32, 3]
    train_y = np.concatenate([p[1] for p in parts])  # [N]
    tests = [read_cifar_batch(d / n, which=which) for n in test_files]
    test_x = np.concatenate([p[0] for p in tests])
    test_y = np.concatenate([p[1] for p in tests])
    if val_size is None:
        val_size = min(5000, len(train_y) // 10)
    if not 0 <= val_size < len(train_y):
        raise ValueError(f"val_size must be in 0..{len(train_y) - 1} (the {len(train_y)} training images of "
                         f"{d}), got {val_size!r}")
    perm = np.random.default_rng(seed).permutation(len(train_y))
    val_idx, train_idx = np.sort(perm[:val_size]), np.sort(perm[val_size:])

    recipe_name, tr, ev, custom = _transforms(f"cifar{which}", image_size, augment, train_transform, eval_transform)

    origin = (f"CIFAR-{which} python pickles at {d} ({len(train_idx)}/{len(val_idx)}/{len(test_y)} train/val/test; "
              f"val carved from {'+'.join(train_files)} seed {seed}, test = {'+'.join(test_files)}), "
              f"{image_size}x{image_size}, augment {recipe_name}")
    identity = {"kind": f"cifar{which}", "data": _hash_arrays(train_x, train_y, test_x, test_y),
                "image_size": image_size, "seed": seed, "val_size": val_size, "augment": recipe_name,
                "transforms": [repr(tr), repr(ev)] if custom else None}
    return ImageSplits(train=ArrayImageDataset(train_x, train_y, train_idx, tr),
                       val=ArrayImageDataset(train_x, train_y, val_idx, ev),
                       test=ArrayImageDataset(test_x, test_y, np.arange(len(test_y)), ev),
                       num_classes=which, class_names=class_names, origin=origin,
                       fingerprint=_fingerprint(identity), kind=f"cifar{which}", image_size=image_size,
                       augment=recipe_name, details={"root": str(d), "val_size": val_size})


# ------------------------------------------------------------------------------------------------- ImageNet

IMAGENET_LAYOUT = "ROOT/train/<wnid>/*.JPEG and ROOT/val/<wnid>/*.JPEG (torchvision ImageFolder layout)"


def read_class_list(path: PathLike) -> list[tuple[str, int]]:
    """A class-list file -> ``[(wnid, line number)]``: one name a line, blank lines and ``#`` comments ignored."""
    path = Path(path)
    if not path.is_file():
        raise DataMissingError(f"{path}: class-list file not found (expected one class folder name a line)")
    out: list[tuple[str, int]] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, 1):
            text = raw.split("#", 1)[0].strip()
            if not text:
                continue
            if len(text.split()) != 1:
                raise DataError(f"expected one class name per line, found {text!r}", path=path, line=lineno)
            if text in seen:
                raise DataError(f"class {text!r} listed twice (first on line {seen[text]})", path=path,
                                      line=lineno)
            seen[text] = lineno
            out.append((text, lineno))
    if not out:
        raise DataError("the class list names no class", path=path)
    return out


def _list_class_dirs(split_dir: Path) -> list[str]:
    return sorted(e.name for e in os.scandir(split_dir) if e.is_dir() and not e.name.startswith("."))


def _image_files(folder: Path) -> list[str]:
    from torchvision.datasets.folder import IMG_EXTENSIONS

    return [e.name for e in os.scandir(folder) if e.is_file() and e.name.lower().endswith(IMG_EXTENSIONS)]


def _resolve_classes(classes: Union[None, int, str, PathLike, Sequence[str]], train_dir: Path
                     ) -> tuple[list[str], str, dict[str, str]]:
    """The chosen wnids (sorted), a description for ``origin``, and where each came from (for errors)."""
    available = _list_class_dirs(train_dir)
    if not available:
        raise DataError(f"no class folders; expected {IMAGENET_LAYOUT}", path=train_dir)
    if isinstance(classes, str) and classes.strip().isdigit():
        classes = int(classes)
    if classes is None:
        return available, f"all {len(available)} classes", {}
    if isinstance(classes, bool):
        raise ValueError(f"classes must be None, a count, a class-list file or a list of names; got {classes!r}")
    if isinstance(classes, (int, np.integer)):
        n = int(classes)
        if not 1 <= n <= len(available):
            raise DataError(f"classes={n} but there are {len(available)} class folders (choose 1.."
                                  f"{len(available)})", path=train_dir)
        return available[:n], f"the first {n} classes (sorted)", {}
    if isinstance(classes, (str, os.PathLike)):
        path = SHIPPED_CLASSLISTS.get(str(classes), Path(classes))
        entries = read_class_list(path)
        avail = set(available)
        for wnid, lineno in entries:
            if wnid not in avail:
                close = difflib.get_close_matches(wnid, available, n=3)
                hint = f" (closest: {', '.join(close)})" if close else ""
                raise DataError(f"class {wnid!r} is not a folder of {train_dir}{hint}", path=path,
                                      line=lineno)
        where = {w: f"{path}, line {ln}" for w, ln in entries}
        return sorted(w for w, _ in entries), f"{len(entries)} classes from {path.name}", where
    names = list(classes)
    if not names or not all(isinstance(c, str) for c in names):
        raise ValueError(f"classes must be None, a count, a class-list file or a non-empty list of names; "
                         f"got {classes!r}")
    dup = sorted({c for c in names if names.count(c) > 1})
    if dup:
        raise ValueError(f"classes lists {dup} more than once")
    avail = set(available)
    for c in names:
        if c not in avail:
            close = difflib.get_close_matches(c, available, n=3)
            hint = f" (closest: {', '.join(close)})" if close else ""
            raise DataError(f"class {c!r} is not a folder of {train_dir}{hint}", path=train_dir)
    return sorted(names), f"{len(names)} listed classes", {}


class _ImageReadError(DataError, OSError):
    pass


def checked_loader(path: str):
    """torchvision's default image loader, with an error naming the file when the image cannot be read."""
    from PIL import Image, UnidentifiedImageError
    from torchvision.datasets.folder import default_loader

    try:
        img = default_loader(path)
        if isinstance(img, Image.Image):
            img.load()
        return img
    except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise _ImageReadError(f"unreadable image ({type(e).__name__}: {msg})", path=path) from None


_SUBSET_IMAGE_FOLDER: Optional[type] = None


def _subset_image_folder_class() -> type:
    """torchvision's ``ImageFolder`` restricted to given classes; made on first use (torchvision loads lazily),
    published as this module's ``SubsetImageFolder`` so that datasets pickle into DataLoader workers."""
    global _SUBSET_IMAGE_FOLDER
    if _SUBSET_IMAGE_FOLDER is None:
        from torchvision.datasets import ImageFolder

        class SubsetImageFolder(ImageFolder):
            """``ImageFolder`` over ``root`` restricted to ``wnids`` (labels = their order, sorted by the caller)."""

            def __init__(self, root: str, wnids: Sequence[str], **kwargs: Any):
                self.wnids = list(wnids)
                super().__init__(root, **kwargs)

            def find_classes(self, directory):  # noqa: ARG002  (the subset, not every folder)
                return list(self.wnids), {w: i for i, w in enumerate(self.wnids)}

        SubsetImageFolder.__module__ = __name__
        SubsetImageFolder.__qualname__ = "SubsetImageFolder"
        _SUBSET_IMAGE_FOLDER = SubsetImageFolder
    return _SUBSET_IMAGE_FOLDER


def __getattr__(name: str) -> Any:  # PEP 562: ``SubsetImageFolder`` exists once torchvision is imported
    if name == "SubsetImageFolder":
        return _subset_image_folder_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _subset_image_folder(split_dir: Path, wnids: list[str], where: dict[str, str]):
    """``SubsetImageFolder`` over ``split_dir``, after checking each class folder is there and holds images."""
    for w in wnids:
        cdir = split_dir / w
        src = f" (listed in {where[w]})" if w in where else ""
        if not cdir.is_dir():
            raise DataMissingError(f"{cdir}: class folder missing{src}; expected {IMAGENET_LAYOUT}")
        if not _image_files(cdir):
            raise DataError(f"class folder holds no image files (.jpg/.jpeg/.png/...){src}", path=cdir)
    return _subset_image_folder_class()(str(split_dir), wnids, loader=checked_loader, allow_empty=False)


class FolderView(torch.utils.data.Dataset):
    """``indices`` of an ``ImageFolder`` (read without its transform) with a transform of its own."""

    def __init__(self, folder, indices: np.ndarray, transform: Callable):
        self.folder = folder
        self.indices = np.asarray(indices, dtype=np.int64)
        self.transform = transform

    @property
    def targets(self) -> np.ndarray:
        t = np.asarray(self.folder.targets, dtype=np.int64)
        return t[self.indices]

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        path, target = self.folder.samples[int(self.indices[i])]
        return self.transform(self.folder.loader(path)), int(target)


def load_imagefolder(root: PathLike, classes: Union[None, int, str, PathLike, Sequence[str]] = None,
                     image_size: int = 224, *, seed: int = 0, val_per_class: int = 50, augment: str = "auto",
                     train_transform: Optional[Callable] = None,
                     eval_transform: Optional[Callable] = None) -> ImageSplits:
    """ImageNet (or any ImageFolder tree) under ``root``: ``train/<wnid>/*`` and ``val/<wnid>/*``.

    ``classes``: ``None`` (every class folder of ``train/``), an int N or digit string (the first N, sorted),
    a class-list file path, ``"imagenet100"`` (the shipped CMC list) or a list of wnids. ``test`` = ``val/``;
    ``val`` = ``val_per_class`` images per class carved from ``train/`` (seeded); ``train`` = the rest.
    ``augment``: ``"auto"`` = ``"deit"``, or ``"cifar"`` (the small-image recipe, for images near 32 px),
    ``"basic"``, ``"none"``.
    """
    image_size = _check_size(image_size)
    _check_augment(augment, AUGMENTS)
    root = Path(root)
    if not root.is_dir():
        raise DataMissingError(f"ImageNet root {root} does not exist; expected {IMAGENET_LAYOUT}")
    train_dir, val_dir = root / "train", root / "val"
    for sd in (train_dir, val_dir):
        if not sd.is_dir():
            raise DataMissingError(f"{sd}: split folder missing; expected {IMAGENET_LAYOUT}")
    if not _list_class_dirs(val_dir) and _image_files(val_dir):
        raise DataError(f"images lie directly in the folder, not in class folders; expected "
                              f"{IMAGENET_LAYOUT} (sort the validation images into val/<wnid>/ first)",
                              path=val_dir)
    wnids, described, where = _resolve_classes(classes, train_dir)
    train_folder = _subset_image_folder(train_dir, wnids, where)
    val_folder = _subset_image_folder(val_dir, wnids, where)

    if isinstance(val_per_class, bool) or not isinstance(val_per_class, (int, np.integer)) or val_per_class < 0:
        raise ValueError(f"val_per_class must be an int >= 0, got {val_per_class!r}")
    targets = np.asarray(train_folder.targets, dtype=np.int64)
    rng = np.random.default_rng(seed)
    val_parts = []
    for c, w in enumerate(wnids):
        members = np.flatnonzero(targets == c)
        if val_per_class >= len(members):
            raise DataError(f"{len(members)} images, too few to carve val_per_class={val_per_class} for "
                                  f"validation and keep one for training", path=train_dir / w)
        val_parts.append(rng.permutation(members)[:val_per_class])
    val_idx = np.sort(np.concatenate(val_parts)) if val_parts else np.zeros(0, np.int64)
    train_idx = np.setdiff1d(np.arange(len(targets)), val_idx)

    recipe_name, tr, ev, custom = _transforms("imagenet", image_size, augment, train_transform, eval_transform)

    n_test = len(val_folder)
    origin = (f"ImageNet ImageFolder at {root}, {described}; {len(train_idx)}/{len(val_idx)}/{n_test} "
              f"train/val/test (val = {val_per_class} per class carved from train/ seed {seed}, test = val/), "
              f"{image_size}x{image_size}, augment {recipe_name}")
    rel = lambda folder, base: [(os.path.relpath(p, base), t) for p, t in folder.samples]  # noqa: E731
    identity = {"kind": "imagenet", "classes": wnids,
                "files": hashlib.sha256(json.dumps([rel(train_folder, train_dir), rel(val_folder, val_dir)])
                                        .encode()).hexdigest(),
                "image_size": image_size, "seed": seed, "val_per_class": val_per_class, "augment": recipe_name,
                "transforms": [repr(tr), repr(ev)] if custom else None}
    return ImageSplits(train=FolderView(train_folder, train_idx, tr), val=FolderView(train_folder, val_idx, ev),
                       test=FolderView(val_folder, np.arange(n_test), ev), num_classes=len(wnids),
                       class_names=list(wnids), origin=origin, fingerprint=_fingerprint(identity), kind="imagenet",
                       image_size=image_size, augment=recipe_name,
                       details={"root": str(root), "classes": described, "val_per_class": val_per_class})


# ------------------------------------------------------------------------------------------- folder detection


def detect_folder(root: PathLike) -> tuple[str, Path]:
    """``(kind, root)`` of a user's data folder: ``cifar10`` / ``cifar100`` (the python release, ``root`` or its
    parent) or ``imagenet`` (an ImageFolder: ``root/train/<class>/``, ``root/val/<class>/``). Anything else is a
    :class:`DataError` that says what the folder holds and what to do."""
    root = Path(root)
    if not root.is_dir():
        what = "is a file" if root.exists() else "does not exist"
        raise DataMissingError(f"data folder {root} {what}; expected an ImageFolder ({IMAGENET_LAYOUT}) or "
                                     f"CIFAR's python release ({CIFAR_LAYOUT[10][4]})")
    for which in (10, 100):
        dirname = CIFAR_LAYOUT[which][0]
        if root.name == dirname or (root / dirname).is_dir():
            return f"cifar{which}", root
    if (root / "train").is_dir() and (root / "val").is_dir():
        return "imagenet", root
    dirs = _list_class_dirs(root)
    images = _image_files(root)
    with_images = [d for d in dirs if _image_files(root / d)]
    found = (f"{len(dirs)} folder(s)" + (f" ({', '.join(dirs[:4])}{', ...' if len(dirs) > 4 else ''})" if dirs
                                          else "") + f" and {len(images)} image file(s)")
    if "train" in dirs or "val" in dirs:
        missing = "val" if "train" in dirs else "train"
        todo = f"add {root / missing}/<class>/ with images of the same classes"
    elif with_images:
        todo = (f"these look like class folders: split them into {root}/train/<class>/ and {root}/val/<class>/ "
                f"(the val images are the test set)")
    else:
        todo = f"point --data-dir at a folder holding train/ and val/ (ImageFolder) or {CIFAR_LAYOUT[10][0]}/"
    raise DataError(f"not an image folder attnbench reads: found {found}; expected {IMAGENET_LAYOUT} or "
                          f"ROOT/{CIFAR_LAYOUT[10][4]}; {todo}", path=root)


def class_counts(split_dir: PathLike) -> dict[str, int]:
    """The number of image files in each class folder of ``split_dir``."""
    split_dir = Path(split_dir)
    return {d: len(_image_files(split_dir / d)) for d in _list_class_dirs(split_dir)}


# ------------------------------------------------------------------------------------------------ dispatcher


def build_splits(kind: str, *, root: Optional[PathLike] = None, image_size: Optional[int] = None, seed: int = 0,
                 classes: Union[None, int, str, PathLike, Sequence[str]] = None, augment: str = "auto",
                 **options: Any) -> ImageSplits:
    """The runner's entry point: ``kind`` in ``digits | cifar10 | cifar100 | imagenet``.

    ``root`` is the data folder (not used by ``digits``); ``image_size`` defaults per kind (32, 32, 32, 224);
    ``classes`` applies to ``imagenet`` only; ``options`` go to the loader (``val_frac`` / ``test_frac`` for
    digits, ``val_size`` for CIFAR, ``val_per_class`` for ImageNet, ``train_transform`` / ``eval_transform``).
    """
    if kind not in KINDS:
        close = difflib.get_close_matches(str(kind), KINDS, n=2)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise UnknownNameError(f"unknown image data kind {kind!r} (known: {', '.join(KINDS)}){hint}")
    size = DEFAULT_IMAGE_SIZE[kind] if image_size is None else image_size
    if classes is not None and kind != "imagenet":
        raise ValueError(f"classes applies to imagenet only, not {kind!r}")
    if kind == "digits":
        if root is not None:
            raise ValueError(f"data kind 'digits' is scikit-learn's bundled images and reads no folder, but one "
                             f"was given ({root}); leave the folder out, or read it with a preset of kind "
                             f"cifar10, cifar100 or imagenet")
        return load_digits_splits(size, seed, augment=augment, **options)
    if root is None:
        layout = CIFAR_LAYOUT[10 if kind == "cifar10" else 100][4] if kind != "imagenet" else IMAGENET_LAYOUT
        raise DataMissingError(f"{kind} needs a data folder (root); expected ROOT/{layout}"
                                     if kind != "imagenet" else f"imagenet needs a data folder (root); expected "
                                     f"{layout}")
    if kind in ("cifar10", "cifar100"):
        return load_cifar(root, 10 if kind == "cifar10" else 100, size, seed=seed, augment=augment, **options)
    return load_imagefolder(root, classes, size, seed=seed, augment=augment, **options)
