"""``attnbench run adala --smoke``: the whole ViT-AdaLA pipeline of a preset on the CPU before a user's GPU run.

The vision preset's data is written in its real format and shortened as ``run vision --smoke`` does
(:mod:`attnbench.image.smoke`); then :func:`.pipeline.run_adala` runs everything the preset runs: the
softmax teacher trained first, the from-scratch model of each student at the pipeline's budget,
stage 1 (attention alignment, Eq. 3), stage 2 (feature alignment, Eq. 4), stage 3 (fine-tuning with a new head),
the measurements and the store, each stage for 2 steps at a batch of 2 in float32 with a checkpoint every step.
Each stage is stopped once inside its step 2 and the rerun must resume it from its step-1 checkpoint (so the
pipeline also resumes past finished stages). Then the full run's cost, stage by stage.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from attnbench.api.spec import as_specs, parse_spec
from attnbench.engine.smoke import FullRunCost, StopOnce, first_failure, smoke_dirs, smoke_where, train_flops
from attnbench.image import smoke as vsmoke
from attnbench.image.classify import build_classifier
from attnbench.image.smoke import full_run_cost, smoke_train

from .config import ALL_STAGES, AdalaPreset, load_preset
from .pipeline import AlignNet, FeatureNet, attention_loss, build_student, feature_loss, run_adala, scratch_preset


def smoke_preset(pre: AdalaPreset) -> AdalaPreset:
    return dataclasses.replace(pre, stage1=smoke_train(pre.stage1), stage2=smoke_train(pre.stage2),
                               stage3=smoke_train(pre.stage3), setting=f"{pre.key}-smoke")


def stage_costs(pre: AdalaPreset, vpre, spec, num_classes: int) -> list[tuple[str, object]]:
    """``[(what, FullRunCost)]``: the teacher's and the from-scratch model's vision runs, then each stage (its own
    loss, forward + backward through the student, the teacher's forward included) at the preset's steps."""
    import torch

    opts = pre.adala
    teacher = build_classifier(parse_spec("softmax"), vpre, num_classes).eval()
    student = build_student(spec, vpre, num_classes, teacher)
    x = torch.randn(1, 3, vpre.data.image_size, vpre.data.image_size)
    losses = {1: lambda: attention_loss(AlignNet(student, opts.attn_output), teacher, x, opts.attn_output),
              2: lambda: feature_loss(FeatureNet(student, opts.features), teacher, x, opts.features, opts.lam),
              3: lambda: student(x).float().sum()}
    out = [("teacher (trained first)", full_run_cost(vpre, parse_spec("softmax"), num_classes)),
           ("from scratch", full_run_cost(scratch_preset(pre, vpre), spec, num_classes))]
    for k in ALL_STAGES:
        cfg = pre.stage(k)
        flops = train_flops(lambda: losses[k]().backward())
        out.append((f"stage {k}", FullRunCost(steps=cfg.steps, items_per_step=cfg.batch_size, unit="images",
                                              train_flops_per_item=float(flops))))
    return out


def run_smoke(*, attentions: Sequence, preset, seed: int = 0, db: Optional[str] = None, out: Optional[str] = None,
              console=None, gpu: str = "H100") -> int:
    """Run the smoke (module docstring); returns the exit code (0 ok, 1 a cell failed or a stage did not resume)."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    pre = preset if isinstance(preset, AdalaPreset) else load_preset(preset)
    vpre = pre.load_vision()
    specs = as_specs(attentions)
    small, vsmall = smoke_preset(pre), vsmoke.smoke_preset(vpre)
    with smoke_dirs(out, db, "adala") as d:
        data_dir = vsmoke.write_data(vsmall, d.data)
        console.print(f"[bold]adala {escape(pre.key)} smoke[/]: students {', '.join(s.label for s in specs)}; "
                      f"teacher {escape(vpre.key)} ({vpre.model.size} ViT, {vpre.data.image_size}x"
                      f"{vpre.data.image_size}); stages 1, 2, 3 of {vsmoke.SMOKE_STEPS} steps at batch "
                      f"{vsmoke.SMOKE_BATCH}, {smoke_where()}; store {escape(d.db)}")
        stop = StopOnce(at=2)
        kw = dict(attentions=specs, preset=small, vision=vsmall, stages="1,2,3",
                  data_dir=str(data_dir) if data_dir else None, seed=seed, db=d.db, out=str(d.work),
                  console=console, progress=False, eval_limit=vsmoke.EVAL_LIMIT,
                  hooks=lambda cell, k: stop.hooks((cell, k)))
        summary, bad = None, None
        for attempt in range(1, len(ALL_STAGES) + 2):  # each attempt stops (then resumes) the next stage
            console.print(f"[dim]attempt {attempt}[/]")
            summary = run_adala(**kw)
            bad = first_failure([o for o in summary.outcomes if o.result.status != "interrupted" and not o.skipped])
            if bad is not None or all(o.result.status == "ok" for o in summary.outcomes):
                break
        else:
            bad = bad or "the pipeline did not finish after a stop in each stage"
        done = [o for o in summary.outcomes if o.cell.payload.kind == "adala" and not o.skipped]
        for o in done:
            for k, rec in sorted((o.result.metrics or {}).get("stages", {}).items()):
                if rec.get("resumed_from") != 1 and bad is None:
                    bad = f"{o.cell.label} stage {k}: expected a resume from step 1, got {rec.get('resumed_from')}"
        if bad is None and not done:
            bad = "no pipeline cell ran"
        if bad is not None:
            console.print(f"[bold red]smoke failed:[/] {escape(bad)}")
            return 1
        num_classes = done[0].result.metrics["num_classes"]
    for i, spec in enumerate(specs):
        for what, cost in stage_costs(pre, vpre, spec.with_defaults(vpre.options_for(spec.name)), num_classes):
            if what.startswith("teacher"):
                if i == 0:  # one teacher for every student
                    console.print(f"  {what}: {escape(cost.line(gpu))}")
                continue
            console.print(f"  {escape(spec.label)} {what}: {escape(cost.line(gpu))}")
    console.print(f"[green]smoke ok[/]: {escape(pre.key)} ran its whole pipeline")
    return 0
