"""The vision runner: the same ViT with only the attention swapped, on the same data and recipe, one cell per
attention spec; accuracy beside speed and memory.

``attnbench run vision`` -> :func:`run_vision`. The data of the preset (:mod:`.data`), the ViT of
:func:`attnbench.models.vit.build_vit`, the shared trainer (:mod:`attnbench.train`: AdamW, warm-up + cosine,
checkpoints and resume, ``--nproc`` DDP) and sweep (:mod:`attnbench.sweep`), the DeiT recipe's parts from timm
(label smoothing, mixup / cutmix). Per cell the store gets top-1 (and top-5) on the test split at the best
validation step (``score`` = test top-1 in %), the validation top-1 at the last step, parameters, FLOPs per
image (``torch.utils.flop_counter``), training and inference throughput (images/s), peak memory, wall time.

Determinism: the batch of step ``s`` is drawn from ``(seed, epoch)`` and the RNG (torch and numpy: mixup) is
seeded from ``(seed, s, rank)``, so a run resumed from its checkpoint ends as an uninterrupted one (with
``recipe.workers = 0``; data-loader workers draw augmentations from their own streams).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from attnbench.errors import AttnbenchError
from attnbench.models import BlockOptions
from attnbench.spec import AttentionSpec, as_specs
from attnbench.runctx import RunContext, RunOptions, run_options
from attnbench.sweep import Cell, CellContext, CellResult, Outcome, SweepSummary
from attnbench.train import Dist, TrainHooks, TrainOrder, TrainTask, step_seed, train
from attnbench.train.memory import PeakMeter

from .config import VisionPreset, load_preset, with_folder

SUITE = "vision"
HooksFor = Callable[[str, str], TrainHooks]


def build_model(spec: AttentionSpec | Sequence[AttentionSpec], pre: VisionPreset, num_classes: int):
    from attnbench.models.vit import build_vit

    m = pre.model
    return build_vit(spec, size=m.size, img_size=pre.data.image_size, patch_size=m.patch_size,
                     num_classes=num_classes, global_pool=m.global_pool, drop_rate=m.drop_rate,
                     drop_path_rate=m.drop_path, options=BlockOptions(dwc_kernel=m.dwc_kernel))


class FirstItems(torch.utils.data.Dataset):
    """The first ``n`` items of ``dataset``, with its ``targets``: the short evaluations of a smoke run."""

    def __init__(self, dataset, n: int):
        self.dataset, self.n = dataset, min(int(n), len(dataset))

    @property
    def targets(self) -> np.ndarray:
        return np.asarray(self.dataset.targets)[: self.n]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.dataset[i]


def load_splits(pre: VisionPreset, data_dir: Optional[str], *, eval_limit: Optional[int] = None):
    """The preset's data: its reader, size, split, classes, augmentation and reader options, from ``data_dir``;
    with ``eval_limit`` the validation and test splits are cut to their first ``eval_limit`` images (smoke)."""
    from attnbench.image import data as vision_data

    splits = vision_data.build_splits(pre.data.kind, root=Path(data_dir) if data_dir else None,
                                      image_size=pre.data.image_size, seed=pre.data.seed, classes=pre.data.classes,
                                      augment=pre.recipe.augment, **pre.data.options())
    if eval_limit:
        splits.val, splits.test = FirstItems(splits.val, eval_limit), FirstItems(splits.test, eval_limit)
    return splits


def tokens_of(pre: VisionPreset) -> int:
    return (pre.data.image_size // pre.model.patch_size) ** 2 + (1 if pre.model.global_pool == "token" else 0)


class _StepSampler:
    """Index lists of rank ``rank``'s share of the global batches of steps ``start, start + 1, ...``."""

    def __init__(self, order: TrainOrder, start: int, rank: int, world: int):
        self.order, self.start, self.rank, self.world = order, start, rank, world

    def __iter__(self):
        step = self.start
        while True:
            yield self.order.shard(step, self.rank, self.world).tolist()
            step += 1


