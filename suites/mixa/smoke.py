"""``attnbench run mixa --smoke``: the whole MixA pipeline of a preset on the CPU before a user's GPU run.

The vision preset's data is written in its real format and shortened as ``run vision --smoke`` does
(:mod:`attnbench.image.smoke`); then :func:`.train.run_mixa` runs everything the preset runs: the softmax
teacher trained first, Eq. 3's layer scores (``score.batches`` batches, at most 2, of 2 images), the
top-k selection, the KD fine-tune of the mix and of every control (all-SteLLA, last-k, each random-k seed) at the
preset's model size and resolution, the evaluations and the store: 2 steps at a batch of 2 in float32, a
checkpoint every step. Each variant's fine-tune is stopped once inside step 2 and the rerun must resume it from
its step-1 checkpoint. Then the full run's cost: the teacher's vision run and each variant's fine-tune.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from attnbench.api.spec import parse_spec
from attnbench.engine.smoke import FullRunCost, StopOnce, smoke_dirs, smoke_where, train_flops
from attnbench.image import smoke as vsmoke
from attnbench.image.classify import build_classifier
from attnbench.image.smoke import full_run_cost

from .config import MixaPreset, load_preset
from .train import layer_specs, run_mixa


def smoke_preset(pre: MixaPreset) -> MixaPreset:
    train = vsmoke.smoke_train(pre.train)
    score = dataclasses.replace(pre.score, batches=min(pre.score.batches, 2), batch_size=vsmoke.SMOKE_BATCH)
    return dataclasses.replace(pre, vision=vsmoke.smoke_preset(pre.vision), train=train, score=score,
                               setting=f"{pre.key}-smoke")


def variant_costs(pre: MixaPreset, outcomes, num_classes: int) -> list[tuple[str, object]]:
    """``[(what, FullRunCost)]``: the teacher's vision run, then each variant's fine-tune (student forward +
    backward and the teacher's forward, per image) at the preset's steps."""
    import torch

    vp = pre.vision
    teacher = build_classifier(parse_spec("softmax"), vp, num_classes).eval()
    x = torch.randn(1, 3, vp.data.image_size, vp.data.image_size)
    with torch.no_grad():
        teacher_flops = train_flops(lambda: teacher(x))
    out = [("teacher (trained first)", full_run_cost(vp, parse_spec("softmax"), num_classes))]
    for o in outcomes:
        if o.cell.payload is None:
            continue
        student = build_classifier(layer_specs(pre, o.cell.params["depth"], o.cell.payload), vp, num_classes)
        flops = train_flops(lambda: student(x).float().sum().backward()) + teacher_flops
        out.append((o.cell.attention, FullRunCost(steps=pre.train.steps, items_per_step=pre.train.batch_size,
                                                  unit="images", train_flops_per_item=float(flops))))
    return out


def run_smoke(*, preset, k: Optional[int] = None, seed: int = 0, db: Optional[str] = None,
              out: Optional[str] = None, console=None, gpu: str = "H100") -> int:
    """Run the smoke (module docstring); returns the exit code (0 ok, 1 a cell failed or did not resume)."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    pre = preset if isinstance(preset, MixaPreset) else load_preset(preset)
    small = smoke_preset(pre)
    vp = pre.vision
    with smoke_dirs(out, db, "mixa") as d:
        data_dir = vsmoke.write_data(small.vision, d.data)
        console.print(f"[bold]mixa {escape(pre.key)} smoke[/]: teacher {escape(vp.key)} ({vp.model.size} ViT, "
                      f"{vp.data.image_size}x{vp.data.image_size}); scores, selection, the mix and its controls, "
                      f"{vsmoke.SMOKE_STEPS} steps at batch {vsmoke.SMOKE_BATCH}, {smoke_where()}; "
                      f"store {escape(d.db)}")
        stop = StopOnce(at=2)
        kw = dict(preset=small, k=k, data_dir=str(data_dir) if data_dir else None, seed=seed, db=d.db,
                  out=str(d.work), console=console, progress=False, eval_limit=vsmoke.EVAL_LIMIT)
        second, bad = stop.stop_and_resume(lambda **extra: run_mixa(**kw, **extra), console, unit="variant",
                                           first=dict(hooks=lambda task, attention: stop.hooks((task, attention))),
                                           finished_ok=True)
        ran = [o for o in second.outcomes if not o.skipped]
        if bad is None and len(ran) < len(second.outcomes) - 1:
            bad = f"{len(second.outcomes) - len(ran)} cells did not rerun (only the teacher should be done)"
        if bad is not None:
            console.print(f"[bold red]smoke failed:[/] {escape(bad)}")
            return 1
        num_classes = ran[0].result.metrics["num_classes"]
        costs = variant_costs(pre, ran, num_classes)
    for what, cost in costs:
        console.print(f"  {escape(what)}: {escape(cost.line(gpu))}")
    console.print(f"[green]smoke ok[/]: {escape(pre.key)} ran its whole pipeline")
    return 0
