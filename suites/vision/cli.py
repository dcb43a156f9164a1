"""``attnbench run vision``: a typer command over :mod:`.train`. Torch-free at import."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench import clikit
from attnbench.clikit import console, fail
from attnbench.errors import AttnbenchError


def run_command(
    attn: str = typer.Option(..., "--attn", help=clikit.ATTN_HELP),
    preset: str = typer.Option("tiny", "--preset", help="tiny (offline digits, CPU minutes), cifar10, imagenet100, "
                               "imagenet1k, or a .toml path"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="directory holding the images: "
                                           "cifar-10-batches-py/ or cifar-100-python/, or ImageNet's train/ and val/ "
                                           "(not needed for tiny)"),
    pretrained: Optional[str] = typer.Option(None, "--pretrained", help="start every cell from this checkpoint (a "
                                             "timm / DeiT / torch state dict of a ViT of the preset's size; a "
                                             "softmax one loads into any attention)"),
    seed: int = clikit.SEED,
    force: bool = clikit.FORCE,
    db: Optional[str] = clikit.DB,
    out: Optional[str] = typer.Option(None, "--out", help="work directory: checkpoints and job stores (default: "
                                      "results/runs/vision)"),
    nproc: int = clikit.NPROC,
    shard: Optional[str] = clikit.SHARD,
    launcher: str = clikit.LAUNCHER,
    jobs: int = clikit.JOBS,
    partition: Optional[str] = clikit.PARTITION,
    gpus_per_job: int = clikit.GPUS,
    job_minutes: int = clikit.TIMEOUT_MIN,
) -> None:
    """Train the same ViT with each attention on the same images and recipe; accuracy, speed and memory."""
    import sys

    from attnbench.spec import parse_specs
    from attnbench.store import project_root
    from attnbench.sweep import parse_shard

    try:
        specs = parse_specs(attn)
        shard_kn = parse_shard(shard)
        from .config import load_preset

        setting = load_preset(preset).key
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))
    work = out or str(project_root() / "results" / "runs" / "vision")

    def run():
        from .train import run_vision

        return run_vision(attentions=specs, preset=preset, data_dir=data_dir, seed=seed, force=force, db=db, out=out,
                          shard=shard_kn, console=console, argv=sys.argv, pretrained=pretrained)

    clikit.finish(run, suite="vision", setting=setting, db=db,
                  launch=dict(nproc=nproc, launcher=launcher, jobs=jobs, partition=partition,
                              gpus_per_job=gpus_per_job, job_minutes=job_minutes, work=work))
