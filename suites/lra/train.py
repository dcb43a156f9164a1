"""The LRA runner: train and evaluate every (task, attention) cell of a preset, record the results in the store.

``attnbench run lra`` -> :func:`run_lra`. For each task of the preset: the data (real files from ``--data-dir``,
else generated into a cache directory when the preset says how, else the task is skipped with a message saying
where to put the data); then, for each attention spec, one *cell*: the model of :mod:`.model` trained by the
shared trainer (:mod:`attnbench.engine.train`: AdamW under ``OneCycleLR`` as the reference ``run_tasks.py`` /
Skyformer ``main.py``, validation every ``eval_every`` steps, early stopping by patience, checkpoints and
resume), and the test split evaluated with the weights of the best validation step. The cells are run by the
shared sweep (:mod:`attnbench.engine.sweep`: skip finished, statuses, ``--shard``, summary and exit code).

Per cell the store gets one record (suite ``lra``, task, setting ``lra/<preset>``, attention spec + options,
resolved impl, seed, provenance) and the metrics: test accuracy at the best validation step (``score`` in %,
``test_acc``), the majority-class test accuracy, training throughput (samples/s and tokens/s over the training
steps only), peak memory (:class:`attnbench.measure.peak.PeakMeter`) and wall time.

Data order: the training batch of step ``s`` is a slice of a permutation drawn from ``(seed, epoch)``; each rank
takes its contiguous share of the global batch, so ``--nproc N`` (DDP) trains on the same global batches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from attnbench.api.spec import AttentionSpec, as_specs
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunContext, RunOptions, run_options
from attnbench.engine.sweep import Cell, CellContext, CellResult, Outcome, SweepSummary
from attnbench.engine.train.config import TrainConfig
from attnbench.engine.train.dist import Dist
from attnbench.engine.train.trainer import TrainHooks, TrainOrder, TrainTask, train
from attnbench.io.generated import COMPLETE, materialize
from attnbench.measure.peak import PeakMeter
from attnbench.results import provenance
from attnbench.results.records import point_hash

from . import data as lra_data
from . import generate
from .config import PAIR_TASKS, TASKS, Preset, TaskConfig, load_preset
from .model import build_model

SUITE = "lra"

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


class DataUnavailable(AttnbenchError):
    """A task has no data here (no --data-dir holding it and no generator in the preset)."""


#: Test hook: ``hooks(task, attention_label) -> TrainHooks`` for each cell.
HooksFor = Callable[[str, str], TrainHooks]


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

    d = generated_dir(task, cfg, cache)
    if (d / COMPLETE).exists():
        return d
    gen = cfg.generate

    def fill(tmp: Path) -> None:
        if task == "listops":
            generate.generate_listops(tmp, n_train=gen.n_train, n_val=gen.n_val, n_test=gen.n_test, seed=gen.seed,
                                      max_depth=gen.max_depth, max_args=gen.max_args, min_length=gen.min_length,
                                      max_length=gen.max_length)
        elif task == "pathfinder":
            generate.generate_pathfinder(tmp, n=gen.n, seed=gen.seed, contour_length=gen.contour_length,
                                         size=gen.size)
        else:  # pragma: no cover - the preset loader refuses it
            raise DataUnavailable(f"{task} has no generator")

    status = console.status(f"generating {task} data (once; cached in {d})") if console else contextlib.nullcontext()
    t0 = time.perf_counter()
    with status:
        made = materialize(d, fill, {"task": task, **dataclasses.asdict(gen)})
    if made and console:
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
        except lra_data.DataMissingError as e:
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



def _warm_up(specs: Sequence[AttentionSpec], preset: Preset, device: torch.device) -> None:
    """One small training step per attention before any cell, outside every measurement: the first step of a
    process loads libraries and allocates pools (~100 MiB of RSS on a CPU), which would otherwise be charged to
    the first cell's peak memory and throughput. Leaves the global RNG state as it found it."""

    m = preset.model
    state = torch.get_rng_state()
    for spec in specs:
        with contextlib.suppress(Exception):
            model = build_model(spec, vocab_size=16, num_classes=2, seq_len=64, pair=False, pad_id=0, dim=m.dim,
                                ffn_dim=m.ffn_dim, heads=m.heads, head_dim=m.head_dim, layers=m.layers,
                                dropout=m.dropout).to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            x = torch.randint(1, 16, (4, 64), device=device)
            F.cross_entropy(model(x), torch.zeros(4, dtype=torch.long, device=device)).backward()
            opt.step()
            with torch.no_grad():
                model.eval()(x)
    torch.set_rng_state(state)


