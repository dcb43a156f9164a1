"""``attnbench run recall --smoke``: every mixer at every point of a preset through the real pipeline on the CPU.

Each point's data is generated (a few examples per split, written in the suite's file format and read back),
each applicable mixer's model is built at the preset's full size (width, layers, heads, vocabulary, length) and
trained by the preset's recipe for 3 steps at a batch of 2 (float32 on the CPU) at the first learning rate, stopped
inside step 2 and resumed from the checkpoint of step 1, validated and scored on the test split. Then one line per mixer
and point: parameters, state size and the full run's cost (:class:`attnbench.engine.smoke.FullRunCost`: the
preset's steps at its batch, times its learning rates).

What the smoke changes: the split sizes (8 / 4 / 4 examples), steps (3), batch (2), evaluation (every 3 steps),
checkpoints (every step), precision (float32 on the CPU, the preset's own on a GPU), epochs (none: the 3 steps)
and the learning rates (the first only).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from attnbench.engine.smoke import FullRunCost, StopOnce, smoke_dirs, smoke_precision, smoke_where, train_flops

from .config import DataConfig, Mixer, RecallPreset
from .model import build_model
from .tasks import generate
from .train import masked_loss, run_recall

SMOKE_STEPS = 3
SMOKE_BATCH = 2


def smoke_preset(pre: RecallPreset) -> RecallPreset:
    """The preset as the smoke runs it (see the module docstring)."""
    train = dataclasses.replace(pre.train, steps=SMOKE_STEPS, batch_size=SMOKE_BATCH, micro_batch_size=0,
                                warmup=min(pre.train.warmup, 1), eval_every=SMOKE_STEPS, checkpoint_every=1,
                                patience=0, min_steps=0,
                                precision=smoke_precision(pre.train.precision))
    tasks = tuple(dataclasses.replace(t, n_train=0, sweep=tuple({k: v for k, v in s.items() if k != "n_train"}
                                                                 for s in t.sweep)) for t in pre.tasks)
    return dataclasses.replace(pre, data=DataConfig(n_train=8, n_val=4, n_test=4, seed=pre.data.seed), train=train,
                               epochs=0, learning_rates=pre.learning_rates[:1], tasks=tasks,
                               setting=f"{pre.key}-smoke")


def run_smoke(pre: RecallPreset, mixers: Sequence[Mixer], *, sweep: bool = False, seed: int = 0,
              db: Optional[str] = None, out: Optional[str] = None, console=None, gpu: str = "H100") -> int:
    """Run the smoke (see the module docstring); returns the exit code (0 ok, 1 a step failed or did not resume)."""
    import torch
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    for m in mixers:
        if m.variant is None:
            console.print(f"[yellow]{escape(m.label)}: not applicable: {escape(m.not_applicable)}[/]")
    mixers = [m for m in mixers if m.variant is not None]
    if not mixers:
        console.print("[bold red]smoke failed:[/] no applicable mixer")
        return 1
    with smoke_dirs(out, db, "recall") as d:
        small = smoke_preset(pre)
        points = small.points(sweep)
        console.print(f"[bold]recall {escape(pre.key)} smoke[/]: {len(mixers)} mixer(s) × {len(points)} point(s) at "
                      f"full size, {SMOKE_STEPS} steps at batch {SMOKE_BATCH}, {smoke_where(pre.train.precision)}; "
                      f"store {d.db}")
        stop = StopOnce(at=2)
        kw = dict(mixers=mixers, preset=small, sweep=sweep, seed=seed, db=d.db, out=str(d.work), console=console,
                  hooks=stop.hooks, progress=False)
        _, bad = stop.stop_and_resume(lambda **extra: run_recall(**kw, **extra), console)
        if bad is not None:
            console.print(f"[bold red]smoke failed:[/] {escape(bad)}")
            return 1
        cells = 0
        for point in pre.points(sweep):
            x, y = (torch.from_numpy(a) for a in generate(point.task, 1, point.params, 0))
            for m in mixers:
                cfg = pre.model_config(m, point)
                torch.manual_seed(0)
                model = build_model(cfg, point.task)
                n = sum(p.numel() for p in model.parameters())
                T = x.shape[1]
                flops = train_flops(lambda net=model: masked_loss(net(x), y).backward())
                cost = FullRunCost(pre.steps(point) * len(pre.learning_rates), pre.train.batch_size * T, "tokens",
                                   flops / T)
                cells += len(pre.learning_rates)
                console.print(f"  {escape(point.label):<28} {escape(m.label):<22} {n / 1e3:9.0f} k parameters · "
                              f"{len(pre.learning_rates)} learning rate(s) · {escape(cost.line(gpu))}")
        console.print(f"[dim]{cells} cells a seed in the full run[/]")
    return 0
