"""The one cell loop of every suite: plan cells, skip what the store has finished, run the rest, record each.

A suite turns its run into :class:`Cell` s (one per point of its grid: an LRA (task, attention) pair, a vision
or LM run, a scaling point) and a ``run_cell(cell, ctx) -> CellResult`` function; :func:`run_sweep` does the
rest, the same way for every suite:

- cells whose ``config_hash`` already has a finished record in the store are skipped (``force`` reruns them);
- ``--shard K/N`` keeps a deterministic 1/N of the cells (by config hash, so it does not depend on the order or
  on the other cells of the grid): N jobs with K = 1..N cover the grid exactly once;
- one rich progress display for the whole sweep (the trainer adds its per-cell line to it, ``ctx.progress``);
- exceptions become statuses: :class:`CellError` carries its own (``incorrect``, ``unsupported``, ...), an
  out-of-memory error is ``oom``, ``TimeoutError`` is ``timeout``, any other exception ``failed`` (with a short
  traceback in the record); Ctrl-C and SIGTERM record the cell in flight as ``interrupted`` and stop the sweep
  (a rerun resumes it: finished cells are skipped and the trainer resumes from its checkpoint);
- runs of this host whose process died (SIGKILL, power loss) are marked ``interrupted`` when a sweep starts;
- several processes may share one store: each cell is claimed in the store before it runs (a lease with the
  process, its host and start time, renewed while the cell runs, released after its record; see
  :meth:`attnbench.results.store.Store.claim`), so a second process skips a cell another one is running (and says so)
  instead of measuring it twice; a record whose timing overlapped another attnbench process on this host (any
  store) lists those processes in ``metrics["concurrent_attnbench"]``, and the tables mark it;
- one record per cell, a summary line, and :meth:`SweepSummary.exit_code`: 0 when every cell finished ok (or
  was finished before), 1 when any cell failed / was incorrect or when nothing was run at all, 130 when
  interrupted;
- the run's torch thread count (``threads``) is set once, before any cell, and every record carries the counts
  in force (``metrics["threads"]``, ``metrics["interop_threads"]``); no op changes them.

Under torchrun every rank runs the loop (the cells train data-parallel); only rank 0 reads and writes the store.

Launchers: :func:`launch_jobs` submits N shards of the same command line as N jobs through ``submitit`` (Slurm,
or its local executor), each with its own store, and says how to merge them (``attnbench ingest``).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from attnbench.core.errors import AttnbenchError, is_oom
from attnbench.engine.argv import strip_options
from attnbench.engine.interrupts import sigterm_as_interrupt
from attnbench.measure.peak import keep_freed_memory
from attnbench.results import provenance
from attnbench.results.store import Store

# Cell outcomes that make the command fail (oom / timeout are measurements of a point that is too large).
FAILING = ("failed", "incorrect")


class CellError(AttnbenchError):
    """A cell ends with ``status`` (e.g. ``incorrect``, ``unsupported``, ``failed``) and this message."""
    def __init__(self, message: str, status: str = "failed", metrics: Optional[dict] = None):
        super().__init__(message)
        self.status = status
        self.metrics = metrics or {}


@dataclasses.dataclass
class Cell:
    """One point of a suite's grid. ``params`` and ``options`` go into the record; ``payload`` is whatever the
    suite's ``run_cell`` needs (a spec, a config); ``config_hash`` is the point's identity in the store."""

    task: str
    attention: str
    config_hash: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    dtype: Optional[str] = None
    seed: Optional[int] = None
    payload: Any = None
    name: str = ""  # how summaries name the cell (default: "task · attention")

    @property
    def label(self) -> str:
        return self.name or f"{self.task} · {self.attention}"


@dataclasses.dataclass
class CellResult:
    status: str = "ok"
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    impl: Optional[str] = None
    error: Optional[str] = None


@dataclasses.dataclass
class CellContext:
    """What ``run_cell`` gets besides its cell: the shared progress display (None on ranks > 0 or without one),
    the process group, whether ``--force`` asked to start the cell from scratch and whether ``--compile`` asked
    for a compiled model."""

    progress: Any
    dist: Any
    force: bool
    compile: bool = False   # --compile: the suite's trainer runs the model through torch.compile


@dataclasses.dataclass
class Outcome:
    cell: Cell
    result: CellResult
    skipped: str = ""  # why the cell did not run ("" = it ran)

    @property
    def status(self) -> str:
        return "skipped" if self.skipped else self.result.status

    @property
    def task(self) -> str:
        return self.cell.task

    @property
    def attention(self) -> str:
        return self.cell.attention

    @property
    def metrics(self) -> dict[str, Any]:
        return self.result.metrics

    @property
    def error(self) -> Optional[str]:
        return self.result.error


@dataclasses.dataclass
class SweepSummary:
    suite: str
    setting: str
    outcomes: list[Outcome]
    interrupted: bool = False
    run_id: Optional[str] = None
    planned: int = 0  # runnable cells of the whole grid (before --shard; not those skipped before the loop)

    @property
    def ran(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.skipped]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes:
            key = o.result.status if not o.skipped else ("finished earlier" if o.result.status == "ok" else
                                                         o.result.status)
            out[key] = out.get(key, 0) + 1
        return out

    def exit_code(self) -> int:
        if self.interrupted:
            return 130
        if any(o.result.status in FAILING for o in self.ran):
            return 1
        if not self.planned:  # nothing could run (e.g. every task lacked data); an empty shard is fine
            return 1
        return 0

    def line(self) -> str:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(self.counts().items())) or "no cells"
        why = ""
        if self.interrupted:
            why = " — interrupted: rerun the same command to resume"
        elif not self.planned:
            why = " — nothing to run"
        elif not self.outcomes:
            why = " — no cell of the grid falls in this shard"
        elif any(o.result.status in FAILING for o in self.ran):
            bad = [o.cell.label for o in self.ran if o.result.status in FAILING]
            why = f" — failed: {', '.join(bad)}"
        return f"{self.suite} {self.setting}: {counts}{why}"


def merge_summaries(summaries: Sequence[SweepSummary]) -> SweepSummary:
    """One summary of several sweeps run one after the other (e.g. one per seed, for a suite whose cells of a seed
    depend on a model trained at that seed): every outcome, interrupted if any was, the last run's id."""
    if not summaries:
        raise ValueError("no sweep to summarise")
    first = summaries[0]
    return SweepSummary(first.suite, first.setting, [o for s in summaries for o in s.outcomes],
                        interrupted=any(s.interrupted for s in summaries), run_id=summaries[-1].run_id,
                        planned=sum(s.planned for s in summaries))


