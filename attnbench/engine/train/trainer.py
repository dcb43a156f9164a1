"""The training loop every training suite drives: its model, its data and its loss, this loop.

A suite gives a :class:`TrainTask` (``batch(step, rank, world)``: this rank's share of the global batch of
``step``, a tuple of tensors split along dim 0; ``loss(model, batch, teacher)``; ``evaluate(model)``: a dict of
metrics holding ``cfg.metric``, already reduced over the ranks) and :func:`train` does the rest:

- determinism: before step ``s`` the RNG is seeded from ``(seed, s, rank)``, so a run is a function of
  ``(seed, step)`` and a resumed run ends bit-identical to an uninterrupted one;
- the optimizer and schedule of the config, per-group learning rates, frozen parameters, gradient
  accumulation over micro-batches, gradient clipping, bf16 / fp16 autocast on CUDA;
- the non-finite-loss guard (:class:`NonFiniteLoss`) and, with ``cfg.diverge_factor``, the divergence guard
  (:class:`Diverged`): the run stops with status ``failed`` and a one-line reason;
- evaluation every ``eval_every`` steps, best-so-far weights by the named metric and its direction, patience;
- checkpoints (atomic; model, optimizer, schedule, scaler, :class:`TrainState`, best weights, RNG states) every
  ``checkpoint_every`` steps; a rerun resumes from it;
- a teacher (frozen model, eval mode, no gradients) handed to the loss for distillation;
- optionally ``torch.compile`` of the model the steps call (``compile``);
- one line in the sweep's rich progress display: loss, samples/s, best metric, ETA.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

from attnbench.engine.sweep import CellError
from attnbench.engine.train import checkpoint as ckpt_io
from attnbench.engine.train.config import TrainConfig
from attnbench.engine.train.dist import Dist, wrap_model

Batch = tuple


class NonFiniteLoss(CellError):
    """The training loss became NaN or infinite: the run stops with status ``failed``."""


class Diverged(CellError):
    """The training loss rose above ``cfg.diverge_factor`` times the first step's: status ``failed``."""


@dataclasses.dataclass
class TrainTask:
    batch: Callable[[int, int, int], Batch]
    loss: Callable[..., torch.Tensor]
    evaluate: Callable[[torch.nn.Module], dict[str, float]]
    unit: str = "samples"   # what the progress line counts per second: samples, or e.g. tokens
    per_sample: int = 1     # units per sample (an LM's sequence length)


@dataclasses.dataclass
class TrainHooks:
    """Test hooks: ``after_step(step, loss)`` runs after optimizer step ``step`` (1-based) and may raise (a
    simulated kill); ``transform_loss(step, loss)`` may replace the loss before the finiteness check."""

    after_step: Optional[Callable[[int, float], None]] = None
    transform_loss: Optional[Callable[[int, torch.Tensor], torch.Tensor]] = None


@dataclasses.dataclass
class TrainState:
    """Everything about a run's progress that a checkpoint must restore (besides weights and optimizer)."""

    step: int = 0
    best_value: Optional[float] = None
    best_step: int = 0
    since_best: int = 0
    stopped_early: bool = False
    history: list = dataclasses.field(default_factory=list)  # [{"step": s, **metrics}, ...]
    train_time: float = 0.0  # seconds inside training steps
    samples: int = 0
    elapsed: float = 0.0  # wall seconds of earlier (interrupted) attempts
    recent_losses: list = dataclasses.field(default_factory=list)
    resumed_from: Optional[int] = None
    first_loss: Optional[float] = None


@dataclasses.dataclass
class TrainResult:
    state: TrainState
    wall_s: float
    n_params: int
    n_trainable: int

    def metrics(self, prefix: str = "best_val_") -> dict[str, Any]:
        st = self.state
        tt = max(st.train_time, 1e-9)
        return {
            f"{prefix}metric": st.best_value, "best_step": st.best_step, "steps_run": st.step,
            "stopped_early": st.stopped_early,
            "final_train_loss": float(np.mean(st.recent_losses[-10:])) if st.recent_losses else None,
            "train_samples_per_s": st.samples / tt, "train_time_s": st.train_time, "wall_s": self.wall_s,
            "n_params": self.n_params, "n_trainable": self.n_trainable, "resumed_from": st.resumed_from,
        }


