"""``attnbench run vision``: a typer command over :mod:`.train`. Torch-free at import."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench.api.spec import parse_specs
from attnbench.cli import kit as clikit
from attnbench.cli.kit import console, fail
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunOptions


@clikit.run_command(suite="vision")
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
    *, opts: RunOptions,
) -> None:
    """Train the same ViT with each attention on the same images and recipe; accuracy, speed and memory."""
    if smoke:
        if data_dir is not None:
            fail("--smoke writes its own small data in the preset's format; drop --data-dir")
        from .smoke import run_smoke

        clikit.exit_with(lambda: run_smoke(attentions=parse_specs(attn or "softmax"), preset=preset,
                                           seed=opts.only_seed(), db=opts.db, out=opts.out, console=console), opts)
    if attn is None:
        fail("--attn is required: the attentions to train, e.g. --attn softmax,nala")
    try:
        specs = parse_specs(attn)
        from .config import load_preset, with_folder

        pre = with_folder(load_preset(preset), data_dir)
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))

    def run():
        from .train import run_vision

        return run_vision(attentions=specs, preset=pre, data_dir=data_dir, opts=opts, console=console,
                          pretrained=pretrained)

    clikit.finish(run, suite="vision", setting=pre.key, opts=opts)
