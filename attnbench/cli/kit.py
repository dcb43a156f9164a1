"""What every command of the CLI shares: the console, the one-line error exit, the options that every suite's
``run`` command takes (declared once here by :func:`run_command`, so no suite copies them) and the one path from
them to a launcher, torchrun or this process (:func:`finish`). Torch-free: imported by every invocation, including
``--help``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, NoReturn, Optional

import typer

from attnbench.api import plugins
from attnbench.core.errors import AttnbenchError
from attnbench.engine import sweep
from attnbench.engine.context import RunOptions
from attnbench.engine.sweep import LAUNCHERS, parse_shard
from attnbench.engine.train import dist
from attnbench.results import provenance
from attnbench.results.ingest import ingest
from attnbench.results.paths import resolve_db
from attnbench.results.store import Store, check_writable
from attnbench.views import tables
from attnbench.views.render import default_console

# soft-wrapped when piped: a name never folds across lines (a piped `attnbench list | grep` must find it)
console = default_console()
if not sys.stderr.isatty():  # progress bars of libraries (lm-eval, datasets) would fill a log file: off
    os.environ.setdefault("TQDM_DISABLE", "1")

DB_HELP = "results store (default: $ATTNBENCH_DB, else results/attnbench.db at the project root)"
PLUGIN_HELP = ("a plug-in: a Python file (my_attn.py) or a dotted module whose classes register attentions or "
               "feature maps (repeatable; also ATTNBENCH_PLUGINS and the attnbench.attentions entry points)")
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


# The options of the store and the rerun: every run command has them (through run_command), and so do other
# commands that write the store (eval). typer reads these OptionInfo objects as metadata, so one object may serve
# as the default of a parameter in several commands.
DB = typer.Option(None, "--db", help=DB_HELP)
FORCE = flag(False, "--force", help="rerun cells already finished in the store (from scratch)")


def _shared_options(suite: str) -> list[tuple[str, Any, Any]]:
    """``(parameter, type, typer.Option)`` of every option a suite's ``run`` command shares (see
    :func:`run_command`); only ``--out``'s help names the suite."""
    return [
        ("seed", Optional[int], typer.Option(None, "--seed", help="seed of model init, data order and dropout "
                                             "(default 0)")),
        ("seeds", Optional[str], typer.Option(None, "--seeds", help="comma-separated seeds or ranges, e.g. 0,1,2 "
                                              "or 0-15: the run once per seed (instead of --seed)")),
        ("force", bool, FORCE),
        ("db", Optional[str], DB),
        ("out", Optional[str], typer.Option(None, "--out", help="work directory: checkpoints, data caches, "
                                            f"figures, job stores (default: results/runs/{suite})")),
        ("nproc", int, typer.Option(1, "--nproc", help="processes on this machine: re-runs this command under "
                                    "torchrun (DDP, or FSDP2 where the suite's train config says strategy = fsdp; "
                                    "gloo on CPU, NCCL on CUDA)")),
        ("shard", Optional[str], typer.Option(None, "--shard", help="K/N: run only the K-th of N deterministic "
                                              "parts of the cells (K = 1..N), e.g. one job of an array; merge the "
                                              "stores with `attnbench ingest`")),
        ("launcher", str, typer.Option("local", "--launcher", help="local (this process), slurm (submitit: --jobs "
                                       "jobs, one shard and one store each under --out/jobs; merge with "
                                       "`attnbench ingest`), submitit-local (the same jobs as local processes; "
                                       "waits and merges into --db) or workers (--jobs processes of this command "
                                       "on this machine and one store, each taking the next unclaimed cell: many "
                                       "small cells at once on one GPU or many cores)")),
        ("jobs", int, typer.Option(1, "--jobs", help="with --launcher slurm, submitit-local or workers: number of "
                                   "jobs (shards) or worker processes")),
        ("partition", Optional[str], typer.Option(None, "--partition", help="with --launcher slurm: the Slurm "
                                                  "partition")),
        ("gpus_per_job", int, typer.Option(0, "--gpus-per-job", help="with --launcher slurm: GPUs per job")),
        ("job_minutes", int, typer.Option(240, "--job-minutes", help="with --launcher slurm: time limit of each "
                                          "job")),
        ("threads", Optional[int], typer.Option(None, "--threads", help="torch threads of the run, set once "
                                                "before any cell and recorded with every result (default: "
                                                "torch's, i.e. OMP_NUM_THREADS or the cores; 0: the same)")),
        ("compile", bool, flag(False, "--compile", help="train through torch.compile (the model's forward and "
                                "loss; timm's --torchcompile): recorded with every result, not part of a cell's "
                                "identity; off by default: on the CPU presets it does not pay (benchmarks/README.md)")),
        ("plugin", Optional[list[str]], typer.Option(None, "--plugin", metavar="SRC", help="load attention "
                                                     "mechanisms from SRC (a module, a .py file or a folder) "
                                                     "before any --attn is read; repeatable")),
    ]


