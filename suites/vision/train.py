"""The vision runner: the same ViT with only the attention swapped, on the same data and recipe, one cell per
attention spec; accuracy beside speed and memory.

``attnbench run vision`` -> :func:`run_vision`: one cell per spec, each trained and tested by
:func:`attnbench.image.classify.fit_classifier` (the preset's data from :mod:`attnbench.image.data`, the ViT of
:func:`attnbench.models.vit.build_vit`, the shared trainer with AdamW, warm-up + cosine, checkpoints and resume,
``--nproc`` DDP, the DeiT recipe's label smoothing and mixup / cutmix from timm) in the shared sweep
(:mod:`attnbench.engine.sweep`). Per cell the store gets top-1 (and top-5) on the test split at the best validation
step (``score`` = test top-1 in %), the validation top-1 at the last step, parameters, FLOPs per image
(``torch.utils.flop_counter``), training and inference throughput (images/s), peak memory, wall time, and the
trained weights' path (the teacher of other runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from attnbench.api.spec import AttentionSpec, as_specs
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunContext, RunOptions, run_options
from attnbench.engine.sweep import Cell, CellContext, CellResult, Outcome, SweepSummary
from attnbench.engine.train.trainer import TrainHooks
from attnbench.image.classify import build_classifier, fit_classifier, load_splits, tokens_of
from attnbench.models import BlockOptions
from attnbench.models.vit import VIT_SIZES, load_pretrained
from attnbench.results.provenance import file_id
from attnbench.results.records import point_hash

from .config import VisionPreset, load_preset, with_folder

SUITE = "vision"
HooksFor = Callable[[str, str], TrainHooks]


def plan_cells(pre: VisionPreset, specs: Sequence[AttentionSpec], *, seed: int | Sequence[int], device: str,
               data_fingerprint: str, pretrained: Optional[str] = None) -> list[Cell]:
    """One cell per (spec, seed) (``seed``: one seed or several); a seed's cell is the same whether its run had
    other seeds or not (the seed is in params)."""

    seeds = [seed] if isinstance(seed, int) else list(seed)
    cells = []
    for spec, seed in ((sp, s) for s in seeds for sp in specs):
        full = spec.with_defaults(pre.options_for(spec.name))
        params = {"seed": seed, "preset": pre.name, "image_size": pre.data.image_size, "model": pre.model.size,
                  "patch_size": pre.model.patch_size, "steps": pre.train.steps, "batch_size": pre.train.batch_size,
                  "block_options": BlockOptions(dwc_kernel=pre.model.dwc_kernel).active(),
                  "identity": pre.identity_hash(), "data": data_fingerprint}
        if pretrained:
            params["pretrained"] = pretrained  # "<file name>@<sha256 prefix>": what the cells start from
        h = point_hash(suite=SUITE, setting=pre.key, task=pre.data.kind, attention=spec.label,
                       options=dict(full.options), params=params, dtype="float32", device=device)
        cells.append(Cell(task=pre.data.kind, attention=spec.label, config_hash=h, options=dict(full.options),
                          params=params, dtype="float32", seed=seed, payload=full,
                          name=f"{spec.label} · seed {seed}" if len(seeds) > 1 else ""))
    return cells


def run_cell(cell: Cell, ctx: CellContext, *, splits, pre: VisionPreset, device: torch.device, work: Path,
             hooks: Optional[HooksFor] = None, pretrained: Optional[Path] = None) -> CellResult:
    """Train, validate and test the ViT with one attention spec (:func:`attnbench.image.classify.fit_classifier`);
    resumes from its checkpoint if there is one. The trained weights are kept: a teacher for other runs."""
    ckpt = artifact_path(work, "checkpoints", pre, cell)
    fitted = fit_classifier(cell.payload, pre, splits, seed=cell.seed, device=device, dist=ctx.dist,
                            identity=cell.config_hash, checkpoint=ckpt, progress=ctx.progress, label=cell.label,
                            hooks=hooks(cell.task, cell.attention) if hooks else None, restart=ctx.force,
                            pretrained=pretrained, compile=ctx.compile)
    metrics = fitted.metrics
    if ctx.dist.main:
        weights = artifact_path(work, "models", pre, cell)  # the trained model (best val step)
        weights.parent.mkdir(parents=True, exist_ok=True)
        torch.save(fitted.model.state_dict(), weights)
        metrics["weights"] = str(weights)
        ckpt.unlink(missing_ok=True)
    return CellResult("ok", metrics=metrics, impl=fitted.impl)


def artifact_path(work: Path, kind: str, pre: VisionPreset, cell: Cell) -> Path:
    """``WORK/<kind>/<setting>/<spec>-<config hash>-seed<seed>.pt`` (kind: ``checkpoints`` while training,
    ``models`` for the trained weights)."""
    slug = pre.key.replace("/", "_")
    return work / kind / slug / f"{cell.attention.replace(':', '_')}-{cell.config_hash}-seed{cell.seed}.pt"


def run_vision(*, attentions: Sequence[str | AttentionSpec], preset: str | VisionPreset = "tiny",
               data_dir: Optional[str] = None, opts: Optional[RunOptions] = None, console=None,
               hooks: Optional[HooksFor] = None, progress: bool = True, pretrained: Optional[str] = None,
               eval_limit: Optional[int] = None, **fields) -> SweepSummary:
    """Train and test the preset's ViT once per attention spec (from the weights of ``pretrained``, a timm /
    DeiT / torch state dict, if given); see the module docstring. ``opts``: the shared run options (or single
    ``fields`` of them, e.g. ``db=``, ``out=``, ``seed=``). A ``digits`` preset given ``data_dir`` reads that
    folder (:func:`.config.with_folder`); ``eval_limit`` cuts validation and test short (smoke runs)."""
    from rich.markup import escape

    opts = run_options(opts, **fields)
    seeds = opts.seeds  # one cell per (spec, seed)
    run = RunContext(opts, suite=SUITE, console=console, progress=progress)
    console = run.console
    specs = as_specs(attentions)
    if not specs:
        raise AttnbenchError("give at least one attention (--attn softmax,nala,...)")
    pre = with_folder(preset if isinstance(preset, VisionPreset) else load_preset(preset), data_dir)

    size = VIT_SIZES.get(pre.model.size)
    if size is None:
        raise AttnbenchError(f"{pre.path}: [model] size {pre.model.size!r} is not one of {', '.join(VIT_SIZES)}")
    for spec in specs:  # a value the mechanism refuses fails here, before any data or cell
        spec.with_defaults(pre.options_for(spec.name)).check_builds(heads=size.heads,
                                                                     head_dim=size.embed_dim // size.heads,
                                                                     seq_len=tokens_of(pre))
    device = run.device
    run.check_trainable(pre, [pre.train])
    with run:
        dist = run.dist
        work = run.work
        splits = load_splits(pre, data_dir, eval_limit=eval_limit)
        say = run.say
        say(f"[bold]{escape(pre.key)}[/] ({escape(pre.description)}): {len(specs)} attention(s), seed "
            f"{','.join(map(str, seeds))}, "
            f"device {device}" + (f", {dist.world} processes" if dist.enabled else "")
            + f"\n  data: {escape(splits.origin)}")
        ckpt_id = None
        if pretrained:
            path = Path(pretrained)
            if not path.is_file():
                raise AttnbenchError(f"--pretrained {path}: no such file")
            ckpt_id = file_id(path)

            load_pretrained(build_classifier(specs[0], pre, splits.num_classes), path)  # does it fit? before any cell
        cells = plan_cells(pre, specs, seed=seeds, device=device.type, data_fingerprint=splits.fingerprint,
                           pretrained=ckpt_id)
        config = {"preset": pre.name, "preset_file": pre.path, "setting": pre.key,
                  "attentions": [s.label for s in specs], "seed": seeds[0], "seeds": seeds, "nproc": dist.world,
                  "data_dir": data_dir,
                  **pre.identity()}

        def one(cell: Cell, ctx: CellContext) -> CellResult:
            return run_cell(cell, ctx, splits=splits, pre=pre, device=device, work=work, hooks=hooks,
                            pretrained=Path(pretrained) if pretrained else None)

        return run.sweep(cells, one, setting=pre.key, config=config, describe=_line)


def _line(o: Outcome) -> str:
    from rich.markup import escape

    head = f"  {escape(o.cell.attention):<16}" + (f" seed {o.cell.seed}" if o.cell.name else "")
    r = o.result
    if r.status == "ok":
        m = r.metrics
        return (f"{head} [green]ok[/]  test top-1 {m['score']:.1f}% (best val {100 * m['best_val_top1']:.1f}% @ "
                f"step {m['best_step']})  {m['train_images_per_s']:.0f} img/s train, "
                f"{m['infer_images_per_s']:.0f} img/s inference  {m['flops_per_image'] / 1e9:.3g} GFLOPs  "
                f"wall {m['wall_s']:.0f} s")
    color = "yellow" if r.status == "interrupted" else "red"
    return f"{head} [{color}]{r.status}[/]  {escape((r.error or o.skipped).splitlines()[0])}"