class TrainOrder:
    """The global batch of step ``s``: a slice of the permutation of epoch ``s // steps_per_epoch`` drawn from
    ``(seed, epoch)`` (the incomplete last batch of an epoch is dropped). Each rank takes its contiguous share
    (:meth:`shard`), so N processes train on the same global batches as one."""

    def __init__(self, n: int, batch: int, seed: int):
        if batch > n:
            raise CellError(f"batch_size {batch} is larger than the training split ({n} examples)")
        self.n, self.batch, self.seed = n, batch, seed
        self.per_epoch = n // batch
        self._epoch, self._perm = -1, None

    def indices(self, step: int) -> np.ndarray:
        epoch, j = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n)
        return self._perm[j * self.batch:(j + 1) * self.batch]

    def shard(self, step: int, rank: int, world: int) -> np.ndarray:
        local = self.batch // world
        return self.indices(step)[rank * local:(rank + 1) * local]


def step_seed(seed: int, step: int, rank: int) -> int:
    return int(np.random.SeedSequence([seed, step, rank]).generate_state(1, dtype=np.uint64)[0] % (2**63))


# --- optimizer and schedule ---------------------------------------------------------------------------------
def param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict]:
    """Trainable parameters in the config's groups (first matching pattern wins); frozen ones get
    ``requires_grad=False``. Groups without parameters are dropped."""
    groups: list[list] = [[] for _ in range(len(cfg.groups) + 1)]
    for name, p in model.named_parameters():
        if any(fnmatch(name, pat) for pat in cfg.frozen):
            p.requires_grad_(False)
            continue
        if not p.requires_grad:
            continue
        idx = next((i for i, g in enumerate(cfg.groups) if any(fnmatch(name, pat) for pat in g.patterns)),
                   len(cfg.groups))
        groups[idx].append(p)
    out = []
    for i, params in enumerate(groups):
        if not params:
            continue
        g = cfg.groups[i] if i < len(cfg.groups) else None
        d = {"params": params, "lr": cfg.lr * (g.lr_scale if g else 1.0)}
        if g is not None and g.weight_decay is not None:
            d["weight_decay"] = g.weight_decay
        out.append(d)
    if not out:
        raise CellError("no trainable parameters (every parameter is frozen)")
    return out


def make_optimizer(groups: list[dict], cfg: TrainConfig, *, sharded: bool = False) -> torch.optim.Optimizer:
    """The config's optimizer over ``groups``. torch's multi-tensor (``foreach``) update, which torch picks by
    itself on CUDA only: on the CPU it gives the same parameters to the bit as the per-tensor loop and saves its
    per-tensor overhead (a third of the step's optimizer time for the small models of the CPU presets; the fused
    kernel would save more but rounds differently, so committed results would not reproduce). ``sharded``
    (FSDP2's DTensor parameters): torch's own choice."""
    foreach = None if sharded else True
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                               foreach=foreach)
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
               foreach=foreach)


def make_schedule(opt: torch.optim.Optimizer, cfg: TrainConfig):
    """torch's own schedulers; per-group peak learning rates are each group's ``lr``."""
    S = torch.optim.lr_scheduler
    if cfg.schedule == "onecycle":
        return S.OneCycleLR(opt, max_lr=[g["lr"] for g in opt.param_groups], total_steps=cfg.steps,
                            pct_start=cfg.warmup / cfg.steps, anneal_strategy=cfg.anneal)
    rest = cfg.steps - cfg.warmup
    if cfg.schedule == "cosine":
        main = S.LambdaLR(opt, lambda s: cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 *
                          (1 + math.cos(math.pi * min(s, rest) / max(rest, 1))))
    elif cfg.schedule == "polynomial":
        main = S.LambdaLR(opt, lambda s: cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) *
                          (1 - min(s, rest) / max(rest, 1)) ** cfg.power)
    else:
        main = S.LambdaLR(opt, lambda s: 1.0)
    if not cfg.warmup:
        return main
    warm = S.LambdaLR(opt, lambda s: (s + 1) / cfg.warmup)
    return S.SequentialLR(opt, [warm, main], milestones=[cfg.warmup])


