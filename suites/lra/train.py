"""The LRA runner: train and evaluate every (task, attention) cell of a preset, record the results in the store.

``attnbench run lra`` -> :func:`run_lra`. For each task of the preset: the data (real files from ``--data-dir``,
else generated into a cache directory when the preset says how, else the task is skipped with a message saying
where to put the data); then, for each attention, one *cell*: the model of :mod:`.model`, AdamW under
``OneCycleLR`` (the reference ``run_tasks.py`` / Skyformer ``main.py``), validation every ``eval_every`` steps,
early stopping by patience, and the test split evaluated with the weights of the best validation step.

Per cell the store gets one record (suite ``lra``, task, setting ``lra/<preset>``, attention + options, resolved
impl, seed, provenance) with status ``ok``, ``failed`` (e.g. a non-finite loss — the sweep goes on) or
``interrupted`` (Ctrl-C / SIGTERM — the sweep stops) and the metrics: test accuracy at the best validation step
(``score`` in %, ``test_acc``), the majority-class test accuracy, training throughput (samples/s and tokens/s over
the training steps only), peak memory (CPU: peak RSS of the rank-0 process above its RSS at the cell's start —
a process-level measure, not allocator bytes; CUDA: ``max_memory_allocated``) and wall time.

Determinism and resume. The training batch of step ``s`` is a slice of a permutation drawn from
``(seed, epoch)``, and the dropout RNG is re-seeded from ``(seed, s, rank)`` before every step, so a run is a
function of ``(seed, step)`` alone. A checkpoint (model, optimizer, scheduler, step, best validation accuracy
and weights, RNG states, counters) is written atomically (temp file + ``os.replace``) every
``checkpoint_every`` steps (default: at every evaluation); a killed run restarts from it and ends with the same
result as an uninterrupted run. Finished cells (in the store) are skipped unless ``force``.

Data parallel. ``nproc > 1`` re-launches the command under ``torch.distributed.run`` (torchrun) with DDP on
gloo (CPU) or NCCL (CUDA). The global batch is split into equal contiguous shards, one per rank; DDP averages
the gradients, so the update equals the one-process update on the same global batch (up to float summation
order; dropout masks differ because each rank draws its own). Evaluation shards the split and sums the counts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

import torch.nn.functional as F

from attnbench import provenance, registry
from attnbench.protocol import AttnbenchError
from attnbench.interrupts import sigterm_as_interrupt

from . import data as lra_data
from .config import GENERATORS, PAIR_TASKS, TASKS, Preset, TaskConfig, load_preset

SUITE = "lra"
DEFAULT_WORK = Path("results") / "runs" / "lra"
CHECKPOINT_FORMAT = 1

#: Where each task's real data goes (what a skip message tells the user).
LAYOUT = {
    "listops": "the LRA release's listops-1000/basic_{train,val,test}.tsv (or generate it: "
               "`attnbench data listops --out DIR`)",
    "text": "the IMDb release's aclImdb/{train,test}/{pos,neg}/*.txt (https://ai.stanford.edu/~amaas/data/sentiment/)",
    "retrieval": "the LRA release's tsv_data/new_aan_pairs.{train,eval,test}.tsv "
                 "(https://storage.googleapis.com/long-range-arena/lra_release.gz)",
    "image": "CIFAR-10's python pickles cifar-10-batches-py/{data_batch_1..5,test_batch} "
             "(https://www.cs.toronto.edu/~kriz/cifar.html)",
    "pathfinder": "the LRA release's pathfinder32/curv_contour_length_14/{imgs,metadata} (or generate it: "
                  "`attnbench data pathfinder --out DIR`)",
}


class NonFiniteLoss(AttnbenchError):
    """The training loss became NaN or infinite: the cell stops with status ``failed``."""


class DataUnavailable(AttnbenchError):
    """A task has no data here (no --data-dir holding it and no generator in the preset)."""


@dataclasses.dataclass
class Hooks:
    """Test hooks. ``after_step(task, attention, step, loss)`` runs after optimizer step ``step`` (1-based) and
    may raise (e.g. to simulate a kill); ``transform_loss(task, attention, step, loss)`` may replace the loss
    tensor before the finiteness check (e.g. with NaN)."""

    after_step: Optional[Callable[[str, str, int, float], None]] = None
    transform_loss: Optional[Callable[[str, str, int, torch.Tensor], torch.Tensor]] = None


# ---------------------------------------------------------------------------------------------- distributed
@dataclasses.dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()

    def all_reduce_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
        return t

    def broadcast(self, obj: Any) -> Any:
        """``obj`` of rank 0 on every rank."""
        if not self.enabled:
            return obj
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ)


def init_dist(device: torch.device) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank=dist.get_rank(), world=dist.get_world_size())


def torchrun_command(nproc: int, cli_args: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m attnbench.cli run lra ARGS``."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={nproc}", "-m", "attnbench.cli", "run", "lra", *cli_args]


def cli_args(*, attentions: Sequence[str], tasks: Optional[Sequence[str]], preset: str, data_dir: Optional[str],
             seed: int, force: bool, nproc: int, db: Optional[str], out: Optional[str]) -> list[str]:
    """The command-line arguments that reproduce a :func:`run_lra` call in a torchrun worker. ``--nproc`` is left
    out: a worker takes its world size from torchrun, and torchrun's own parser would read ``--nproc`` as an
    ambiguous abbreviation of its ``--nproc-per-node``."""
    args = ["--attn", ",".join(attentions), "--preset", str(preset), "--seed", str(seed)]
    if tasks:
        args += ["--tasks", ",".join(tasks)]
    if data_dir:
        args += ["--data-dir", str(data_dir)]
    if db:
        args += ["--db", str(db)]
    if out:
        args += ["--out", str(out)]
    if force:
        args.append("--force")
    return args


# ----------------------------------------------------------------------------------------------------- data
@dataclasses.dataclass
class TaskData:
    train: lra_data.TokenDataset
    val: lra_data.TokenDataset
    test: lra_data.TokenDataset
    origin: str  # "files:<dir>" or "generated:<dir>"
    fingerprint: str  # what enters the cell's identity: "files" or "generated:<hash>"


def _limit(ds: lra_data.TokenDataset, n: int) -> lra_data.TokenDataset:
    """A fixed random subset of ``n`` examples (seed 0: the same for every training seed); all if ``n`` is 0."""
    if not n or len(ds) <= n:
        return ds
    idx = np.sort(np.random.default_rng(0).permutation(len(ds))[:n])
    return ds.subset(idx)


def _load_splits(task: str, root: Path, cfg: TaskConfig, **override) -> tuple:
    if task in ("listops", "text", "retrieval"):
        opts: dict[str, Any] = {"max_length": cfg.seq_len}
    elif task == "pathfinder":
        opts = {"resolution": cfg.resolution, "difficulty": cfg.difficulty}
    else:
        opts = {}
    opts.update(override)
    out = []
    for split, limit in (("train", cfg.train_limit), ("val", cfg.val_limit), ("test", cfg.test_limit)):
        out.append(_limit(lra_data.load_lra(task, root, split, **opts), limit))
    return tuple(out)


def generated_dir(task: str, cfg: TaskConfig, cache: Path) -> Path:
    gen = dataclasses.asdict(cfg.generate)
    return Path(cache) / f"{task}-{provenance.config_hash({'task': task, **gen})}"


def ensure_generated(task: str, cfg: TaskConfig, cache: Path, console=None) -> Path:
    """Generate the task's synthetic data into the cache (once; deterministic by the preset's generator seed).

    Written to a temporary directory and renamed into place when complete, so a killed generation never leaves
    a directory that looks finished."""
    from . import generate

    d = generated_dir(task, cfg, cache)
    if (d / "COMPLETE").exists():
        return d
    gen = cfg.generate
    tmp = d.with_name(f"{d.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    status = console.status(f"generating {task} data (once; cached in {d})") if console else contextlib.nullcontext()
    t0 = time.perf_counter()
    with status:
        if task == "listops":
            generate.generate_listops(tmp, n_train=gen.n_train, n_val=gen.n_val, n_test=gen.n_test, seed=gen.seed,
                                      max_depth=gen.max_depth, max_args=gen.max_args, min_length=gen.min_length,
                                      max_length=gen.max_length)
        elif task == "pathfinder":
            generate.generate_pathfinder(tmp, n=gen.n, seed=gen.seed, contour_length=gen.contour_length,
                                         size=gen.size)
        else:  # pragma: no cover - the preset loader refuses it
            raise DataUnavailable(f"{task} has no generator")
    (tmp / "params.json").write_text(json.dumps({"task": task, **dataclasses.asdict(gen)}, indent=1) + "\n")
    (tmp / "COMPLETE").write_text(f"generated in {time.perf_counter() - t0:.1f} s\n")
    if d.exists():  # leftovers of an older, incomplete layout
        shutil.rmtree(d, ignore_errors=True)
    try:
        os.replace(tmp, d)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    if console:
        console.print(f"generated {task} data in {time.perf_counter() - t0:.0f} s: {d}")
    return d


def prepare_task(task: str, cfg: TaskConfig, *, data_dir: Optional[Path], cache: Path, console=None,
                 generate_ok: bool = True) -> TaskData:
    """The three splits of ``task``: real files under ``data_dir`` if it holds them, else generated data if the
    preset has a generator for the task, else :class:`DataUnavailable` saying where to put the data."""
    missing = None
    if data_dir is not None and cfg.data != "generate":
        try:
            tr, va, te = _load_splits(task, Path(data_dir), cfg)
            return TaskData(tr, va, te, origin=f"files:{data_dir}", fingerprint="files")
        except lra_data.LRADataMissingError as e:
            missing = str(e)
    if cfg.generate is not None and cfg.data != "files":
        d = ensure_generated(task, cfg, cache, console) if generate_ok else generated_dir(task, cfg, cache)
        override = {}
        if task == "pathfinder":
            override = {"resolution": cfg.generate.size, "difficulty": cfg.generate.contour_length}
        tr, va, te = _load_splits(task, d, cfg, **override)
        return TaskData(tr, va, te, origin=f"generated:{d}", fingerprint=f"generated:{d.name}")
    where = f"--data-dir {data_dir} does not hold it" if data_dir is not None else "no --data-dir given"
    msg = f"{task}: skipped, no data ({where}). Put {LAYOUT[task]} under a directory and pass --data-dir DIR."
    if missing and data_dir is not None:
        msg += f"\n  reader: {missing.splitlines()[0]}"
    raise DataUnavailable(msg)


class Batches:
    """Index -> batch tensors for one split (pre-padded when small, else padded per batch)."""

    def __init__(self, ds: lra_data.TokenDataset):
        self.ds = ds
        self.pair = ds.is_pair
        self.y = torch.from_numpy(np.asarray(ds.labels, dtype=np.int64))
        small = len(ds) * ds.seq_len * (2 if self.pair else 1) <= 64_000_000
        self.x = ds.padded(1) if small else None
        self.x2 = ds.padded(2) if small and self.pair else None

    def __len__(self) -> int:
        return len(self.ds)

    def get(self, idx: np.ndarray, device: torch.device) -> tuple:
        t = torch.from_numpy(np.asarray(idx, dtype=np.int64))
        if self.x is not None:
            x = self.x[t]
            x2 = self.x2[t] if self.pair else None
        else:
            items = [self.ds[int(i)] for i in idx]
            x = torch.stack([it["inputs"] for it in items])
            x2 = torch.stack([it["inputs2"] for it in items]) if self.pair else None
        return x.to(device), (x2.to(device) if x2 is not None else None), self.y[t].to(device)


class TrainOrder:
    """The global batch of step ``s``: a slice of the permutation of epoch ``s // steps_per_epoch`` drawn from
    ``(seed, epoch)`` (the incomplete last batch of an epoch is dropped)."""

    def __init__(self, n: int, batch: int, seed: int):
        if batch > n:
            raise AttnbenchError(f"batch_size {batch} is larger than the training split ({n} examples)")
        self.n, self.batch, self.seed = n, batch, seed
        self.per_epoch = n // batch
        self._epoch, self._perm = -1, None

    def indices(self, step: int) -> np.ndarray:
        epoch, j = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perm[j * self.batch:(j + 1) * self.batch]


def step_seed(seed: int, step: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1, dtype=np.uint64)[0] % (2**63))


# ---------------------------------------------------------------------------------------------------- cells
@dataclasses.dataclass
class Cell:
    task: str
    attention: str
    options: dict[str, Any]
    cfg: TaskConfig
    params: dict[str, Any]  # what identifies the point in the store (with suite, setting, task, attention, ...)
    config_hash: str = ""
    skip: str = ""  # why it is not run ("" = run it)


@dataclasses.dataclass
class CellOutcome:
    task: str
    attention: str
    status: str  # ok | failed | interrupted | skipped (finished before / no data)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: Optional[str] = None
    impl: Optional[str] = None
    message: str = ""


@dataclasses.dataclass
class RunSummary:
    setting: str
    outcomes: list[CellOutcome]
    interrupted: bool = False
    run_id: Optional[str] = None
    returncode: int = 0


def _malloc_trim() -> None:
    """glibc ``malloc_trim(0)`` (no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _peak_meter(device: torch.device):
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        return lambda: (torch.cuda.max_memory_allocated(device) - base,
                        "CUDA max_memory_allocated above the allocation at the cell's start")
    from attnbench.bench import PeakRSS

    _malloc_trim()  # hand freed heap back to the OS, so the baseline is what is live, not what earlier cells left
    if not PeakRSS.available():
        return lambda: (None, "unavailable (no /proc/self/status)")
    rss = PeakRSS()
    rss.reset()
    return lambda: (rss.peak(), f"CPU: peak RSS of the rank-0 process during the cell minus its RSS at the cell's "
                                f"start after malloc_trim ({'VmHWM reset via clear_refs' if rss.resettable else 'VmHWM, no reset'}"
                                f"; process-level, includes allocator caching)")


def _warm_up(attentions: Sequence[str], preset: Preset, device: torch.device) -> None:
    """One small training step per attention before any cell, outside every measurement: the first step of a
    process loads libraries and allocates pools (~100 MiB of RSS on a CPU), which would otherwise be charged to
    the first cell's peak memory and throughput. Leaves the global RNG state as it found it."""
    from .model import build_model

    m = preset.model
    state = torch.get_rng_state()
    for attn in attentions:
        with contextlib.suppress(Exception):
            model = build_model(attn, vocab_size=16, num_classes=2, seq_len=64, pair=False, pad_id=0, dim=m.dim,
                                ffn_dim=m.ffn_dim, heads=m.heads, head_dim=m.head_dim, layers=m.layers,
                                dropout=m.dropout, options=preset.options_for(attn)).to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randint(1, 16, (4, 64), device=device)
            F.cross_entropy(model(x), torch.zeros(4, dtype=torch.long, device=device)).backward()
            opt.step()
            with torch.no_grad():
                model.eval()(x)
    torch.set_rng_state(state)


def _checkpoint_path(work: Path, setting: str, cell: Cell, seed: int) -> Path:
    slug = setting.replace("/", "_")
    return work / "checkpoints" / slug / cell.task / f"{cell.attention}-{cell.config_hash}-seed{seed}.pt"


def _save_atomic(state: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Batches, indices: np.ndarray, bs: int, dist: Dist,
             device: torch.device) -> tuple[float, float]:
    """(accuracy, mean loss) over ``indices`` of a split, sharded over the ranks and summed."""
    was = model.training
    model.eval()
    shard = indices[dist.rank::dist.world]
    sums = torch.zeros(3, dtype=torch.float64)
    for s in range(0, len(shard), bs):
        x, x2, y = batches.get(shard[s:s + bs], device)
        logits = model(x, x2) if batches.pair else model(x)
        sums[0] += (logits.argmax(-1) == y).sum().item()
        sums[1] += len(y)
        sums[2] += F.cross_entropy(logits.float(), y, reduction="sum").item()
    dist.all_reduce_sum(sums)
    model.train(was)
    n = max(sums[1].item(), 1.0)
    return sums[0].item() / n, sums[2].item() / n


def _eval_indices(n: int, cfg: TaskConfig) -> np.ndarray:
    if cfg.eval_batches and cfg.eval_batches * cfg.eval_bs < n:
        return np.sort(np.random.default_rng(1).permutation(n)[:cfg.eval_batches * cfg.eval_bs])
    return np.arange(n)


def majority_accuracy(train: lra_data.TokenDataset, test: lra_data.TokenDataset) -> float:
    """Test accuracy of always predicting the most frequent training class."""
    cls = int(np.argmax(np.bincount(train.labels, minlength=train.num_classes)))
    return float(np.mean(test.labels == cls)) if len(test) else float("nan")


def first_operator_accuracy(train: lra_data.TokenDataset, test: lra_data.TokenDataset) -> float:
    """ListOps: test accuracy of predicting, for the outermost operator (the first token), its most frequent
    training answer — what a model gets without evaluating any nested list."""
    from collections import Counter, defaultdict

    counts: dict[int, Counter] = defaultdict(Counter)
    for x, y in zip(train.inputs, train.labels):
        counts[int(x[0])][int(y)] += 1
    best = {k: c.most_common(1)[0][0] for k, c in counts.items()}
    fallback = int(np.argmax(np.bincount(train.labels, minlength=train.num_classes)))
    return float(np.mean([best.get(int(x[0]), fallback) == int(y) for x, y in zip(test.inputs, test.labels)]))


def train_cell(cell: Cell, data: TaskData, *, preset: Preset, seed: int, device: torch.device, dist: Dist,
               ckpt: Path, progress=None, hooks: Optional[Hooks] = None) -> CellOutcome:
    """Train, validate and test one (task, attention) cell; resumes from ``ckpt`` if it exists.

    Raises :class:`NonFiniteLoss` on a NaN/inf loss, ``KeyboardInterrupt`` on Ctrl-C (the last checkpoint stays).
    """
    from .model import build_model, resolve_impl

    cfg, m = cell.cfg, preset.model
    hooks = hooks or Hooks()
    if cfg.batch_size % dist.world:
        raise AttnbenchError(f"batch_size {cfg.batch_size} of {cell.task} does not split over {dist.world} ranks")
    local_bs = cfg.batch_size // dist.world
    pair = cell.task in PAIR_TASKS
    t_wall0 = time.perf_counter()
    meter = _peak_meter(device)

    torch.manual_seed(seed)
    model = build_model(cell.attention, vocab_size=data.train.vocab_size, num_classes=data.train.num_classes,
                        seq_len=cfg.seq_len, pair=pair, pad_id=data.train.pad_id, dim=m.dim, ffn_dim=m.ffn_dim,
                        heads=m.heads, head_dim=m.head_dim, layers=m.layers, dropout=m.dropout,
                        options=cell.options).to(device)
    impl = resolve_impl(model, device)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                            weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.steps,
                                                pct_start=cfg.warmup / cfg.steps, anneal_strategy="linear")
    st: dict[str, Any] = {"step": 0, "best_val": -1.0, "best_step": 0, "best_state": None, "since_best": 0,
                          "history": [], "train_time": 0.0, "samples": 0, "elapsed": 0.0, "recent": [],
                          "stopped_early": False, "resumed_from": None}
    if ckpt.exists():
        saved = torch.load(ckpt, map_location="cpu", weights_only=False)
        if saved.get("format") == CHECKPOINT_FORMAT and saved.get("config_hash") == cell.config_hash:
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["optimizer"])
            sched.load_state_dict(saved["scheduler"])
            st.update(saved["state"])
            st["resumed_from"] = st["step"]
            rng = saved.get("rng", {})
            if "torch" in rng:
                torch.set_rng_state(rng["torch"])
            if "numpy" in rng:
                np.random.set_state(rng["numpy"])
            if "python" in rng:
                random.setstate(rng["python"])
    ddp = model
    if dist.enabled:
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    train_b, val_b, test_b = Batches(data.train), Batches(data.val), Batches(data.test)
    order = TrainOrder(len(data.train), cfg.batch_size, seed)
    val_idx = _eval_indices(len(data.val), cfg)
    ckpt_every = cfg.checkpoint_every or cfg.eval_every
    tokens_per_sample = cfg.seq_len * (2 if pair else 1)

    def save() -> None:
        if dist.main:
            elapsed = st["elapsed"] + (time.perf_counter() - t_wall0)
            _save_atomic({"format": CHECKPOINT_FORMAT, "config_hash": cell.config_hash, "seed": seed,
                          "task": cell.task, "attention": cell.attention, "model": model.state_dict(),
                          "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                          "state": {**st, "elapsed": elapsed},
                          "rng": {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
                                  "python": random.getstate()}}, ckpt)

    bar = None
    if progress is not None:
        bar = progress.add_task(f"{cell.task} · {cell.attention}", total=cfg.steps, completed=st["step"],
                                info="resumed at step %d" % st["step"] if st["resumed_from"] else "")
    model.train()
    try:
        while st["step"] < cfg.steps and not st["stopped_early"]:
            step = st["step"]
            torch.manual_seed(step_seed(seed, step, dist.rank))
            idx = order.indices(step)[dist.rank * local_bs:(dist.rank + 1) * local_bs]
            x, x2, y = train_b.get(idx, device)
            t0 = time.perf_counter()
            logits = ddp(x, x2) if pair else ddp(x)
            loss = F.cross_entropy(logits.float(), y)
            if hooks.transform_loss:
                loss = hooks.transform_loss(cell.task, cell.attention, step + 1, loss)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.clip_grad_value:
                torch.nn.utils.clip_grad_value_(model.parameters(), cfg.clip_grad_value)
            glob = dist.all_reduce_sum(loss.detach().double().reshape(1).clone()) / dist.world
            g = glob.item()
            if not math.isfinite(g):
                raise NonFiniteLoss(f"{cell.task}/{cell.attention}: training loss is {g} at step {step + 1} "
                                    f"(lr {sched.get_last_lr()[0]:.3g}); the cell stops here")
            opt.step()
            sched.step()
            st["train_time"] += time.perf_counter() - t0
            st["samples"] += cfg.batch_size
            st["step"] = step = step + 1
            st["recent"] = (st["recent"] + [g])[-50:]
            if hooks.after_step:
                hooks.after_step(cell.task, cell.attention, step, g)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                acc, vloss = evaluate(model, val_b, val_idx, cfg.eval_bs, dist, device)
                st["history"].append([step, acc, vloss])
                if acc > st["best_val"]:
                    st["best_val"], st["best_step"], st["since_best"] = acc, step, 0
                    st["best_state"] = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
                else:
                    st["since_best"] += 1
                    if cfg.patience and st["since_best"] >= cfg.patience and step >= cfg.min_steps:
                        st["stopped_early"] = True
            if step % ckpt_every == 0 or st["stopped_early"]:
                save()
            if bar is not None:
                best = f" · best val {100 * st['best_val']:.1f}% @{st['best_step']}" if st["best_step"] else ""
                progress.update(bar, completed=step, info=f"loss {np.mean(st['recent']):.3f}{best}")
    finally:
        if bar is not None:
            progress.remove_task(bar)

    model.load_state_dict(st["best_state"])
    test_idx = np.arange(len(data.test))
    test_acc, test_loss = evaluate(model, test_b, test_idx, cfg.eval_bs, dist, device)
    peak, mem_method = meter()
    wall = st["elapsed"] + (time.perf_counter() - t_wall0)
    tt = max(st["train_time"], 1e-9)
    metrics = {
        "score": 100.0 * test_acc, "test_acc": test_acc, "test_loss": test_loss,
        "best_val_acc": st["best_val"], "best_step": st["best_step"], "steps_run": st["step"],
        "stopped_early": st["stopped_early"], "final_train_loss": float(np.mean(st["recent"][-10:])),
        "majority_test_acc": majority_accuracy(data.train, data.test),
        "train_samples_per_s": st["samples"] / tt, "train_tokens_per_s": st["samples"] * tokens_per_sample / tt,
        "train_time_s": st["train_time"], "wall_s": wall, "peak_mem_bytes": peak, "mem_method": mem_method,
        "world_size": dist.world, "threads": torch.get_num_threads(), "n_params": n_params,
        "n_train": len(data.train), "n_val": len(data.val), "n_test": len(data.test), "n_val_eval": len(val_idx),
        "val_history": st["history"], "data": data.origin, "resumed_from": st["resumed_from"],
    }
    if cell.task == "listops":
        metrics["first_op_test_acc"] = first_operator_accuracy(data.train, data.test)
    return CellOutcome(cell.task, cell.attention, "ok", metrics=metrics, impl=impl)