def per_seed(opts, run_one: Callable[[Any], SweepSummary]) -> Optional[SweepSummary]:
    """For a runner whose cells of a seed depend on what is trained at that seed (a teacher): with several
    ``opts.seeds``, ``run_one(opts for one seed)`` for each seed in turn (stopping at an interruption), so each
    seed's cells are exactly those of a ``--seed`` run of it; None with one seed (the caller runs it)."""
    if len(opts.seeds) < 2:
        return None
    done = []
    for s in opts.seeds:
        done.append(run_one(opts.replace(seed=s)))
        if done[-1].interrupted:
            break
    return merge_summaries(done)


# --- shards -------------------------------------------------------------------------------------------------
def parse_shard(text: Optional[str]) -> Optional[tuple[int, int]]:
    """``"K/N"`` -> ``(K, N)`` with 1 <= K <= N; None -> None."""
    if text is None or text == "":
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise AttnbenchError(f"--shard {text!r}: expected K/N with integers, e.g. 1/4") from None
    if not (n >= 1 and 1 <= k <= n):
        raise AttnbenchError(f"--shard {text!r}: need 1 <= K <= N, e.g. 1/4 .. 4/4")
    return k, n


def in_shard(config_hash: str, shard: Optional[tuple[int, int]]) -> bool:
    if shard is None:
        return True
    k, n = shard
    return int(config_hash, 16) % n == k - 1


def shard_cells(cells: Sequence[Cell], shard: Optional[tuple[int, int]]) -> list[Cell]:
    """The cells of shard ``(K, N)``: decided by each cell's config hash alone."""
    return [c for c in cells if in_shard(c.config_hash, shard)]