# --- the loop -----------------------------------------------------------------------------------------------
def _split(batch: Batch, n: int) -> list[Batch]:
    if n == 1:
        return [batch]
    parts = [t.chunk(n, dim=0) if isinstance(t, torch.Tensor) else (t,) * n for t in batch]
    return [tuple(p[i] for p in parts) for i in range(n)]


def _autocast(cfg: TrainConfig, device: torch.device):
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if cfg.precision == "bf16" else torch.float16)


def _rng_states() -> dict[str, Any]:
    """Every generator's state as tensors and plain values: a checkpoint loads with ``weights_only=True``."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    out = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached))}
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def _set_rng_states(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch"])
    kind, keys, pos, has_gauss, cached = rng["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def _full_states(model: torch.nn.Module, opt: Optional[torch.optim.Optimizer], fsdp: bool):
    """CPU copies of the whole model's (and optimizer's) state; under FSDP2 gathered from the shards."""
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, \
            get_optimizer_state_dict

        o = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return (get_model_state_dict(model, options=o),
                get_optimizer_state_dict(model, opt, options=o) if opt is not None else None)
    weights = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
    return weights, (opt.state_dict() if opt is not None else None)


def _load_states(model: torch.nn.Module, opt: Optional[torch.optim.Optimizer], weights: dict,
                 opt_state: Optional[dict], fsdp: bool) -> None:
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, \
            set_optimizer_state_dict

        # full states live on rank 0 only (cpu_offload gathers there): broadcast them to the shards
        o = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, weights, options=o)
        if opt is not None:
            set_optimizer_state_dict(model, opt, opt_state, options=o)
        return
    model.load_state_dict(weights)
    if opt is not None:
        opt.load_state_dict(opt_state)


@dataclasses.dataclass
class _Loop:
    """What one run of :func:`train` holds while it steps: the model (and its DDP / FSDP wrapper), the optimiser,
    schedule, grad scaler and EMA, the batching, the state and the best weights so far."""

    cfg: TrainConfig
    task: TrainTask
    model: torch.nn.Module
    wrapped: torch.nn.Module
    no_sync: Callable
    opt: torch.optim.Optimizer
    sched: Any
    scaler: Optional[torch.amp.GradScaler]
    trainable: list
    dist: Dist
    device: torch.device
    n_micro: int
    label: str
    fsdp: bool
    st: TrainState = dataclasses.field(default_factory=TrainState)
    best_weights: Optional[dict] = None
    ema: Any = None

    @property
    def evaluated(self) -> torch.nn.Module:
        """What is evaluated and kept as the best: the EMA of the weights when there is one."""
        return self.ema.module if self.ema is not None else self.model

    def resume(self, checkpoint: Optional[Path], *, identity: str, restart: bool) -> Optional[dict]:
        """Load ``checkpoint`` when it exists (``restart``: delete it first); returns what was loaded."""
        if checkpoint is not None and restart and self.dist.main:
            checkpoint.unlink(missing_ok=True)
        self.dist.barrier()
        if checkpoint is None or not checkpoint.exists():
            return None
        saved = ckpt_io.load(checkpoint, identity=identity)
        _load_states(self.model, self.opt, saved["model"], saved["optimizer"], self.fsdp)
        self.sched.load_state_dict(saved["scheduler"])
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        self.st = TrainState(**saved["state"])
        self.st.resumed_from = self.st.step
        self.best_weights = saved["best_model"]
        _set_rng_states(saved["rng"])
        return saved

    def step(self, step: int, batch, teacher, hooks: TrainHooks) -> float:
        """One optimisation step on ``batch`` (its micro-batches, clipping, the non-finite and divergence
        guards); returns the step's loss averaged over the processes."""
        cfg, opt, sched, scaler, st = self.cfg, self.opt, self.sched, self.scaler, self.st
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, mb in enumerate(_split(batch, self.n_micro)):
            sync = contextlib.nullcontext() if i == self.n_micro - 1 else self.no_sync()
            with sync:
                with _autocast(cfg, self.device):
                    loss = self.task.loss(self.wrapped, mb, teacher)
                if hooks.transform_loss:
                    loss = hooks.transform_loss(step + 1, loss)
                if self.n_micro > 1:
                    loss = loss / self.n_micro
                (scaler.scale(loss) if scaler is not None else loss).backward()
            total += loss.detach().double()
        if scaler is not None:
            scaler.unscale_(opt)
        if cfg.clip_grad_value:
            torch.nn.utils.clip_grad_value_(self.trainable, cfg.clip_grad_value)
        if cfg.clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.trainable, cfg.clip_grad_norm)
        g = (self.dist.all_reduce_sum(total.reshape(1).clone()) / self.dist.world).item()
        if not math.isfinite(g):
            raise NonFiniteLoss(f"{self.label}: training loss is {g} at step {step + 1} (lr "
                                f"{sched.get_last_lr()[0]:.3g}); the run stops here")
        if st.first_loss is None:
            st.first_loss = g
        elif cfg.diverge_factor and g > cfg.diverge_factor * st.first_loss:
            raise Diverged(f"{self.label}: training loss {g:.4g} at step {step + 1} is over {cfg.diverge_factor:g}x "
                           f"the first step's {st.first_loss:.4g}: the run diverged (lr "
                           f"{sched.get_last_lr()[0]:.3g}; lower lr or lengthen warmup); it stops here")
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        sched.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        return g

    def evaluate(self, step: int) -> None:
        """Evaluate at ``step``: keep the best weights, count the evaluations since the best (patience)."""
        cfg, st = self.cfg, self.st
        metrics = self.task.evaluate(self.evaluated)
        if cfg.metric not in metrics:
            raise CellError(f"the evaluation returned {sorted(metrics)}, not the metric {cfg.metric!r}")
        value = float(metrics[cfg.metric])
        st.history.append({"step": step, **metrics})
        better = (lambda a, b: a > b) if cfg.mode == "max" else (lambda a, b: a < b)
        if st.best_value is None or better(value, st.best_value):
            st.best_value, st.best_step, st.since_best = value, step, 0
            self.best_weights = _full_states(self.evaluated, None, self.fsdp)[0]
        else:
            st.since_best += 1
            if cfg.patience and st.since_best >= cfg.patience and step >= cfg.min_steps:
                st.stopped_early = True

    def save(self, checkpoint: Optional[Path], *, identity: str, seed: int, elapsed: float) -> None:
        """Write the run's state to ``checkpoint`` (atomically, by the main process; a collective under FSDP)."""
        if checkpoint is None:
            return
        state = dataclasses.replace(self.st, elapsed=self.st.elapsed + elapsed)
        model_state, opt_state = _full_states(self.model, self.opt, self.fsdp)  # a collective under FSDP: every rank
        payload = {"format": ckpt_io.FORMAT, "identity": identity, "seed": seed, "model": model_state,
                   "optimizer": opt_state, "scheduler": self.sched.state_dict(),
                   "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                   "state": dataclasses.asdict(state), "best_model": self.best_weights, "rng": _rng_states(),
                   "ema": self.ema.state_dict() if self.ema is not None else None}
        if self.dist.main:
            ckpt_io.save_atomic(payload, checkpoint)


