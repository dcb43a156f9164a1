"""LRA presets: TOML data (``presets/*.toml``) loaded into typed dataclasses; an unknown key is an error.

A preset file has::

    name, description, source          # strings; ``setting`` (default "lra/<name>") keys the results
    tasks_default = [...]              # tasks run when --tasks is not given
    [model]                            # ModelConfig: dim, ffn_dim, heads, head_dim, layers, dropout
    [train]                            # TaskConfig fields shared by every task (defaults)
    [tasks.<task>]                     # TaskConfig fields for one task (override [train])
    [tasks.<task>.generate]            # listops / pathfinder only: synthetic data when no data directory has it
    [attn_options.<attention>]         # build options of one mechanism (checked by the registry when built)

Every key is checked: a key that is not a field of its table, or a value of the wrong type, raises
:class:`PresetError` naming the key, the table and the file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional, Union

from attnbench.engine import presets
from attnbench.results import provenance
from attnbench.engine.presets import PresetError, build, check_keys, coerce
from attnbench.engine.presets import preset_names as _preset_names

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
PAIR_TASKS = ("retrieval",)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The Skyformer/Nyströmformer LRA model (``lra_config.py``: 2 layers, dim 64, FFN 128, 2 x 32 heads, 0.1)."""

    dim: int = 64
    ffn_dim: int = 128
    heads: int = 2
    head_dim: int = 32
    layers: int = 2
    dropout: float = 0.1

    def __post_init__(self) -> None:
        for k in ("dim", "ffn_dim", "heads", "head_dim", "layers"):
            if getattr(self, k) < 1:
                raise ValueError(f"model.{k} must be positive, got {getattr(self, k)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout must be in [0, 1), got {self.dropout}")


@dataclasses.dataclass(frozen=True)
class ListopsGenerate:
    """Arguments of :func:`attnbench.suites.lra.generate.generate_listops` (LRA's algorithm)."""

    n_train: int
    n_val: int
    n_test: int
    seed: int = 0
    max_depth: int = 10
    max_args: int = 10
    min_length: int = 500
    max_length: int = 2000


@dataclasses.dataclass(frozen=True)
class PathfinderGenerate:
    """Arguments of :func:`attnbench.suites.lra.generate.generate_pathfinder` (split 80/10/10 by the reader)."""

    n: int
    seed: int = 0
    contour_length: int = 14
    size: int = 32


GENERATORS: dict[str, type] = {"listops": ListopsGenerate, "pathfinder": PathfinderGenerate}


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """Training and evaluation of one task.

    ``steps`` optimizer steps of ``batch_size`` (the *global* batch, split over ``--nproc`` ranks); AdamW
    (``betas``, ``eps``, ``weight_decay``) under ``OneCycleLR(max_lr=lr, pct_start=warmup/steps,
    anneal_strategy='linear')`` as the reference ``run_tasks.py``/``main.py``; gradient values clipped to
    ``clip_grad_value`` (0: off; Skyformer clips at 1). Validation every ``eval_every`` steps (and at the last
    step) on ``eval_batches`` batches (0: the whole split); early stop after ``patience`` evaluations without a
    better validation accuracy, never before ``min_steps`` (0/0: off). The test split is evaluated once, with the
    weights of the best validation step. A checkpoint is written every ``checkpoint_every`` steps (0: at every
    evaluation). ``*_limit`` keep only that many examples of a split (a fixed random subset; 0: all).
    ``data``: where the examples come from — ``auto`` (the real files under ``--data-dir`` when it holds them,
    else the ``generate`` table's synthetic data), ``files`` (real files only) or ``generate`` (always synthetic,
    e.g. when the preset's lengths are made for its generator).
    """

    seq_len: int
    batch_size: int
    lr: float
    warmup: int
    steps: int
    eval_every: int
    eval_batches: int = 0
    eval_batch_size: int = 0  # 0: batch_size
    patience: int = 0
    min_steps: int = 0
    weight_decay: float = 0.0
    betas: list[float] = dataclasses.field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-6
    clip_grad_value: float = 0.0
    checkpoint_every: int = 0
    train_limit: int = 0
    val_limit: int = 0
    test_limit: int = 0
    data: str = "auto"  # auto: files under --data-dir if there, else generated | files | generate
    difficulty: str = "hard"  # pathfinder: easy | intermediate | hard (contour length 6 / 9 / 14)
    resolution: int = 32  # pathfinder: image side; seq_len must be resolution**2
    generate: Optional[Union[ListopsGenerate, PathfinderGenerate]] = None

    def __post_init__(self) -> None:
        for k in ("seq_len", "batch_size", "steps", "eval_every"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} must be positive, got {getattr(self, k)}")
        for k in ("warmup", "eval_batches", "eval_batch_size", "patience", "min_steps", "checkpoint_every",
                  "train_limit", "val_limit", "test_limit"):
            if getattr(self, k) < 0:
                raise ValueError(f"{k} must be >= 0, got {getattr(self, k)}")
        if not 0 <= self.warmup < self.steps:
            raise ValueError(f"warmup ({self.warmup}) must be < steps ({self.steps}) (OneCycleLR's pct_start < 1)")
        if self.warmup == 1:
            raise ValueError("warmup must be 0 or >= 2 (OneCycleLR divides by warmup - 1)")
        if self.lr <= 0:
            raise ValueError(f"lr must be positive, got {self.lr}")
        if self.data not in ("auto", "files", "generate"):
            raise ValueError(f"data must be 'auto', 'files' or 'generate', got {self.data!r}")
        if len(self.betas) != 2:
            raise ValueError(f"betas must have two values, got {self.betas}")

    @property
    def eval_bs(self) -> int:
        return self.eval_batch_size or self.batch_size

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Preset(presets.SuitePreset):
    suite = "lra"

    tasks: dict[str, TaskConfig]
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    tasks_default: list[str] = dataclasses.field(default_factory=lambda: list(TASKS))
    attn_options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def task(self, name: str) -> TaskConfig:
        if name not in self.tasks:
            raise PresetError(f"preset {self.name!r} has no task {name!r} (it has: {', '.join(self.tasks)})")
        return self.tasks[name]

    def options_for(self, attention: str) -> dict[str, Any]:
        return dict(self.attn_options.get(attention, {}))

    def cell_hash(self, task: str, attention: str, options: dict[str, Any]) -> str:
        """Identity of what a (task, attention) cell trains: the model, the task config, the mechanism and its
        options (the preset's merged with the command line's)."""
        return provenance.config_hash({"model": dataclasses.asdict(self.model), "task": self.task(task).to_dict(),
                                       "options": options, "attention": attention, "task_name": task})


