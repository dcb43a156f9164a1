"""``attnbench run adala``: a typer command over :mod:`.pipeline`. Torch-free at import."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench.api.spec import parse_specs
from attnbench.cli import kit as clikit
from attnbench.cli.kit import console, fail
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunOptions


@clikit.run_command(suite="adala", no_training="not wired through AdaLA's staged distillation yet (each stage "
                    "freezes and swaps parts of the model, which a compiled graph would have to follow)")
def run_command(
    attn: str = typer.Option("linear", "--attn", help="student attention spec(s), comma-separated: linear (ELU+1, "
                             "the paper's) or any registered linear attention (nala, mirrorla, ...)"),
    teacher: Optional[str] = typer.Option(None, "--teacher", help="the softmax ViT checkpoint (a state dict of the "
                                          "vision preset's ViT); default: the one `attnbench run vision --attn "
                                          "softmax` trained on that preset, trained first if absent"),
    stages: str = typer.Option("1,2,3", "--stages", help="which stages run, e.g. 1,2,3 / 2,3 / 3 (1: attention "
                               "alignment, 2: feature alignment, 3: supervised fine-tuning)"),
    ablation: bool = clikit.flag(False, "--ablation", help="run the paper's Table 3 stage sets (3, 1+3, 2+3, "
                                 "1+2+3; the preset's [adala] ablation) instead of --stages"),
    preset: str = typer.Option("tiny", "--preset", help="tiny (offline digits teacher, CPU minutes) or a .toml path"),
    smoke: bool = clikit.flag(False, "--smoke", help="the preset's whole pipeline (teacher, from-scratch model, "
                              "stages 1-3) on the CPU on a few images written in its real format: 2 steps a stage at "
                              "batch 2, each stage stopped once and resumed, then the full run's cost on an H100; "
                              "temporary store and files unless --db / --out"),
    scratch: bool = clikit.flag(True, "--scratch/--no-scratch", help="also measure the vision suite's "
                                "from-scratch model of each student attention at the pipeline's step budget "
                                "(trained first if absent)"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="the vision preset's image directory (not "
                                           "needed for tiny)"),
    *, opts: RunOptions,
) -> None:
    """Linearise a softmax ViT into a linear attention in ViT-AdaLA's three stages; beside the teacher and the
    from-scratch model: accuracy after every stage, loss curves, speed and memory."""

    if smoke:
        if data_dir is not None or teacher is not None:
            fail("--smoke trains its own teacher on small data it writes in the preset's format; drop "
                 "--data-dir / --teacher")
        from .smoke import run_smoke

        clikit.exit_with(lambda: run_smoke(attentions=parse_specs(attn), preset=preset, seed=opts.only_seed(),
                                           db=opts.db, out=opts.out, console=console), opts)
    try:
        specs = parse_specs(attn)
        from .config import load_preset, parse_stages

        parse_stages(stages)
        pre = load_preset(preset)
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))

    def run():
        from .pipeline import run_adala

        return run_adala(attentions=specs, preset=pre, stages=stages, ablation=ablation, teacher=teacher,
                         scratch=scratch, data_dir=data_dir, opts=opts, console=console)

    clikit.finish(run, suite="adala", setting=pre.key, opts=opts)
