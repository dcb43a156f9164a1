"""The scaling suite: time, peak memory and FLOPs of each attention as the sequence grows.

``attnbench run scaling`` -> :func:`run_cli`; the library entry points are :func:`plan_scaling` (a preset
plus overrides -> the points) and :func:`run_scaling` (measure the points into a :class:`attnbench.store.Store`).
Presets are TOML data in ``presets/`` (:func:`load_preset`).
"""

from .config import (DEFAULT_PRESET, Check, Grid, PresetError, ScalingPreset, Timing, load_preset, parse_seq,
                     parse_seq_list, preset_names, task_name)
from .runner import SUITE, Point, ScalingPlan, ScalingResult, parse_inject, plan_scaling, run_cli, run_scaling

__all__ = [
    "DEFAULT_PRESET", "Check", "Grid", "PresetError", "ScalingPreset", "Timing", "load_preset", "parse_seq",
    "parse_seq_list", "preset_names", "task_name", "SUITE", "Point", "ScalingPlan", "ScalingResult",
    "parse_inject", "plan_scaling", "run_cli", "run_scaling",
]
