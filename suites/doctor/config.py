"""Doctor presets: TOML data (``presets/*.toml``; a path to any ``.toml`` works too), every key checked.

A preset names the contract's precisions and lengths, the timed shapes (linear attention and softmax at
``heads x head_dim``, the delta rule at ``delta_heads x delta_head_dim``), the timed lengths and modes, the
precision of the timings, the mechanisms also timed under ``torch.compile``, the presets whose smokes run, and the
time budget.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from attnbench.engine import presets
from attnbench.engine.presets import PresetError, parse_seq
from attnbench.engine.presets import preset_names as _preset_names

CHECK_DTYPES = ("float64", "float32", "float16", "bfloat16")
TIMED_DTYPES = ("fp32", "bf16", "fp16")
MODES = ("fwd", "fwd+bwd")


@dataclasses.dataclass
class Timing:
    warmup_ms: float = 25.0
    rep_ms: float = 100.0


@dataclasses.dataclass(frozen=True)
class DoctorPreset(presets.SuitePreset):
    suite = "doctor"

    budget_min: float = 8.0
    check_dtypes: list[str] = dataclasses.field(default_factory=lambda: ["float32"])
    check_lengths: list[int] = dataclasses.field(default_factory=lambda: [1, 7, 129])
    gate_len: int = 256
    batch: int = 1
    heads: int = 4
    head_dim: int = 64
    delta_heads: int = 4
    delta_head_dim: int = 64
    dtype: str = "bf16"
    lengths: list[str] = dataclasses.field(default_factory=lambda: ["1k"])
    modes: list[str] = dataclasses.field(default_factory=lambda: list(MODES))
    compile: list[str] = dataclasses.field(default_factory=list)   # mechanisms also timed under torch.compile
    smokes: list[str] = dataclasses.field(default_factory=list)    # "suite/preset" smokes run on the device
    smoke_estimate_s: float = 45.0
    timing: Timing = dataclasses.field(default_factory=Timing)

    def __post_init__(self) -> None:
        bad = [d for d in self.check_dtypes if d not in CHECK_DTYPES]
        if bad:
            raise PresetError(f"preset {self.name!r}: check_dtypes must be among {list(CHECK_DTYPES)}, got {bad}")
        if self.dtype not in TIMED_DTYPES:
            raise PresetError(f"preset {self.name!r}: dtype must be one of {list(TIMED_DTYPES)}, got {self.dtype!r}")
        bad = [m for m in self.modes if m not in MODES]
        if bad:
            raise PresetError(f"preset {self.name!r}: modes must be among {list(MODES)}, got {bad}")
        for what in ("batch", "heads", "head_dim", "delta_heads", "delta_head_dim", "gate_len"):
            if getattr(self, what) < 1:
                raise PresetError(f"preset {self.name!r}: {what} must be positive")
        if self.budget_min <= 0:
            raise PresetError(f"preset {self.name!r}: budget_min must be positive")
        for n in self.lengths:
            try:
                parse_seq(n)
            except ValueError as e:
                raise PresetError(f"preset {self.name!r}: lengths: {e}") from None
        bad = [s for s in self.smokes if s.count("/") != 1]
        if bad:
            raise PresetError(f"preset {self.name!r}: smokes are 'suite/preset' names, got {bad}")

    @property
    def seq_lens(self) -> list[int]:
        return sorted(parse_seq(n) for n in self.lengths)

    def identity(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in ("path", "budget_min", "description")}


def preset_names() -> list[str]:
    return _preset_names(__package__)


def load_preset(name_or_path: str | Path) -> DoctorPreset:
    """An embedded preset by name, or a ``.toml`` file by path."""
    return presets.load(DoctorPreset, __package__, name_or_path, kind="doctor")
