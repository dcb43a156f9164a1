"""``attnbench run mixa``: a typer command over :mod:`.train`. Torch-free at import."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench.cli import kit as clikit
from attnbench.cli.kit import console, fail
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunOptions


@clikit.run_command(suite="mixa")
def run_command(
    teacher: Optional[str] = typer.Option(None, "--teacher", help="the softmax ViT to start from (a timm / DeiT / "
                                          "torch state dict of the vision preset's size); default: the vision "
                                          "suite's softmax model of that preset, trained first if the store has "
                                          "none"),
    k: Optional[int] = typer.Option(None, "--k", help="layers kept quadratic (ReLU, Eqs. 4-5); default: the "
                                    "preset's (tiny: 2 of 4)"),
    preset: str = typer.Option("tiny", "--preset", help="tiny (offline digits, CPU minutes) or a .toml path"),
    smoke: bool = clikit.flag(False, "--smoke", help="the preset's whole pipeline (teacher, scores, selection, the "
                              "mix and its controls) on the CPU on a few images written in its real format: 2 steps "
                              "at batch 2, each fine-tune stopped once and resumed, then the full run's cost on an "
                              "H100; temporary store and files unless --db / --out"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="the vision preset's data folder (not needed "
                                           "for tiny)"),
    *, opts: RunOptions,
) -> None:
    """MixA: score the teacher's layers (Eq. 3), keep the top-k quadratic, the rest SteLLA; KD fine-tune the mix
    and its controls (all-SteLLA, last-k, random-k) from the teacher; accuracy, speed, memory."""
    if smoke:
        if data_dir is not None or teacher is not None:
            fail("--smoke trains its own teacher on small data it writes in the preset's format; drop "
                 "--data-dir / --teacher")
        from .smoke import run_smoke

        clikit.exit_with(lambda: run_smoke(preset=preset, k=k, seed=opts.only_seed(), db=opts.db, out=opts.out,
                                           console=console), opts)
    try:
        from .config import load_preset

        pre = load_preset(preset)
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))

    def run():
        from .train import run_mixa

        return run_mixa(preset=pre, teacher=teacher, k=k, data_dir=data_dir, opts=opts, console=console)

    clikit.finish(run, suite="mixa", setting=pre.key, opts=opts)
