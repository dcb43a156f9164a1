"""The MixA runner (``attnbench run mixa``): score the teacher's layers (Eq. 3), pick the top-k, build the mixed
ViT (ReLU quadratic attention, Eqs. 4-5, in the selected layers; SteLLA, Eqs. 6-7, elsewhere), fine-tune it from
the teacher's weights with soft-label knowledge distillation, beside controls fine-tuned the same way.

Cells (one record each, setting ``mixa/<preset>``): ``teacher`` (the softmax model, evaluated only), ``mixa`` (the
top-k layers of Eq. 3), ``all-stella`` (k = 0), ``last-k`` (the last k layers quadratic) and ``random-k:seed=S``
(k layers drawn with seed S). Every variant starts from the teacher's qkv / proj / MLP weights (the mechanisms'
α', β' at 1), trains on the same batches with the same seed, and is distilled from the teacher:
``alpha * T^2 * KL(softmax(t / T) || softmax(s / T)) + (1 - alpha) * CE`` (the CE of the vision recipe: label
smoothing / mixup). Records: test top-1 at the best validation step, top-5, parameters, FLOPs per image, training
and inference images/s, peak memory (training: process RSS or CUDA; inference: tensor bytes of one forward),
the variant's quadratic layers (params) and, in every cell, the Eq. 3 scores, their per-head trace terms and the
selected layers (metrics), and the teacher's test top-1.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from attnbench.api.spec import Spec
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunContext, RunOptions, run_options
from attnbench.engine.sweep import Cell, CellContext, CellResult, Outcome, SweepSummary, per_seed
from attnbench.engine.train.trainer import TrainOrder, TrainTask, train
from attnbench.image.classify import (
    StepBatches,
    build_classifier,
    evaluate,
    flops_per_image,
    inference_memory,
    inference_throughput,
    load_splits,
    majority_accuracy,
    mixed_batch,
    recipe_loss,
)
from attnbench.image.teacher import get_teacher
from attnbench.measure.peak import PeakMeter
from attnbench.models.vit import VIT_SIZES, load_pretrained, resolve_impl
from attnbench.results.provenance import file_id
from attnbench.results.records import point_hash

from . import score as mixa_score
from .config import MixaPreset, load_preset

SUITE = "mixa"
TEACHER = "teacher"


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, target: torch.Tensor, *, temperature: float,
            alpha: float, criterion) -> torch.Tensor:
    """Soft-label KD (Hinton et al. 2015): ``alpha * T^2 * KL(p_t^T || p_s^T) + (1 - alpha) * criterion(s, y)``,
    logits ``[B, C]``; the KL is the batch mean over images."""
    t = temperature
    kl = F.kl_div(F.log_softmax(student / t, dim=-1), F.log_softmax(teacher / t, dim=-1), log_target=True,
                  reduction="batchmean")
    ce = criterion(student, target) if alpha < 1 else student.new_zeros(())
    return alpha * t * t * kl + (1 - alpha) * ce


def variants(pre: MixaPreset, depth: int, selected: Sequence[int], k: int) -> list[tuple[str, list[int]]]:
    """``(name, quadratic layers)`` of the selected mix and the preset's controls."""
    out = [("mixa", list(selected))]
    c = pre.controls
    if c.all_stella:
        out.append(("all-stella", []))
    if c.last_k:
        out.append(("last-k", mixa_score.last_k(depth, k)))
    for s in c.random_seeds:
        out.append((f"random-k:seed={s}", mixa_score.random_k(depth, k, s)))
    return out


def score_batches(splits, pre: MixaPreset):
    """The ``(images, labels)`` batches Eq. 3 is computed on: ``score.batches`` batches of ``score.batch_size`` of
    the ``score.split``, in a fixed order (``score.seed``; augmentations drawn from the same seed)."""
    ds = splits.train if pre.score.split == "train" else splits.val
    sc = pre.score
    order = TrainOrder(len(ds), min(sc.batch_size, len(ds)), sc.seed)
    out = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(sc.seed)
        for b in range(sc.batches):
            items = [ds[int(i)] for i in order.shard(b, 0, 1)]
            out.append((torch.stack([it[0] for it in items]),
                        torch.as_tensor([int(it[1]) for it in items], dtype=torch.long)))
    return out


