"""The scaling suite: time, peak memory and FLOPs of each attention as the sequence grows.

A plug-in: this module registers the suite's :class:`attnbench.api.suites.Suite` record, and stays cheap to
import (no torch): every ``attnbench`` invocation discovers all suites. The parts, imported when used:

- ``cli``: ``attnbench run scaling`` (:func:`~.cli.run_scaling_cmd`);
- ``runner``: :func:`plan_scaling` (a preset plus overrides -> the points) and :func:`run_scaling` (measure the
  points into a :class:`attnbench.results.store.Store`);
- ``config``: presets, TOML data in ``presets/`` (:func:`load_preset`);
- ``leaderboard``: leaderboards and plots (``attnbench table/plot scaling``);
- ``ingest``: pytest-benchmark JSON files (``attnbench ingest``).

The names below (``plan_scaling``, ``load_preset``, ...) are re-exported lazily from those modules.
"""

from __future__ import annotations

import importlib
from typing import Any

from attnbench.api.suites import Suite, register_suite

from .cli import run_scaling_cmd
from .ingest import ingest
from .leaderboard import VIEW

_LAZY = {
    "config": ("DEFAULT_PRESET", "Check", "Grid", "PresetError", "ScalingPreset", "Timing", "load_preset",
               "parse_seq", "parse_seq_list", "preset_names", "task_name"),
    "runner": ("SUITE", "Point", "ScalingPlan", "ScalingResult", "parse_inject", "plan_scaling", "run_cli",
               "run_scaling"),
}
_WHERE = {name: module for module, names in _LAZY.items() for name in names}

__all__ = ["run_scaling_cmd", *_WHERE]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


class _LazyView:
    """The suite's :class:`attnbench.views.tables.View`, imported on first use (``table``/``plot``/``export``)."""
    def _view(self):
        return VIEW

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view(), name)


def _ingest(path, store):
    """pytest-benchmark JSON (from pytest benchmarks --benchmark-json)."""
    return ingest(path, store)


register_suite(Suite(
    name="scaling",
    help="Time, peak memory and FLOPs of each attention as N grows, gated on correctness; resumable.",
    run=run_scaling_cmd,
    view=_LazyView(),
    ingest=_ingest,
))