# --- the loop -----------------------------------------------------------------------------------------------
def _result_of(exc: BaseException) -> CellResult:
    if isinstance(exc, CellError):
        return CellResult(exc.status, metrics=exc.metrics, error=str(exc))
    if is_oom(exc):
        return CellResult("oom", error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    if isinstance(exc, TimeoutError):
        return CellResult("timeout", error=str(exc) or "timed out")
    tb = traceback.format_exc(limit=6)
    return CellResult("failed", error=f"{type(exc).__name__}: {exc}\n{tb}")


def _progress(console, enabled: bool):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console,
                    disable=not enabled or not console.is_terminal, transient=False)  # no bars in a log file


def run_sweep(cells: Sequence[Cell], run_cell: Callable[[Cell, CellContext], CellResult], *, suite: str,
              setting: str, db: Optional[str] = None, config: Optional[dict] = None, device: str = "cpu",
              threads: Optional[int] = None, force: bool = False, shard: Optional[tuple[int, int]] = None,
              compile: bool = False, console=None, progress: bool = True, argv: Optional[list[str]] = None, dist=None,
              describe: Optional[Callable[[Outcome], str]] = None,
              skipped: Sequence[Outcome] = ()) -> SweepSummary:
    """Run ``cells`` (see the module docstring). ``skipped`` are outcomes decided before the loop (e.g. a task
    without data), reported with the rest; ``describe(outcome)`` is the suite's one-line report of a cell.
    ``threads``: torch intra-op threads for the whole run, set here once on every rank (None or 0: the count
    as it is, torch's default or ``OMP_NUM_THREADS``, per rank under torchrun). ``compile`` reaches each cell
    (:class:`CellContext`) and every record of a result carries it (``metrics["compile"]``), as the thread count:
    an execution setting, not part of a cell's identity (the config hash), since a compiled step computes the
    same function to rounding, as a step on another thread count does."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    if threads:  # a run parameter, set once here: no op chooses its own count
        import torch

        torch.set_num_threads(threads)
    keep_freed_memory()
    main = dist is None or dist.main
    bcast = (lambda x: x) if dist is None else dist.broadcast
    planned = len(cells)
    cells = shard_cells(cells, shard)
    store = Store(db) if main else None
    outcomes: list[Outcome] = list(skipped)
    try:
        if main:
            for note in store.reap_dead_runs():
                console.print(f"[yellow]{note}[/]")
        finished = bcast(store.finished(suite, [c.config_hash for c in cells]) if main and not force else set())
        todo = [c for c in cells if c.config_hash not in finished]
        outcomes += [Outcome(c, CellResult("ok"), skipped="finished earlier (--force reruns it)")
                     for c in cells if c.config_hash in finished]
        if finished and main:
            console.print(f"{len(cells) - len(todo)} cell(s) already finished in {store.path} are skipped "
                          f"(--force reruns them)")
        run = None
        if main:
            cfg = {**(config or {}), "shard": list(shard) if shard else None}
            run = store.start_run(suite=suite, setting=setting, config=cfg, device=device, threads=threads,
                                  argv=argv)
        interrupted = False
        bars = _progress(console, progress and main)
        with bars, sigterm_as_interrupt():
            overall = bars.add_task(f"{suite} cells", total=len(todo), info="")
            ctx = CellContext(progress=bars if main and progress else None, dist=dist, force=force, compile=compile)
            for cell in todo:
                skip = _claim(cell, store, run, suite, force, bcast)
                if skip is not None:
                    outcomes.append(skip)
                    if main:
                        bars.console.print(f"  {escape(cell.label)} [yellow]skipped[/]: {escape(skip.skipped)}")
                        bars.advance(overall)
                    continue
                result, interrupted = _measure(cell, run_cell, ctx, db, store, run, device)
                outcome = Outcome(cell, result)
                if main:
                    bars.console.print(describe(outcome) if describe else default_line(outcome))
                    bars.advance(overall)
                outcomes.append(outcome)
                if interrupted:
                    break
        summary = SweepSummary(suite, setting, outcomes, interrupted=interrupted,
                               run_id=run.run_id if run else None, planned=planned)
        if main:  # a run whose command fails (a cell failed, or nothing could run) is not recorded as ok
            code = summary.exit_code()
            store.finish_run(run.run_id, "interrupted" if interrupted else ("failed" if code else "ok"),
                             note=None if not code or interrupted else summary.line())
        if main:
            color = "yellow" if interrupted else ("red" if summary.exit_code() else "green")
            console.print(f"[{color}]{summary.line()}[/]")
        return summary
    finally:
        if store is not None:
            store.close()


def _claim(cell: Cell, store: Optional[Store], run, suite: str, force: bool, bcast) -> Optional[Outcome]:
    """Take ``cell`` for this run in the store (the main rank asks, every rank hears): None when taken, else the
    outcome of a cell another process finished meanwhile or is running now."""
    claim, holder = store.claim(suite, cell.config_hash, run_id=run.run_id, label=cell.label, force=force) \
        if store is not None else ("claimed", None)
    claim, holder = bcast((claim, holder))
    if claim == "claimed":
        return None
    why = ("finished meanwhile by another process" if claim == "finished" else
           f"another process is running it (pid {holder['pid']} on {holder['hostname']}, since "
           f"{holder['started_at']}); rerun later to pick up its result")
    return Outcome(cell, CellResult("ok" if claim == "finished" else "skipped"), skipped=why)


def _measure(cell: Cell, run_cell, ctx: CellContext, db: Optional[str], store: Optional[Store], run,
             device: str) -> tuple[CellResult, bool]:
    """Run one claimed cell and record it (the main rank, ``store`` given); returns its result and whether the
    sweep was interrupted (Ctrl-C or SIGTERM: the cell is ``interrupted`` and the sweep stops). Every other failure
    of the cell is its result; a process abandoning the cell releases it."""
    started = provenance.now()
    watch = _Watch(db, store.path if store is not None else None)
    interrupted = False
    try:
        result = run_cell(cell, ctx)
    except KeyboardInterrupt:
        interrupted = True
        result = CellResult("interrupted", error="interrupted (Ctrl-C or SIGTERM); rerun the same command to resume")
    except Exception as exc:  # noqa: BLE001 - every failure of one cell is recorded, the sweep goes on
        result = _result_of(exc)
    except BaseException:  # the process abandons the cell unrecorded: it no longer holds it
        watch.stop()
        if store is not None:
            store.release(cell.config_hash)
        raise
    others = watch.stop()
    if others and result.metrics is not None:
        result.metrics = {**result.metrics, "concurrent_attnbench": others}
    if result.metrics is not None:
        result.metrics = {**result.metrics, "compile": ctx.compile}
    if store is not None:
        store.add(run.record(task=cell.task, attention=cell.attention, status=result.status, options=cell.options,
                             impl=result.impl, dtype=cell.dtype, params=cell.params, metrics=result.metrics,
                             seed=cell.seed, error=result.error, started_at=started, ended_at=provenance.now(),
                             device=device, config_hash=cell.config_hash))
        store.release(cell.config_hash)
    return result, interrupted


# --- other processes ----------------------------------------------------------------------------------------
def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _is_attnbench(argv: list[str]) -> bool:
    """Whether ``argv`` is an attnbench command (the console script or ``-m attnbench...``)."""
    prog = os.path.basename(argv[0]) if argv else ""
    if prog == "attnbench":  # the console script run directly (exec -a attnbench, a frozen binary)
        return True
    return prog.startswith("python") and len(argv) > 1 and (
        os.path.basename(argv[1]) == "attnbench" or (argv[1] == "-m" and len(argv) > 2
                                                     and argv[2].split(".")[0] == "attnbench"))


def _launches_workers(argv: list[str]) -> bool:
    """Whether ``argv`` is a ``--launcher workers`` command: its children are workers, each running cells of its
    own (:func:`launch_workers`)."""
    return "--launcher=workers" in argv or any(a == "--launcher" and b == "workers" for a, b in zip(argv, argv[1:]))


def other_attnbench_processes() -> list[dict[str, Any]]:
    """attnbench commands running on this host besides this one and its own family (its torchrun launcher and
    ranks, its data-loader workers): ``[{"pid", "argv"}]`` (:func:`others_in`). Empty where ``/proc`` is not
    available."""
    if not os.path.isdir("/proc"):
        return []
    table = {int(name): (_ppid(int(name)), _cmdline(int(name))) for name in os.listdir("/proc") if name.isdigit()}
    return others_in(table, os.getpid())


def others_in(table: dict[int, tuple[Optional[int], list[str]]], me: int) -> list[dict[str, Any]]:
    """The attnbench processes of ``table`` (pid: (parent pid, command line)) outside ``me``'s family: the
    processes above it, and everything under the outermost attnbench (or torchrun) process above it, which runs the
    same cell (a torchrun launcher and its ranks, data-loader workers). A ``--launcher workers`` command ends the
    climb: its workers are each other's load, each training cells of its own."""
    top, cur, family = me, me, set()
    while True:
        parent = table.get(cur, (None, []))[0]
        if not parent or parent <= 1:
            break
        family.add(parent)
        argv = table.get(parent, (None, []))[1]
        if _is_attnbench(argv):
            if _launches_workers(argv):
                break
            top = parent
        elif "torchrun" in " ".join(argv[:3]):
            top = parent
        cur = parent
    children: dict[int, list[int]] = {}
    for pid, (pp, _argv) in table.items():
        if pp is not None:
            children.setdefault(pp, []).append(pid)
    stack = [top]
    while stack:
        p = stack.pop()
        family.add(p)
        stack += children.get(p, [])
    return [{"pid": pid, "argv": _short(argv)} for pid, (_pp, argv) in sorted(table.items())
            if pid not in family and _is_attnbench(argv)]


