"""The recall runner: every (task point, mixer, learning rate, seed) cell trained on the same generated data.

``attnbench run recall`` -> :func:`run_recall`. For each point of the preset (:meth:`RecallPreset.points`: each
task at its default difficulty, its whole difficulty grid with ``--sweep``, or the grid's points ``--point`` names):
the data, generated once into files (:mod:`.data`); then for each mixer and each learning rate of the preset, one
cell: the causal language model of :mod:`attnbench.models.lm` with that mixer in every block, trained by the shared
trainer (:mod:`attnbench.engine.train`) on the cross entropy of the asked positions only (targets not -100),
validated on the validation split's answers every ``eval_every`` steps (the weights of the best step are kept), then
scored on the test split. The cells run through the shared sweep (skip finished, ``--shard``, resume from checkpoints).
Every seed trains at every rate: a seed's score is taken at the rate its validation picks (:mod:`.rates`, applied
by the leaderboard).

Per cell the store gets: ``score`` (test accuracy over the asked positions, in %), ``n_test`` (those positions),
the best validation accuracy (what chooses the learning rate: :mod:`.leaderboard`), the mixer's state size per
layer (numbers per sequence; per token when it keeps every key and value), parameters, throughput and wall time.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunContext, RunOptions, run_options
from attnbench.engine.sweep import Cell, CellContext, CellResult, Outcome, SweepSummary
from attnbench.engine.train.dist import Dist
from attnbench.engine.train.trainer import TrainHooks, TrainOrder, TrainTask, train
from attnbench.measure.peak import PeakMeter
from attnbench.models.mixers import fla_refusal
from attnbench.ops.delta import resolve_delta_impl
from attnbench.results.records import point_hash

from . import data as recall_data
from .config import Mixer, Point, RecallPreset, load_preset
from .model import build_model
from .tasks import IGNORE

SUITE = "recall"
HooksFor = Callable[[str], TrainHooks]   # a cell's label -> its trainer hooks (tests, the smoke)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What :func:`run_cell` needs besides the sweep's :class:`Cell`."""
    point: Point
    mixer: Mixer
    lr: float


def masked_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy over the asked positions (targets not -100), as Zoology's and MAD's losses. The asked rows
    are taken first (MQAR asks a quarter of the positions): the log-softmax and its backward skip the rest. Every
    gradient is ``cross_entropy(..., ignore_index)``'s to the bit (each row's terms and the count are the same); the
    loss's value sums the same terms in another order, so the logged loss may differ in its last bit."""
    flat, t = logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1)
    asked = (t != IGNORE).nonzero().squeeze(1)
    return F.cross_entropy(flat.index_select(0, asked), t.index_select(0, asked))


@torch.no_grad()
def accuracy(model: torch.nn.Module, split: recall_data.Split, *, batch: int, dist: Dist,
             device: torch.device) -> tuple[float, int, float]:
    """``(accuracy, asked positions, mean loss)`` over the asked positions of ``split``, sharded over the ranks
    and summed."""
    was = model.training
    model.eval()
    mine = np.arange(dist.rank, len(split), dist.world)
    sums = torch.zeros(3, dtype=torch.float64)
    for s in range(0, len(mine), batch):
        idx = mine[s:s + batch]
        x = torch.from_numpy(split.inputs[idx]).to(device)
        y = torch.from_numpy(split.targets[idx]).to(device)
        logits = model(x)
        asked = y != IGNORE
        sums[0] += (logits.argmax(-1)[asked] == y[asked]).sum().item()
        sums[1] += asked.sum().item()
        sums[2] += F.cross_entropy(logits.float()[asked], y[asked], reduction="sum").item()
    dist.all_reduce_sum(sums)
    model.train(was)
    count = int(sums[1].item())
    return sums[0].item() / max(count, 1), count, sums[2].item() / max(count, 1)


def plan_cells(pre: RecallPreset, mixers: Sequence[Mixer], points: Sequence[Point], *, seeds: Sequence[int],
               device: str) -> list[Cell]:
    """One cell per (point, applicable mixer, learning rate, seed); a seed's cell is the same whether its run
    had other seeds or not."""
    cells = []
    for point in points:
        for m in (m for m in mixers if m.variant is not None):
            for lr in pre.learning_rates:
                for seed in seeds:
                    params = {"seed": seed, "preset": pre.name, "task_params": point.params, "hidden": point.hidden,
                              "n_train": point.n_train,
                              "lr": lr, "steps": pre.steps(point), "batch_size": pre.train.batch_size,
                              "identity": pre.identity_hash()}
                    options = m.variant.options()
                    h = point_hash(suite=SUITE, setting=pre.key, task=point.label, attention=m.label, options=options,
                                   params=params, dtype="float32", device=device)
                    cells.append(Cell(task=point.label, attention=m.label, config_hash=h, options=options,
                                      params=params, dtype="float32", seed=seed, payload=Plan(point, m, lr),
                                      name=f"{point.label} · {m.label} · lr {lr:g} · seed {seed}"))
    return cells


