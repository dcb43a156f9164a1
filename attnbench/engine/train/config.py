"""The trainer's typed configuration (loaded from a suite preset's ``[train]`` table; unknown keys are errors)."""

from __future__ import annotations

import dataclasses
from typing import Optional

OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("onecycle", "cosine", "polynomial", "constant")
MODES = ("max", "min")
PRECISIONS = ("fp32", "bf16", "fp16")
STRATEGIES = ("ddp", "fsdp")


@dataclasses.dataclass(frozen=True)
class ParamGroup:
    """Parameters whose names match any of ``patterns`` (``fnmatch``, e.g. ``"head.*"``, ``"*.attn.*"``) train
    at ``lr * lr_scale`` (and ``weight_decay`` if given). The first matching group wins."""

    patterns: tuple[str, ...]
    lr_scale: float = 1.0
    weight_decay: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """One training run.

    - ``batch_size`` is the global batch (all ranks, all micro-batches); ``micro_batch_size`` (0: no
      accumulation) splits each rank's share into micro-batches whose gradients are accumulated.
    - ``schedule``: ``onecycle`` (torch ``OneCycleLR``, warm-up ``warmup`` steps, ``anneal`` linear or cos: the
      LRA reference's), ``cosine`` (linear warm-up, cosine to ``lr * min_lr_ratio``), ``polynomial`` (linear
      warm-up, ``power`` decay), ``constant`` (linear warm-up).
    - evaluation every ``eval_every`` steps (and at the last); ``metric`` names the number the suite's
      evaluation returns and ``mode`` its direction (``max`` accuracy, ``min`` loss or perplexity); the best
      step's weights are kept; ``patience`` evaluations without improvement stop the run (after ``min_steps``).
    - checkpoints every ``checkpoint_every`` steps (0: at every evaluation).
    - ``frozen``: name patterns of parameters that are not trained; ``groups``: per-group learning rates.
    - ``precision``: ``bf16`` / ``fp16`` autocast (CUDA only); ``strategy``: ``ddp`` or ``fsdp`` (FSDP2) under
      torchrun.
    - ``diverge_factor`` > 1: a step whose loss exceeds it times the first step's stops the run (diverged).
    - ``ema_decay`` > 0: an exponential moving average of the weights (torch's ``AveragedModel``) is what is
      evaluated and kept as the best (DeiT's optional EMA); not with FSDP.
    """

    steps: int
    batch_size: int
    lr: float
    micro_batch_size: int = 0
    optimizer: str = "adamw"
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.9
    schedule: str = "onecycle"
    warmup: int = 0
    anneal: str = "linear"
    min_lr_ratio: float = 0.0
    power: float = 1.0
    clip_grad_value: float = 0.0
    clip_grad_norm: float = 0.0
    eval_every: int = 0
    metric: str = "accuracy"
    mode: str = "max"
    patience: int = 0
    min_steps: int = 0
    checkpoint_every: int = 0
    frozen: tuple[str, ...] = ()
    groups: tuple[ParamGroup, ...] = ()
    precision: str = "fp32"
    strategy: str = "ddp"
    ema_decay: float = 0.0  # > 0: evaluate (and keep as best) an exponential moving average of the weights
    diverge_factor: float = 0.0  # > 0: stop (failed) when a step's loss exceeds this times the first step's

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"train config: {msg}")

        for k in ("steps", "batch_size"):
            if getattr(self, k) < 1:
                bad(f"{k} must be >= 1, got {getattr(self, k)}")
        for k in ("micro_batch_size", "warmup", "eval_every", "patience", "min_steps", "checkpoint_every"):
            if getattr(self, k) < 0:
                bad(f"{k} must be >= 0, got {getattr(self, k)}")
        if not self.lr > 0:
            bad(f"lr must be > 0, got {self.lr}")
        if self.warmup >= self.steps and self.schedule != "constant":
            bad(f"warmup ({self.warmup}) must be shorter than steps ({self.steps})")
        for k, allowed in (("optimizer", OPTIMIZERS), ("schedule", SCHEDULES), ("mode", MODES),
                           ("precision", PRECISIONS), ("strategy", STRATEGIES), ("anneal", ("linear", "cos"))):
            if getattr(self, k) not in allowed:
                bad(f"{k} must be one of {', '.join(allowed)}, got {getattr(self, k)!r}")
        if self.clip_grad_value < 0 or self.clip_grad_norm < 0:
            bad("clip_grad_value / clip_grad_norm must be >= 0")
        if self.diverge_factor and self.diverge_factor <= 1.0:
            bad(f"diverge_factor must be 0 (off) or > 1, got {self.diverge_factor}")
        if not 0.0 <= self.ema_decay < 1.0:
            bad(f"ema_decay must be in [0, 1), got {self.ema_decay}")

    def precision_problem(self, device_type: str) -> Optional[str]:
        """Why this config cannot train on a ``device_type`` device (None: it can): autocast is CUDA's only."""
        if self.precision != "fp32" and device_type != "cuda":
            return f"precision {self.precision!r} is autocast on CUDA only and this machine has no GPU"
        return None

    @property
    def eval_interval(self) -> int:
        return self.eval_every or self.steps

    @property
    def checkpoint_interval(self) -> int:
        return self.checkpoint_every or self.eval_interval

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