def _short(argv: list[str]) -> str:
    """``attnbench run lra ...`` of a command line (the interpreter and script path left out), at most 120 chars."""
    i = next((i for i, a in enumerate(argv[:3]) if os.path.basename(a) == "attnbench" or a.startswith("attnbench")),
             -1)
    return " ".join(["attnbench", *argv[i + 1:]])[:120]


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a for a in f.read().decode(errors="replace").split("\0") if a]
    except OSError:
        return []


class _Watch:
    """While a cell runs: renew this process's claims in the store and note the other attnbench processes of this
    host (a background thread with its own connection; every :data:`WATCH_S` seconds)."""

    def __init__(self, db, path) -> None:
        import threading

        self.path = path
        self.others: dict[int, str] = {}
        self._sample()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="attnbench-watch")
        self._thread.start()

    def _sample(self) -> None:
        for p in other_attnbench_processes():
            self.others.setdefault(p["pid"], p["argv"])

    def _loop(self) -> None:
        n = 0
        while not self._stop.wait(WATCH_S):
            self._sample()
            n += 1
            if self.path is not None and n % max(1, int(RENEW_S // WATCH_S)) == 0:
                try:
                    with Store(self.path) as st:
                        st.renew()
                except Exception:  # noqa: BLE001 - a missed renewal only shortens the lease
                    pass

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()
        return [{"pid": pid, "argv": argv} for pid, argv in sorted(self.others.items())][:MAX_LISTED]


WATCH_S = 2.0    # how often a running cell looks for other attnbench processes
MAX_LISTED = 20  # of them, at most this many are listed in a record
RENEW_S = 60.0   # how often it renews its claim (well below store.LEASE_STALE_S)


def default_line(o: Outcome) -> str:
    from rich.markup import escape

    r = o.result
    head = f"  {escape(o.cell.label)}"
    if r.status == "ok":
        return f"{head} [green]ok[/]"
    color = "yellow" if r.status in ("interrupted", "oom", "timeout") else "red"
    return f"{head} [{color}]{r.status}[/]  {escape((r.error or '').splitlines()[0] if r.error else '')}"


# --- launchers ----------------------------------------------------------------------------------------------
LAUNCHER_OPTIONS = {"--launcher": True, "--jobs": True, "--partition": True, "--gpus-per-job": True,
                    "--job-minutes": True, "--shard": True, "--db": True}
LAUNCHERS = ("local", "slurm", "submitit-local", "workers")


def shard_db(folder: Path, k: int, n: int) -> Path:
    return Path(folder) / f"shard-{k}-of-{n}.db"


def launch_jobs(argv: Sequence[str], *, jobs: int, folder: str | os.PathLike, launcher: str = "slurm",
                partition: Optional[str] = None, gpus_per_job: int = 0, minutes: int = 240,
                wait: Optional[bool] = None, console=None) -> list[Path]:
    """Submit ``jobs`` shards of the command line ``argv`` (``attnbench`` arguments) through submitit: job K runs
    ``attnbench ARGV --shard K/N --db FOLDER/shard-K-of-N.db``. ``launcher="slurm"`` submits to Slurm (and
    returns); ``"submitit-local"`` runs the jobs as local processes with submitit's local executor and waits
    (``wait``). Returns the shard stores; merge them with ``attnbench ingest`` (done here when waiting)."""
    if launcher not in ("slurm", "submitit-local"):
        raise AttnbenchError(f"launch_jobs: launcher must be slurm or submitit-local, got {launcher!r}")
    if jobs < 1:
        raise AttnbenchError(f"--jobs must be >= 1, got {jobs}")
    try:
        import submitit
    except ImportError:
        raise AttnbenchError("--launcher slurm needs submitit: pip install submitit") from None

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    base = strip_options(argv, LAUNCHER_OPTIONS)
    if launcher == "slurm":
        ex = submitit.AutoExecutor(folder=str(folder / "submitit"), cluster="slurm")
        params: dict[str, Any] = {"timeout_min": minutes, "slurm_partition": partition} if partition else \
            {"timeout_min": minutes}
        if gpus_per_job:
            params["gpus_per_node"] = gpus_per_job
        ex.update_parameters(**params)
    else:
        ex = submitit.LocalExecutor(folder=str(folder / "submitit"))
        ex.update_parameters(timeout_min=minutes)
    dbs = [shard_db(folder, k, jobs) for k in range(1, jobs + 1)]
    cmds = [[sys.executable, "-m", "attnbench.cli.main", *base, "--shard", f"{k}/{jobs}", "--db", str(db)]
            for k, db in zip(range(1, jobs + 1), dbs)]
    submitted = [ex.submit(submitit.helpers.CommandFunction(cmd, verbose=False)) for cmd in cmds]
    if console is not None:
        for job, cmd in zip(submitted, cmds):
            console.print(f"submitted job {job.job_id}: {' '.join(cmd[3:])}")
    wait = (launcher == "submitit-local") if wait is None else wait
    if not wait:
        if console is not None:
            console.print(f"when the jobs are done, merge their stores: attnbench ingest {folder}/shard-*-of-{jobs}.db")
        return dbs
    failures = []
    for k, job in enumerate(submitted, 1):
        try:
            job.result()
        except Exception:  # noqa: BLE001 - every job's failure is reported
            failures.append(f"job {job.job_id} (shard {k}/{jobs}) failed, see {job.paths.stdout}")
    if failures:
        raise AttnbenchError("; ".join(failures))
    return dbs


def launch_workers(argv: Sequence[str], *, workers: int, db: str | os.PathLike, folder: str | os.PathLike,
                   console=None) -> int:
    """``workers`` processes of the command line ``argv`` (``attnbench`` arguments) on this machine, all on the one
    store ``db``: each takes the next cell no other has claimed (:meth:`Store.claim`), so cells of uneven length
    keep every worker busy until the grid is done, and no cell runs twice; the workers share the host, so each
    record names the others it ran beside (``concurrent_attnbench``: its timings are marked). Each worker's output
    goes to ``FOLDER/worker-K.log``. Waits for all; returns the worst exit code (130 if any was interrupted, else 1 if any
    failed). Ctrl-C or SIGTERM stops every worker (each records its cell in flight as interrupted)."""
    import signal
    import subprocess

    if workers < 1:
        raise AttnbenchError(f"--jobs must be >= 1, got {workers}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    base = strip_options(argv, LAUNCHER_OPTIONS)
    cmd = [sys.executable, "-m", "attnbench.cli.main", *base, "--db", str(Path(db).resolve())]
    logs = [folder / f"worker-{k}.log" for k in range(1, workers + 1)]
    procs = []
    try:
        with sigterm_as_interrupt():
            for log in logs:
                with open(log, "w") as f:
                    procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                                  env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONSAFEPATH": "1"}))
            if console is not None:
                console.print(f"{workers} workers on one store ({db}): {' '.join(cmd[3:])}; logs {folder}/worker-K.log")
            codes = []
            for k, p in enumerate(procs, 1):
                codes.append(p.wait())
                if console is not None:
                    console.print(f"worker {k} exited {codes[-1]}")
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait()
        return 130
    return 130 if 130 in codes else max(codes)