def layer_specs(pre: MixaPreset, depth: int, quadratic_layers) -> list[Spec]:
    """The spec of every layer of a variant: the preset's quadratic spec in ``quadratic_layers``, its linear spec
    elsewhere (both parsed once, with the preset)."""
    return mixa_score.mixed_specs(depth, quadratic_layers, quadratic_spec=pre.select.quadratic_spec,
                                  linear_spec=pre.select.linear_spec)


def plan_cells(pre: MixaPreset, *, k: int, depth: int, scores: mixa_score.LayerScores, teacher_id: str,
               seed: int, device: str, data_fingerprint: str) -> list[Cell]:
    selected = mixa_score.top_k(scores.scores, k)
    base = {"seed": seed, "preset": pre.name, "vision_preset": pre.vision.name, "teacher": teacher_id,
            "identity": pre.identity_hash(), "data": data_fingerprint, "k": k, "depth": depth,
            "image_size": pre.vision.data.image_size, "model": pre.vision.model.size,
            "patch_size": pre.vision.model.patch_size, "steps": pre.train.steps, "batch_size": pre.train.batch_size,
            "kd_temperature": pre.kd.temperature, "kd_alpha": pre.kd.alpha,
            "score_batches": pre.score.batches, "score_batch_size": pre.score.batch_size,
            "score_split": pre.score.split, "linear_matrix": pre.score.linear_matrix,
            "selected_layers": selected}
    plan = [(TEACHER, None)] + variants(pre, depth, selected, k)
    cells = []
    for name, layers in plan:
        if layers is None:
            specs = ["softmax"] * depth
            params = {**base, "variant": TEACHER, "quadratic_layers": None, "specs": specs}
        else:
            specs = [s.label for s in layer_specs(pre, depth, layers)]
            params = {**base, "variant": name, "quadratic_layers": layers, "specs": specs}
        options = {"quadratic_layers": layers, "k": None if layers is None else len(layers)}
        h = point_hash(suite=SUITE, setting=pre.key, task=pre.vision.data.kind, attention=name, options=options,
                       params=params, dtype="float32", device=device)
        cells.append(Cell(task=pre.vision.data.kind, attention=name, config_hash=h, options=options, params=params,
                          dtype="float32", seed=seed, payload=layers))
    return cells