SHARED = tuple(name for name, _, _ in _shared_options(""))


def _parse_seeds(text: str) -> list[int]:
    """``0,1,2``, ``0-15`` or both (``0-3,8``): the seeds in the order given."""
    out: list[int] = []
    try:
        for part in (x.strip() for x in text.split(",")):
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            out += list(range(int(lo), int(hi) + 1)) if sep and lo else [int(part)]
    except ValueError:
        raise AttnbenchError(f"--seeds {text!r}: expected comma-separated integers or ranges, e.g. 0,1,2 or "
                             f"0-15") from None
    return out


def run_options(*, seed: Optional[int] = None, seeds: Optional[str] = None, shard: Optional[str] = None,
                plugin: Optional[list[str]] = None, argv: Optional[list[str]] = None, **rest: Any):
    """The :class:`attnbench.engine.context.RunOptions` of the shared options as typer passes them (text as typed)."""
    if seed is not None and seeds is not None:
        raise AttnbenchError("--seed and --seeds: give one (--seeds 0,1,2 runs every seed, --seed 1 one)")
    if rest.get("launcher", "local") not in LAUNCHERS:
        raise AttnbenchError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {rest['launcher']!r}")
    return RunOptions(seed=seed, seeds=_parse_seeds(seeds) if seeds is not None else None, shard=parse_shard(shard),
                      plugins=list(plugin or []), argv=list(sys.argv) if argv is None else argv, **rest)


def run_command(*, suite: str, one_process: Optional[str] = None,
                no_training: Optional[str] = None) -> Callable[[Callable], Callable]:
    """Declare a suite's ``run`` command: the decorated function takes its own options plus ``opts`` (a
    :class:`attnbench.engine.context.RunOptions`); the command gets every shared option (``--seed``, ``--seeds``,
    ``--force``, ``--db``, ``--out``, ``--nproc``, ``--shard``, ``--launcher``, ``--jobs``, ``--partition``,
    ``--gpus-per-job``, ``--job-minutes``, ``--threads``, ``--compile``, ``--plugin``) after its own, from this one
    declaration.
    The options are parsed and checked (one-line errors) and ``--plugin`` sources are loaded before the function
    runs, so its specs may name plug-in mechanisms. ``one_process``: why the suite cannot use ``--nproc`` (it is
    then an error above 1); ``no_training``: why ``--compile`` (which compiles what the trainer trains) does not
    apply to the suite (it is then an error)."""
    import functools
    import inspect
    import typing

    shared = _shared_options(suite)

    def decorate(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
        if "opts" not in sig.parameters:
            raise TypeError(f"{fn.__qualname__}: a run command takes opts (the shared run options)")
        clash = [p for p in sig.parameters if p in SHARED]
        if clash:
            raise TypeError(f"{fn.__qualname__}: {', '.join(clash)} are shared run options (drop them)")
        own = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()
               if p.name != "opts"]
        params = own + [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=tp)
                        for name, tp, info in shared]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in SHARED}
            try:
                opts = run_options(**given)
                if one_process and opts.nproc > 1:
                    raise AttnbenchError(f"--nproc {opts.nproc}: {one_process}")
                if no_training and opts.compile:
                    raise AttnbenchError(f"--compile: {no_training}")
                if opts.plugins:  # before any spec of the command is parsed
                    plugins.activate(opts.plugins)
            except (AttnbenchError, ValueError, OSError, ImportError) as e:
                fail(str(e))
            return fn(**kwargs, opts=opts)

        del command.__wrapped__  # typer must read the signature below, not the function's
        command.__signature__ = sig.replace(parameters=params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate


def exit_with(call: Callable[[], int], opts=None) -> NoReturn:
    """Exit with the code ``call()`` returns (a suite's ``--smoke``); bad input or data: one line, no traceback.
    With the run's ``opts``: a smoke runs in this process on its own small data, so ``--nproc``, ``--launcher`` and
    ``--shard`` are errors, and ``--threads`` is set for it."""
    if opts is not None:
        unused = [flag for flag, given in (("--nproc", opts.nproc != 1), ("--launcher", opts.launcher != "local"),
                                           ("--shard", opts.shard is not None)) if given]
        if unused:
            fail(f"--smoke runs in this process on its own small data: drop {', '.join(unused)}")
        if opts.threads:
            import torch

            torch.set_num_threads(opts.threads)
    try:
        rc = call()
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))
    raise typer.Exit(code=rc)