def _micro_batches(cfg: TrainConfig, dist: Dist, device: torch.device) -> int:
    """Micro-batches per step on this process; a precision the device lacks or a batch that does not split is a
    one-line :class:`CellError`."""
    problem = cfg.precision_problem(device.type)
    if problem:
        raise CellError(f"{problem}; use precision = \"fp32\" on {device}")
    if cfg.batch_size % dist.world:
        raise CellError(f"batch_size {cfg.batch_size} does not split over {dist.world} processes")
    local_bs = cfg.batch_size // dist.world
    micro = cfg.micro_batch_size or local_bs
    if local_bs % micro:
        raise CellError(f"micro_batch_size {micro} does not divide the per-process batch {local_bs}")
    return local_bs // micro


def train(model: torch.nn.Module, cfg: TrainConfig, task: TrainTask, *, seed: int, device: torch.device,
          identity: str, checkpoint: Optional[Path] = None, dist: Optional[Dist] = None,
          teacher: Optional[torch.nn.Module] = None, progress=None, label: str = "train",
          hooks: Optional[TrainHooks] = None, restart: bool = False, compile: bool = False) -> TrainResult:
    """Train ``model`` (already on ``device``) by ``cfg`` on ``task``; see the module docstring.

    ``compile`` (``--compile``): the training steps call the model through ``torch.compile`` (the forward the
    loss calls, its backward through AOTAutograd; timm's ``--torchcompile``); evaluation, checkpoints and the best
    weights use the model itself, whose parameters the compiled one shares.

    ``identity`` (the cell's config hash) is written into checkpoints and checked on resume; ``restart`` deletes
    an existing checkpoint first (``--force``). Returns with the best evaluation's weights loaded into ``model``.
    Raises :class:`NonFiniteLoss`, :class:`attnbench.engine.train.checkpoint.CheckpointError`, ``KeyboardInterrupt``
    (the last checkpoint stays).
    """
    dist = dist or Dist()
    hooks = hooks or TrainHooks()
    n_micro = _micro_batches(cfg, dist, device)
    t_wall0 = time.perf_counter()

    fsdp = dist.enabled and cfg.strategy == "fsdp"
    groups = param_groups(model, cfg)  # marks frozen parameters before any wrapping
    wrapped, no_sync = wrap_model(model, dist, device, cfg.strategy)
    if compile:
        wrapped = torch.compile(wrapped)
    if fsdp:  # fully_shard replaced the parameters: the optimizer must hold the sharded ones
        groups = param_groups(model, cfg)
    opt = make_optimizer(groups, cfg, sharded=fsdp)
    run = _Loop(cfg=cfg, task=task, model=model, wrapped=wrapped, no_sync=no_sync, opt=opt,
                sched=make_schedule(opt, cfg),
                scaler=torch.amp.GradScaler(device.type) if cfg.precision == "fp16" else None,
                trainable=[p for g in opt.param_groups for p in g["params"]], dist=dist, device=device,
                n_micro=n_micro, label=label, fsdp=fsdp)
    saved = run.resume(checkpoint, identity=identity, restart=restart)
    if teacher is not None:
        teacher.eval().requires_grad_(False)
    if cfg.ema_decay:
        if fsdp:
            raise CellError("ema_decay is not supported with strategy = \"fsdp\"")
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        run.ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(cfg.ema_decay), use_buffers=True)
        if saved is not None:
            run.ema.load_state_dict(saved["ema"])
    st = run.st
    bar = None
    if progress is not None:
        bar = progress.add_task(label, total=cfg.steps, completed=st.step,
                                info=f"resumed at step {st.step}" if st.resumed_from else "")
    model.train()
    try:
        while st.step < cfg.steps and not st.stopped_early:
            step = st.step
            torch.manual_seed(step_seed(seed, step, dist.rank))
            batch = task.batch(step, dist.rank, dist.world)
            t0 = time.perf_counter()
            g = run.step(step, batch, teacher, hooks)
            st.train_time += time.perf_counter() - t0
            st.samples += cfg.batch_size
            st.step = step = step + 1
            st.recent_losses = (st.recent_losses + [g])[-50:]
            if hooks.after_step:
                hooks.after_step(step, g)
            if step % cfg.eval_interval == 0 or step == cfg.steps:
                run.evaluate(step)
            if step % cfg.checkpoint_interval == 0 or st.stopped_early:
                run.save(checkpoint, identity=identity, seed=seed, elapsed=time.perf_counter() - t_wall0)
            if bar is not None:
                best = f" · best {cfg.metric} {st.best_value:.4g} @{st.best_step}" if st.best_step else ""
                rate = st.samples * task.per_sample / max(st.train_time, 1e-9)
                progress.update(bar, completed=step,
                                info=f"loss {np.mean(st.recent_losses):.3f} · {rate:.0f} {task.unit}/s{best}")
    finally:
        if bar is not None:
            progress.remove_task(bar)
    if run.best_weights is not None:
        _load_states(model, None, run.best_weights, None, fsdp)
    n_params = sum(p.numel() for p in model.parameters())
    return TrainResult(state=st, wall_s=st.elapsed + time.perf_counter() - t_wall0, n_params=n_params,
                       n_trainable=sum(p.numel() for p in run.trainable))
