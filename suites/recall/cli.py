"""``attnbench run recall`` and ``attnbench data recall``: typer commands over :mod:`.train` and :mod:`.data`.
Torch-free at import."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench.cli import kit as clikit
from attnbench.cli.kit import console, fail
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunOptions

ATTN_HELP = ("mixers, comma-separated: a causal attention of the registry with options (softmax, nala:lam=2, a "
             "plug-in's), each in a Transformer block; or a language-model mixer LAYER[+NAME][:key=value...] "
             "(deltanet, deltanet+nala, gated_deltanet, gla, retnet, mamba). Default: the preset's mixers")


@clikit.run_command(suite="recall")
def run_command(
    attn: Optional[str] = typer.Option(None, "--attn", help=ATTN_HELP),
    preset: str = typer.Option("tiny", "--preset", help="tiny (offline CPU default), zoology (Zoology's MQAR grid), "
                               "mad (MAD's six tasks), or a .toml path"),
    sweep: bool = clikit.flag(False, "--sweep", help="every difficulty point of each task (and the preset's "
                              "widths), not only its default"),
    smoke: bool = clikit.flag(False, "--smoke", help="every mixer at every point of the preset (--sweep: its whole "
                              "grid) through the real pipeline on a few generated examples: 3 steps at batch 2 on "
                              "the CPU at the first learning rate, a checkpoint and a resume, then the full run's "
                              "cost on an H100; temporary store and files unless --db / --out"),
    point: Optional[str] = typer.Option(None, "--point", help="only these points of the preset's whole grid "
                                        "(--sweep's), comma-separated, by the task label their records carry, "
                                        "e.g. 'mqar d=32'"),
    *, opts: RunOptions,
) -> None:
    """Train token mixers on synthetic recall tasks (Zoology's MQAR, MAD's six), each at the best of a
    learning-rate sweep; the leaderboard, its separation line and accuracy against state size."""
    from .config import load_preset, parse_mixers
    from .smoke import run_smoke

    try:
        pre = load_preset(preset)
        mixers = parse_mixers(attn or pre.mixers)
        point_labels = [p.strip() for p in point.split(",") if p.strip()] if point is not None else []
        if point is not None and not point_labels:
            raise AttnbenchError("--point is empty: name a point by its task label, e.g. --point 'mqar d=32'")
        pre.points(sweep, only=point_labels)  # an unknown label fails here, before anything runs
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))
    if smoke and point_labels:
        fail("--point with --smoke: the smoke runs the preset's default point (its whole grid with --sweep); "
             "drop --point")
    if smoke:
        clikit.exit_with(lambda: run_smoke(pre, mixers, sweep=sweep, seed=opts.only_seed(), db=opts.db, out=opts.out,
                                           console=console), opts)

    def run():
        from .train import run_recall

        return run_recall(mixers=mixers, preset=pre, sweep=sweep, point_labels=point_labels, opts=opts,
                          console=console)

    clikit.finish(run, suite="recall", setting=pre.key, opts=opts)


def data_recall(out: str = typer.Option(..., "--out", help="directory; one folder per task point (train.npz, "
                                        "val.npz, test.npz, params.json)"),
                preset: str = typer.Option("tiny", "--preset", help="whose tasks and split sizes"),
                sweep: bool = clikit.flag(False, "--sweep", help="every difficulty point, not only the default"),
                ) -> None:
    """Generate a recall preset's task data into files (what a run generates into its work directory)."""
    from pathlib import Path

    from . import data
    from .config import load_preset

    try:
        pre = load_preset(preset)
        for point in {p.label: p for p in pre.points(sweep)}.values():
            d = data.ensure(Path(out), point.task, point.params, pre.sizes(point), pre.data.seed)
            console.print(f"{point.label}: {d}")
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))