def estimate_seconds(spec: AttentionSpec, preset: Preset, task: str, data: TaskData, device: torch.device,
                     world: int = 1) -> float:
    """Seconds one cell of ``task`` will take, from two timed training steps of ``spec`` at the task's length
    on a small batch (scaled to the real one), plus a share for evaluation. A rough guide, printed before a run
    starts; leaves the global RNG state as it found it."""

    cfg, m = preset.task(task), preset.model
    local_bs = cfg.batch_size // world
    probe = min(local_bs, 16)
    state = torch.get_rng_state()
    model = build_model(spec, vocab_size=data.train.vocab_size, num_classes=data.train.num_classes,
                        seq_len=cfg.seq_len, pair=task in PAIR_TASKS, pad_id=data.train.pad_id, dim=m.dim,
                        ffn_dim=m.ffn_dim, heads=m.heads, head_dim=m.head_dim, layers=m.layers,
                        dropout=m.dropout).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, x2, y = Batches(data.train).get(np.arange(probe), device)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        F.cross_entropy(model(x, x2) if x2 is not None else model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    torch.set_rng_state(state)
    per_step = min(times[1:]) * local_bs / probe
    evals = cfg.steps // cfg.eval_every + 1
    eval_examples = (len(_eval_indices(len(data.val), cfg)) * evals + len(data.test)) / max(world, 1)
    return per_step * cfg.steps + per_step / 3 * eval_examples / local_bs  # a forward is about 1/3 of a step


def _fmt_duration(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else (f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h")


# ---------------------------------------------------------------------------------------------------- cells
@dataclasses.dataclass
class CellPlan:
    """What ``run_cell`` needs besides the sweep's :class:`Cell`: the task's config and the spec."""
    cfg: TaskConfig
    spec: AttentionSpec


def train_config(cfg: TaskConfig) -> TrainConfig:
    """The trainer's config of one task: AdamW under OneCycleLR (linear anneal), as the reference code."""
    return TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, optimizer="adamw",
                       betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay, schedule="onecycle",
                       warmup=cfg.warmup, anneal="linear", clip_grad_value=cfg.clip_grad_value,
                       eval_every=cfg.eval_every, metric="accuracy", mode="max", patience=cfg.patience,
                       min_steps=cfg.min_steps, checkpoint_every=cfg.checkpoint_every)


def plan_cells(preset: Preset, specs: Sequence[AttentionSpec], tasks: Sequence[str], *, seed: int | Sequence[int],
               device: str, data_fingerprints: dict[str, str]) -> list[Cell]:
    """One cell per (task, spec, seed) (``seed``: one seed or several). A spec's options are the preset's options
    for the mechanism overridden by the spec's own; its identity (config hash, with the seed in its params) is
    unchanged from before the shared trainer for plain names, and a seed's cell is the same whether its run had
    other seeds or not."""

    seeds = [seed] if isinstance(seed, int) else list(seed)
    cells = []
    for task, seed in ((t, s) for t in tasks for s in seeds):
        cfg = preset.task(task)
        for spec in specs:
            full = spec.with_defaults(preset.options_for(spec.name))
            label = spec.label
            params = {"seed": seed, "preset": preset.name, "seq_len": cfg.seq_len, "batch_size": cfg.batch_size,
                      "steps": cfg.steps, "cell_hash": preset.cell_hash(task, spec.name, dict(full.options)),
                      "data": data_fingerprints.get(task, "")}
            h = point_hash(suite=SUITE, setting=preset.key, task=task, attention=label, options=dict(full.options),
                           params=params, dtype="float32", device=device)
            cells.append(Cell(task=task, attention=label, config_hash=h, options=dict(full.options), params=params,
                              dtype="float32", seed=seed, payload=CellPlan(cfg=cfg, spec=full),
                              name=f"{task} · {label} · seed {seed}" if len(seeds) > 1 else ""))
    return cells


def checkpoint_path(work: Path, setting: str, cell: Cell) -> Path:
    slug = setting.replace("/", "_")
    name = cell.attention.replace(":", "_").replace("=", "-")
    return work / "checkpoints" / slug / cell.task / f"{name}-{cell.config_hash}-seed{cell.seed}.pt"


def run_cell(cell: Cell, ctx: CellContext, *, data: TaskData, preset: Preset, device: torch.device, work: Path,
             hooks: Optional[HooksFor] = None) -> CellResult:
    """Train, validate and test one (task, attention) cell; resumes from its checkpoint if there is one."""
    plan: CellPlan = cell.payload
    cfg, m, dist = plan.cfg, preset.model, ctx.dist
    pair = cell.task in PAIR_TASKS
    meter = PeakMeter(device)
    torch.manual_seed(cell.seed)
    model = build_model(plan.spec, vocab_size=data.train.vocab_size, num_classes=data.train.num_classes,
                        seq_len=cfg.seq_len, pair=pair, pad_id=data.train.pad_id, dim=m.dim, ffn_dim=m.ffn_dim,
                        heads=m.heads, head_dim=m.head_dim, layers=m.layers, dropout=m.dropout).to(device)
    impl = model.resolve_impl(device)
    train_b, val_b, test_b = Batches(data.train), Batches(data.val), Batches(data.test)
    order = TrainOrder(len(data.train), cfg.batch_size, cell.seed)
    val_idx = _eval_indices(len(data.val), cfg)

    def batch(step: int, rank: int, world: int) -> tuple:
        return train_b.get(order.shard(step, rank, world), device)

    def loss(net, b, teacher) -> torch.Tensor:
        x, x2, y = b
        return F.cross_entropy((net(x, x2) if pair else net(x)).float(), y)

    def validate(net) -> dict[str, float]:
        acc, vloss = evaluate(net, val_b, val_idx, cfg.eval_bs, dist, device)
        return {"accuracy": acc, "loss": vloss}

    ckpt = checkpoint_path(work, preset.key, cell)
    result = train(model, train_config(cfg), TrainTask(batch, loss, validate), seed=cell.seed, device=device,
                   identity=cell.config_hash, checkpoint=ckpt, dist=dist, progress=ctx.progress,
                   label=cell.label, hooks=hooks(cell.task, cell.attention) if hooks else None, restart=ctx.force,
                   compile=ctx.compile)
    test_acc, test_loss = evaluate(model, test_b, np.arange(len(data.test)), cfg.eval_bs, dist, device)
    peak, mem_method = meter.read()
    st = result.state
    tt = max(st.train_time, 1e-9)
    tokens_per_sample = cfg.seq_len * (2 if pair else 1)
    metrics = {
        "score": 100.0 * test_acc, "test_acc": test_acc, "test_loss": test_loss,
        "best_val_acc": st.best_value, "best_step": st.best_step, "steps_run": st.step,
        "stopped_early": st.stopped_early, "final_train_loss": float(np.mean(st.recent_losses[-10:])),
        "majority_test_acc": majority_accuracy(data.train, data.test),
        "train_samples_per_s": st.samples / tt, "train_tokens_per_s": st.samples * tokens_per_sample / tt,
        "train_time_s": st.train_time, "wall_s": result.wall_s, "peak_mem_bytes": peak, "mem_method": mem_method,
        "world_size": dist.world, "threads": torch.get_num_threads(), "n_params": result.n_params,
        "n_train": len(data.train), "n_val": len(data.val), "n_test": len(data.test), "n_val_eval": len(val_idx),
        "val_history": [[h["step"], h["accuracy"], h["loss"]] for h in st.history], "data": data.origin,
        "resumed_from": st.resumed_from,
    }
    if cell.task == "listops":
        metrics["first_op_test_acc"] = first_operator_accuracy(data.train, data.test)
    if dist.main:
        ckpt.unlink(missing_ok=True)  # finished: the record is what stays
    return CellResult("ok", metrics=metrics, impl=impl)


# ------------------------------------------------------------------------------------------------------ run
def resolve_preset(preset: Optional[str | Preset], data_dir: Optional[str], say=None) -> Preset:
    """``preset`` loaded (a :class:`Preset` as it is); without one: ``skyformer`` with ``data_dir`` (``say`` tells
    the user so), else ``tiny``."""
    if isinstance(preset, Preset):
        return preset
    pre = load_preset(preset or ("skyformer" if data_dir else "tiny"))
    if preset is None and data_dir and say is not None:
        say(f"--data-dir without --preset: running the [bold]{pre.name}[/] preset (the published settings: long "
            f"sequences, thousands of steps; hours on a CPU). Pass --preset tiny for the CPU smoke setting.")
    return pre


def check_tasks(pre: Preset, tasks: Optional[Sequence[str]]) -> list[str]:
    import difflib

    tasks = list(tasks) if tasks else list(pre.tasks_default)
    for t in tasks:
        if t not in TASKS:
            close = difflib.get_close_matches(t, TASKS, n=1)
            raise AttnbenchError(f"unknown LRA task {t!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                                 + f" (tasks: {', '.join(TASKS)})")
        pre.task(t)
    return tasks


def run_lra(*, attentions: Sequence[str | AttentionSpec], tasks: Optional[Sequence[str]] = None,
            preset: Optional[str | Preset] = None, data_dir: Optional[str] = None, opts: Optional[RunOptions] = None,
            console=None, hooks: Optional[HooksFor] = None, progress: bool = True, estimate: bool = True,
            **fields) -> SweepSummary:
    """Train and evaluate ``attentions`` x ``tasks`` of ``preset`` (default: ``tiny`` without ``data_dir``,
    ``skyformer`` with it); see the module docstring. ``opts``: the shared run options (or single ``fields`` of
    them, e.g. ``db=``, ``out=``, ``seed=``). Under torchrun every rank calls this (DDP). ``estimate``: time a few
    steps first and print the run's expected duration (the smoke, which is that run, does not)."""
    from rich.markup import escape

    opts = run_options(opts, **fields)
    seeds = opts.seeds  # one cell per (task, spec, seed)
    run = RunContext(opts, suite=SUITE, console=console, progress=progress)
    console = run.console
    specs = as_specs(attentions)
    if not specs:
        raise AttnbenchError("give at least one attention (--attn softmax,nala,...)")
    pre = resolve_preset(preset, data_dir, say=console.print)
    tasks = check_tasks(pre, tasks)
    for spec in specs:  # a value the mechanism refuses fails here, before any data or cell
        spec.with_defaults(pre.options_for(spec.name)).check_builds(heads=pre.model.heads,
                                                                     head_dim=pre.model.head_dim,
                                                                     seq_len=pre.task(tasks[0]).seq_len)
    device = run.device
    with run:
        dist = run.dist
        for t in tasks:
            if pre.task(t).batch_size % dist.world:
                raise AttnbenchError(f"{t}: batch_size {pre.task(t).batch_size} does not split over "
                                     f"{dist.world} processes")
        work = run.work
        cache = work / "data"
        dpath = Path(data_dir) if data_dir else None
        say = run.say
        say(f"[bold]{escape(pre.key)}[/] ({escape(pre.description)}): {len(specs)} attention(s) x "
            f"{len(tasks)} task(s), seed {','.join(map(str, seeds))}, device {device}" + (f", {dist.world} processes" if dist.enabled
                                                                     else ""))
        datas, skips = _prepare_all(pre, tasks, dpath, cache, console, dist)
        for t, msg in skips.items():
            say(f"[yellow]{escape(msg)}[/]")
        if dist.main and datas and estimate:
            est = sum(estimate_seconds(specs[0].with_defaults(pre.options_for(specs[0].name)), pre, t, d, device,
                                       dist.world) for t, d in datas.items())
            samples = ", ".join(f"{t} {pre.task(t).steps} steps x {pre.task(t).batch_size}" for t in datas)
            say(f"{len(datas) * len(specs) * len(seeds)} cell(s): {samples}; estimated "
                f"{_fmt_duration(est * len(specs) * len(seeds))} on "
                f"this machine (timed from {specs[0].label}; other attentions differ; cells finished earlier "
                f"are skipped)")
        cells = plan_cells(pre, specs, [t for t in tasks if t in datas], seed=seeds, device=device.type,
                           data_fingerprints={t: d.fingerprint for t, d in datas.items()})
        skipped = [Outcome(Cell(task=t, attention=s.label, config_hash=""), CellResult("skipped"), skipped=msg)
                   for t, msg in skips.items() for s in specs]
        config = {"preset": pre.name, "preset_file": pre.path, "setting": pre.key,
                  "attentions": [s.label for s in specs], "tasks": list(tasks), "seed": seeds[0], "seeds": seeds,
                  "nproc": dist.world,
                  "data_dir": data_dir, "model": dataclasses.asdict(pre.model),
                  "task_configs": {t: pre.task(t).to_dict() for t in tasks}}
        _warm_up([s.with_defaults(pre.options_for(s.name)) for s in specs], pre, device)

        def one(cell: Cell, ctx: CellContext) -> CellResult:
            return run_cell(cell, ctx, data=datas[cell.task], preset=pre, device=device, work=work, hooks=hooks)

        return run.sweep(cells, one, setting=pre.key, config=config, describe=_line, skipped=skipped)


def _prepare_all(pre: Preset, tasks: Sequence[str], dpath: Optional[Path], cache: Path, console,
                 dist: Dist) -> tuple[dict[str, TaskData], dict[str, str]]:
    """Rank 0 generates what is missing, then every rank loads."""
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
    return datas, skips


def _line(o: Outcome) -> str:
    from rich.markup import escape

    head = f"  {o.cell.task:<10} {escape(o.cell.attention):<14}" + (f" seed {o.cell.seed}" if o.cell.name else "")
    r = o.result
    if r.status == "ok":
        m = r.metrics
        mem = m.get("peak_mem_bytes")
        mem_s = f"{mem / 2**20:.0f} MiB" if isinstance(mem, (int, float)) else "< res."
        return (f"{head} [green]ok[/]  test {m['score']:.1f}% (majority {100 * m['majority_test_acc']:.1f}%, best "
                f"val {100 * m['best_val_acc']:.1f}% @ step {m['best_step']})  {m['train_samples_per_s']:.1f} "
                f"samples/s  peak {mem_s}  wall {m['wall_s']:.0f} s")
    color = "yellow" if r.status == "interrupted" else "red"
    return f"{head} [{color}]{r.status}[/]  {escape((r.error or o.skipped).splitlines()[0])}"