class StepBatches:
    """The images and labels of rank ``rank``'s share of the global batch of a step, stacked on ``device``.

    ``workers = 0`` reads them in this process; with workers, a ``DataLoader`` over the same index lists decodes
    and augments ahead (restarted at the requested step after a resume). Workers draw augmentations from their
    own random streams, so only ``workers = 0`` makes a resumed run bit-identical."""

    def __init__(self, dataset, order: TrainOrder, device: torch.device, workers: int = 0):
        self.dataset, self.order, self.device, self.workers = dataset, order, device, workers
        self._it, self._next = None, -1

    def get(self, step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.workers:
            items = [self.dataset[int(i)] for i in self.order.shard(step, rank, world)]
            x = torch.stack([it[0] for it in items])
            y = torch.as_tensor([int(it[1]) for it in items], dtype=torch.long)
        else:
            if self._it is None or step != self._next:
                loader = torch.utils.data.DataLoader(
                    self.dataset, batch_sampler=_StepSampler(self.order, step, rank, world),
                    num_workers=self.workers, pin_memory=self.device.type == "cuda", prefetch_factor=4)
                self._it, self._next = iter(loader), step
            x, y = next(self._it)
            self._next += 1
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset, bs: int, dist: Dist, device: torch.device,
             workers: int = 0) -> dict[str, float]:
    """Top-1, top-5 and mean loss over ``dataset`` (sharded over the ranks, summed)."""
    was = model.training
    model.eval()
    shard = torch.utils.data.Subset(dataset, list(range(dist.rank, len(dataset), dist.world)))
    loader = torch.utils.data.DataLoader(shard, batch_size=bs, num_workers=workers,
                                         pin_memory=device.type == "cuda")
    sums = torch.zeros(4, dtype=torch.float64)
    for x, y in loader:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        logits = model(x).float()
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # [B, 5]
        sums[0] += (top[:, 0] == y).sum().item()
        sums[1] += (top == y[:, None]).any(-1).sum().item()
        sums[2] += F.cross_entropy(logits, y, reduction="sum").item()
        sums[3] += len(y)
    dist.all_reduce_sum(sums)
    model.train(was)
    n = max(sums[3].item(), 1.0)
    return {"top1": sums[0].item() / n, "top5": sums[1].item() / n, "loss": sums[2].item() / n}


def _recipe_loss(pre: VisionPreset, num_classes: int):
    """``(mix, criterion)``: timm's Mixup (None when off) and the matching loss (soft-target CE with mixup,
    else label-smoothing CE)."""
    r = pre.recipe
    if r.mixup > 0 or r.cutmix > 0:
        from timm.data import Mixup
        from timm.loss import SoftTargetCrossEntropy

        mix = Mixup(mixup_alpha=r.mixup, cutmix_alpha=r.cutmix, label_smoothing=r.label_smoothing,
                    num_classes=num_classes)
        return mix, SoftTargetCrossEntropy()
    if r.label_smoothing > 0:
        from timm.loss import LabelSmoothingCrossEntropy

        return None, LabelSmoothingCrossEntropy(smoothing=r.label_smoothing)
    return None, torch.nn.CrossEntropyLoss()


@torch.no_grad()
def inference_throughput(model: torch.nn.Module, image_size: int, batch: int, device: torch.device,
                         reps: int = 3) -> float:
    """Images/s of a forward pass at ``batch`` images (best of ``reps`` after one warm-up)."""
    was = model.training
    model.eval()
    x = torch.randn(batch, 3, image_size, image_size, device=device)
    model(x)
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        model(x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    model.train(was)
    return batch / best


def flops_per_image(model: torch.nn.Module, image_size: int, device: torch.device) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    was = model.training
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(torch.randn(1, 3, image_size, image_size, device=device))
    model.train(was)
    return int(fc.get_total_flops())


def resolution_sweep(model: torch.nn.Module, pre: VisionPreset, num_classes: int,
                     device: torch.device) -> list[dict]:
    """The trained weights at each resolution of ``pre.sweep`` (position embedding resampled): inference
    images/s and peak memory of one forward at ``pre.sweep.batch`` images. Peak memory is the CUDA allocator's
    peak on a GPU, else the tensor bytes alive at once (:class:`attnbench.bench.memory.TensorMemory`, the same on any
    CPU). A resolution that runs out of memory is recorded ``oom`` and the sweep goes on."""
    import tempfile

    from attnbench.bench.memory import TensorMemory
    from attnbench.errors import is_oom
    from attnbench.models.vit import load_pretrained

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.pt"
        torch.save(model.state_dict(), path)
        for res in pre.sweep.resolutions:
            row = {"resolution": res, "tokens": (res // pre.model.patch_size) ** 2
                   + (1 if pre.model.global_pool == "token" else 0)}
            try:
                at = dataclasses.replace(pre, data=dataclasses.replace(pre.data, image_size=res))
                m = build_model(model.attnbench_specs, at, num_classes).to(device).eval()
                load_pretrained(m, path)
                x = torch.randn(pre.sweep.batch, 3, res, res, device=device)
                with torch.no_grad():
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                        base = torch.cuda.memory_allocated(device)
                        m(x)
                        row["peak_mem_bytes"] = torch.cuda.max_memory_allocated(device) - base
                    else:
                        with TensorMemory() as tm:
                            m(x)
                        row["peak_mem_bytes"] = tm.peak
                row["infer_images_per_s"] = inference_throughput(m, res, pre.sweep.batch, device)
                row["status"] = "ok"
            except Exception as e:  # noqa: BLE001 - a resolution that fails is recorded, the others still run
                row["status"] = "oom" if is_oom(e) else "failed"
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            finally:
                m = x = None  # noqa: F841 - free before the next resolution
            out.append(row)
    return out


def plan_cells(pre: VisionPreset, specs: Sequence[AttentionSpec], *, seed: int, device: str,
               data_fingerprint: str, pretrained: Optional[str] = None) -> list[Cell]:
    from attnbench.store import point_hash

    cells = []
    for spec in specs:
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
                          params=params, dtype="float32", seed=seed, payload=full))
    return cells


