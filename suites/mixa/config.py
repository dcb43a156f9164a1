"""MixA presets: TOML data (``presets/*.toml``) loaded into typed dataclasses; an unknown key is an error.

A preset file has::

    name, description, source, setting  # strings; ``setting`` (default "mixa/<name>") keys the results
    vision                              # the vision preset (a name, or a .toml path relative to this file: the
                                        # rule of attnbench.engine.presets.resolve_reference): data, ViT, recipe, teacher
    [score]                             # ScoreConfig: the batches Eq. 3 is computed on, the form of A'
    [select]                            # SelectConfig: k and the two mechanisms (Eqs. 4-5 and 6-7)
    [kd]                                # KDConfig: soft-label distillation temperature and weight
    [train]                             # attnbench.engine.train.TrainConfig of the fine-tune of every variant
    [controls]                          # ControlsConfig: all-SteLLA, last-k, random-k seeds
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from attnbench.api.spec import parse_spec
from attnbench.core.errors import AttnbenchError
from attnbench.engine import presets
from attnbench.engine.presets import preset_names as _preset_names
from attnbench.engine.train.config import TrainConfig

LINEAR_MATRICES = ("effective", "eq7")  # = score.LINEAR_MATRICES (kept torch-free here)
SCORE_SPLITS = ("train", "val")


@dataclasses.dataclass(frozen=True)
class ScoreConfig:
    """Eq. 3 over ``batches`` batches of ``batch_size`` images of the ``split`` (drawn with ``seed``); ``A'`` as
    ``linear_matrix`` (``effective``: SteLLA's matrix times 1/N, what multiplies V; ``eq7``: Eq. 7 as
    printed). See ``suites/mixa/score.py``."""

    batches: int = 4
    batch_size: int = 64
    split: str = "train"
    seed: int = 0
    linear_matrix: str = "effective"

    def __post_init__(self) -> None:
        if self.batches < 1 or self.batch_size < 1:
            raise ValueError(f"score: batches and batch_size must be >= 1, got {self.batches}, {self.batch_size}")
        if self.split not in SCORE_SPLITS:
            raise ValueError(f"score.split must be one of {', '.join(SCORE_SPLITS)}, got {self.split!r}")
        if self.linear_matrix not in LINEAR_MATRICES:
            raise ValueError(f"score.linear_matrix must be one of {', '.join(LINEAR_MATRICES)}, "
                             f"got {self.linear_matrix!r}")


@dataclasses.dataclass(frozen=True)
class SelectConfig:
    """The top-``k`` layers get ``quadratic`` (ReLU quadratic attention, Eqs. 4-5), the rest ``linear`` (SteLLA,
    Eqs. 6-7); specs, so options may be given (``relu_quadratic:block_size=64``). The text is the preset's identity;
    ``quadratic_spec`` / ``linear_spec`` are the :class:`attnbench.api.spec.Spec` s parsed from it once, on load."""

    k: int = 6
    quadratic: str = "relu_quadratic"
    linear: str = "stella"

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"select.k must be >= 0, got {self.k}")
        for key in ("quadratic", "linear"):
            try:
                spec = parse_spec(getattr(self, key))
            except AttnbenchError as e:
                raise ValueError(f"select.{key} = {getattr(self, key)!r}: {e}") from None
            object.__setattr__(self, f"{key}_spec", spec)  # not a field: the identity stays the text


@dataclasses.dataclass(frozen=True)
class KDConfig:
    """Soft-label KD (Hinton et al.): ``alpha * T^2 * KL(softmax(t/T) || softmax(s/T)) + (1 - alpha) * CE``."""
    temperature: float = 1.0
    alpha: float = 0.5

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"kd.temperature must be > 0, got {self.temperature}")
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"kd.alpha must be in [0, 1], got {self.alpha}")


@dataclasses.dataclass(frozen=True)
class ControlsConfig:
    """The controls run beside the selected mix: every layer SteLLA (k = 0), the last k layers quadratic, and k
    random layers quadratic for each seed of ``random_seeds`` (Table 7's "QA" control)."""

    all_stella: bool = True
    last_k: bool = True
    random_seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])


@dataclasses.dataclass(frozen=True)
class MixaPreset(presets.SuitePreset):
    suite = "mixa"

    vision: Any  # the vision suite's preset (data, ViT, recipe), loaded through its registered loader
    train: TrainConfig
    score: ScoreConfig = dataclasses.field(default_factory=ScoreConfig)
    select: SelectConfig = dataclasses.field(default_factory=SelectConfig)
    kd: KDConfig = dataclasses.field(default_factory=KDConfig)
    controls: ControlsConfig = dataclasses.field(default_factory=ControlsConfig)

    def identity(self) -> dict[str, Any]:
        """What a variant's cell depends on besides its layers and the teacher: recorded and hashed."""
        return {"vision": self.vision.identity(), "train": self.train.to_dict(),
                "score": dataclasses.asdict(self.score), "select": dataclasses.asdict(self.select),
                "kd": dataclasses.asdict(self.kd)}


def preset_names() -> list[str]:
    return _preset_names(__package__)


def load_preset(name_or_path: str | Path) -> MixaPreset:
    """An embedded preset (``tiny``) or a ``.toml`` file, with the vision preset its ``vision`` key names."""
    return presets.load(MixaPreset, __package__, name_or_path, kind="mixa", references={"vision": "vision"})
