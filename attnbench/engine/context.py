"""The options every suite's run shares, and the one context a suite's runner runs in.

:class:`RunOptions` is what ``attnbench run <suite>`` parses once for every suite (seed, store, work directory,
shard, threads, launch; see :func:`attnbench.cli.kit.run_command`) and hands to the suite's runner.
:class:`RunContext` owns what every runner needs once: the device, the process group under torchrun, the
thread count of the run (set once, recorded with every result by the store), the work directory, the sweep call
and the shutdown. Torch-free at import (the CLI imports this for ``--help``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from attnbench.core.errors import AttnbenchError
from attnbench.engine.sweep import run_sweep
from attnbench.engine.train.dist import Dist, default_device, init_dist, shutdown
from attnbench.results.paths import project_root


def work_dir(suite: str, out: Optional[str] = None) -> Path:
    """The work directory of a suite's run: ``out``, else ``results/runs/<suite>`` at the project root (the one
    definition of that default)."""

    return Path(out) if out else project_root() / "results" / "runs" / suite


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The shared options of a suite's run. ``seeds`` is ``[seed]`` unless several seeds were given (``seed`` is
    then the first); ``out`` is the user's ``--out`` (None: the suite's default, :meth:`work`, or a temporary
    folder for a smoke run); ``shard`` is ``(K, N)``; ``threads`` None or 0 leaves torch's count as it is;
    ``compile``: the trainer runs the model through ``torch.compile`` (:func:`attnbench.engine.train.trainer.train`);
    ``argv`` is the command line recorded with the run."""

    seed: int = None  # type: ignore[assignment]  # filled in from seeds
    seeds: list[int] = None  # type: ignore[assignment]  # filled in from seed
    force: bool = False
    db: Optional[str] = None
    out: Optional[str] = None
    nproc: int = 1
    shard: Optional[tuple[int, int]] = None
    launcher: str = "local"
    jobs: int = 1
    partition: Optional[str] = None
    gpus_per_job: int = 0
    job_minutes: int = 240
    threads: Optional[int] = None
    compile: bool = False
    plugins: list[str] = dataclasses.field(default_factory=list)
    argv: Optional[list[str]] = None

    def __post_init__(self) -> None:
        seeds = None if self.seeds is None else [int(s) for s in self.seeds]
        if seeds is None:
            seeds = [0 if self.seed is None else int(self.seed)]
        if not seeds:
            raise AttnbenchError("--seeds: give at least one seed, e.g. --seeds 0,1,2")
        if len(set(seeds)) != len(seeds):
            raise AttnbenchError(f"--seeds {','.join(map(str, seeds))}: a seed is given twice")
        if self.seed is not None and int(self.seed) != seeds[0]:
            raise AttnbenchError(f"seed {self.seed} and seeds {seeds}: give one of --seed / --seeds")
        object.__setattr__(self, "seeds", seeds)
        object.__setattr__(self, "seed", seeds[0])
        object.__setattr__(self, "plugins", list(self.plugins or []))
        if self.threads is not None and self.threads < 0:
            raise AttnbenchError(f"--threads must be >= 0 (0: torch's default), got {self.threads}")
        if self.nproc < 1:
            raise AttnbenchError(f"--nproc must be >= 1, got {self.nproc}")

    def replace(self, **changes: Any) -> "RunOptions":
        """A copy with ``changes`` (field names); a new ``seed`` replaces ``seeds`` and a new ``seeds`` the seed."""
        if "seed" in changes and "seeds" not in changes:
            changes["seeds"] = None
        elif "seeds" in changes and "seed" not in changes:
            changes["seed"] = None
        return dataclasses.replace(self, **changes)

    def only_seed(self) -> int:
        """The run's one seed. Runners that build one cell per seed of ``seeds`` do not call this (#25)."""
        if len(self.seeds) > 1:
            raise AttnbenchError(f"--seeds {','.join(map(str, self.seeds))}: this suite runs one seed per command "
                                 f"so far; run it once per seed with --seed")
        return self.seed

    def work(self, suite: str) -> Path:
        """This run's work directory (:func:`work_dir`)."""
        return work_dir(suite, self.out)


def run_options(opts: Optional[RunOptions] = None, **fields: Any) -> RunOptions:
    """``opts`` (default: all defaults) with ``fields`` over it: how a runner called from Python (tests, smoke runs,
    another runner) may give single fields, e.g. ``run_lra(..., db=path, out=folder)``."""
    opts = opts or RunOptions()
    return opts.replace(**fields) if fields else opts


class RunContext:
    """One suite run: ``RunContext(opts, suite=...)`` picks the device and sets the run's thread count; ``with ctx:``
    joins the process group torchrun set up (and leaves it on exit); :meth:`sweep` runs the cells through
    :func:`attnbench.engine.sweep.run_sweep` with the run's store, force, shard, threads and command line.

    A runner that first runs another suite's runner in this process (a teacher trained by the vision suite) does
    that before ``with ctx:``: that runner opens and closes its own process group."""

    def __init__(self, opts: RunOptions, *, suite: str, console=None, progress: bool = True):
        from rich.console import Console

        self.opts = opts
        self.suite = suite
        self.console = console or Console()
        self.progress = progress
        self.device = default_device()
        self.dist = Dist()
        self._set_threads()

    def _set_threads(self) -> None:
        if self.opts.threads:  # a run parameter, set by the run only: no op chooses its own count
            import torch

            torch.set_num_threads(self.opts.threads)

    def check_trainable(self, preset, configs) -> None:
        """Before any data is read: every train config in ``configs`` (those of ``preset``, a
        :class:`attnbench.engine.presets.SuitePreset`) can train on this run's device (the rule the trainer applies to each
        cell), else one error naming the preset's file and what to do."""
        for cfg in configs:
            problem = cfg.precision_problem(self.device.type)
            if problem:
                raise AttnbenchError(f"{preset.path}: {problem}; use --preset tiny, or `--smoke` to run the "
                                     f"{preset.name} pipeline on the CPU")

    @property
    def work(self) -> Path:
        return self.opts.work(self.suite)

    def say(self, *args, **kwargs) -> None:
        """Print on rank 0 only."""
        if self.dist.main:
            self.console.print(*args, **kwargs)

    def __enter__(self) -> "RunContext":
        self.dist = init_dist(self.device)
        self._set_threads()  # init_dist shares the cores between ranks; an explicit --threads wins
        return self

    def __exit__(self, *exc) -> None:
        shutdown(self.dist)

    def sweep(self, cells, run_cell: Callable, *, setting: str, config: Optional[dict] = None,
              describe: Optional[Callable] = None, skipped: Sequence = (), device: Optional[str] = None,
              threads: Optional[int] = None, dist: Any = "ctx"):
        """:func:`attnbench.engine.sweep.run_sweep` with this run's options; ``threads`` (default: the count in force) and
        ``dist`` (default: this context's process group) for a suite that measures in child processes."""
        import torch

        return run_sweep(cells, run_cell, suite=self.suite, setting=setting, db=self.opts.db, config=config,
                         device=device or self.device.type,
                         threads=torch.get_num_threads() if threads is None else threads, force=self.opts.force,
                         compile=self.opts.compile,
                         shard=self.opts.shard, console=self.console, progress=self.progress, argv=self.opts.argv,
                         dist=self.dist if dist == "ctx" else dist, describe=describe, skipped=skipped)