def argv_tail() -> list[str]:
    """The arguments of this invocation after the program name (what a relaunch repeats)."""
    return list(sys.argv[1:])


def dispatch(opts, *, work) -> Optional[int]:
    """Where this command runs, by its :class:`attnbench.engine.context.RunOptions`. ``--launcher slurm|submitit-local``:
    submit ``--jobs`` shards of this same command line (each job its own store under ``WORK/jobs``) and return 0
    (merging the jobs' stores into ``--db`` when they are waited for); ``--launcher workers``: ``--jobs`` processes
    of this command line on one store, waited for, and their worst exit code; ``--nproc N > 1`` outside torchrun: rerun
    it under torchrun and return its exit code; else None: the caller runs the work in this process."""
    from pathlib import Path

    if opts.launcher == "workers":
        return sweep.launch_workers(argv_tail(), workers=opts.jobs, db=resolve_db(opts.db),
                                    folder=Path(work) / "workers", console=console)
    if opts.launcher != "local":
        folder = Path(work) / "jobs"
        dbs = sweep.launch_jobs(argv_tail(), jobs=opts.jobs, folder=folder, launcher=opts.launcher,
                          partition=opts.partition, gpus_per_job=opts.gpus_per_job, minutes=opts.job_minutes,
                          console=console)
        if opts.launcher == "submitit-local":  # waited for: merge the shards' stores into this command's store
            with Store(opts.db) as store:
                for path in dbs:
                    console.print(ingest(str(path), store))
        return 0
    return dist.relaunch_under_torchrun(opts.nproc, argv_tail(), console=console)


def machine_line(threads: Optional[int] = None) -> None:
    """Measure this machine (CPU model, ISA, fp32 matmul GFLOP/s; ~0.3 s) with the run's ``threads`` (its
    ``--threads``; None: torch's current count) and print its line, once per run (rank 0 under torchrun); the
    records of the run carry the measured GFLOP/s, so every table names its machine at the run's thread count."""
    import os

    from rich.markup import escape

    if os.environ.get("RANK", "0") == "0":
        console.print(escape(provenance.machine_line(provenance.machine(threads=threads))))


def finish(run: Callable[[], Any], *, suite: str, setting: str, db: Optional[str] = None, opts=None,
           machine: bool = True, table: bool = True) -> None:
    """The end of every suite's ``run`` command, the one path from the options to where the work runs: with
    ``opts`` (the shared :class:`attnbench.engine.context.RunOptions`), hand the command line to a launcher or torchrun
    when asked (:func:`dispatch`), else ``run()`` here (it returns a sweep summary or an exit code); then print
    the suite's table of ``setting`` and exit with the run's code. A torchrun worker exits without the table (the
    launching process prints it). ``machine`` / ``table``: print the machine line before and the table after (off
    for a suite that prints its own). Bad input or data: one line, no traceback."""

    db = opts.db if opts is not None else db
    try:
        check_writable(db)  # before any data is generated or any cell trains
        rc = dispatch(opts, work=opts.work(suite)) if opts is not None else None
        if rc is None:
            if machine:
                machine_line(opts.threads if opts is not None else None)
            summary = run()
            code = summary if isinstance(summary, int) else summary.exit_code()
            if dist.under_torchrun():
                raise typer.Exit(code=code)
            rc = code
    except (AttnbenchError, ValueError, OSError) as e:  # bad preset, data or store
        fail(str(e))
    if table:
        console.print()
        tables.table(suite, db=db, setting=setting, console=console)
    if rc:
        raise typer.Exit(code=rc)
