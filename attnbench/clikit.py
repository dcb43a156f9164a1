"""What every command of the CLI shares: the console, the one-line error exit, and the options that every
suite's ``run`` command takes (defined once here, so no suite copies them). Torch-free: imported by every
invocation, including ``--help``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, NoReturn, Optional

import typer
from rich.console import Console

from .errors import AttnbenchError

# soft_wrap: never fold a name across lines (a piped `attnbench list | grep` must find it)
console = Console(soft_wrap=not sys.stdout.isatty())
if not sys.stderr.isatty():  # progress bars of libraries (lm-eval, datasets) would fill a log file: off
    os.environ.setdefault("TQDM_DISABLE", "1")

DB_HELP = "results store (default: $ATTNBENCH_DB, else results/attnbench.db at the project root)"
ATTN_HELP = ("comma-separated attention specs: a registered name, optionally with options as name:key=value"
             ":key=value (e.g. nala:lam=2,mirrorla); `attnbench list` shows every name and option")


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: <message>`` and exit with ``code`` (no traceback)."""
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(message)}")  # messages name TOML tables like [train]
    raise typer.Exit(code=code)


def flag(default: bool, *names: str, help: str):
    """A boolean option shown without a ``<bool>`` type label (typer prints one for plain flags)."""
    return typer.Option(default, *names, metavar="", help=help)


# The options every suite's run command has. typer reads these OptionInfo objects as metadata, so one object
# may serve as the default of a parameter in several commands.
DB = typer.Option(None, "--db", help=DB_HELP)
FORCE = flag(False, "--force", help="rerun cells already finished in the store (from scratch)")
SEED = typer.Option(0, "--seed", help="seed of model init, data order and dropout")
NPROC = typer.Option(1, "--nproc", help="processes on this machine: re-runs this command under torchrun "
                     "(DDP, or FSDP2 where the suite's train config says strategy = fsdp; gloo on CPU, NCCL on "
                     "CUDA)")
SHARD = typer.Option(None, "--shard", help="K/N: run only the K-th of N deterministic parts of the cells "
                     "(K = 1..N), e.g. one job of an array; merge the stores with `attnbench ingest`")
LAUNCHER = typer.Option("local", "--launcher", help="local (this process), slurm (submitit: --jobs jobs, one "
                        "shard and one store each under --out/jobs; merge with `attnbench ingest`) or "
                        "submitit-local (the same jobs as local processes; waits and merges into --db)")
JOBS = typer.Option(1, "--jobs", help="with --launcher slurm: number of jobs (shards) to submit")
PARTITION = typer.Option(None, "--partition", help="with --launcher slurm: the Slurm partition")
GPUS = typer.Option(0, "--gpus-per-job", help="with --launcher slurm: GPUs per job")
TIMEOUT_MIN = typer.Option(240, "--job-minutes", help="with --launcher slurm: time limit of each job")


def argv_tail() -> list[str]:
    """The arguments of this invocation after the program name (what a relaunch repeats)."""
    return list(sys.argv[1:])


def dispatch(*, nproc: int, launcher: str, jobs: int, partition: Optional[str], gpus_per_job: int,
             job_minutes: int, work: str, db: Optional[str] = None) -> Optional[int]:
    """Where this command runs. ``--launcher slurm|submitit-local``: submit ``--jobs`` shards of this same
    command line (each job its own store under ``WORK/jobs``) and return 0 (merging the jobs' stores into ``db``
    when they are waited for); ``--nproc N > 1`` outside torchrun: rerun it under torchrun and return its exit code;
    else None: the caller runs the work in this process."""
    from pathlib import Path

    from .train.dist import relaunch_under_torchrun

    if launcher != "local":
        from .store import Store, ingest
        from .sweep import launch_jobs

        folder = Path(work) / "jobs"
        dbs = launch_jobs(argv_tail(), jobs=jobs, folder=folder, launcher=launcher, partition=partition,
                          gpus_per_job=gpus_per_job, minutes=job_minutes, console=console)
        if launcher == "submitit-local":  # waited for: merge the shards' stores into this command's store
            with Store(db) as store:
                for path in dbs:
                    console.print(ingest(str(path), store))
        return 0
    return relaunch_under_torchrun(nproc, argv_tail(), console=console)


def machine_line() -> None:
    """Measure this machine (CPU model, ISA, fp32 matmul GFLOP/s; ~0.3 s) and print its line, once per run (rank
    0 under torchrun); the records of the run carry the measured GFLOP/s, so every table names its machine."""
    import os

    from rich.markup import escape

    from . import provenance

    if os.environ.get("RANK", "0") == "0":
        console.print(escape(provenance.machine_line(provenance.machine())))


def finish(run: Callable[[], Any], *, suite: str, setting: str, db: Optional[str],
           launch: Optional[dict] = None) -> None:
    """The end of every suite's ``run`` command: with ``launch`` (the keyword arguments of :func:`dispatch`),
    hand the command line to a launcher or torchrun when asked, else ``run()`` here (a sweep summary); then print
    the suite's table of ``setting`` and exit with the run's code. A torchrun worker exits without the table
    (the launching process prints it). Bad input or data: one line, no traceback."""
    from .store import check_writable
    from .train.dist import under_torchrun

    try:
        check_writable(db)  # before any data is generated or any cell trains
        rc = dispatch(db=db, **launch) if launch else None
        if rc is None:
            machine_line()
            summary = run()
            if under_torchrun():
                raise typer.Exit(code=summary.exit_code())
            rc = summary.exit_code()
    except (AttnbenchError, ValueError, OSError) as e:  # bad preset, data or store
        fail(str(e))
    from . import tables

    console.print()
    tables.table(suite, db=db, setting=setting, console=console)
    if rc:
        raise typer.Exit(code=rc)
