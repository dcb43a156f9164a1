"""ViT-AdaLA (Li et al. 2026, Sec. 3.2): a softmax ViT linearised in three stages, each one run of the shared
trainer (:func:`attnbench.engine.train.train`) with its own :class:`~attnbench.engine.train.TrainConfig` (``[stage1..3]`` of
the preset), checkpoint, loss curve and metric.

The student is the teacher's ViT (:func:`attnbench.image.classify.build_classifier`) with every block's attention
built from the student spec (``linear`` = ELU+1, the paper's; any registered attention, e.g. ``nala``), and every
weight copied from the teacher (``qkv`` = W_Q, W_K, W_V, ``proj`` = W_O, norms, MLPs, head); a mechanism's own
parameters, if any, keep their initialisation.

**Stage 1, attention alignment (Eq. 3).** Per block i, the student attention f^LA_i (initialised from that
block's W_Q, W_K, W_V) gets the *teacher's* block input X_i (the output of the teacher block's first LayerNorm,
captured by a forward pre-hook on ``blocks[i].attn`` while the frozen teacher runs: teacher forcing, every layer
aligned independently) and is trained on

    L_att = sum_{i=1..K} 1/(N D) sum_{n,d} (o_i^{nd} - ô_i^{nd})^2,   o_i = f^SA_i(X_i), ô_i = f^LA_i(X_i)   (3)

(a sum over the K layers of per-layer means over tokens x channels, averaged over the batch). Only the W_Q, W_K,
W_V of the student attentions are trained (``qkv``): the trainer is given a module holding just the student's
attention modules with their ``proj`` (W_O), ``mech`` and ``dwc`` frozen, so nothing else of the student can
change. Validation metric: L_att on the validation split.

**Stage 2, feature alignment (Eq. 4).** The whole linearised ViT is trained against the frozen teacher on

    L_fa = lambda / (N D) sum_{n,d} (f_v^{nd} - f̂_v^{nd})^2,   f_v = F_theta0(X_v), f̂_v = F_theta(X_v)   (4)

with lambda from the preset (Table 5: 1 for a supervised ViT). The classifier head gets no gradient from Eq. 4
and is frozen (weight decay would otherwise shrink it). Validation metric: L_fa on the validation split.

**Stage 3, supervised fine-tuning.** A single linear head on the backbone's pooled feature, the backbone at
``backbone_lr_scale`` (0.1, Sec. 4) times the head's lr, on the vision preset's classification loss (its label
smoothing / mixup). Validation metric: top-1.

After every stage the student's test top-1 is recorded (before stage 3 with the teacher's head, which the
student inherits), so any subset of stages (``--stages``; ``--ablation`` runs Table 3's rows 3, 1+3, 2+3,
1+2+3) yields a score.

**Where the paper is silent** (each choice is a preset option, ``[adala]``):

- ``attn_output = "proj"`` (default): Eq. 3's o_i is the attention module's output *after* W_O, what the block
  adds to the residual stream (W_O is the teacher's and stays frozen in stage 1, so the loss weights the heads'
  errors as the block does). ``"heads"``: the heads' concatenation before W_O.
- ``features = "tokens"`` (default): Eq. 4's f_v are all tokens (class token and patches, N = 1 + patches) of
  the final layer *after* the final LayerNorm (timm's ``forward_features``, what a head or Mask2Former reads).
  ``"prenorm"``: the same tokens before the final norm (the norm is then frozen: it gets no gradient);
  ``"pooled"``: the pooled feature only (class token after the norm, N = 1).
- ``stage1_mech = false`` (default): a mechanism's own parameters (e.g. hedgehog's feature maps) stay frozen in
  stage 1, as the paper trains W_Q, W_K, W_V only; ``true`` trains them too (they train in stages 2 and 3).
- ``head = "new"`` (default, the paper appends a head to a head-less foundation model): stage 3 starts from a
  freshly initialised linear head (timm's init: truncated normal, std 0.02); ``"teacher"`` keeps the teacher's.
- Data: every stage reads the vision preset's training split with its augmentation (the paper uses COCO, then
  ImageNet-22K, then the task's data); the teacher is the softmax model of the same vision preset
  (:func:`attnbench.image.teacher.get_teacher`: a vision run's, else trained here).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.api.spec import AttentionSpec, as_specs
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunContext, RunOptions, run_options
from attnbench.engine.sweep import Cell, CellContext, CellResult, Outcome, SweepSummary, per_seed
from attnbench.engine.train.config import ParamGroup, TrainConfig
from attnbench.engine.train.dist import Dist
from attnbench.engine.train.trainer import TrainHooks, TrainOrder, TrainTask, train
from attnbench.image.classify import (
    StepBatches,
    build_classifier,
    evaluate,
    flops_per_image,
    inference_throughput,
    load_splits,
    majority_accuracy,
    mixed_batch,
    recipe_loss,
    tokens_of,
)
from attnbench.image.teacher import get_teacher, get_trained
from attnbench.measure.memory import TensorMemory
from attnbench.measure.peak import PeakMeter
from attnbench.models.vit import VIT_SIZES, load_pretrained, resolve_impl
from attnbench.results.provenance import file_id
from attnbench.results.records import point_hash

from .config import AdalaPreset, load_preset, parse_stages, stages_label

SUITE = "adala"
StageHooks = Union[TrainHooks, Callable[[str, int], TrainHooks]]
MAX_CURVE = 500  # points of a stage's recorded training-loss curve (every k-th step beyond that)


# --- the stages' objectives -----------------------------------------------------------------------------------
def _attn_out(attn: nn.Module, x: torch.Tensor, where: str) -> torch.Tensor:
    """A ViT block attention's output on ``x [B, N, dim]``: after W_O (``proj``) or the heads before it."""
    if where == "proj":
        return attn(x)
    got: list[torch.Tensor] = []
    h = attn.proj.register_forward_pre_hook(lambda m, args: got.append(args[0]))
    try:
        attn(x)
    finally:
        h.remove()
    return got[0]  # [B, N, dim]


