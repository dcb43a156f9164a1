"""``attnbench run scaling``: the typer command the scaling suite registers (``Suite.run``).

Torch-free at import: every ``attnbench`` invocation (``--help`` included) discovers the suites and reads this
command's signature; the work is imported when the command runs.
"""

from __future__ import annotations

from typing import Optional

import typer

from attnbench.api.spec import parse_specs
from attnbench.cli import kit as clikit
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunOptions


@clikit.run_command(suite="scaling", one_process="each point is measured alone in its own child process (a "
                    "timing shared with other ranks would measure the contention); split the points over jobs with "
                    "--shard or --launcher instead",
                    no_training="the scaling suite times attention calls; it trains no model to compile")
def run_scaling_cmd(
    attn: Optional[str] = typer.Option(None, "--attn", help=clikit.ATTN_HELP + " (default: the preset's)"),
    seq: Optional[str] = typer.Option(None, "--seq", help="sequence lengths, e.g. 1k,4k,16k,64k"),
    mode: Optional[str] = typer.Option(None, "--mode", help="fwd, fwd+bwd, or both comma-separated"),
    causal: Optional[bool] = typer.Option(None, "--causal/--bidirectional", metavar="", help="force every point causal / "
                                          "bidirectional (default: the preset's)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="comma-separated: fp32, bf16, fp16, fp64"),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda"),
    heads: Optional[int] = typer.Option(None, "--heads", help="attention heads H of every point (default: the "
                                        "preset's; another value is another setting, scaling/<preset>[h..])"),
    head_dim: Optional[int] = typer.Option(None, "--head-dim", help="head size D of q, k, v (default: the "
                                           "preset's; another value is another setting)"),
    batch: Optional[int] = typer.Option(None, "--batch", help="batch size B of every point (default: the "
                                        "preset's; another value is another setting)"),
    preset: str = typer.Option("cpu-default", "--preset", help="embedded preset name or a .toml path"),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", help="seconds per point before it is "
                                                "killed and recorded as timeout"),
    mem_budget: Optional[float] = typer.Option(None, "--mem-budget", help="GiB of address space per point "
                                               "(past it: oom)"),
    smoke: bool = clikit.flag(False, "--smoke", help="each point kind (attention x mode x dtype) once at the "
                              "smallest length through the real sweep (child process, memory budget, correctness "
                              "gate, FLOPs, one timed call) into a temporary store (or --db), then the full "
                              "sweep's points and estimated time on this machine"),
    *, opts: RunOptions,
) -> None:
    """Time, peak memory and FLOPs of each attention as N grows, gated on correctness; resumable. --threads is the
    torch thread count of every point (in its child process; another count is another setting)."""

    from .runner import plan_cli

    try:
        specs = parse_specs(attn, required=False) if attn is not None else None
        plan = plan_cli(preset, attn=specs or None, seq=seq, mode=mode, causal=causal, dtype=dtype, device=device,
                        heads=heads, head_dim=head_dim, batch=batch, threads=opts.threads, seed=opts.only_seed(),
                        time_budget=time_budget, mem_budget_gb=mem_budget, console=clikit.console)
        if smoke:
            from .runner import run_smoke

            clikit.exit_with(lambda: run_smoke(plan, db=opts.db, console=clikit.console), opts)
    except (AttnbenchError, ValueError) as e:
        clikit.fail(str(e))

    def run() -> int:
        from .runner import run_cli

        return run_cli(plan, opts=opts, console=clikit.console).exit_code

    # the machine line is printed by run_cli (measured with the points' thread count)
    clikit.finish(run, suite="scaling", setting=plan.setting, opts=opts, machine=False)