def run_cell(cell: Cell, ctx: CellContext, *, splits, pre: VisionPreset, device: torch.device, work: Path,
             hooks: Optional[HooksFor] = None, pretrained: Optional[Path] = None) -> CellResult:
    """Train, validate and test the ViT with one attention spec; resumes from its checkpoint if there is one."""
    from attnbench.models.vit import resolve_impl

    dist = ctx.dist
    meter = PeakMeter(device)
    torch.manual_seed(cell.seed)
    model = build_model(cell.payload, pre, splits.num_classes)
    if pretrained is not None:  # fine-tune from a checkpoint (a softmax ViT loads into any attention)
        from attnbench.models.vit import load_pretrained

        load_pretrained(model, pretrained)
    model = model.to(device)
    impl = resolve_impl(model, device)
    order = TrainOrder(len(splits.train), pre.train.batch_size, cell.seed)
    batches = StepBatches(splits.train, order, device, pre.recipe.workers)
    mix, criterion = _recipe_loss(pre, splits.num_classes)

    def batch(step: int, rank: int, world: int):
        x, y = batches.get(step, rank, world)
        if mix is not None:
            np.random.seed(step_seed(cell.seed, step, rank) % 2**32)  # timm's Mixup draws from numpy
            x, y = mix(x, y)
        return x, y

    def loss(net, b, teacher):
        x, y = b
        return criterion(net(x).float(), y)

    def validate(net):
        return evaluate(net, splits.val, pre.recipe.eval_batch_size, dist, device, pre.recipe.workers)

    ckpt = artifact_path(work, "checkpoints", pre, cell)
    result = train(model, pre.train, TrainTask(batch, loss, validate), seed=cell.seed, device=device,
                   identity=cell.config_hash, checkpoint=ckpt, dist=dist, progress=ctx.progress, label=cell.label,
                   hooks=hooks(cell.task, cell.attention) if hooks else None, restart=ctx.force)
    test = evaluate(model, splits.test, pre.recipe.eval_batch_size, dist, device, pre.recipe.workers)
    peak, mem_method = meter.read()
    st = result.state
    last = st.history[-1] if st.history else {}
    metrics = {
        "score": 100.0 * test["top1"], "test_top1": test["top1"], "test_top5": test["top5"],
        "test_loss": test["loss"], "best_val_top1": st.best_value, "best_step": st.best_step,
        "last_val_top1": last.get("top1"), "steps_run": st.step, "n_params": result.n_params,
        "flops_per_image": flops_per_image(model, pre.data.image_size, device),
        "train_images_per_s": st.samples / max(st.train_time, 1e-9),
        "infer_images_per_s": inference_throughput(model, pre.data.image_size,
                                                   min(pre.recipe.eval_batch_size, 64), device),
        "train_time_s": st.train_time, "wall_s": result.wall_s, "peak_mem_bytes": peak, "mem_method": mem_method,
        "world_size": dist.world, "threads": torch.get_num_threads(), "n_train": len(splits.train),
        "n_val": len(splits.val), "n_test": len(splits.test), "num_classes": splits.num_classes,
        "data": splits.origin, "tokens": tokens_of(pre), "resumed_from": st.resumed_from,
        "val_history": [[h["step"], h["top1"], h["loss"]] for h in st.history],
        "majority_test_acc": _majority(splits),
        "resolution_sweep": resolution_sweep(model, pre, splits.num_classes, device),
    }
    if dist.main:
        weights = artifact_path(work, "models", pre, cell)  # the trained model (best val step): a teacher for others
        weights.parent.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), weights)
        metrics["weights"] = str(weights)
        ckpt.unlink(missing_ok=True)
    return CellResult("ok", metrics=metrics, impl=impl)