# ------------------------------------------------------------------------------------------------------ run
def _default_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def plan_cells(preset: Preset, attentions: Sequence[str], tasks: Sequence[str], *, seed: int, device: str,
               data_fingerprints: dict[str, str]) -> list[Cell]:
    from attnbench.store import point_hash

    cells = []
    for task in tasks:
        cfg = preset.task(task)
        for attn in attentions:
            options = preset.options_for(attn)
            params = {"seed": seed, "preset": preset.name, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size,
                      "steps": cfg.steps, "cell_hash": preset.cell_hash(task, attn),
                      "data": data_fingerprints.get(task, "")}
            h = point_hash(suite=SUITE, setting=preset.key, task=task, attention=attn, options=options,
                           params=params, dtype="float32", device=device)
            cells.append(Cell(task=task, attention=attn, options=options, cfg=cfg, params=params, config_hash=h))
    return cells


def _resolve_preset(preset: Optional[str | Preset], data_dir: Optional[str]) -> Preset:
    if isinstance(preset, Preset):
        return preset
    return load_preset(preset or ("skyformer" if data_dir else "tiny"))


def run_lra(*, attentions: Sequence[str], tasks: Optional[Sequence[str]] = None,
            preset: Optional[str | Preset] = None, data_dir: Optional[str] = None, seed: int = 0,
            force: bool = False, nproc: int = 1, db: Optional[str] = None, out: Optional[str] = None,
            console=None, hooks: Optional[Hooks] = None, argv: Optional[list[str]] = None,
            progress: bool = True) -> RunSummary:
    """Train and evaluate ``attentions`` x ``tasks`` of ``preset`` (default: ``tiny`` without ``data_dir``,
    ``skyformer`` with it); see the module docstring. ``nproc > 1`` re-runs this under torchrun."""
    from rich.console import Console

    console = console or Console()
    if not attentions:
        raise AttnbenchError("give at least one attention (--attn softmax,nala,...)")
    for a in attentions:
        registry.get_attention(a)  # did-you-mean on a typo, before any work
    if nproc < 1:
        raise AttnbenchError(f"--nproc must be >= 1, got {nproc}")
    pre = _resolve_preset(preset, data_dir)
    tasks = list(tasks) if tasks else list(pre.tasks_default)
    for t in tasks:
        if t not in TASKS:
            import difflib

            close = difflib.get_close_matches(t, TASKS, n=1)
            raise AttnbenchError(f"unknown LRA task {t!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                                 + f" (tasks: {', '.join(TASKS)})")
        pre.task(t)
    if under_torchrun():
        nproc = int(os.environ.get("WORLD_SIZE", "1"))
    for t in tasks:
        if pre.task(t).batch_size % nproc:
            raise AttnbenchError(f"{t}: batch_size {pre.task(t).batch_size} does not split over --nproc {nproc}")

    if nproc > 1 and not under_torchrun():
        if hooks is not None:
            raise AttnbenchError("test hooks do not cross process boundaries; use nproc=1 with hooks")
        preset_arg = pre.path if pre.path.endswith(".toml") and Path(pre.path).is_file() else pre.name
        cmd = torchrun_command(nproc, cli_args(attentions=attentions, tasks=tasks, preset=preset_arg,
                                               data_dir=data_dir, seed=seed, force=force, nproc=nproc, db=db,
                                               out=out))
        console.print(f"[dim]launching {nproc} processes: {' '.join(cmd)}[/]")
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        rc = subprocess.call(cmd, env=env)
        return RunSummary(setting=pre.key, outcomes=[], interrupted=rc == 130, returncode=rc)

    device = _default_device()
    dist = init_dist(device)
    try:
        return _run(pre, attentions, tasks, data_dir=data_dir, seed=seed, force=force, nproc=nproc, db=db, out=out,
                    console=console, hooks=hooks, argv=argv, progress=progress, device=device, dist=dist)
    finally:
        if dist.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _run(pre: Preset, attentions, tasks, *, data_dir, seed, force, nproc, db, out, console, hooks, argv, progress,
         device: torch.device, dist: Dist) -> RunSummary:
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    from attnbench.store import Store, project_root

    if dist.enabled and device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.world))
    work = Path(out) if out else project_root() / DEFAULT_WORK
    cache = work / "data"
    dpath = Path(data_dir) if data_dir else None
    say = console.print if dist.main else (lambda *a, **k: None)
    say(f"[bold]{escape(pre.key)}[/] ({escape(pre.description)}): {len(attentions)} attention(s) x "
        f"{len(tasks)} task(s), seed {seed}, device {device}" + (f", {dist.world} processes" if dist.enabled else ""))

    # data: rank 0 generates what is missing, then every rank loads
    datas: dict[str, TaskData] = {}
    skips: dict[str, str] = {}
    if dist.main:
        for t in tasks:
            try:
                datas[t] = prepare_task(t, pre.task(t), data_dir=dpath, cache=cache, console=console)
            except DataUnavailable as e:
                skips[t] = str(e)
    dist.barrier()
    skips = dist.broadcast(skips)
    if not dist.main:
        for t in tasks:
            if t not in skips:
                datas[t] = prepare_task(t, pre.task(t), data_dir=dpath, cache=cache, generate_ok=False)
    for t, msg in skips.items():
        say(f"[yellow]{escape(msg)}[/]")

    cells = plan_cells(pre, attentions, [t for t in tasks if t in datas], seed=seed, device=device.type,
                       data_fingerprints={t: d.fingerprint for t, d in datas.items()})
    store = Store(db) if dist.main else None
    finished = set()
    if dist.main and not force:
        finished = store.finished(SUITE, [c.config_hash for c in cells])
    finished = dist.broadcast(finished)
    outcomes: list[CellOutcome] = [CellOutcome(t, a, "skipped", message=skips[t]) for t in skips for a in attentions]
    todo = []
    for c in cells:
        if c.config_hash in finished:
            outcomes.append(CellOutcome(c.task, c.attention, "skipped", message="finished earlier (--force reruns)"))
        else:
            todo.append(c)
    if finished:
        say(f"{len(cells) - len(todo)} cell(s) already finished in {store.path if store else 'the store'} are "
            f"skipped (--force reruns them)")

    run = None
    if dist.main:
        config = {"preset": pre.name, "preset_file": pre.path, "setting": pre.key, "attentions": list(attentions),
                  "tasks": list(tasks), "seed": seed, "nproc": dist.world, "data_dir": data_dir,
                  "model": dataclasses.asdict(pre.model),
                  "task_configs": {t: pre.task(t).to_dict() for t in tasks}}
        run = store.start_run(suite=SUITE, setting=pre.key, config=config, device=device.type,
                              threads=torch.get_num_threads(), argv=argv)
    _warm_up(attentions, pre, device)
    interrupted = False
    bars = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console,
                    disable=not (progress and dist.main), transient=False)
    with bars, sigterm_as_interrupt():
        overall = bars.add_task("lra cells", total=len(todo), info="")
        for cell in todo:
            ckpt = _checkpoint_path(work, pre.key, cell, seed)
            if force and dist.main:
                ckpt.unlink(missing_ok=True)  # --force: start this cell from scratch
            dist.barrier()
            started = provenance.now()
            try:
                oc = train_cell(cell, datas[cell.task], preset=pre, seed=seed, device=device, dist=dist, ckpt=ckpt,
                                progress=bars if dist.main else None, hooks=hooks)
            except KeyboardInterrupt:
                interrupted = True
                oc = CellOutcome(cell.task, cell.attention, "interrupted",
                                 error="interrupted (Ctrl-C or SIGTERM); rerun to resume from the last checkpoint")
            except NonFiniteLoss as e:
                oc = CellOutcome(cell.task, cell.attention, "failed", error=str(e))
                if dist.main:
                    ckpt.unlink(missing_ok=True)
            except (AttnbenchError, RuntimeError, ValueError) as e:
                oc = CellOutcome(cell.task, cell.attention, "failed",
                                 error=f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}")
            if oc.impl is None:
                with contextlib.suppress(Exception):
                    oc.impl = registry.build_for_length(cell.attention, seq_len=cell.cfg.seq_len,
                                                        heads=pre.model.heads, head_dim=pre.model.head_dim,
                                                        **cell.options).resolve_impl(device)
            if dist.main:
                store.add(run.record(task=cell.task, attention=cell.attention, status=oc.status,
                                     options=cell.options, impl=oc.impl, dtype="float32", params=cell.params,
                                     metrics=oc.metrics, seed=seed, error=oc.error, started_at=started,
                                     ended_at=provenance.now(), device=device.type))
                if oc.status == "ok":
                    ckpt.unlink(missing_ok=True)
                bars.console.print(_line(oc))
                bars.advance(overall)
            outcomes.append(oc)
            if interrupted:
                break
    if dist.main:
        store.finish_run(run.run_id, "interrupted" if interrupted else "ok")
        store.close()
    return RunSummary(setting=pre.key, outcomes=outcomes, interrupted=interrupted,
                      run_id=run.run_id if run else None)