def preset_names() -> list[str]:
    return _preset_names(__package__)


def _read_tasks(data: dict, file: str) -> dict[str, Any]:
    """``[train]`` (defaults of every task), ``[tasks.<task>]`` (each merged over them, with its optional
    ``generate`` table) and ``tasks_default`` (default: every task of the file)."""
    train = data.get("train", {})
    check_keys(train, [f.name for f in dataclasses.fields(TaskConfig) if f.name != "generate"], f"{file}: [train]")
    tasks_tbl = data.get("tasks", {})
    if not isinstance(tasks_tbl, dict) or not tasks_tbl:
        raise PresetError(f"{file}: needs at least one [tasks.<task>] table")
    check_keys(tasks_tbl, TASKS, f"{file}: [tasks]")
    tasks = {}
    for task, tbl in tasks_tbl.items():
        where = f"{file}: [tasks.{task}]"
        if not isinstance(tbl, dict):
            raise PresetError(f"{where}: expected a table")
        tbl = dict(tbl)
        gen = tbl.pop("generate", None)
        merged = {**train, **tbl}
        cfg = build(TaskConfig, merged, where, skip=("generate",))
        if gen is not None:
            if task not in GENERATORS:
                raise PresetError(f"{file}: [tasks.{task}.generate]: task {task!r} has no generator (only "
                                  f"{', '.join(GENERATORS)} can be generated); it reads real data from --data-dir")
            cfg = dataclasses.replace(cfg, generate=build(GENERATORS[task], gen, f"{file}: [tasks.{task}.generate]"))
        if task == "pathfinder" and cfg.generate is not None and cfg.generate.size != cfg.resolution:
            raise PresetError(f"{file}: [tasks.pathfinder.generate]: size {cfg.generate.size} must equal the task's "
                              f"resolution {cfg.resolution}")
        if task == "pathfinder" and cfg.seq_len != cfg.resolution ** 2:
            raise PresetError(f"{where}: pathfinder seq_len must be resolution**2 = {cfg.resolution ** 2}, "
                              f"got {cfg.seq_len}")
        if task == "image" and cfg.seq_len != 1024:
            raise PresetError(f"{where}: image seq_len must be 1024 (32x32 CIFAR-10), got {cfg.seq_len}")
        if cfg.data == "generate" and cfg.generate is None:
            raise PresetError(f"{where}: data = 'generate' needs a [tasks.{task}.generate] table")
        tasks[task] = cfg
    tasks_default = coerce(list[str], data.get("tasks_default", list(tasks)), f"{file}: key 'tasks_default'")
    for t in tasks_default:
        if t not in tasks:
            raise PresetError(f"{file}: tasks_default names {t!r}, which has no [tasks.{t}] table")
    return {"tasks": tasks, "tasks_default": tasks_default}


def load_preset(name_or_path: str | Path) -> Preset:
    """An embedded preset (``tiny``, ``skyformer``) or a ``.toml`` file; every key is checked (see module doc)."""
    return presets.load(Preset, __package__, name_or_path, kind="LRA", own=("train", "tasks", "tasks_default"),
                        read=_read_tasks)
