"""``attnbench run vision --smoke``: a preset's real pipeline on the CPU before a user's GPU run.

The preset's data in its real format is written into a temporary directory (:func:`attnbench.image.smoke.write_data`:
CIFAR's python pickles or an ImageFolder of JPEGs under the real class names; the offline ``digits`` needs none).
Then the preset itself runs through
:func:`.train.run_vision`: its reader and augmentation (DeiT's RandAugment, random erasing), its ViT at full size
and resolution, its loss (label smoothing, mixup / cutmix), optimizer and schedule kind, EMA, evaluation, test,
FLOPs, throughput, the resolution sweep and the store. What the smoke shortens: 2 steps at a batch of 2 (float32 on
the CPU, the preset's precision on a GPU), data-loader workers at most 1, evaluations on the first 4 images, the
resolution sweep at the first of the preset's resolutions other than the training one (the position embedding
resampled) at batch 1, a validation carve of 1 image per class (2 images for CIFAR). Each cell's first attempt stops
in step 2 after its step-1 checkpoint and the rerun must resume from it. Then one line per attention: the full run's
cost (:class:`attnbench.engine.smoke.FullRunCost`).
"""

from __future__ import annotations

from typing import Optional, Sequence

from attnbench.api.spec import as_specs
from attnbench.engine.smoke import StopOnce, smoke_dirs, smoke_where
from attnbench.image.smoke import EVAL_LIMIT, SMOKE_BATCH, SMOKE_STEPS, full_run_cost, smoke_preset, write_data

from .config import VisionPreset, load_preset
from .train import run_vision


# ------------------------------------------------------------------------------------------------- the run
def run_smoke(*, attentions: Sequence, preset, seed: int = 0, db: Optional[str] = None, out: Optional[str] = None,
              console=None, gpu: str = "H100") -> int:
    """Run the smoke (module docstring); prints each cell and the full runs' cost; returns the exit code (0 ok,
    1 a cell failed or did not resume)."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    pre = preset if isinstance(preset, VisionPreset) else load_preset(preset)
    specs = as_specs(attentions)
    small = smoke_preset(pre)
    with smoke_dirs(out, db, "vision") as d:
        data_dir = write_data(small, d.data)
        console.print(f"[bold]vision {escape(pre.key)} smoke[/]: {', '.join(s.label for s in specs)}; "
                      f"{pre.model.size} ViT at {pre.data.image_size}x{pre.data.image_size}, {SMOKE_STEPS} steps at "
                      f"batch {SMOKE_BATCH}, {smoke_where(pre.train.precision)}; data "
                      + (f"in the real format under {escape(str(data_dir))}" if data_dir else "bundled")
                      + f"; store {escape(d.db)}")
        stop = StopOnce(at=2)
        kw = dict(attentions=specs, preset=small, data_dir=str(data_dir) if data_dir else None, seed=seed, db=d.db,
                  out=str(d.work), console=console, progress=False, eval_limit=EVAL_LIMIT)
        second, bad = stop.stop_and_resume(lambda **extra: run_vision(**kw, **extra), console,
                                           first=dict(hooks=lambda task, attention: stop.hooks((task, attention))))
        if bad is not None:
            console.print(f"[bold red]smoke failed:[/] {escape(bad)}")
            return 1
        num_classes = second.outcomes[0].result.metrics["num_classes"]
    for spec in specs:
        cost = full_run_cost(pre, spec.with_defaults(pre.options_for(spec.name)), num_classes)
        console.print(f"  {escape(spec.label)}: {escape(cost.line(gpu))}")
    console.print(f"[green]smoke ok[/]: {escape(pre.key)} ran its real pipeline")
    return 0
