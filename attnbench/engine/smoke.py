"""What a preset's full run would cost, printed by every ``run --smoke`` after its few CPU steps.

A smoke run exercises a preset's real pipeline (model size, resolution, augmentation, loss, schedule, evaluation,
checkpoint and resume) on a little data written in the real format, so a user's first GPU run is not where a
preset's first bug is found. It ends with one line: the full run's size and a time estimate for a named GPU,
derived from the training FLOPs that ``torch.utils.flop_counter`` counts for one item (matmul-class work only;
elementwise work is not counted, so the estimate is a lower bound on time).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

from attnbench.engine.sweep import CellError
from attnbench.results import provenance

# Dense bf16 tensor-core peaks from the vendors' data sheets (SXM parts), FLOP/s.
GPU_PEAK_BF16 = {"H100": 989e12, "A100": 312e12}
# The fraction of peak a well-tuned training run reaches; a stated assumption, not a measurement.
ASSUMED_MFU = 0.4


@dataclass(frozen=True)
class FullRunCost:
    """A full run's size: ``steps`` optimizer steps of ``items_per_step`` items (images, tokens, sequences), each
    costing ``train_flops_per_item`` FLOPs for forward + backward."""

    steps: int
    items_per_step: int
    unit: str
    train_flops_per_item: float

    @property
    def items(self) -> int:
        return self.steps * self.items_per_step

    @property
    def flops(self) -> float:
        return self.items * self.train_flops_per_item

    def hours_on(self, gpu: str = "H100", mfu: float = ASSUMED_MFU) -> float:
        if gpu not in GPU_PEAK_BF16:
            raise ValueError(f"unknown GPU {gpu!r}: expected one of {', '.join(GPU_PEAK_BF16)}")
        return self.flops / (GPU_PEAK_BF16[gpu] * mfu) / 3600.0

    def line(self, gpu: str = "H100", mfu: float = ASSUMED_MFU) -> str:
        """``full run: 300,000 steps x 1,024 images = 3.07e+08 images, 1.4e+18 FLOPs; about 1.0 h on one H100
        (bf16 at 40% of its 989 TFLOP/s; matmul FLOPs only)``."""
        peak = GPU_PEAK_BF16[gpu] / 1e12
        when = _fmt_hours(self.hours_on(gpu, mfu))
        when = when if when.startswith("under") else f"about {when}"
        return (f"full run: {self.steps:,} steps x {self.items_per_step:,} {self.unit} = {self.items:.3g} {self.unit}, "
                f"{self.flops:.2g} FLOPs; {when} on one {gpu} "
                f"(bf16 at {mfu:.0%} of its {peak:.0f} TFLOP/s; matmul FLOPs only)")


def smoke_precision(precision: str) -> str:
    """The precision a smoke trains in: the preset's own on a GPU (bf16 / fp16 autocast, what its full run uses, so
    a GPU smoke proves that path), float32 on the CPU (autocast is CUDA-only here)."""
    import torch

    return precision if torch.cuda.is_available() else "fp32"


def smoke_where(precision: str = "fp32") -> str:
    """``"float32, CPU"`` or ``"bf16 autocast, CUDA"``: how and where a smoke trains, for its first line."""
    import torch

    p = smoke_precision(precision)
    return f"{'float32' if p == 'fp32' else p + ' autocast'}, {'CUDA' if torch.cuda.is_available() else 'CPU'}"


def train_flops(step: Callable[[], Any]) -> int:
    """FLOPs of one forward + backward, as ``torch.utils.flop_counter`` counts them: ``step`` runs both."""
    from attnbench.measure.flops import count_flops  # brings torch: imported when a smoke counts its FLOPs

    return count_flops(step)


def fmt_duration(seconds: float) -> str:
    """``"45 s"``, ``"12 min"``, ``"3.5 h"``, ``"2.1 days"``."""
    return _fmt_hours(seconds / 3600.0)


def _fmt_hours(h: float) -> str:
    if h < 1 / 3600:
        return "under 1 s"
    if h < 1 / 60:
        return f"{h * 3600:.0f} s"
    if h < 1:
        return f"{h * 60:.0f} min"
    if h < 48:
        return f"{h:.1f} h"
    return f"{h / 24:.1f} days"


# ------------------------------------------------------------------------------------------- smoke plumbing
@dataclass(frozen=True)
class SmokeDirs:
    """Where a smoke run writes: ``data`` (its small files in the real formats), ``work`` (checkpoints, caches,
    artifacts) and ``db`` (the results store). Temporary unless the user gave ``--out`` / ``--db``."""

    root: Any
    data: Any
    work: Any
    db: str


class smoke_dirs:
    """``with smoke_dirs(out, db, "lra") as d:`` a temporary directory (removed on exit) holding the smoke's data,
    work directory and store; ``out`` / ``db`` given by the user replace the work directory / the store, so
    nothing is written into the repository unless asked. Every suite's smoke starts here, so entering it first
    prints the machine line every run prints (:func:`attnbench.cli.kit.machine_line`: CPU, ISA, threads, measured
    fp32 matmul GFLOP/s, which the smoke's records then carry)."""

    def __init__(self, out: Optional[str] = None, db: Optional[str] = None, suite: str = "smoke"):
        self.out, self.db, self.suite = out, db, suite

    def __enter__(self) -> SmokeDirs:
        import tempfile
        from pathlib import Path

        if os.environ.get("RANK", "0") == "0":  # the machine first, as every run prints it
            print(provenance.machine_line(provenance.machine()), flush=True)
        self._tmp = Path(tempfile.mkdtemp(prefix=f"attnbench-{self.suite}-smoke-"))
        work = Path(self.out) if self.out else self._tmp / "work"
        return SmokeDirs(root=self._tmp, data=self._tmp / "data", work=work,
                         db=str(self.db) if self.db else str(self._tmp / "smoke.db"))

    def __exit__(self, *exc) -> None:
        import shutil

        shutil.rmtree(self._tmp, ignore_errors=True)


class PlannedStop(CellError):
    """Raised by :class:`StopOnce` inside a training step: the smoke's stand-in for a killed run (the sweep
    records the cell ``interrupted`` and goes on to the next)."""

    def __init__(self, message: str):
        super().__init__(message, status="interrupted")


class StopOnce:
    """Trainer hooks that stop each cell's first attempt inside step ``at`` (1-based), after the checkpoint of
    step ``at - 1``, so the cell's second attempt must resume from that checkpoint. Kill-free: the stop is an
    exception the suite's sweep records as the cell's status, and the smoke reruns the sweep."""

    def __init__(self, at: int = 2):
        if at < 2:
            raise ValueError(f"StopOnce(at={at}): the first attempt must checkpoint at least one step")
        self.at = at
        self.stopped: set = set()

    def hooks(self, key: Any):
        from attnbench.engine.train.trainer import TrainHooks

        if key in self.stopped:
            return TrainHooks()

        def stop(step: int, loss):
            if step == self.at:
                self.stopped.add(key)
                raise PlannedStop(f"smoke: planned stop in step {step} (resumes from the checkpoint of step "
                                  f"{step - 1})")
            return loss

        return TrainHooks(transform_loss=stop)

    def check_resumed(self, outcomes) -> list[str]:
        """One message per finished cell that was stopped but did not resume from step ``at - 1`` (or was never
        stopped: then no checkpoint was exercised)."""
        bad = []
        for o in outcomes:
            if o.result.status != "ok" or o.skipped:
                continue
            resumed = (o.result.metrics or {}).get("resumed_from")
            if resumed != self.at - 1:
                bad.append(f"{o.cell.label}: expected a resume from the checkpoint of step {self.at - 1}, got "
                           f"resumed_from={resumed}")
        return bad


    def stop_and_resume(self, run: Callable[..., Any], console, *, unit: str = "cell", first: Optional[dict] = None,
                        second: Optional[dict] = None, finished_ok: bool = False) -> tuple[Any, Optional[str]]:
        """Run a suite's sweep twice with these hooks installed by ``run``: the first attempt stops each cell,
        the second must resume each from its checkpoint. ``first`` / ``second``: extra keywords per attempt;
        ``finished_ok``: cells the second attempt skips as already finished (a shared teacher) are no failure.
        Returns the second attempt's summary (the first's if it failed) and the first failure, or None."""
        console.print(f"[dim]attempt 1: each {unit} stops inside step {self.at}, after its step-{self.at - 1} "
                      f"checkpoint[/]")
        summary = run(**(first or {}))
        bad = first_failure([o for o in summary.outcomes if o.result.status != "interrupted"])
        if bad is not None:
            return summary, bad
        console.print(f"[dim]attempt 2: each {unit} resumes from its checkpoint[/]")
        summary = run(**(second or {}))
        ran = [o for o in summary.outcomes if not (finished_ok and o.skipped)]
        return summary, first_failure(ran) or next(iter(self.check_resumed(ran)), None)


def first_failure(outcomes) -> Optional[str]:
    """``"<cell>: <first line of its error>"`` of the first cell that did not end ok (skips included), or None."""
    for o in outcomes:
        status = "skipped" if o.skipped else o.result.status
        if status != "ok":
            why = (o.result.error or o.skipped or status).strip().splitlines()
            return f"{o.cell.label}: {status}: {why[-1] if why else status}"
    return None
