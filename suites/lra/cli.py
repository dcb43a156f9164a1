"""``attnbench run lra`` and ``attnbench data listops|pathfinder``: typer commands over :mod:`.train` and
:mod:`.generate`. Torch-free at import (every CLI invocation imports this to list the commands)."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench.api.spec import parse_specs
from attnbench.cli import kit as clikit
from attnbench.cli.kit import console, fail
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunOptions


@clikit.run_command(suite="lra")
def run_command(
    attn: Optional[str] = typer.Option(None, "--attn", help=clikit.ATTN_HELP + " (required; --smoke: default "
                                       "softmax)"),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="comma-separated of listops, text, retrieval, image, "
                                        "pathfinder (default: the preset's; tasks without data are skipped)"),
    preset: Optional[str] = typer.Option(None, "--preset", help="tiny, skyformer or a .toml path (default: tiny "
                                         "without --data-dir, skyformer with it)"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="directory holding the real data (LRA release, "
                                           "aclImdb/, cifar-10-batches-py/)"),
    smoke: bool = clikit.flag(False, "--smoke", help="every task of the preset through its real pipeline on a "
                              "few examples written in the release formats: 3 steps at batch 2 on the CPU, a "
                              "checkpoint and a resume, then the full run's cost on an H100; temporary store "
                              "and files unless --db / --out"),
    *, opts: RunOptions,
) -> None:
    """Train and evaluate attentions on the Long Range Arena; resumable; prints the leaderboard."""
    from pathlib import Path

    from .smoke import run_smoke

    task_list = [t.strip() for t in tasks.split(",") if t.strip()] if tasks else None
    if smoke:
        if data_dir is not None:
            fail("--smoke writes its own small data in the release formats; drop --data-dir")

        clikit.exit_with(lambda: run_smoke(attentions=parse_specs(attn or "softmax"), preset=preset, tasks=task_list,
                                           seed=opts.only_seed(), db=opts.db, out=opts.out, console=console), opts)
    if attn is None:
        fail("--attn is required: the attentions to train, e.g. --attn softmax,nala")
    if data_dir is not None and not Path(data_dir).expanduser().is_dir():
        fail(f"--data-dir {data_dir}: no such directory (it should hold the LRA release, aclImdb/ or "
             f"cifar-10-batches-py/; without --data-dir the tiny preset generates its data)")
    try:
        specs = parse_specs(attn)
        from .train import resolve_preset

        pre = resolve_preset(preset, data_dir, say=console.print)
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))

    def run():
        from .train import run_lra

        return run_lra(attentions=specs, tasks=task_list, preset=pre, data_dir=data_dir, opts=opts, console=console)

    clikit.finish(run, suite="lra", setting=pre.key, opts=opts)


def data_listops(out: str = typer.Option(..., "--out", help="directory; writes listops-1000/basic_*.tsv"),
                 n_train: int = typer.Option(96000, "--n-train"), n_val: int = typer.Option(2000, "--n-val"),
                 n_test: int = typer.Option(2000, "--n-test"), seed: int = typer.Option(0, "--seed"),
                 max_depth: int = typer.Option(10, "--max-depth"), max_args: int = typer.Option(10, "--max-args"),
                 min_length: int = typer.Option(500, "--min-length"),
                 max_length: int = typer.Option(2000, "--max-length")) -> None:
    """Generate ListOps with the LRA algorithm (defaults: the release's sizes and length bounds)."""
    from .generate import generate_listops

    try:
        paths = generate_listops(out, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed, max_depth=max_depth,
                                 max_args=max_args, min_length=min_length, max_length=max_length)
    except (ValueError, RuntimeError, OSError) as e:
        fail(str(e))
    for split, path in paths.items():
        console.print(f"{split}: {path}")


def data_pathfinder(out: str = typer.Option(..., "--out", help="directory; writes pathfinder<size>/curv_*/"),
                    n: int = typer.Option(2000, "--n", help="number of images (labels balanced)"),
                    seed: int = typer.Option(0, "--seed"),
                    contour_length: int = typer.Option(14, "--contour-length", help="6 (baseline), 9 or 14"),
                    size: int = typer.Option(32, "--size", help="image side: 32, 64 or 128")) -> None:
    """Generate Pathfinder images (two markers, paddle contours, distractors) in the release's layout."""
    from .generate import generate_pathfinder

    try:
        path = generate_pathfinder(out, n=n, seed=seed, contour_length=contour_length, size=size)
    except (ValueError, RuntimeError, OSError) as e:
        fail(str(e))
    console.print(f"wrote {n} images under {path}")