def artifact_path(work: Path, kind: str, pre: VisionPreset, cell: Cell) -> Path:
    """``WORK/<kind>/<setting>/<spec>-<config hash>-seed<seed>.pt`` (kind: ``checkpoints`` while training,
    ``models`` for the trained weights)."""
    slug = pre.key.replace("/", "_")
    return work / kind / slug / f"{cell.attention.replace(':', '_')}-{cell.config_hash}-seed{cell.seed}.pt"


def _majority(splits) -> float:
    """Test accuracy of always predicting the most frequent training class (labels from ``.targets``, which
    every reader's datasets carry, so no image is decoded)."""
    train_labels, test_labels = np.asarray(splits.train.targets), np.asarray(splits.test.targets)
    return float(np.mean(test_labels == int(np.argmax(np.bincount(train_labels)))))


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
    seed = opts.only_seed()
    run = RunContext(opts, suite=SUITE, console=console, progress=progress)
    console = run.console
    specs = as_specs(attentions)
    if not specs:
        raise AttnbenchError("give at least one attention (--attn softmax,nala,...)")
    pre = with_folder(preset if isinstance(preset, VisionPreset) else load_preset(preset), data_dir)
    from attnbench.models.vit import VIT_SIZES

    size = VIT_SIZES.get(pre.model.size)
    if size is None:
        raise AttnbenchError(f"{pre.path}: [model] size {pre.model.size!r} is not one of {', '.join(VIT_SIZES)}")
    for spec in specs:  # a value the mechanism refuses fails here, before any data or cell
        spec.with_defaults(pre.options_for(spec.name)).check_builds(heads=size.heads,
                                                                     head_dim=size.embed_dim // size.heads,
                                                                     seq_len=tokens_of(pre))
    device = run.device
    with run:
        dist = run.dist
        work = run.work
        splits = load_splits(pre, data_dir, eval_limit=eval_limit)
        say = run.say
        say(f"[bold]{escape(pre.key)}[/] ({escape(pre.description)}): {len(specs)} attention(s), seed {seed}, "
            f"device {device}" + (f", {dist.world} processes" if dist.enabled else "")
            + f"\n  data: {escape(splits.origin)}")
        ckpt_id = None
        if pretrained:
            import hashlib

            path = Path(pretrained)
            if not path.is_file():
                raise AttnbenchError(f"--pretrained {path}: no such file")
            ckpt_id = f"{path.name}@{hashlib.sha256(path.read_bytes()).hexdigest()[:12]}"
            from attnbench.models.vit import load_pretrained

            load_pretrained(build_model(specs[0], pre, splits.num_classes), path)  # does it fit? before any cell
        cells = plan_cells(pre, specs, seed=seed, device=device.type, data_fingerprint=splits.fingerprint,
                           pretrained=ckpt_id)
        config = {"preset": pre.name, "preset_file": pre.path, "setting": pre.key,
                  "attentions": [s.label for s in specs], "seed": seed, "nproc": dist.world, "data_dir": data_dir,
                  **pre.identity()}

        def one(cell: Cell, ctx: CellContext) -> CellResult:
            return run_cell(cell, ctx, splits=splits, pre=pre, device=device, work=work, hooks=hooks,
                            pretrained=Path(pretrained) if pretrained else None)

        return run.sweep(cells, one, setting=pre.key, config=config, describe=_line)


def _line(o: Outcome) -> str:
    from rich.markup import escape

    head = f"  {escape(o.cell.attention):<16}"
    r = o.result
    if r.status == "ok":
        m = r.metrics
        return (f"{head} [green]ok[/]  test top-1 {m['score']:.1f}% (best val {100 * m['best_val_top1']:.1f}% @ "
                f"step {m['best_step']})  {m['train_images_per_s']:.0f} img/s train, "
                f"{m['infer_images_per_s']:.0f} img/s inference  {m['flops_per_image'] / 1e9:.3g} GFLOPs  "
                f"wall {m['wall_s']:.0f} s")
    color = "yellow" if r.status == "interrupted" else "red"
    return f"{head} [{color}]{r.status}[/]  {escape((r.error or o.skipped).splitlines()[0])}"