def run_cell(cell: Cell, ctx: CellContext, *, splits: dict[str, recall_data.Split], pre: RecallPreset,
             device: torch.device, work: Path, hooks: Optional[HooksFor] = None) -> CellResult:
    """Train one mixer at one learning rate; the test accuracy with the weights of the best validation step."""
    plan: Plan = cell.payload
    dist = ctx.dist or Dist()
    meter = PeakMeter(device)
    cfg = pre.model_config(plan.mixer, plan.point)
    torch.manual_seed(cell.seed)
    model = build_model(cfg, plan.point.task).to(device)
    train_split, val, test = splits["train"], splits["val"], splits["test"]
    order = TrainOrder(len(train_split), pre.train.batch_size, cell.seed)
    eval_batch = max(1, pre.train.batch_size)

    def batch(step: int, rank: int, world: int):
        idx = order.shard(step, rank, world)
        return (torch.from_numpy(train_split.inputs[idx]).to(device),
                torch.from_numpy(train_split.targets[idx]).to(device))

    def loss(net, b, teacher):
        return masked_loss(net(b[0]), b[1])

    def validate(net):
        acc, _, vloss = accuracy(net, val, batch=eval_batch, dist=dist, device=device)
        return {"accuracy": acc, "loss": vloss}

    tcfg = dataclasses.replace(pre.train, lr=plan.lr, steps=pre.steps(plan.point))
    ckpt = Path(work) / "checkpoints" / pre.key.replace("/", "_") / f"{cell.config_hash}.pt"
    seq_len = train_split.inputs.shape[1]
    result = train(model, tcfg, TrainTask(batch, loss, validate, unit="tokens", per_sample=seq_len),
                   seed=cell.seed, device=device, identity=cell.config_hash, checkpoint=ckpt, dist=dist,
                   progress=ctx.progress, label=cell.label, hooks=hooks(cell.label) if hooks else None,
                   restart=ctx.force, compile=ctx.compile)
    st = result.state
    test_acc, n_test, test_loss = accuracy(model, test, batch=eval_batch, dist=dist, device=device)
    peak, mem_method = meter.read()
    mixer = model.blocks[0].attn
    tt = max(st.train_time, 1e-9)
    metrics = {
        "score": 100.0 * test_acc, "test_acc": test_acc, "n_test": n_test, "test_loss": test_loss,
        "best_val_acc": st.best_value, "best_step": st.best_step, "steps_run": st.step, "lr": plan.lr,
        "stopped_early": st.stopped_early, "first_loss": st.first_loss,
        "final_train_loss": float(np.mean(st.recent_losses[-10:])) if st.recent_losses else None,
        "state_per_layer": mixer.state_size(), "state_per_token": bool(getattr(mixer, "state_grows", False)),
        "n_params": result.n_params, "model": cfg.to_dict(), "seq_len": seq_len,
        "n_train": len(train_split), "n_val": len(val), "n_val_answers": val.answers,
        "train_tokens_per_s": st.samples * seq_len / tt, "train_time_s": st.train_time, "wall_s": result.wall_s,
        "peak_mem_bytes": peak, "mem_method": mem_method, "world_size": dist.world,
        "threads": torch.get_num_threads(), "resumed_from": st.resumed_from,
        "val_history": [[h["step"], h["accuracy"]] for h in st.history],
    }
    if dist.main:
        ckpt.unlink(missing_ok=True)
    return CellResult("ok", metrics=metrics, impl=_impl(mixer, cfg, device))


def _impl(mixer, cfg, device: torch.device) -> str:
    """The form the mixer ran: the attention's resolved impl, or the recurrent op's (the delta rule, GLA and
    RetNet share its setting; Mamba's scan has one form)."""
    if hasattr(mixer, "mech"):
        return mixer.mech.resolve_impl(device)
    if cfg.layer == "mamba":
        return "recurrent"
    return resolve_delta_impl(device, cfg.delta_impl)


def _data_for(pre: RecallPreset, point: Point, cache: Path, dist: Dist) -> dict[str, recall_data.Split]:
    """Rank 0 generates the point's files (once), then every rank reads them."""
    d = recall_data.point_dir(cache, point.task, point.params, pre.sizes(point), pre.data.seed)
    if dist.main:
        recall_data.ensure(cache, point.task, point.params, pre.sizes(point), pre.data.seed)
    dist.barrier()
    return {s: recall_data.load_split(d, s, point.vocab_size) for s in recall_data.SPLITS}