@torch.no_grad()
def teacher_attention(teacher: nn.Module, x: torch.Tensor, where: str = "proj"):
    """``(inputs, outputs)``: per block, the teacher attention's input X_i (after the block's first LayerNorm)
    and its output O_i (after W_O, or before it with ``where="heads"``) while the teacher runs on images ``x``."""
    ins: list[torch.Tensor] = []
    outs: list[torch.Tensor] = []
    hooks = []
    for blk in teacher.blocks:
        hooks.append(blk.attn.register_forward_pre_hook(lambda m, args: ins.append(args[0])))
        if where == "proj":
            hooks.append(blk.attn.register_forward_hook(lambda m, args, out: outs.append(out)))
        else:
            hooks.append(blk.attn.proj.register_forward_pre_hook(lambda m, args: outs.append(args[0])))
    try:
        teacher.forward_features(x)
    finally:
        for h in hooks:
            h.remove()
    return ins, outs


class AlignNet(nn.Module):
    """Stage 1's trained module: the student's block attentions (shared, not copied), each applied to its own
    block's teacher input. Parameter names ``attns.<i>.qkv.*`` (W_Q, W_K, W_V), ``attns.<i>.proj.*`` (W_O),
    ``attns.<i>.mech.*``."""

    def __init__(self, student: nn.Module, where: str):
        super().__init__()
        self.attns = nn.ModuleList(blk.attn for blk in student.blocks)
        self.where = where

    def forward(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [_attn_out(a, x, self.where) for a, x in zip(self.attns, inputs)]


def stage1_frozen(mech: bool) -> tuple[str, ...]:
    return ("attns.*.proj.*", "attns.*.dwc.*") + (() if mech else ("attns.*.mech.*",))


def attention_loss(net: nn.Module, teacher: nn.Module, x: torch.Tensor, where: str) -> torch.Tensor:
    """Eq. 3: the sum over layers of the per-layer MSE between student and teacher attention outputs, the
    student fed the teacher's own block inputs."""
    ins, targets = teacher_attention(teacher, x, where)
    outs = net(ins)
    return sum(F.mse_loss(o.float(), t.float()) for o, t in zip(outs, targets))


def final_features(model: nn.Module, x: torch.Tensor, kind: str = "tokens") -> torch.Tensor:
    """Eq. 4's f_v: ``tokens`` [B, N, D] after the final norm, ``prenorm`` [B, N, D] before it, ``pooled``
    [B, D] (the head's input)."""
    if kind == "tokens":
        return model.forward_features(x)
    if kind == "pooled":
        return model.forward_head(model.forward_features(x), pre_logits=True)
    got: list[torch.Tensor] = []
    h = model.norm.register_forward_pre_hook(lambda m, args: got.append(args[0]))
    try:
        model.forward_features(x)
    finally:
        h.remove()
    return got[0]


class FeatureNet(nn.Module):
    """Stage 2's trained module: the whole student, returning its final features (``model.*`` names)."""
    def __init__(self, model: nn.Module, kind: str):
        super().__init__()
        self.model, self.kind = model, kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return final_features(self.model, x, self.kind)


def stage2_frozen(kind: str) -> tuple[str, ...]:
    """What gets no gradient from Eq. 4: the head (and the final norm when the features are taken before it)."""
    return ("model.head.*",) + (("model.norm.*",) if kind == "prenorm" else ())


def feature_loss(net: nn.Module, teacher: nn.Module, x: torch.Tensor, kind: str, lam: float) -> torch.Tensor:
    """Eq. 4: lambda times the MSE of the student's final features to the frozen teacher's."""
    with torch.no_grad():
        target = final_features(teacher, x, kind)
    return lam * F.mse_loss(net(x).float(), target.float())


def new_head(model: nn.Module, seed: int) -> None:
    """A freshly initialised linear head (timm's: truncated normal std 0.02, zero bias), drawn from ``seed``."""
    head = model.head
    if not isinstance(head, nn.Linear):
        raise AttnbenchError("stage 3 needs a ViT with a linear classification head")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        nn.init.trunc_normal_(head.weight, std=0.02)
        nn.init.zeros_(head.bias)


def stage3_config(cfg: TrainConfig, backbone_lr_scale: float) -> TrainConfig:
    """The stage-3 config: the head at ``lr``, everything else (the backbone) at ``lr * backbone_lr_scale``."""
    return dataclasses.replace(cfg, groups=(ParamGroup(("head.*",), 1.0), ParamGroup(("*",), backbone_lr_scale))
                               + tuple(cfg.groups))


# --- the student -----------------------------------------------------------------------------------------------
def build_student(spec: AttentionSpec, vpre, num_classes: int, teacher: nn.Module) -> nn.Module:
    """The teacher's ViT with ``spec``'s attention in every block and every teacher weight copied in (the
    mechanism's own parameters, absent from a softmax teacher, keep their initialisation)."""

    student = build_classifier(spec, vpre, num_classes)
    res = student.load_state_dict(teacher.state_dict(), strict=False)
    missing = [k for k in res.missing_keys if ".attn.mech." not in k and ".attn.dwc." not in k]
    if missing or res.unexpected_keys:
        raise AttnbenchError(f"the teacher does not fit the student ViT: missing {missing[:3]}, unexpected "
                             f"{res.unexpected_keys[:3]}")
    return student


def _batches_of(dataset, bs: int, dist: Dist, device: torch.device):
    import numpy as np

    idx = np.arange(len(dataset))[dist.rank::dist.world]
    for s in range(0, len(idx), bs):
        items = [dataset[int(i)] for i in idx[s:s + bs]]
        yield (torch.stack([it[0] for it in items]).to(device),
               torch.as_tensor([int(it[1]) for it in items], dtype=torch.long, device=device))


@torch.no_grad()
def mean_loss(fn: Callable[[torch.Tensor], torch.Tensor], dataset, bs: int, dist: Dist,
              device: torch.device) -> float:
    """The batch-size-weighted mean of ``fn(images)`` over ``dataset`` (sharded over the ranks, summed)."""
    sums = torch.zeros(2, dtype=torch.float64)
    for x, _ in _batches_of(dataset, bs, dist, device):
        sums[0] += float(fn(x)) * len(x)
        sums[1] += len(x)
    dist.all_reduce_sum(sums)
    return sums[0].item() / max(sums[1].item(), 1.0)


# --- measuring a model (teacher, from-scratch, student) ----------------------------------------------------------
def measure(model: nn.Module, splits, vpre, device: torch.device, dist: Dist) -> dict:
    """Test top-1 / top-5, parameters, FLOPs per image, inference images/s and the peak memory of one forward at
    the preset's sweep batch (CUDA allocator's peak, else tensor bytes alive at once: the same on any CPU)."""

    bs = vpre.recipe.eval_batch_size
    test = evaluate(model, splits.test, bs, dist, device)
    size = vpre.data.image_size
    model.eval()
    x = torch.randn(max(vpre.sweep.batch, 1), 3, size, size, device=device)
    with torch.no_grad():
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            model(x)
            peak = torch.cuda.max_memory_allocated(device) - base
        else:
            with TensorMemory() as tm:
                model(x)
            peak = tm.peak
    return {"score": 100.0 * test["top1"], "test_top1": test["top1"], "test_top5": test["top5"],
            "test_loss": test["loss"], "n_params": sum(p.numel() for p in model.parameters()),
            "flops_per_image": flops_per_image(model, size, device),
            "infer_images_per_s": inference_throughput(model, size, min(bs, 64), device),
            "infer_peak_mem_bytes": peak, "mem_batch": int(x.shape[0]), "n_test": len(splits.test),
            "num_classes": splits.num_classes, "majority_test_acc": majority_accuracy(splits), "data": splits.origin,
            "image_size": size}


# --- one pipeline cell ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Job:
    """A cell's payload: ``kind`` ``teacher`` | ``scratch`` | ``adala``; the student spec and stages."""
    kind: str
    spec: Optional[AttentionSpec] = None
    stages: tuple[int, ...] = ()
    weights: Optional[Path] = None  # scratch: the vision suite's trained model


def _curve(points: list) -> list:
    k = max(1, -(-len(points) // MAX_CURVE))
    return [p for i, p in enumerate(points) if i % k == 0 or i == len(points) - 1]


def run_stage(k: int, student: nn.Module, teacher: nn.Module, pre: AdalaPreset, vpre, splits, *, seed: int,
              device: torch.device, dist: Dist, identity: str, checkpoint: Optional[Path], progress=None,
              label: str = "", restart: bool = False, hooks: Optional[TrainHooks] = None) -> dict:
    """Run stage ``k`` on ``student`` (in place; the best validation step's weights are kept) and return its
    record: config, training-loss curve ``[[step, loss], ...]``, validation history, best step and value,
    trainable parameters, times, and the student's validation / test top-1 after the stage."""

    opts = pre.adala
    cfg = pre.stage(k)
    mix = None
    order = TrainOrder(len(splits.train), cfg.batch_size, seed + 1000 * k)
    batches = StepBatches(splits.train, order, device, vpre.recipe.workers)
    ebs = vpre.recipe.eval_batch_size
    if k == 1:
        net = AlignNet(student, opts.attn_output)
        cfg = dataclasses.replace(cfg, frozen=tuple(cfg.frozen) + stage1_frozen(opts.stage1_mech))

        def loss(m, b, t):
            return attention_loss(m, t, b[0], opts.attn_output)

        def validate(m):
            return {"loss": mean_loss(lambda x: attention_loss(m, teacher, x, opts.attn_output), splits.val, ebs,
                                      dist, device)}
    elif k == 2:
        net = FeatureNet(student, opts.features)
        cfg = dataclasses.replace(cfg, frozen=tuple(cfg.frozen) + stage2_frozen(opts.features))

        def loss(m, b, t):
            return feature_loss(m, t, b[0], opts.features, opts.lam)

        def validate(m):
            return {"loss": mean_loss(lambda x: feature_loss(m, teacher, x, opts.features, opts.lam), splits.val,
                                      ebs, dist, device)}
    else:
        net = student
        if opts.head == "new":
            new_head(student, seed)
        cfg = stage3_config(cfg, opts.backbone_lr_scale)
        mix, criterion = recipe_loss(vpre, splits.num_classes)  # the vision recipe's label smoothing / mixup

        def loss(m, b, t):
            x, y = b
            return criterion(m(x).float(), y)

        def validate(m):
            return evaluate(m, splits.val, ebs, dist, device)
    student.requires_grad_(True)  # an earlier stage's frozen parameters train again
    curve: list = []
    user_after = hooks.after_step if hooks else None

    def after(step: int, value: float) -> None:
        curve.append([step, value])
        if user_after:
            user_after(step, value)

    def batch(step: int, rank: int, world: int):
        x, y = batches.get(step, rank, world)
        return mixed_batch(mix if k == 3 else None, seed + 1000 * k, step, rank, x, y)

    th = TrainHooks(after_step=after, transform_loss=hooks.transform_loss if hooks else None)
    result = train(net, cfg, TrainTask(batch, loss, validate), seed=seed + 1000 * k,
                   device=device, identity=f"{identity}-stage{k}", checkpoint=checkpoint, dist=dist,
                   teacher=teacher if k < 3 else None, progress=progress, label=label, hooks=th, restart=restart)
    student.requires_grad_(True)
    st = result.state
    val = evaluate(student, splits.val, ebs, dist, device)
    test = evaluate(student, splits.test, ebs, dist, device)
    return {"stage": k, "train_loss": _curve(curve), "first_train_loss": curve[0][1] if curve else None,
            "final_train_loss": result.metrics()["final_train_loss"], "val_history": st.history,
            "metric": cfg.metric, "best_value": st.best_value, "best_step": st.best_step, "steps_run": st.step,
            "n_trainable": result.n_trainable, "train_time_s": st.train_time, "wall_s": result.wall_s,
            "train_images_per_s": st.samples / max(st.train_time, 1e-9), "resumed_from": st.resumed_from,
            "val_top1": val["top1"], "test_top1": test["top1"], "test_top5": test["top5"]}


def run_pipeline(spec: AttentionSpec, stages: tuple[int, ...], teacher: nn.Module, pre: AdalaPreset, vpre, splits,
                 *, seed: int, device: torch.device, dist: Dist, identity: str, work: Path, progress=None,
                 force: bool = False, hooks: Optional[StageHooks] = None) -> tuple[nn.Module, dict]:
    """``(student, {stage: record})``: the student built from ``teacher`` and trained by ``stages`` in order. A
    finished stage's weights and record are kept under ``work/stages`` until the cell ends, so a rerun of an
    interrupted cell resumes at the stage it was in (and inside it, from that stage's checkpoint). ``hooks``:
    the trainer hooks of every stage, or ``hooks(cell tag, stage)`` giving each stage its own."""
    torch.manual_seed(seed)
    student = build_student(spec, vpre, splits.num_classes, teacher).to(device)
    teacher = teacher.to(device).eval()
    records: dict = {}
    tag = f"{spec.label.replace(':', '_').replace('/', '_')}-{identity}-seed{seed}"
    for k in stages:
        stage_hooks = hooks(f"{tag}-{stages_label(stages)}", k) if callable(hooks) else hooks
        done = work / "stages" / f"{tag}-stage{k}.pt"
        if done.is_file() and not force:
            saved = torch.load(done, map_location="cpu", weights_only=True)
            student.load_state_dict(saved["model"])
            records[k] = saved["record"]
            continue
        ckpt = work / "checkpoints" / f"{tag}-stage{k}.pt"
        records[k] = run_stage(k, student, teacher, pre, vpre, splits, seed=seed, device=device, dist=dist,
                               identity=identity, checkpoint=ckpt, progress=progress,
                               label=f"{spec.label} stage {k}/{stages_label(stages)}", restart=force,
                               hooks=stage_hooks)
        if dist.main:
            done.parent.mkdir(parents=True, exist_ok=True)
            tmp = done.with_suffix(".tmp")
            torch.save({"model": student.state_dict(), "record": records[k]}, tmp)
            tmp.replace(done)
            ckpt.unlink(missing_ok=True)
    return student, records


def plan_cells(pre: AdalaPreset, vpre, specs: Sequence[AttentionSpec], stage_sets: Sequence[tuple[int, ...]], *,
               seed: int, device: str, data_fingerprint: str, teacher_id: str,
               scratch: dict[str, Path]) -> list[Cell]:
    """The teacher, each spec's from-scratch model (when given), and one cell per (spec, stage set)."""
    base = {"seed": seed, "preset": pre.name, "vision_preset": vpre.name, "vision_identity": vpre.identity_hash(),
            "teacher": teacher_id, "data": data_fingerprint, "image_size": vpre.data.image_size,
            "model": vpre.model.size, "patch_size": vpre.model.patch_size}

    def cell(task: str, attention: str, options: dict, params: dict, job: Job) -> Cell:
        h = point_hash(suite=SUITE, setting=pre.key, task=task, attention=attention, options=options,
                       params=params, dtype="float32", device=device)
        return Cell(task=task, attention=attention, config_hash=h, options=options, params=params, dtype="float32",
                    seed=seed, payload=job)

    cells = [cell("teacher", "softmax", {}, {**base, "stages": "teacher"}, Job("teacher"))]
    for spec in specs:
        full = spec.with_defaults(vpre.options_for(spec.name))
        if spec.label in scratch:
            w = scratch[spec.label]
            cells.append(cell("scratch", spec.label, dict(full.options),
                              {**base, "stages": "scratch", "steps": pre.budget(), "weights": file_id(w)},
                              Job("scratch", full, weights=w)))
        for stages in stage_sets:
            params = {**base, "stages": stages_label(stages), "identity": pre.identity_hash(),
                      "steps": pre.budget(stages)}
            cells.append(cell(f"stages {stages_label(stages)}", spec.label, dict(full.options), params,
                              Job("adala", full, stages)))
    return cells


def run_cell(cell: Cell, ctx: CellContext, *, teacher: nn.Module, pre: AdalaPreset, vpre, splits,
             device: torch.device, work: Path, hooks: Optional[StageHooks] = None) -> CellResult:
    job: Job = cell.payload
    dist = ctx.dist or Dist()
    if job.kind == "teacher":
        m = teacher.to(device)
        return CellResult("ok", metrics={**measure(m, splits, vpre, device, dist), "stages_run": []},
                          impl=resolve_impl(m, device))
    if job.kind == "scratch":
        m = build_classifier(job.spec, vpre, splits.num_classes)
        load_pretrained(m, job.weights)
        m = m.to(device)
        return CellResult("ok", metrics={**measure(m, splits, vpre, device, dist), "stages_run": [],
                                         "weights": str(job.weights)}, impl=resolve_impl(m, device))
    meter = PeakMeter(device)
    student, records = run_pipeline(job.spec, job.stages, teacher, pre, vpre, splits, seed=cell.seed,
                                    device=device, dist=dist, identity=cell.config_hash, work=work / "runs",
                                    progress=ctx.progress, force=ctx.force, hooks=hooks)
    peak, mem_method = meter.read()
    metrics = {**measure(student, splits, vpre, device, dist), "stages_run": list(job.stages),
               "stages": {str(k): r for k, r in records.items()}, "train_peak_mem_bytes": peak,
               "train_mem_method": mem_method,
               "wall_s": sum(r["wall_s"] for r in records.values()),
               "train_time_s": sum(r["train_time_s"] for r in records.values())}
    for k, r in records.items():
        metrics[f"stage{k}_test_top1"] = r["test_top1"]
        metrics[f"stage{k}_best"] = r["best_value"]
        metrics[f"stage{k}_first_loss"] = r["first_train_loss"]
        metrics[f"stage{k}_final_loss"] = r["final_train_loss"]
    if dist.main:
        tag = f"{cell.attention.replace(':', '_')}-{cell.config_hash}-seed{cell.seed}"
        weights = work / "models" / pre.key.replace("/", "_") / f"{tag}.pt"
        weights.parent.mkdir(parents=True, exist_ok=True)
        torch.save(student.state_dict(), weights)
        metrics["weights"] = str(weights)
        for k in job.stages:
            (work / "runs" / "stages" / f"{job.spec.label.replace(':', '_').replace('/', '_')}-{cell.config_hash}"
             f"-seed{cell.seed}-stage{k}.pt").unlink(missing_ok=True)
    return CellResult("ok", metrics=metrics, impl=resolve_impl(student, device))


# --- the from-scratch row -------------------------------------------------------------------------------------
def scratch_preset(pre: AdalaPreset, vpre):
    """The vision preset at the full pipeline's budget (its steps = stage 1 + 2 + 3 steps; the same preset when
    they already agree, so ``run vision``'s own record is reused)."""
    steps = pre.budget()
    if steps == vpre.train.steps:
        return vpre
    warm = min(vpre.train.warmup, steps // 10)
    ev = min(vpre.train.eval_every, steps) if vpre.train.eval_every else 0
    return dataclasses.replace(vpre, train=dataclasses.replace(vpre.train, steps=steps, warmup=warm,
                                                               eval_every=ev))


def get_scratch(pre: AdalaPreset, vpre, spec: AttentionSpec, splits, *, db, work: Path, seed: int,
                console=None) -> Path:
    """The weights of ``spec``'s model trained from scratch on the vision preset at the full pipeline's budget
    (:func:`scratch_preset`): from the store (a vision run of that preset), else trained before under ``work``,
    else trained now (:func:`attnbench.image.teacher.get_trained`)."""

    path, _, _ = get_trained(scratch_preset(pre, vpre), spec, splits, db=db, work=work, seed=seed, console=console)
    return path


def run_adala(*, attentions: Sequence[str | AttentionSpec], preset: str | AdalaPreset = "tiny",
              stages: str | Sequence[int] | None = "1,2,3", ablation: bool = False, teacher: Optional[str] = None,
              scratch: bool = True, data_dir: Optional[str] = None, opts: Optional[RunOptions] = None, console=None,
              progress: bool = True, hooks: Optional[StageHooks] = None, vision=None,
              eval_limit: Optional[int] = None, **fields) -> SweepSummary:
    """Linearise the teacher into each attention spec by the given stages (or Table 3's stage sets with
    ``ablation``), beside the teacher and the from-scratch model; see the module docstring. ``opts``: the shared
    run options (or single ``fields`` of them, e.g. ``db=``, ``out=``, ``seed=``). ``vision``: a vision preset in
    place of the preset's (smoke runs); ``eval_limit``: validation and test cut short."""
    from rich.markup import escape

    opts = run_options(opts, **fields)
    # each seed has its own teacher and from-scratch models: one run per seed
    several = per_seed(opts, lambda o: run_adala(attentions=attentions, preset=preset, stages=stages,
                                                 ablation=ablation, teacher=teacher, scratch=scratch,
                                                 data_dir=data_dir, opts=o, console=console, progress=progress,
                                                 hooks=hooks, vision=vision, eval_limit=eval_limit))
    if several is not None:
        return several
    seed = opts.seed
    db = opts.db
    run = RunContext(opts, suite=SUITE, console=console, progress=progress)
    console = run.console
    specs = as_specs(attentions)
    if not specs:
        raise AttnbenchError("give at least one student attention (--attn linear,nala,...)")
    pre = preset if isinstance(preset, AdalaPreset) else load_preset(preset)
    vpre = vision or pre.load_vision()
    stage_sets = pre.adala.ablation_sets() if ablation else [parse_stages(stages or "1,2,3")]

    size = VIT_SIZES[vpre.model.size]
    for spec in specs:
        if spec.name == "softmax":
            raise AttnbenchError("the student must be a linear attention (softmax is the teacher)")
        spec.with_defaults(vpre.options_for(spec.name)).check_builds(heads=size.heads,
                                                                      head_dim=size.embed_dim // size.heads,
                                                                      seq_len=tokens_of(vpre))
    device = run.device
    run.check_trainable(pre, [vpre.train, pre.stage1, pre.stage2, pre.stage3])
    work = run.work
    vision_out = str(work / "vision")
    splits = load_splits(vpre, data_dir, eval_limit=eval_limit)
    # the teacher and the from-scratch models: a vision run's from the store, else trained here (before the
    # process group opens) and kept under WORK/vision
    t = get_teacher(vpre, splits, path=teacher, db=db, work=Path(vision_out), seed=seed, console=console)
    scratch_w = ({s.label: get_scratch(pre, vpre, s, splits, db=db, work=Path(vision_out), seed=seed,
                                       console=console) for s in specs} if scratch else {})
    with run:
        dist = run.dist
        top1 = f", test top-1 {100 * t.test_top1:.1f}%" if t.test_top1 is not None else ""
        run.say(f"[bold]{escape(pre.key)}[/] ({escape(pre.description)}): teacher {escape(str(t.path))} "
                f"({t.origin}{top1}); students {', '.join(s.label for s in specs)}; stages "
                f"{', '.join(stages_label(s) for s in stage_sets)}; seed {seed}, device {device}"
                + (f", {dist.world} processes" if dist.enabled else ""))
        cells = plan_cells(pre, vpre, specs, stage_sets, seed=seed, device=device.type,
                           data_fingerprint=splits.fingerprint, teacher_id=file_id(t.path), scratch=scratch_w)
        config = {"preset": pre.name, "preset_file": pre.path, "setting": pre.key, "vision_preset": vpre.name,
                  "teacher": str(t.path), "teacher_origin": t.origin, "attentions": [s.label for s in specs],
                  "stages": [stages_label(s) for s in stage_sets], "seed": seed, "nproc": dist.world,
                  "data_dir": data_dir, **pre.identity(), "vision": vpre.identity()}

        def one(cell: Cell, ctx: CellContext) -> CellResult:
            return run_cell(cell, ctx, teacher=t.model, pre=pre, vpre=vpre, splits=splits, device=device,
                            work=work, hooks=hooks)

        return run.sweep(cells, one, setting=pre.key, config=config, describe=_line)


def _line(o: Outcome) -> str:
    from rich.markup import escape

    head = f"  {escape(o.cell.task):<14} {escape(o.cell.attention):<14}"
    r = o.result
    if o.skipped:
        return f"{head} [dim]skipped[/]  {escape(o.skipped)}"
    if r.status != "ok":
        color = "yellow" if r.status == "interrupted" else "red"
        return f"{head} [{color}]{r.status}[/]  {escape((r.error or o.skipped).splitlines()[0])}"
    m = r.metrics
    parts = []
    for k, s in sorted((m.get("stages") or {}).items()):
        parts.append(f"stage {k}: loss {s['first_train_loss']:.3g} -> {s['final_train_loss']:.3g}, "
                     f"top-1 {100 * s['test_top1']:.1f}%")
    return (f"{head} [green]ok[/]  test top-1 {m['score']:.1f}%  {m['infer_images_per_s']:.0f} img/s"
            + (f"  ({'; '.join(parts)})" if parts else ""))
