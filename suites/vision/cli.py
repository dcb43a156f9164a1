"""``attnbench run vision``: a typer command over :mod:`.train`. Torch-free at import."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench import clikit
from attnbench.clikit import console, fail
from attnbench.errors import AttnbenchError


def run_command(
    attn: Optional[str] = typer.Option(None, "--attn", help=clikit.ATTN_HELP + " (required; --smoke: default "
                                       "softmax)"),
    preset: str = typer.Option("tiny", "--preset", help="tiny (offline digits, CPU minutes), cifar10, imagenet100, "
                               "imagenet1k, or a .toml path"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="directory holding the images: "
                                           "cifar-10-batches-py/ or cifar-100-python/, or an ImageFolder's train/ "
                                           "and val/; with tiny (digits): the same CPU recipe on that folder"),
    smoke: bool = clikit.flag(False, "--smoke", help="the preset's real pipeline on the CPU on a few images "
                              "written in its real format: its model, resolution, augmentation, loss and "
                              "evaluation, 2 steps at batch 2, a checkpoint and a resume, then the full run's cost "
                              "on an H100; temporary store and files unless --db / --out"),
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

    if smoke:
        if data_dir is not None:
            fail("--smoke writes its own small data in the preset's format; drop --data-dir")
        from .smoke import run_smoke

        try:
            rc = run_smoke(attentions=parse_specs(attn or "softmax"), preset=preset, seed=seed, db=db, out=out,
                           console=console)
        except (AttnbenchError, ValueError, OSError) as e:
            fail(str(e))
        raise typer.Exit(code=rc)
    if attn is None:
        fail("--attn is required: the attentions to train, e.g. --attn softmax,nala")
    try:
        specs = parse_specs(attn)
        shard_kn = parse_shard(shard)
        from .config import load_preset, with_folder

        setting = with_folder(load_preset(preset), data_dir).key
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