def run_recall(*, mixers: Sequence[Mixer], preset: str | RecallPreset, sweep: bool = False,
               point_labels: Sequence[str] = (), opts: Optional[RunOptions] = None, console=None,
               hooks: Optional[HooksFor] = None, progress: bool = True, **fields) -> SweepSummary:
    """Train every applicable mixer of ``mixers`` at every learning rate of ``preset`` on each of its points (the
    difficulty grid with ``sweep``; ``point_labels``: the grid's points of those labels, the records' tasks).
    ``opts``: the shared run options (or single ``fields`` of them, e.g. ``db=``, ``out=``, ``seeds=``). Mixers
    without a causal form are reported as not applicable, with the reason."""
    opts = run_options(opts, **fields)
    seeds = opts.seeds
    run = RunContext(opts, suite=SUITE, console=console, progress=progress)
    pre = preset if isinstance(preset, RecallPreset) else load_preset(preset)
    points = pre.points(sweep, only=point_labels)
    for point in points:          # every model builds at every point before any data is generated
        for m in mixers:
            if m.variant is not None:
                try:
                    with torch.device("meta"):
                        build_model(pre.model_config(m, point), point.task)
                except AttnbenchError as e:
                    raise AttnbenchError(f"--attn {m.label} at {point.label}: {e}") from None
    run.check_trainable(pre, [pre.train])
    device = run.device
    for m in mixers:  # FLA's refusal of a gated backward on this GPU: one line before any cell trains
        refusal = fla_refusal(pre.model_config(m, points[0]), device) if m.variant is not None else None
        if refusal:
            raise AttnbenchError(f"--attn {m.label}: {refusal}")
    with run:
        dist = run.dist
        if pre.train.batch_size % dist.world:
            raise AttnbenchError(f"batch_size {pre.train.batch_size} does not split over {dist.world} processes")
        work = run.work
        applicable = [m for m in mixers if m.variant is not None]
        run.say(f"[bold]recall[/] {pre.key}: {len(applicable)} mixer(s) × {len(pre.learning_rates)} learning "
                f"rate(s) × {len(points)} point(s) · seed {','.join(map(str, seeds))} · "
                + (f"{pre.epochs} epochs" if pre.epochs else f"{pre.train.steps} steps") + " × "
                f"{pre.train.batch_size} · {device}" + (f" · {dist.world} processes" if dist.enabled else ""))
        cells = plan_cells(pre, mixers, points, seeds=seeds, device=device.type)
        skipped = [Outcome(Cell(task=p.label, attention=m.label, config_hash=""), CellResult("skipped"),
                           skipped=f"not applicable: {m.not_applicable}")
                   for p in points for m in mixers if m.variant is None]
        splits: dict[str, dict[str, recall_data.Split]] = {}

        def one(cell: Cell, ctx: CellContext) -> CellResult:
            point = cell.payload.point
            if point.label not in splits:
                splits.clear()  # one point's data in memory at a time (cells are ordered by point)
                splits[point.label] = _data_for(pre, point, work / "data", ctx.dist or Dist())
            return run_cell(cell, ctx, splits=splits[point.label], pre=pre, device=device, work=work, hooks=hooks)

        config = {"preset": pre.name, "mixers": [m.label for m in mixers], "seeds": seeds, "sweep": sweep,
                  "points": [p.label for p in points], "learning_rates": pre.learning_rates, **pre.identity()}
        return run.sweep(cells, one, setting=pre.key, config=config, describe=_line, skipped=skipped)


def _line(o: Outcome) -> str:
    from rich.markup import escape

    head = f"  {escape(o.cell.label):<48}"
    r = o.result
    if r.status == "ok" and r.metrics:
        m = r.metrics
        state = f"{m['state_per_layer'] / 1e3:.1f} k" + ("/token" if m.get("state_per_token") else "")
        return (f"{head} [green]ok[/]  test {m['score']:.1f}% of {m['n_test']} answers · best val "
                f"{100 * m['best_val_acc']:.1f}% @ step {m['best_step']} · state/layer {state} · "
                f"{m['n_params'] / 1e3:.0f} k params · wall {m['wall_s']:.0f} s")
    if r.status == "ok":
        return f"{head} [green]ok[/]  ({o.skipped})"
    color = "yellow" if r.status in ("interrupted", "skipped") else "red"
    return f"{head} [{color}]{r.status}[/]  {escape((r.error or o.skipped or '').splitlines()[0])}"
