"""Distributed training on torch's own engine: torchrun-aware init, DDP / FSDP2 wrapping, and the generic
``--nproc N`` relaunch of the current command line under torchrun.

Nothing here is suite-specific: a suite's run command calls :func:`relaunch_under_torchrun` first (it returns
the exit code of the torchrun child when it relaunched, else None), and the trainer gets a :class:`Dist`.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any, Optional, Sequence

from attnbench.core.errors import AttnbenchError
from attnbench.engine.argv import strip_options

STRATEGIES = ("ddp", "fsdp")


def under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("WORLD_SIZE" in os.environ and "LOCAL_RANK" in os.environ)


@dataclasses.dataclass
class Dist:
    """Rank and world size of this process (1 process: rank 0 of 1, every collective a no-op)."""
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
            import torch.distributed as td

            td.barrier()

    def all_reduce_sum(self, t):
        if self.enabled:
            import torch.distributed as td

            td.all_reduce(t, op=td.ReduceOp.SUM)
        return t

    def broadcast(self, obj: Any) -> Any:
        """``obj`` of rank 0 on every rank."""
        if not self.enabled:
            return obj
        import torch.distributed as td

        box = [obj]
        td.broadcast_object_list(box, src=0)
        return box[0]


def default_device():
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_dist(device) -> Dist:
    """Join the process group torchrun set up (gloo on CPU, NCCL on CUDA); one process: :class:`Dist()`."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch
    import torch.distributed as td

    if not td.is_initialized():
        td.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cpu":  # the machine's cores are shared by the ranks
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // td.get_world_size()))
    return Dist(rank=td.get_rank(), world=td.get_world_size())


def shutdown(dist: Dist) -> None:
    if dist.enabled:
        import torch.distributed as td

        if td.is_initialized():
            td.destroy_process_group()


def wrap_model(model, dist: Dist, device, strategy: str = "ddp"):
    """The model the training step calls: itself (1 process), DDP, or FSDP2 (``fully_shard`` on each of
    ``model.fsdp_units()`` if the model names them, else on every child module with parameters, then the root).
    Returns ``(wrapped, no_sync)``: ``no_sync()`` is a context that skips the gradient all-reduce of a non-final
    micro-batch (a null context where it cannot)."""
    import contextlib

    if strategy not in STRATEGIES:
        raise ValueError(f"distributed strategy must be one of {STRATEGIES}, got {strategy!r}")
    if not dist.enabled:
        return model, contextlib.nullcontext
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        return ddp, ddp.no_sync
    from torch.distributed.fsdp import fully_shard

    units = model.fsdp_units() if hasattr(model, "fsdp_units") else [
        child for child in model.children() if any(True for _ in child.parameters())]
    for unit in units:  # a model may name its units (an LM: each block), else its direct children
        fully_shard(unit)
    fully_shard(model)

    @contextlib.contextmanager
    def no_sync():
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return model, no_sync


def torchrun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m attnbench.cli.main ARGV`` (``--nproc`` is
    removed from ARGV: a worker takes its world size from torchrun)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
            f"--nproc-per-node={nproc}", "-m", "attnbench.cli.main", *strip_options(argv, {"--nproc": True})]


def relaunch_under_torchrun(nproc: int, argv: Optional[Sequence[str]] = None, console=None) -> Optional[int]:
    """With ``nproc > 1`` outside torchrun: run this same command line under torchrun and return its exit code.
    Else None (the caller goes on in this process)."""

    if nproc < 1:
        raise AttnbenchError(f"--nproc must be >= 1, got {nproc}")
    if nproc == 1 or under_torchrun():
        return None
    cmd = torchrun_command(nproc, list(sys.argv[1:] if argv is None else argv))
    if console is not None:
        console.print(f"[dim]launching {nproc} processes: {' '.join(cmd)}[/]")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return subprocess.call(cmd, env=env)
