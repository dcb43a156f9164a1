"""Scaling presets: TOML data loaded into typed dataclasses (an unknown key or a wrong type is an error).

A preset names the attentions to sweep (a default; ``--attn`` replaces it), the shape, the dtypes, the grid of
``(mode, causal, sequence lengths)``, the timing and gate parameters and the per-point budgets. The embedded
presets live in ``presets/*.toml`` (package data); a path to any ``.toml`` file works too.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from attnbench.measure.timing import DTYPES, MODES
from attnbench.engine import presets
from attnbench.engine.presets import PresetError
from attnbench.engine.presets import parse_seq
from attnbench.engine.presets import preset_names as _preset_names

DEFAULT_PRESET = "cpu-default"


def parse_seq_list(csv: str) -> list[int]:
    return [parse_seq(s) for s in csv.split(",") if s.strip()]


@dataclasses.dataclass
class Timing:
    warmup_ms: float = 100.0
    rep_ms: float = 1000.0
    min_reps: int = 3
    max_reps: int = 50


@dataclasses.dataclass
class Check:
    seq_len: int = 128
    rtol: float | None = None     # replaces the per-dtype floor of attnbench.checks.tolerance (None: the policy's floor)


@dataclasses.dataclass
class Grid:
    mode: str
    seq: list[int | str]     # lengths; '4k' style strings are parsed to ints on load
    causal: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PresetError(f"grid mode must be one of {MODES}, got {self.mode!r}")
        self.seq = sorted({parse_seq(s) for s in self.seq})
        if not self.seq:
            raise PresetError("grid entry has an empty seq list")

    @property
    def task(self) -> str:
        return task_name(self.mode, self.causal)


def task_name(mode: str, causal: bool) -> str:
    """The scaling task of a point: ``fwd/bidir``, ``fwd/causal``, ``fwd+bwd/bidir``, ``fwd+bwd/causal``."""
    return f"{mode}/{'causal' if causal else 'bidir'}"


@dataclasses.dataclass(frozen=True)
class ScalingPreset(presets.SuitePreset):
    suite = "scaling"

    attentions: list[str]
    grid: list[Grid]
    batch: int = 1
    heads: int = 4
    head_dim: int = 64
    dtypes: list[str] = dataclasses.field(default_factory=lambda: ["fp32"])
    device: str = "cpu"
    seed: int = 0
    threads: int = 0
    time_budget: float = 120.0
    mem_budget_gb: float | None = None
    options: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    timing: Timing = dataclasses.field(default_factory=Timing)
    check: Check = dataclasses.field(default_factory=Check)

    def __post_init__(self) -> None:
        for d in self.dtypes:
            if d not in DTYPES:
                raise PresetError(f"preset {self.name!r}: dtype must be one of {list(DTYPES)}, got {d!r}")
        for what in ("batch", "heads", "head_dim"):
            if getattr(self, what) < 1:
                raise PresetError(f"preset {self.name!r}: {what} must be positive")
        if self.time_budget <= 0:
            raise PresetError(f"preset {self.name!r}: time_budget must be positive")
        if not self.grid:
            raise PresetError(f"preset {self.name!r}: needs at least one [[grid]] entry")


def preset_names() -> list[str]:
    """The embedded presets (``presets/*.toml`` shipped with the package)."""
    return _preset_names(__package__)


def load_preset(name_or_path: str | Path = DEFAULT_PRESET) -> ScalingPreset:
    """An embedded preset by name, or a ``.toml`` file by path."""
    return presets.load(ScalingPreset, __package__, name_or_path, kind="scaling")
