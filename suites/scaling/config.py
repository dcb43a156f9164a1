"""Scaling presets: TOML data loaded into typed dataclasses (an unknown key or a wrong type is an error).

A preset names the attentions to sweep (a default; ``--attn`` replaces it), the shape, the dtypes, the grid of
``(mode, causal, sequence lengths)``, the timing and gate parameters and the per-point budgets. The embedded
presets live in ``presets/*.toml`` (package data); a path to any ``.toml`` file works too.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from attnbench.bench import DTYPES, MODES
from attnbench.protocol import AttnbenchError, UnknownNameError

DEFAULT_PRESET = "cpu-default"


class PresetError(AttnbenchError):
    """A preset that does not load: unknown key, wrong type, bad value."""


def parse_seq(value: int | str) -> int:
    """``4096``, ``"4096"``, ``"4k"`` (= 4096), ``"1m"`` (= 1048576) -> int."""
    if isinstance(value, bool):
        raise ValueError(f"not a sequence length: {value!r}")
    if isinstance(value, int):
        n = value
    else:
        s = str(value).strip().lower()
        mult = {"k": 1024, "m": 1024 * 1024}.get(s[-1:], 1)
        body = s[:-1] if mult > 1 else s
        try:
            n = int(float(body) * mult) if "." in body else int(body) * mult
        except ValueError:
            raise ValueError(f"not a sequence length: {value!r} (expected e.g. 4096 or '4k')") from None
    if n < 1:
        raise ValueError(f"sequence length must be positive, got {value!r}")
    return n


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
    rtol: float | None = None     # None: the per-dtype default of attnbench.bench.RTOL


@dataclasses.dataclass
class Grid:
    mode: str
    seq: list[int]
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


@dataclasses.dataclass
class ScalingPreset:
    name: str
    attentions: list[str]
    grid: list[Grid]
    description: str = ""
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


# --- the typed loader ------------------------------------------------------------------------------------------
def from_dict(cls: type, data: Any, where: str) -> Any:
    """Build dataclass ``cls`` from ``data``; unknown keys, missing required keys and wrong types are errors
    that name the key (``where`` is its path, e.g. ``preset cpu-default: grid[1]``)."""
    if not isinstance(data, dict):
        raise PresetError(f"{where}: expected a table, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise PresetError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
                raise PresetError(f"{where}: missing required key {name!r}")
            continue
        kwargs[name] = _coerce(hints[name], data[name], f"{where}.{name}")
    try:
        return cls(**kwargs)
    except PresetError:
        raise
    except (TypeError, ValueError) as e:
        raise PresetError(f"{where}: {e}") from None


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(a, value, where)
            except PresetError as e:
                errors.append(str(e))
        raise PresetError(errors[0] if errors else f"{where}: bad value {value!r}")
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin is list:
        if not isinstance(value, list):
            raise PresetError(f"{where}: expected a list, got {type(value).__name__}")
        (item,) = args or (Any,)
        if item is int and where.endswith(".seq"):  # sequence lengths may be written '4k'
            item = typing.Union[int, str]
        return [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise PresetError(f"{where}: expected a table, got {type(value).__name__}")
        _, vt = args or (Any, Any)
        return {str(k): _coerce(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is Any:
        return value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(tp, type) and not (tp is int and isinstance(value, bool)) and isinstance(value, tp):
        return value
    raise PresetError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def preset_names() -> list[str]:
    """The embedded presets (``presets/*.toml`` shipped with the package)."""
    folder = resources.files(__package__) / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_preset(name_or_path: str | Path = DEFAULT_PRESET) -> ScalingPreset:
    """An embedded preset by name, or a ``.toml`` file by path."""
    p = Path(name_or_path)
    if p.suffix == ".toml" and p.exists():
        text, where = p.read_text(), f"preset file {p}"
    else:
        name = str(name_or_path)
        res = resources.files(__package__) / "presets" / f"{name}.toml"
        if not res.is_file():
            import difflib

            known = preset_names()
            close = difflib.get_close_matches(name, known, n=2, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise UnknownNameError(f"unknown scaling preset {name!r}{hint} (embedded: {', '.join(known)}; "
                                   f"or give a path to a .toml file)")
        text, where = res.read_text(), f"preset {name}"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PresetError(f"{where}: not valid TOML: {e}") from None
    return from_dict(ScalingPreset, data, where)