def _line(oc: CellOutcome) -> str:
    from rich.markup import escape

    head = f"  {oc.task:<10} {oc.attention:<14}"
    if oc.status == "ok":
        m = oc.metrics
        mem = m.get("peak_mem_bytes")
        mem_s = f"{mem / 2**20:.0f} MiB" if isinstance(mem, (int, float)) else "-"
        return (f"{head} [green]ok[/]  test {m['score']:.1f}% (majority {100 * m['majority_test_acc']:.1f}%, best "
                f"val {100 * m['best_val_acc']:.1f}% @ step {m['best_step']})  {m['train_samples_per_s']:.1f} "
                f"samples/s  peak {mem_s}  wall {m['wall_s']:.0f} s")
    color = "yellow" if oc.status == "interrupted" else "red"
    return f"{head} [{color}]{oc.status}[/]  {escape((oc.error or oc.message).splitlines()[0])}"


def run_cli(*, attentions: Sequence[str], tasks: Optional[Sequence[str]], preset: Optional[str],
            data_dir: Optional[str], seed: int, force: bool, nproc: int, db: Optional[str], out: Optional[str],
            console=None, argv: Optional[list[str]] = None) -> int:
    """``attnbench run lra``: run, then print the leaderboard of the setting. Returns the exit code."""
    from rich.console import Console

    from .leaderboard import print_leaderboard

    console = console or Console()
    summary = run_lra(attentions=attentions, tasks=tasks, preset=preset, data_dir=data_dir, seed=seed, force=force,
                      nproc=nproc, db=db, out=out, console=console, argv=argv)
    if under_torchrun():  # a worker: the launching process prints the leaderboard
        return 130 if summary.interrupted else 0
    if summary.returncode not in (0, 130):
        console.print(f"[red]the distributed run failed (exit code {summary.returncode})[/]")
        return summary.returncode
    console.print()
    print_leaderboard(setting=summary.setting, db=db, console=console)
    if summary.interrupted:
        console.print("[yellow]interrupted[/]: rerun the same command to resume from the last checkpoints")
        return 130
    failed = [o for o in summary.outcomes if o.status == "failed"]
    if failed:
        console.print(f"[red]{len(failed)} cell(s) failed[/]: " + ", ".join(f"{o.task}/{o.attention}" for o in failed))
    return 0