def run_cell(cell: Cell, ctx: CellContext, *, splits, pre: MixaPreset, teacher, teacher_path: Path,
             teacher_top1: Optional[float], scores: mixa_score.LayerScores, device: torch.device, work: Path,
             hooks=None) -> CellResult:
    dist = ctx.dist
    vp = pre.vision
    meter = PeakMeter(device)
    eval_bs = vp.recipe.eval_batch_size
    infer_bs = min(eval_bs, 64)
    common = {"scores": scores.scores, "score_traces": scores.traces, "score_loss": scores.loss,
              "score_images": scores.images, "selected_layers": cell.params["selected_layers"],
              "quadratic_layers": cell.payload, "n_val": len(splits.val), "n_test": len(splits.test),
              "n_train": len(splits.train), "num_classes": splits.num_classes, "data": splits.origin,
              "majority_test_acc": majority_accuracy(splits), "world_size": dist.world,
              "threads": torch.get_num_threads()}
    if cell.payload is None:  # the teacher: evaluated, not trained
        import time

        t0 = time.perf_counter()
        model = teacher
        test = evaluate(model, splits.test, eval_bs, dist, device)
        metrics = {"score": 100.0 * test["top1"], "test_top1": test["top1"], "test_top5": test["top5"],
                   "test_loss": test["loss"], "n_params": sum(p.numel() for p in model.parameters()),
                   "train_images_per_s": None}
        wall = time.perf_counter() - t0
    else:
        torch.manual_seed(cell.seed)
        specs = layer_specs(pre, cell.params["depth"], cell.payload)
        model = build_classifier(specs, vp, splits.num_classes)
        load_pretrained(model, teacher_path)  # the mechanisms' own α', β' stay at 1
        model = model.to(device)
        order = TrainOrder(len(splits.train), pre.train.batch_size, cell.seed)
        batches = StepBatches(splits.train, order, device, vp.recipe.workers)
        mix, criterion = recipe_loss(vp, splits.num_classes)

        def batch(step: int, rank: int, world: int):
            x, y = batches.get(step, rank, world)
            return mixed_batch(mix, cell.seed, step, rank, x, y)

        def loss(net, b, tm):
            x, y = b
            with torch.no_grad():
                t_logits = tm(x).float()
            return kd_loss(net(x).float(), t_logits, y, temperature=pre.kd.temperature, alpha=pre.kd.alpha,
                           criterion=criterion)

        def validate(net):
            return evaluate(net, splits.val, eval_bs, dist, device)

        slug = pre.key.replace("/", "_")
        ckpt = work / "checkpoints" / slug / f"{cell.attention.replace(':', '_').replace('=', '')}-{cell.config_hash}.pt"
        result = train(model, pre.train, TrainTask(batch, loss, validate), seed=cell.seed, device=device,
                       identity=cell.config_hash, checkpoint=ckpt, dist=dist, teacher=teacher,
                       progress=ctx.progress, label=cell.label, restart=ctx.force,
                       hooks=hooks(cell.task, cell.attention) if hooks else None, compile=ctx.compile)
        test = evaluate(model, splits.test, eval_bs, dist, device)
        st = result.state
        last = st.history[-1] if st.history else {}
        wall = result.wall_s
        metrics = {"score": 100.0 * test["top1"], "test_top1": test["top1"], "test_top5": test["top5"],
                   "test_loss": test["loss"], "best_val_top1": st.best_value, "best_step": st.best_step,
                   "last_val_top1": last.get("top1"), "steps_run": st.step, "n_params": result.n_params,
                   "train_images_per_s": st.samples / max(st.train_time, 1e-9), "train_time_s": st.train_time,
                   "resumed_from": st.resumed_from,
                   "val_history": [[h["step"], h["top1"], h["loss"]] for h in st.history]}
        if dist.main:
            ckpt.unlink(missing_ok=True)
    peak, mem_method = meter.read()
    metrics.update(common)
    metrics.update({
        "teacher_test_top1": teacher_top1, "wall_s": wall, "peak_mem_bytes": peak, "mem_method": mem_method,
        "flops_per_image": flops_per_image(model, vp.data.image_size, device),
        "infer_images_per_s": inference_throughput(model, vp.data.image_size, infer_bs, device),
        "infer_peak_mem_bytes": inference_memory(model, vp.data.image_size, infer_bs, device),
        "infer_batch": infer_bs,
    })
    if teacher_top1 is not None:
        metrics["delta_vs_teacher"] = 100.0 * (test["top1"] - teacher_top1)
    return CellResult("ok", metrics=metrics, impl=resolve_impl(model, device))


