"""A toy suite on the shared engine (``attnbench.engine.sweep`` + ``attnbench.engine.train``): a small MLP classifier on
synthetic data. The engine tests run it in subprocesses, so it can be SIGKILLed, sent SIGTERM, or started under
torchrun. ``python tests/toy_train.py --db DB --work DIR [--kill-at S] [--term-at S] [--cells N] ...``; prints
one JSON line per finished cell and exits with the sweep's exit code."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from attnbench.engine.sweep import Cell, CellContext, CellResult, parse_shard, run_sweep
from attnbench.engine.train.config import TrainConfig
from attnbench.engine.train.dist import default_device, init_dist, shutdown
from attnbench.engine.train.trainer import TrainHooks, TrainTask, train

DIM, CLASSES, N_TRAIN = 8, 3, 64


def toy_data(seed: int = 0, n: int = N_TRAIN) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, DIM, generator=g)
    y = (x @ torch.randn(DIM, CLASSES, generator=g)).argmax(-1)
    return x, y


def toy_model(dropout: float) -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, CLASSES))


def weights_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        v = v.full_tensor() if hasattr(v, "full_tensor") else v  # FSDP2 shards (a collective: every rank calls)
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def toy_task(x, y, cfg: TrainConfig, seed: int, device) -> TrainTask:
    def batch(step: int, rank: int, world: int):
        epoch, j = divmod(step, len(x) // cfg.batch_size)
        perm = np.random.default_rng([seed, epoch]).permutation(len(x))
        idx = perm[j * cfg.batch_size:(j + 1) * cfg.batch_size]
        local = cfg.batch_size // world
        idx = torch.from_numpy(idx[rank * local:(rank + 1) * local])
        return x[idx].to(device), y[idx].to(device)

    def loss(net, b, teacher):
        xb, yb = b
        return nn.functional.cross_entropy(net(xb), yb)

    @torch.no_grad()
    def evaluate(net):
        was = net.training
        net.eval()
        logits = net(x.to(device))
        net.train(was)
        return {"accuracy": (logits.argmax(-1) == y.to(device)).float().mean().item(),
                "loss": nn.functional.cross_entropy(logits, y.to(device)).item()}

    return TrainTask(batch, loss, evaluate)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--cells", type=int, default=1)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--micro", type=int, default=0)
    ap.add_argument("--ckpt-every", type=int, default=3)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--kill-at", type=int, default=0, help="SIGKILL this process after this step")
    ap.add_argument("--term-at", type=int, default=0, help="SIGTERM this process after this step")
    ap.add_argument("--shard", default=None)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    device = default_device()
    dist = init_dist(device)
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch, micro_batch_size=args.micro, lr=0.05,
                      schedule="cosine", warmup=2, eval_every=4, checkpoint_every=args.ckpt_every,
                      strategy=args.strategy, clip_grad_norm=1.0)
    x, y = toy_data()
    cells = [Cell(task="toy", attention=f"mlp{i}", config_hash=hashlib.sha256(f"toy{i}".encode()).hexdigest()[:16],
                  params={"i": i}, seed=i) for i in range(args.cells)]

    def kill(step: int, loss: float) -> None:
        if step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.term_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def run_cell(cell: Cell, ctx: CellContext) -> CellResult:
        torch.manual_seed(cell.seed)
        model = toy_model(args.dropout).to(device)
        res = train(model, cfg, toy_task(x, y, cfg, cell.seed, device), seed=cell.seed, device=device,
                    identity=cell.config_hash, checkpoint=Path(args.work) / f"{cell.attention}.pt", dist=ctx.dist,
                    hooks=TrainHooks(after_step=kill), restart=ctx.force, label=cell.label)
        metrics = {**res.metrics(), "digest": weights_digest(model), "world": ctx.dist.world}
        if ctx.dist.main:
            print(json.dumps({"cell": cell.attention, **metrics}), flush=True)
        return CellResult("ok", metrics=metrics)

    try:
        summary = run_sweep(cells, run_cell, suite="toy", setting="toy/test", db=args.db, device=device.type,
                            force=args.force, shard=parse_shard(args.shard), progress=False, dist=dist)
    finally:
        shutdown(dist)
    return summary.exit_code()


if __name__ == "__main__":
    sys.exit(main())
