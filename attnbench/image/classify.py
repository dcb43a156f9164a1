"""Image classification with a ViT whose attention is chosen from specs: the classifier of a preset, its data,
the DeiT recipe's loss, evaluation, FLOPs, throughput and memory, and :func:`fit_classifier`, which trains and
tests one classifier on the shared trainer (:func:`attnbench.engine.train.train`).

A preset is any object with the fields of :class:`ClassifierPreset`. The model is timm's ``VisionTransformer``
with each block's attention built from a spec (:func:`attnbench.models.vit.build_vit`); the recipe's parts are
timm's (label smoothing, mixup / cutmix). Determinism: the batch of step ``s`` is drawn from ``(seed, epoch)``
and mixup's numpy RNG from ``(seed, s, rank)``, so a run resumed from its checkpoint ends as an uninterrupted
one (with ``recipe.workers = 0``; data-loader workers draw augmentations from their own streams).
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Optional, Protocol, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from attnbench.api.spec import AttentionSpec
from attnbench.core.errors import is_oom
from attnbench.engine.train.dist import Dist
from attnbench.engine.train.trainer import TrainHooks, TrainOrder, TrainTask, step_seed, train
from attnbench.image import data as image_data
from attnbench.measure.memory import TensorMemory
from attnbench.measure.peak import PeakMeter
from attnbench.models import BlockOptions
from attnbench.models.vit import build_vit, load_pretrained, resolve_impl


class ClassifierPreset(Protocol):
    """What the functions here read of a preset: ``data`` (``kind``, ``image_size``, ``seed``, ``classes``,
    ``options()``), ``model`` (``size``, ``patch_size``, ``global_pool``, ``drop_rate``, ``drop_path``,
    ``dwc_kernel``), ``recipe`` (``label_smoothing``, ``mixup``, ``cutmix``, ``augment``, ``eval_batch_size``,
    ``workers``), ``train`` (an :class:`attnbench.engine.train.TrainConfig`), ``sweep`` (``resolutions``, ``batch``),
    ``key`` (its setting), ``identity_hash()`` and ``options_for(attention)``."""

    data: Any
    model: Any
    recipe: Any
    train: Any
    sweep: Any

    @property
    def key(self) -> str: ...

    def identity_hash(self) -> str: ...

    def options_for(self, attention: str) -> dict[str, Any]: ...


# ------------------------------------------------------------------------------------------- model and data
def build_classifier(spec: AttentionSpec | Sequence[AttentionSpec], pre: ClassifierPreset, num_classes: int):
    """The preset's ViT (size, patch, pooling, dropouts, block options) at its image size, with ``spec``'s
    attention in every block (or one spec per block)."""

    m = pre.model
    return build_vit(spec, size=m.size, img_size=pre.data.image_size, patch_size=m.patch_size,
                     num_classes=num_classes, global_pool=m.global_pool, drop_rate=m.drop_rate,
                     drop_path_rate=m.drop_path, options=BlockOptions(dwc_kernel=m.dwc_kernel))


def tokens_of(pre: ClassifierPreset) -> int:
    """The sequence length the attention sees: patches, plus the class token with ``global_pool = "token"``."""
    return (pre.data.image_size // pre.model.patch_size) ** 2 + (1 if pre.model.global_pool == "token" else 0)


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


def load_splits(pre: ClassifierPreset, data_dir: Optional[str], *, eval_limit: Optional[int] = None):
    """The preset's data: its reader, size, split, classes, augmentation and reader options, from ``data_dir``;
    with ``eval_limit`` the validation and test splits are cut to their first ``eval_limit`` images (smoke)."""

    splits = image_data.build_splits(pre.data.kind, root=Path(data_dir) if data_dir else None,
                                     image_size=pre.data.image_size, seed=pre.data.seed, classes=pre.data.classes,
                                     augment=pre.recipe.augment, **pre.data.options())
    if eval_limit:
        splits.val, splits.test = FirstItems(splits.val, eval_limit), FirstItems(splits.test, eval_limit)
    return splits


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


# ------------------------------------------------------------------------------------- loss and evaluation
def recipe_loss(pre: ClassifierPreset, num_classes: int):
    """``(mix, criterion)``: timm's Mixup (None when off) and the matching loss (soft-target CE with mixup,
    else label-smoothing CE, else plain CE)."""
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


def mixed_batch(mix, seed: int, step: int, rank: int, x: torch.Tensor, y: torch.Tensor):
    """``(x, y)`` through timm's Mixup (which draws from numpy's global RNG, seeded here from ``(seed, step,
    rank)`` so a resumed run draws the same), or unchanged when ``mix`` is None."""
    if mix is None:
        return x, y
    np.random.seed(step_seed(seed, step, rank) % 2**32)
    return mix(x, y)


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


def majority_accuracy(splits) -> float:
    """Test accuracy of always predicting the most frequent training class (labels from ``.targets``, which
    every reader's datasets carry, so no image is decoded)."""
    train_labels, test_labels = np.asarray(splits.train.targets), np.asarray(splits.test.targets)
    return float(np.mean(test_labels == int(np.argmax(np.bincount(train_labels)))))


# ------------------------------------------------------------------------------ FLOPs, throughput, memory
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
    """FLOPs of one image's forward pass (``torch.utils.flop_counter``)."""
    from torch.utils.flop_counter import FlopCounterMode

    was = model.training
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(torch.randn(1, 3, image_size, image_size, device=device))
    model.train(was)
    return int(fc.get_total_flops())


def inference_memory(model: torch.nn.Module, image_size: int, batch: int, device: torch.device) -> int:
    """Peak bytes of one forward at ``batch`` images: the CUDA allocator's peak, else the tensor bytes alive at
    once (:class:`attnbench.measure.memory.TensorMemory`, the same on any CPU)."""

    was = model.training
    model.eval()
    x = torch.randn(batch, 3, image_size, image_size, device=device)
    try:
        with torch.no_grad():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
                base = torch.cuda.memory_allocated(device)
                model(x)
                return torch.cuda.max_memory_allocated(device) - base
            with TensorMemory() as tm:
                model(x)
            return tm.peak
    finally:
        model.train(was)


def resolution_sweep(model: torch.nn.Module, pre: ClassifierPreset, num_classes: int,
                     device: torch.device) -> list[dict]:
    """The trained weights at each resolution of ``pre.sweep`` (position embedding resampled): inference
    images/s and peak memory (:func:`inference_memory`) of one forward at ``pre.sweep.batch`` images. A
    resolution that runs out of memory is recorded ``oom``, one where the attention's own weights are sized by the
    token count (Linformer) ``fixed length``, and the sweep goes on."""
    import tempfile

    out = []
    trained = model.state_dict()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "weights.pt"
        torch.save(trained, path)
        for res in pre.sweep.resolutions:
            row = {"resolution": res, "tokens": (res // pre.model.patch_size) ** 2
                   + (1 if pre.model.global_pool == "token" else 0)}
            m = None
            try:
                at = dataclasses.replace(pre, data=dataclasses.replace(pre.data, image_size=res))
                m = build_classifier(model.attnbench_specs, at, num_classes).to(device).eval()
                own = m.state_dict()
                sized = [f"{k} {tuple(v.shape)} vs {tuple(own[k].shape)}" for k, v in trained.items()
                         if ".attn.mech." in k and k in own and own[k].shape != v.shape]
                if sized:  # e.g. Linformer's E, F: [k, N]; only the position embedding is resampled
                    row.update(status="fixed length", error=f"the attention's weights are sized by the token count: "
                                                            f"{sized[0]}")
                else:
                    load_pretrained(m, path)
                    row["peak_mem_bytes"] = inference_memory(m, res, pre.sweep.batch, device)
                    row["infer_images_per_s"] = inference_throughput(m, res, pre.sweep.batch, device)
                    row["status"] = "ok"
            except Exception as e:  # noqa: BLE001 - a resolution that fails is recorded, the others still run
                row["status"] = "oom" if is_oom(e) else "failed"
                row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            finally:
                m = None  # noqa: F841 - free before the next resolution
            out.append(row)
    return out


# ------------------------------------------------------------------------------------ training one model
@dataclasses.dataclass
class Fitted:
    """A trained and tested classifier: the model (its best validation step's weights), what a result records
    of it, and the attention implementations it ran."""

    model: torch.nn.Module
    metrics: dict[str, Any]
    impl: str


def fit_classifier(spec: AttentionSpec | Sequence[AttentionSpec], pre: ClassifierPreset, splits, *, seed: int,
                   device: torch.device, dist: Dist, identity: str, checkpoint: Path, progress=None, label: str = "",
                   hooks: Optional[TrainHooks] = None, restart: bool = False,
                   pretrained: Optional[Path] = None, compile: bool = False) -> Fitted:
    """Train the preset's ViT with ``spec`` on ``splits.train`` by the preset's recipe (from ``pretrained``'s
    weights if given: a softmax ViT loads into any attention), resuming from ``checkpoint`` if it is there;
    then test it. Metrics: top-1 (and top-5) on the test split at the best validation step (``score`` = test
    top-1 in %), the validation history, parameters, FLOPs per image, training and inference images/s, peak
    memory, times, the majority-class baseline and the resolution sweep."""

    meter = PeakMeter(device)
    torch.manual_seed(seed)
    model = build_classifier(spec, pre, splits.num_classes)
    if pretrained is not None:
        load_pretrained(model, pretrained)
    model = model.to(device)
    impl = resolve_impl(model, device)
    order = TrainOrder(len(splits.train), pre.train.batch_size, seed)
    batches = StepBatches(splits.train, order, device, pre.recipe.workers)
    mix, criterion = recipe_loss(pre, splits.num_classes)

    def batch(step: int, rank: int, world: int):
        x, y = batches.get(step, rank, world)
        return mixed_batch(mix, seed, step, rank, x, y)

    def loss(net, b, teacher):
        x, y = b
        return criterion(net(x).float(), y)

    def validate(net):
        return evaluate(net, splits.val, pre.recipe.eval_batch_size, dist, device, pre.recipe.workers)

    result = train(model, pre.train, TrainTask(batch, loss, validate), seed=seed, device=device, identity=identity,
                   checkpoint=checkpoint, dist=dist, progress=progress, label=label, hooks=hooks, restart=restart,
                   compile=compile)
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
        "majority_test_acc": majority_accuracy(splits),
        "resolution_sweep": resolution_sweep(model, pre, splits.num_classes, device),
    }
    return Fitted(model, metrics, impl)


