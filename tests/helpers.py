"""Test helpers: thin wrappers around the one tolerance policy (:mod:`attnbench.checks.tolerance`), and small shared
helpers.

A fast form's error against the float64 reference may be at most ``MULTIPLE`` times the error the reference itself
makes in the same precision, plus a floor per dtype (relative to ``max|ref64| + 1``). Both in float64, the reference
is the ground truth and the bound is the float64 floor.
"""

from __future__ import annotations

import torch

from attnbench.checks.tolerance import compare


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def scale_of(ref: torch.Tensor) -> float:
    return ref.double().abs().max().item() + 1.0


def assert_matches_fp64(fast: torch.Tensor, ref: torch.Tensor, what: str = "output") -> None:
    """Both computed in float64: the policy with the reference as its own ruler, i.e. the float64 floor."""
    assert fast.shape == ref.shape, f"{what}: shape {tuple(fast.shape)} != reference {tuple(ref.shape)}"
    a = compare(fast, ref, ref, names=[what], dtype=torch.float64)
    assert a.ok, f"{what}: {a.describe()} against the float64 reference"


def assert_within_policy(fast: torch.Tensor, ref_low: torch.Tensor, ref64: torch.Tensor, what: str = "output") -> None:
    """Low precision: error(fast) <= MULTIPLE * error(reference in the same precision) + floor (fast's dtype)."""
    a = compare(fast, ref_low, ref64, names=[what], dtype=fast.dtype)
    assert a.ok, f"{what}: fast-form {a.describe()}"


SMALL_DOCTOR_PRESET = """\
name = "small"
check_dtypes = ["float32"]
check_lengths = [5]
gate_len = 17
batch = 1
heads = 1
head_dim = 8
delta_heads = 1
delta_head_dim = 8
dtype = "fp32"
lengths = ["32", "64"]
modes = ["fwd", "fwd+bwd"]

[timing]
warmup_ms = 1.0
rep_ms = 3.0
"""


def small_doctor_preset(folder) -> str:
    """The doctor's cpu preset cut to seconds (lengths 32 and 64, a short gate, short timing windows), written into
    ``folder``; its path."""
    from pathlib import Path

    path = Path(folder) / "small.toml"
    path.write_text(SMALL_DOCTOR_PRESET)
    return str(path)


def load_file(name: str, path):
    """The module in the file ``path`` (a script or another project's reference, not on ``sys.path``), imported once
    under ``name``."""
    import importlib.util
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before it runs, as an import does: a dataclass in it looks its module up
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def isolate_plugins(monkeypatch):
    """The registry and the plug-in state as they are now, restored when ``monkeypatch`` undoes (conftest's ``fresh``,
    or a ``monkeypatch.context()``: plug-ins loaded inside are gone after it); ATTNBENCH_PLUGINS unset."""
    from attnbench.api import plugins, registry

    registry._ensure_loaded()
    monkeypatch.setattr(registry, "_ATTENTIONS", dict(registry._ATTENTIONS))
    monkeypatch.setattr(registry, "_FEATURE_MAPS", dict(registry._FEATURE_MAPS))
    monkeypatch.setattr(plugins, "_LOADED", dict(plugins._LOADED))
    for name in ("_BY_MODULE", "_REGISTERED"):   # the registry's bookkeeping of where each class came from
        monkeypatch.setattr(registry, name, dict(getattr(registry, name)))
    monkeypatch.setattr(registry, "_LOADING", [])
    monkeypatch.setattr(plugins, "_ENTRY_POINTS_DONE", True)
    monkeypatch.setenv(plugins.ENV, "")
    monkeypatch.setattr(plugins, "_ENV_DONE", "")
    monkeypatch.delenv(plugins.TRACEBACK_ENV, raising=False)
    return monkeypatch


def invoke_isolated(monkeypatch, args, *, cwd=None, env=None):
    """``attnbench <args>`` in this process (typer's runner on the CLI's app: a process start less), the plug-in
    state isolated for the call (:func:`isolate_plugins` on a ``monkeypatch.context()``: a plug-in it loads is gone
    after it), in ``cwd`` if given; ``env`` on top of ``COLUMNS=200``."""
    from typer.testing import CliRunner

    from attnbench.cli.main import app

    with monkeypatch.context() as mp:
        isolate_plugins(mp)
        if cwd is not None:
            mp.chdir(cwd)
        return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})
