"""ViT-AdaLA presets: TOML data (``presets/*.toml``) loaded into typed dataclasses; an unknown key is an error.

A preset file has::

    name, description, source          # strings; ``setting`` (default "adala/<name>") keys the results
    vision                             # the vision preset (a name, or a .toml path relative to this file: the rule
                                       # of attnbench.engine.presets.resolve_reference) that gives the data, the ViT,
                                       # the recipe, the teacher and the from-scratch row
    [adala]                            # AdalaOptions: lambda of Eq. 4 and the choices the paper leaves open
    [stage1] [stage2] [stage3]         # one attnbench.engine.train.TrainConfig per stage
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from attnbench.engine import presets
from attnbench.engine.presets import preset_names as _preset_names
from attnbench.engine.train.config import TrainConfig

ATTN_OUTPUTS = ("proj", "heads")
FEATURES = ("tokens", "prenorm", "pooled")
HEADS = ("new", "teacher")
ALL_STAGES = (1, 2, 3)


def parse_stages(text: str | list | tuple) -> tuple[int, ...]:
    """``"1,2,3"`` / ``"2,3"`` / ``[1, 3]`` -> a sorted tuple of distinct stages out of 1, 2, 3."""
    items = text.replace("+", ",").split(",") if isinstance(text, str) else list(text)
    out = set()
    for it in items:
        s = str(it).strip()
        if not s:
            continue
        if s not in ("1", "2", "3"):
            raise ValueError(f"stages: {s!r} is not a stage (the stages are 1, 2, 3; e.g. --stages 1,2,3)")
        out.add(int(s))
    if not out:
        raise ValueError(f"stages: none given in {text!r} (e.g. --stages 1,2,3)")
    return tuple(sorted(out))


def stages_label(stages: tuple[int, ...]) -> str:
    return "+".join(str(s) for s in stages)


@dataclasses.dataclass(frozen=True)
class AdalaOptions:
    """What the paper fixes (``lam``, ``backbone_lr_scale``) and what it leaves open (see
    :mod:`attnbench.suites.adala.pipeline` for the reasoning behind each default).

    - ``lam``: Eq. 4's lambda (Table 5: DINOv2 5, SigLIP 1, CLIP 4000, supervised IN-1K ViT 1).
    - ``attn_output``: Eq. 3 compares the attention outputs after W_O (``proj``, default) or the heads'
      concatenation before it (``heads``).
    - ``features``: Eq. 4's final features: ``tokens`` (every token after the final norm: timm's
      ``forward_features``, default), ``prenorm`` (every token before it), ``pooled`` (the head's input: the
      class token or the token mean after the norm).
    - ``stage1_mech``: also train the student mechanism's own parameters (e.g. hedgehog's feature maps) in
      stage 1; the paper trains W_Q, W_K, W_V only (default false).
    - ``head``: stage 3 appends a new linear head (``new``, the paper) or keeps the teacher's (``teacher``).
    - ``backbone_lr_scale``: stage 3's backbone lr relative to the head's (Sec. 4: 0.1).
    - ``ablation``: the stage sets ``--ablation`` runs (default Table 3's rows: 3, 1+3, 2+3, 1+2+3).
    """

    lam: float = 1.0
    attn_output: str = "proj"
    features: str = "tokens"
    stage1_mech: bool = False
    head: str = "new"
    backbone_lr_scale: float = 0.1
    ablation: list[str] = dataclasses.field(default_factory=lambda: ["3", "1,3", "2,3", "1,2,3"])

    def __post_init__(self) -> None:
        for k, allowed in (("attn_output", ATTN_OUTPUTS), ("features", FEATURES), ("head", HEADS)):
            if getattr(self, k) not in allowed:
                raise ValueError(f"{k} must be one of {', '.join(allowed)}, got {getattr(self, k)!r}")
        if not self.lam > 0:
            raise ValueError(f"lam must be > 0, got {self.lam}")
        if not self.backbone_lr_scale > 0:
            raise ValueError(f"backbone_lr_scale must be > 0, got {self.backbone_lr_scale}")
        for a in self.ablation:
            parse_stages(a)

    def ablation_sets(self) -> list[tuple[int, ...]]:
        return [parse_stages(a) for a in self.ablation]


@dataclasses.dataclass(frozen=True)
class AdalaPreset(presets.SuitePreset):
    suite = "adala"

    vision: Any  # the vision suite's preset (data, ViT, recipe, teacher), loaded through its registered loader
    stage1: TrainConfig
    stage2: TrainConfig
    stage3: TrainConfig
    adala: AdalaOptions = dataclasses.field(default_factory=AdalaOptions)

    def __post_init__(self) -> None:
        for k, metric in ((1, "loss"), (2, "loss"), (3, "top1")):
            if self.stage(k).metric != metric:
                raise ValueError(f"[stage{k}] metric must be {metric!r} (what stage {k} evaluates), got "
                                 f"{self.stage(k).metric!r}")

    def stage(self, k: int) -> TrainConfig:
        return {1: self.stage1, 2: self.stage2, 3: self.stage3}[k]

    def budget(self, stages: tuple[int, ...] = ALL_STAGES) -> int:
        """Optimizer steps of ``stages`` (the from-scratch row trains for the full pipeline's budget)."""
        return sum(self.stage(k).steps for k in stages)

    def identity(self) -> dict[str, Any]:
        return {"adala": dataclasses.asdict(self.adala), **{f"stage{k}": self.stage(k).to_dict() for k in ALL_STAGES}}

    def load_vision(self):
        """The vision preset (loaded with this preset)."""
        return self.vision


def preset_names() -> list[str]:
    return _preset_names(__package__)


def load_preset(name_or_path: str | Path) -> AdalaPreset:
    """An embedded preset (``tiny``) or a ``.toml`` file, with the vision preset its ``vision`` key names."""
    return presets.load(AdalaPreset, __package__, name_or_path, kind="adala", references={"vision": "vision"})
