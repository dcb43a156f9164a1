"""``attnbench doctor``: a typer command over :mod:`.run`. Torch-free at import."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench.api import plugins
from attnbench.cli import kit as clikit
from attnbench.cli.kit import DB_HELP, console, fail
from attnbench.core.errors import AttnbenchError


def doctor_command(
    preset: Optional[str] = typer.Option(None, "--preset", help="h100 (the default on a GPU: about 8 minutes on "
                                         "one H100), cpu (the default without one), or a .toml path"),
    attn: Optional[str] = typer.Option(None, "--attn", help="mechanisms to check and time, comma-separated "
                                       "(default: every registered one, plug-ins included, and the delta-rule "
                                       "ops delta_rule, gated_delta_rule)"),
    device: str = typer.Option("auto", "--device", help="auto (CUDA if there is one), cuda or cpu"),
    budget: Optional[float] = typer.Option(None, "--budget", help="minutes; past it the longest lengths' timings "
                                           "and then the remaining smokes are dropped, each drop said (default: "
                                           "the preset's)"),
    smokes: Optional[str] = typer.Option(None, "--smokes", help="the presets whose smokes run: a comma-separated "
                                         "suite/preset list, all (every preset of every suite) or none (default: "
                                         "the preset's)"),
    plan: bool = clikit.flag(False, "--plan", help="print every step, its estimate and whether it runs here, and "
                             "run none"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    out: Optional[str] = typer.Option(None, "--out", help="where the summary (doctor.md) and the smokes' store go "
                                      "(default: results/runs/doctor)"),
    plugin: Optional[list[str]] = typer.Option(None, "--plugin", help=clikit.PLUGIN_HELP),
) -> None:
    """Prove attnbench on this machine before trusting a number: every mechanism's contract on the device in each
    precision, the Triton and FLA chunk kernels and SDPA checked then timed (1k-32k, fwd and fwd+bwd), the GPU
    presets' smokes; one verdict line, records in the store, a markdown summary; exit 1 on any failure."""
    from .run import run_doctor

    try:
        plugins.activate(plugin or [])
        code = run_doctor(preset=preset, attn=attn, device=device, budget_min=budget, smokes=smokes, plan_only=plan,
                          db=db, out=out, plugins=plugin or [], say=lambda s: console.print(s, markup=False,
                                                                                         highlight=False))
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))
    raise typer.Exit(code=code)
