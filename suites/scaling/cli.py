"""``attnbench run scaling``: the typer command the scaling suite registers (``Suite.run``).

Torch-free at import: every ``attnbench`` invocation (``--help`` included) discovers the suites and reads this
command's signature; the work is imported when the command runs.
"""

from __future__ import annotations

from typing import Optional

import typer

from attnbench import clikit


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
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads per point (0: all cores)"),
    preset: str = typer.Option("cpu-default", "--preset", help="embedded preset name or a .toml path"),
    db: Optional[str] = clikit.DB,
    time_budget: Optional[float] = typer.Option(None, "--time-budget", help="seconds per point before it is "
                                                "killed and recorded as timeout"),
    mem_budget: Optional[float] = typer.Option(None, "--mem-budget", help="GiB of address space per point "
                                               "(past it: oom)"),
    force: bool = clikit.FORCE,
    smoke: bool = clikit.flag(False, "--smoke", help="each point kind (attention x mode x dtype) once at the "
                              "smallest length through the real sweep (child process, memory budget, correctness "
                              "gate, FLOPs, one timed call) into a temporary store (or --db), then the full "
                              "sweep's points and estimated time on this machine"),
    shard: Optional[str] = clikit.SHARD,
) -> None:
    """Time, peak memory and FLOPs of each attention as N grows, gated on correctness; resumable."""
    from attnbench.errors import AttnbenchError
    from attnbench.spec import parse_specs
    from attnbench.sweep import parse_shard

    from .runner import run_cli

    try:
        specs = parse_specs(attn, required=False) if attn is not None else None
        parts = parse_shard(shard)
        if smoke:
            from .config import parse_seq_list
            from .runner import plan_scaling, run_smoke

            plan = plan_scaling(preset, attentions=specs or None, seq=parse_seq_list(seq) if seq else None,
                                modes=[m.strip() for m in mode.split(",") if m.strip()] if mode else None,
                                causal=causal,
                                dtypes=[d.strip() for d in dtype.split(",") if d.strip()] if dtype else None,
                                device=device, batch=batch, heads=heads, head_dim=head_dim, threads=threads,
                                time_budget=time_budget, mem_budget_gb=mem_budget)
            rc = run_smoke(plan, db=db, console=clikit.console)
            raise typer.Exit(code=rc)
        result = run_cli(shard=parts, attn=specs or None, seq=seq, mode=mode, causal=causal, dtype=dtype, device=device,
                         heads=heads, head_dim=head_dim, batch=batch, threads=threads, preset=preset, db=db,
                         time_budget=time_budget, mem_budget_gb=mem_budget, force=force, console=clikit.console,
                         argv=["attnbench", *clikit.argv_tail()])
    except (AttnbenchError, ValueError) as e:
        clikit.fail(str(e))
    if result.exit_code:  # 130 interrupted, 1 a point failed or was incorrect
        raise typer.Exit(code=result.exit_code)