def run_mixa(*, preset: str | MixaPreset = "tiny", teacher: Optional[str] = None, k: Optional[int] = None,
             data_dir: Optional[str] = None, opts: Optional[RunOptions] = None, console=None, progress: bool = True,
             hooks=None, eval_limit: Optional[int] = None, **fields) -> SweepSummary:
    """Score, select, and fine-tune MixA and its controls from ``teacher`` (a softmax ViT checkpoint of the
    vision preset's size; default: the vision suite's softmax model of that preset, trained first if the store
    has none). ``k`` overrides the preset's. ``opts``: the shared run options (or single ``fields`` of them, e.g.
    ``db=``, ``out=``, ``seed=``). ``hooks(task, attention)``: trainer hooks of a variant's fine-tune;
    ``eval_limit``: validation and test cut to their first images (smoke runs)."""
    from rich.markup import escape

    opts = run_options(opts, **fields)
    # each seed has its own teacher (and so its own Eq. 3 selection): one run per seed
    several = per_seed(opts, lambda o: run_mixa(preset=preset, teacher=teacher, k=k, data_dir=data_dir, opts=o,
                                                console=console, progress=progress, hooks=hooks,
                                                eval_limit=eval_limit))
    if several is not None:
        return several
    seed = opts.seed
    run = RunContext(opts, suite=SUITE, console=console, progress=progress)
    console = run.console
    pre = preset if isinstance(preset, MixaPreset) else load_preset(preset)
    vp = pre.vision
    size = VIT_SIZES.get(vp.model.size) if isinstance(vp.model.size, str) else vp.model.size
    if size is None:
        raise AttnbenchError(f"{vp.path}: [model] size {vp.model.size!r} is not one of {', '.join(VIT_SIZES)}")
    k = pre.select.k if k is None else k
    mixa_score.check_k(k, size.depth)
    for spec in (pre.select.quadratic_spec, pre.select.linear_spec):  # a value the mechanism refuses fails here
        spec.check_builds(heads=size.heads, head_dim=size.embed_dim // size.heads,
                                      seq_len=(vp.data.image_size // vp.model.patch_size) ** 2 + 1)
    if teacher is not None and not Path(teacher).is_file():
        raise AttnbenchError(f"--teacher {teacher}: no such file")
    device = run.device
    run.check_trainable(pre, [vp.train, pre.train])
    work = run.work
    splits = load_splits(vp, data_dir, eval_limit=eval_limit)
    # the teacher first: a vision run's from the store, else trained here (before the process group opens)
    t = get_teacher(vp, splits, path=teacher, db=opts.db, work=work / "teacher", seed=seed, console=console)
    with run:
        dist = run.dist
        say = run.say
        tmodel = t.model.to(device).eval()
        teacher_id = file_id(t.path)
        say(f"[bold]{escape(pre.key)}[/] ({escape(pre.description)}): teacher {escape(str(t.path))} ({t.origin}), "
            f"k = {k} of {size.depth} layers, seed {seed}, device {device}"
            + (f", {dist.world} processes" if dist.enabled else "") + f"\n  data: {escape(splits.origin)}")
        batches = [(x.to(device), y.to(device)) for x, y in score_batches(splits, pre)]
        scores = mixa_score.layer_scores(tmodel, batches, form=pre.score.linear_matrix)
        scores = dist.broadcast(scores)
        selected = mixa_score.top_k(scores.scores, k)
        say("  Eq. 3 scores I_A per layer: " + ", ".join(f"{i}: {s:.3g}" for i, s in enumerate(scores.scores))
            + f" ({scores.batches} batches, {scores.images} images); top-{k}: {selected}")
        teacher_top1 = t.test_top1
        if teacher_top1 is None:
            teacher_top1 = evaluate(tmodel, splits.test, vp.recipe.eval_batch_size, dist, device)["top1"]
        cells = plan_cells(pre, k=k, depth=size.depth, scores=scores, teacher_id=teacher_id, seed=seed,
                           device=device.type, data_fingerprint=splits.fingerprint)
        config = {"preset": pre.name, "preset_file": pre.path, "setting": pre.key, "k": k, "teacher": teacher_id,
                  "teacher_origin": t.origin, "seed": seed, "nproc": dist.world, "data_dir": data_dir,
                  "scores": scores.scores, "selected_layers": selected, **pre.identity()}

        def one(cell: Cell, ctx: CellContext) -> CellResult:
            return run_cell(cell, ctx, splits=splits, pre=pre, teacher=tmodel, teacher_path=t.path,
                            teacher_top1=teacher_top1, scores=scores, device=device, work=work, hooks=hooks)

        return run.sweep(cells, one, setting=pre.key, config=config, describe=_line)


def _line(o: Outcome) -> str:
    from rich.markup import escape

    head = f"  {escape(o.cell.attention):<18}"
    r = o.result
    if r.status == "ok" and r.metrics:
        m = r.metrics
        layers = m.get("quadratic_layers")
        return (f"{head} [green]ok[/]  test top-1 {m['score']:.1f}%"
                + (f" (Δ vs teacher {m['delta_vs_teacher']:+.1f})" if "delta_vs_teacher" in m and layers is not None
                   else "")
                + (f"  quadratic layers {layers}" if layers is not None else "  softmax teacher")
                + f"  {m['infer_images_per_s']:.0f} img/s inference  wall {m['wall_s']:.0f} s")
    if r.status == "ok":
        return f"{head} [green]ok[/]  {escape(o.skipped or '')}"
    color = "yellow" if r.status == "interrupted" else "red"
    return f"{head} [{color}]{r.status}[/]  {escape((r.error or o.skipped).splitlines()[0])}"
