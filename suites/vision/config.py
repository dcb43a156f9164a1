"""Vision presets: TOML data (``presets/*.toml``) loaded into typed dataclasses; an unknown key is an error.

A preset file has::

    name, description, source          # strings; ``setting`` (default "vision/<name>") keys the results
    [data]                             # DataConfig: which images, at what size
    [model]                            # ModelConfig: the ViT (attnbench.models.vit) around the attention
    [train]                            # attnbench.engine.train.TrainConfig (steps, batch, lr, schedule, ...)
    [recipe]                           # RecipeConfig: label smoothing, mixup / cutmix, evaluation batch, workers
    [sweep]                            # ResolutionSweep: resolutions for throughput / memory after training
    [attn_options.<attention>]         # build options of one mechanism (a spec's own options override them)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional, Union

from attnbench.engine import presets
from attnbench.engine.presets import preset_names as _preset_names
from attnbench.engine.train.config import TrainConfig
from attnbench.image.data import class_counts, detect_folder

DATA_KINDS = ("digits", "cifar10", "cifar100", "imagenet")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """``kind``: ``digits`` (scikit-learn's bundled 8x8 digits, upsampled: offline), ``cifar10`` / ``cifar100``
    (python pickles under ``--data-dir``), ``imagenet`` (``train/<wnid>/``, ``val/<wnid>/`` under ``--data-dir``,
    restricted to ``classes``: an embedded class list such as ``imagenet100``, a file, or a count).
    ``val_per_class`` (ImageFolder, default 50) / ``val_size`` (CIFAR, default a tenth of the training images, at
    most 5000): the validation images carved from the training split; unset, they are left out of the preset's
    identity."""

    kind: str
    image_size: int
    classes: Optional[Union[int, str]] = None
    seed: int = 0  # the train / val / test split
    val_per_class: Optional[int] = None
    val_size: Optional[int] = None

    def options(self) -> dict[str, Any]:
        """The reader's options this config sets (``build_splits(**options)``)."""
        return {k: v for k, v in (("val_per_class", self.val_per_class), ("val_size", self.val_size))
                if v is not None}

    def identity(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        for k in ("val_per_class", "val_size"):  # unset: the identity of the presets written before they existed
            if d[k] is None:
                del d[k]
        return d

    def __post_init__(self) -> None:
        if self.kind not in DATA_KINDS:
            raise ValueError(f"data.kind must be one of {', '.join(DATA_KINDS)}, got {self.kind!r}")
        if self.image_size < 8:
            raise ValueError(f"data.image_size must be >= 8, got {self.image_size}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The ViT of :func:`attnbench.models.vit.build_vit`."""
    size: str = "deit_tiny"
    patch_size: int = 16
    global_pool: str = "token"
    drop_rate: float = 0.0
    drop_path: float = 0.1
    dwc_kernel: int = 0  # depthwise conv on V (0: off), recorded when on


@dataclasses.dataclass(frozen=True)
class RecipeConfig:
    """What the DeiT recipe adds around the trainer (timm's parts): label smoothing, mixup / cutmix, and the
    evaluation batch size and data-loader workers."""

    label_smoothing: float = 0.1
    mixup: float = 0.0
    cutmix: float = 0.0
    augment: str = "auto"  # the train transform (attnbench/image/data.py: auto, none, deit, cifar, ...)
    eval_batch_size: int = 256
    workers: int = 0


@dataclasses.dataclass(frozen=True)
class ResolutionSweep:
    """After training, the same weights (position embedding resampled) evaluated at each of ``resolutions`` for
    inference throughput and peak memory at ``batch`` images: the vision papers' high-resolution argument."""

    resolutions: list[int] = dataclasses.field(default_factory=list)
    batch: int = 8


@dataclasses.dataclass(frozen=True)
class VisionPreset(presets.SuitePreset):
    suite = "vision"

    data: DataConfig
    train: TrainConfig
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    recipe: RecipeConfig = dataclasses.field(default_factory=RecipeConfig)
    sweep: ResolutionSweep = dataclasses.field(default_factory=ResolutionSweep)
    attn_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def options_for(self, attention: str) -> dict[str, Any]:
        return dict(self.attn_options.get(attention, {}))

    def identity(self) -> dict[str, Any]:
        """What a cell trains, besides the attention: recorded and hashed into each cell's identity."""
        return {"data": self.data.identity(), "model": dataclasses.asdict(self.model),
                "train": self.train.to_dict(), "recipe": dataclasses.asdict(self.recipe),
                "sweep": dataclasses.asdict(self.sweep)}


def preset_names() -> list[str]:
    return _preset_names(__package__)


def load_preset(name_or_path: str | Path) -> VisionPreset:
    """An embedded preset (``tiny``, ``cifar10``, ``imagenet100``, ``imagenet1k``) or a ``.toml`` file."""
    return presets.load(VisionPreset, __package__, name_or_path, kind="vision")


#: What the CPU folder recipe carves for validation from each class of an ImageFolder's train/: a tenth of the
#: smallest class, between 1 and the readers' default of 50.
FOLDER_VAL_FRACTION = 10
FOLDER_KINDS = {"imagenet": "ImageFolder", "cifar10": "CIFAR-10 folder", "cifar100": "CIFAR-100 folder"}


def with_folder(pre: VisionPreset, data_dir: Optional[str]) -> VisionPreset:
    """The CPU recipe on a user's folder: a ``digits`` preset (``tiny``) given ``--data-dir`` reads that folder (an
    ImageFolder ``DIR/train/<class>/``, ``DIR/val/<class>/`` or CIFAR's python release, detected) with the same
    ViT, resolution and schedule, the small-image DeiT recipe (``augment = "cifar"``: crop, flip, RandAugment,
    erasing), setting ``<preset key>/<folder name>``; on an ImageFolder smaller than a batch, the batch is the
    whole training split. Any other preset, or no folder: ``pre`` unchanged."""
    if data_dir is None or pre.data.kind != "digits":
        return pre

    kind, root = detect_folder(data_dir)
    data = dataclasses.replace(pre.data, kind=kind, classes=None)
    train = pre.train
    if kind == "imagenet":
        counts = class_counts(root / "train")
        if data.val_per_class is None:
            data = dataclasses.replace(data, val_per_class=max(1, min(50, min(counts.values(), default=0)
                                                                      // FOLDER_VAL_FRACTION)))
        n_train = sum(counts.values()) - data.val_per_class * len(counts)
        if 0 < n_train < train.batch_size:
            train = dataclasses.replace(train, batch_size=n_train)
    augment = "cifar" if pre.recipe.augment in ("auto", "none", "crop") else pre.recipe.augment
    name = Path(data_dir).resolve().name
    return dataclasses.replace(
        pre, data=data, train=train, recipe=dataclasses.replace(pre.recipe, augment=augment),
        setting=f"{pre.key}/{name}", attn_options=pre.attn_options,
        description=f"the {pre.name} CPU recipe on the {FOLDER_KINDS[kind]} {name} ({pre.data.image_size}x"
                    f"{pre.data.image_size}, {pre.model.size} ViT, {pre.train.steps} steps)")
