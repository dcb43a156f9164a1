"""The scaling sweep: every (attention spec, mode, causal, dtype, N) point measured in its own child process.

An attention is a spec (:mod:`attnbench.api.spec`: ``nala`` or ``nala:lam=2``); its options, over the preset's
options for that mechanism, are recorded with every point and make it a point of its own. When a run starts,
runs of this host whose process was killed are marked ``interrupted``
(:meth:`attnbench.results.store.Store.reap_dead_runs`), and the machine (:func:`attnbench.results.provenance.machine`) is printed
and recorded in the run's environment.

The loop is the one of every suite, :func:`attnbench.engine.sweep.run_sweep` (skip finished points, ``--shard K/N``,
statuses, summary, exit code); this module turns the plan into cells and measures one cell. For each point, in a
fresh child (:func:`attnbench.measure.isolation.run_in_child`): the correctness gate at a small shape
(status ``incorrect``, no timing, if it fails), the first call at N (its process-level peak memory), one call
under the FLOP counter and the tensor-level memory count, then warm-up and repeated timing
(:func:`.measure.measure_point`). The parent records one measurement
per point in the store as soon as the point ends, so Ctrl-C or a kill loses only the point in flight, and a
re-run skips the points already finished (``force`` measures them again).

A point that runs out of memory or over its time budget is recorded ``oom`` / ``timeout`` and the sweep goes
on; larger N of the same (attention spec, task, dtype) are then recorded ``skipped`` (not attempted) instead of
spending the budget again (within one shard: with ``--shard``, the smaller N may be in another job's shard). A
mechanism that has no form for the request (a bidirectional-only mechanism asked for causal) is recorded
``unsupported``.

Test hook: ``inject`` (or the environment variable ``ATTNBENCH_INJECT``) is a comma-separated list of
``kind:attention:N[:mode]`` with kind ``oom``, ``timeout`` or ``fail``: that point's child raises an
out-of-memory error, sleeps past its budget, or raises.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, Iterable

from attnbench.api import registry
from attnbench.api.spec import AttentionSpec, Spec, as_specs, label_of
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunContext, RunOptions
from attnbench.engine.smoke import fmt_duration, smoke_dirs
from attnbench.engine.sweep import Cell, CellResult
from attnbench.measure import isolation
from attnbench.measure.flops import count_flops
from attnbench.measure.timing import make_step
from attnbench.results import provenance
from attnbench.results.records import Measurement, point_hash
from attnbench.results.store import Store
from attnbench.views import tables
from attnbench.views.rows import fmt_bytes, fmt_time

from .config import DEFAULT_PRESET, Grid, ScalingPreset, load_preset, parse_seq, parse_seq_list, task_name
from .measure import PointSpec, measure_point
from attnbench.views.sources import Source

SUITE = "scaling"
INJECT_ENV = "ATTNBENCH_INJECT"
INJECT_KINDS = ("oom", "timeout", "fail")


def spec_label(attention: str, options: dict[str, Any]) -> str:
    """``name`` or ``name:key=value:...`` (an :class:`AttentionSpec`'s label, also for a stored record)."""
    return label_of(attention, options)


@dataclasses.dataclass
class Point:
    attention: str
    mode: str
    causal: bool
    seq_len: int
    dtype: str
    options: dict[str, Any]

    @property
    def task(self) -> str:
        return task_name(self.mode, self.causal)

    @property
    def spec(self) -> str:
        return spec_label(self.attention, self.options)

    def label(self) -> str:
        return f"{self.spec} {self.task} N={self.seq_len} {self.dtype}"


@dataclasses.dataclass
class ScalingPlan:
    """A resolved sweep: the preset after command-line overrides, the setting name and the points."""
    preset: ScalingPreset
    setting: str
    attentions: list[str]       # spec labels (name or name:key=value...)
    missing: list[str]          # preset names not registered (skipped with a warning)
    threads: int
    points: list[Point]

    def params(self, p: Point) -> dict[str, Any]:
        params = {"seq_len": p.seq_len, "mode": p.mode, "causal": p.causal, "batch": self.preset.batch,
                  "heads": self.preset.heads, "head_dim": self.preset.head_dim, "threads": self.threads}
        if self.preset.seed:  # another seed's inputs are another point; seed 0's keep the identity they had
            params["seed"] = self.preset.seed
        return params

    def point_hash(self, p: Point) -> str:
        return point_hash(suite=SUITE, setting=self.setting, task=p.task, attention=p.attention, options=p.options,
                          params=self.params(p), dtype=p.dtype, device=self.preset.device)

    def config(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self.preset), "attentions": self.attentions, "setting": self.setting,
                "threads": self.threads}


def plan_scaling(preset: str | ScalingPreset = DEFAULT_PRESET, *,
                 attentions: Iterable[str | AttentionSpec] | None = None,
                 seq: Iterable[int | str] | None = None, modes: Iterable[str] | None = None,
                 causal: bool | None = None, dtypes: Iterable[str] | None = None, device: str | None = None,
                 batch: int | None = None, heads: int | None = None, head_dim: int | None = None,
                 threads: int | None = None, time_budget: float | None = None,
                 mem_budget_gb: float | None = None, seed: int | None = None) -> ScalingPlan:
    """Apply command-line overrides to a preset and list the points.

    ``attentions`` replaces the preset's list: attention specs (:class:`attnbench.api.spec.AttentionSpec`, or their
    text ``name[:key=value...]``), each validated, its options over the preset's options for that mechanism
    (the preset's own names that are not registered yet are skipped with a warning). Every spec is built once at
    the plan's sizes, so a value the mechanism refuses fails here, before any point runs. ``seq`` replaces the
    sequence lengths of every grid entry; ``modes`` keeps only those modes (a mode the preset lacks gets an entry
    with the first entry's lengths);
    ``causal`` True/False makes every entry causal/bidirectional. Overriding the batch, heads, head size or
    threads changes the setting name (``scaling/<preset>[h8,d128]``): those numbers are not comparable. ``seed``
    replaces the preset's seed of the random inputs.
    """
    p = load_preset(preset) if isinstance(preset, str) else preset
    over: dict[str, Any] = {}
    for key, val in (("batch", batch), ("heads", heads), ("head_dim", head_dim), ("threads", threads)):
        if val is not None and val != getattr(p, key):
            over[key] = val
    changes: dict[str, Any] = dict(over)
    if dtypes is not None:
        changes["dtypes"] = list(dtypes)
    if device is not None:
        changes["device"] = device
    if time_budget is not None:
        changes["time_budget"] = float(time_budget)
    if mem_budget_gb is not None:
        changes["mem_budget_gb"] = float(mem_budget_gb)
    if seed is not None:
        changes["seed"] = int(seed)
    grid = list(p.grid)
    if modes is not None:
        modes = list(modes)
        by_mode = {g.mode: g for g in grid}
        grid = [g for g in grid if g.mode in modes]
        for m in modes:
            if m not in by_mode:
                grid.append(Grid(mode=m, seq=list(p.grid[0].seq), causal=p.grid[0].causal))
    if causal is not None:
        seen, fixed = set(), []
        for g in grid:
            if g.mode not in seen:
                seen.add(g.mode)
                fixed.append(Grid(mode=g.mode, seq=list(g.seq), causal=causal))
        grid = fixed
    if seq is not None:
        lengths = [parse_seq(s) for s in seq]
        grid = [Grid(mode=g.mode, seq=list(lengths), causal=g.causal) for g in grid]
    changes["grid"] = grid
    p = dataclasses.replace(p, **changes)
    if p.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise AttnbenchError(f"--device {p.device}: torch.cuda.is_available() is False here")
    elif p.device != "cpu":
        raise AttnbenchError(f"--device must be 'cpu' or 'cuda[:i]', got {p.device!r}")

    known = set(registry.names())
    if attentions is not None:
        specs = [s.with_defaults(p.options.get(s.name)) for s in as_specs(attentions)]  # did-you-mean on a typo
        missing: list[str] = []
    else:
        specs = [AttentionSpec.make(n, p.options.get(n)) for n in p.attentions if n in known]
        missing = [n for n in p.attentions if n not in known]
        if missing:
            warnings.warn(f"preset {p.name!r}: not registered (yet), skipped: {', '.join(missing)}", stacklevel=2)
    labels = [s.label for s in specs]
    dup = sorted({x for x in labels if labels.count(x) > 1})
    if dup:
        raise AttnbenchError(f"attention(s) given more than once: {', '.join(dup)}")
    n_min = min(n for g in p.grid for n in g.seq)
    for s in specs:
        desc = registry.describe(s.name)
        s.check_builds(heads=p.heads, head_dim=p.head_dim, seq_len=n_min, causal=not desc["bidirectional"])
    setting = p.key  # scaling/<name> unless the preset sets its own
    if over:
        short = {"batch": "b", "heads": "h", "head_dim": "d", "threads": "t"}
        setting += "[" + ",".join(f"{short[k]}{v}" for k, v in over.items()) + "]"
    import torch

    n_threads = p.threads or torch.get_num_threads()
    points = []
    for g in p.grid:
        for dtype in p.dtypes:
            for n in g.seq:
                for s in specs:
                    points.append(Point(attention=s.name, mode=g.mode, causal=g.causal, seq_len=n, dtype=dtype,
                                        options=dict(s.options)))
    return ScalingPlan(preset=p, setting=setting, attentions=labels, missing=missing, threads=n_threads,
                       points=points)


def parse_inject(spec: str | None) -> dict[tuple, str]:
    """``"oom:softmax:4096,timeout:linear:1k:fwd"`` -> ``{("softmax", 4096, None): "oom", ...}``."""
    out: dict[tuple, str] = {}
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        parts = item.strip().split(":")
        if len(parts) not in (3, 4) or parts[0] not in INJECT_KINDS:
            raise AttnbenchError(f"bad injection {item!r}: expected kind:attention:N[:mode], kind in {INJECT_KINDS}")
        mode = parts[3] if len(parts) == 4 else None
        out[(parts[1], parse_seq(parts[2]), mode)] = parts[0]
    return out


@dataclasses.dataclass
class ScalingResult:
    run_id: str | None
    setting: str
    records: list[Measurement]      # the records of this run, in the order they were measured
    resumed: int                    # points skipped because the store already had them finished
    interrupted: bool = False
    exit_code: int = 0              # the sweep's: 0 ok, 1 a point failed or was incorrect, 130 interrupted

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r.status] = out.get(r.status, 0) + 1
        return out


def _summary_line(status: str, metrics: dict[str, Any], error: str | None) -> str:
    from rich.markup import escape

    if status != "ok":
        why = (error or "").strip().splitlines()
        return f"[yellow]{status}[/]" + (f" ({escape(why[-1][:120])})" if why else "")

    mt = metrics
    med, iqr = mt.get("time_median_s"), mt.get("time_iqr_s") or 0.0
    gf = mt.get("gflops")
    parts = [f"[green]ok[/] {fmt_time(med)} ±{100 * iqr / med if med else 0:.0f}%"]
    if mt.get("peak_tensor_bytes") is not None:
        rss = mt.get("peak_rss_bytes")
        parts.append(f"{fmt_bytes(mt['peak_tensor_bytes'])} tensors (RSS "
                     f"{fmt_bytes(rss) if rss is not None else 'below resolution'})")
    if gf:
        parts.append(f"{gf:.3g} GFLOP/s")
    return " · ".join(parts)


def cells_of(plan: ScalingPlan) -> list[Cell]:
    """The plan's points as :class:`attnbench.engine.sweep.Cell` s (N ascending within each attention, task, dtype)."""
    return [Cell(task=p.task, attention=p.attention, config_hash=plan.point_hash(p), options=dict(p.options),
                 params=plan.params(p), dtype=p.dtype, seed=plan.preset.seed, payload=p, name=p.label())
            for p in plan.points]


def run_scaling(plan: ScalingPlan, store: Store, *, force: bool = False, inject: str | None = None,
                console=None, progress: bool = True, argv: list[str] | None = None, child: bool = True,
                machine: dict | None = None, shard: tuple[int, int] | None = None) -> ScalingResult:
    """Measure every point of ``plan`` (of shard ``(K, N)`` if given) into ``store``; returns this run's records.

    The loop is :func:`attnbench.engine.sweep.run_sweep` (skip finished points, reap runs of dead processes, statuses,
    Ctrl-C / SIGTERM -> the point in flight ``interrupted`` and the run interrupted, summary, exit code); each
    point runs in a child process (``child=False``: in this process, no memory isolation, no time limit; for
    debugging). Before the sweep the machine is measured (or ``machine``, already measured, is used) so the run's
    environment records it. Larger N of an (attention spec, task, dtype) that ended ``oom`` / ``timeout``, in an
    earlier run or earlier in this one, are recorded ``skipped``.
    """
    from rich.console import Console

    console = console or Console(stderr=True)
    run = RunContext(RunOptions(db=str(store.path), force=force, shard=shard, argv=argv), suite=SUITE,
                     console=console, progress=progress)
    injected = parse_inject(inject if inject is not None else os.environ.get(INJECT_ENV))
    pre = plan.preset
    mem_budget = int(pre.mem_budget_gb * 2**30) if pre.mem_budget_gb and pre.device == "cpu" else None
    if machine is None or machine.get("matmul_fp32_gflops") is None:
        provenance.machine(threads=plan.threads)   # provenance.environment() records it with the run
    failed_at: dict[tuple, tuple[int, str]] = {}
    if not force:
        for m in store.measurements(suite=SUITE, setting=plan.setting, status=("oom", "timeout")):
            key = (spec_label(m.attention, m.options), m.task, m.dtype)
            n = int(m.params.get("seq_len", 0))
            if key not in failed_at or n < failed_at[key][0]:
                failed_at[key] = (n, m.status)

    def run_cell(cell: Cell, ctx) -> CellResult:
        p: Point = cell.payload
        desc = registry.describe(p.attention)
        if (p.causal and not desc["causal"]) or (not p.causal and not desc["bidirectional"]):
            return CellResult("unsupported", error=f"{p.attention} has no {'causal' if p.causal else 'bidirectional'} "
                                                   f"form")
        key = (p.spec, p.task, p.dtype)
        if key in failed_at and p.seq_len > failed_at[key][0]:
            n0, st = failed_at[key]
            return CellResult("skipped", error=f"not attempted: N={n0} already ended {st}")
        kind = injected.get((p.attention, p.seq_len, p.mode)) or injected.get((p.attention, p.seq_len, None))
        spec = PointSpec(
            attention=p.attention, seq_len=p.seq_len, mode=p.mode, causal=p.causal, dtype=p.dtype,
            device=pre.device, batch=pre.batch, heads=pre.heads, head_dim=pre.head_dim, options=p.options,
            seed=pre.seed, threads=plan.threads, check_seq_len=pre.check.seq_len, rtol=pre.check.rtol,
            warmup_ms=pre.timing.warmup_ms, rep_ms=pre.timing.rep_ms, min_reps=pre.timing.min_reps,
            max_reps=pre.timing.max_reps, inject=kind)
        line = _in_flight(ctx, p)
        try:
            if child:
                out = isolation.run_in_child(measure_point, spec, timeout=pre.time_budget,
                                             mem_budget_bytes=mem_budget)
            else:
                out = isolation.run_inline(measure_point, spec)
        finally:
            if line is not None:
                ctx.progress.remove_task(line)
        res = out.result or {}
        metrics = dict(res.get("metrics") or {})
        metrics["wall_s"] = round(out.wall_s, 3)
        if out.status in ("oom", "timeout"):
            failed_at[key] = (p.seq_len, out.status)
        return CellResult(out.status, metrics=metrics, impl=res.get("impl"), error=out.error)

    def describe(o) -> str:
        p: Point = o.cell.payload
        return f"  {p.label():<44} {_summary_line(o.status, o.metrics, o.error)}"

    # every point is measured in its own child process: no process group, the plan's threads
    summary = run.sweep(cells_of(plan), run_cell, setting=plan.setting, config=plan.config(), device=pre.device,
                        threads=plan.threads, dist=None, describe=describe)
    records = store.measurements(run_id=summary.run_id) if summary.run_id else []
    return ScalingResult(run_id=summary.run_id, setting=plan.setting, records=records,
                         resumed=summary.counts().get("finished earlier", 0), interrupted=summary.interrupted,
                         exit_code=summary.exit_code())


def _in_flight(ctx, p: Point):
    """A row of the sweep's progress display naming the point being measured (None without a display)."""
    if ctx.progress is None:
        return None
    from rich.markup import escape

    return ctx.progress.add_task(f"  {escape(p.label())}", total=None, info="")


def plan_cli(preset: str, *, attn: list[AttentionSpec] | None, seq: str | None, mode: str | None,
             causal: bool | None, dtype: str | None, device: str | None, heads: int | None, head_dim: int | None,
             batch: int | None, threads: int | None, seed: int | None, time_budget: float | None,
             mem_budget_gb: float | None, console) -> ScalingPlan:
    """:func:`plan_scaling` of the command line's text (its warnings printed on ``console``)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = plan_scaling(preset, attentions=attn or None,
                            seq=parse_seq_list(seq) if seq else None,
                            modes=[m.strip() for m in mode.split(",") if m.strip()] if mode else None,
                            causal=causal,
                            dtypes=[d.strip() for d in dtype.split(",") if d.strip()] if dtype else None,
                            device=device, batch=batch, heads=heads, head_dim=head_dim, threads=threads,
                            time_budget=time_budget, mem_budget_gb=mem_budget_gb, seed=seed)
    for w in caught:
        console.print(f"[yellow]warning:[/] {w.message}")
    return plan


def run_cli(plan: ScalingPlan, *, opts, console=None, show_table: bool = False) -> ScalingResult:
    """What ``attnbench run scaling`` does in its process: measure the machine, sweep ``plan`` (the points of
    ``opts.shard`` only, if given) into ``opts.db``, and (``show_table``) print the setting's leaderboard."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    with Store(opts.db) as store:
        machine = provenance.machine(threads=plan.threads)
        console.print(escape(provenance.machine_line(machine)))
        console.print(f"[bold]{escape(plan.setting)}[/]: {len(plan.attentions)} attention(s) × "
                      f"{len(plan.points) // max(1, len(plan.attentions))} point(s) → {store.path}")
        result = run_scaling(plan, store, force=opts.force, console=console, argv=opts.argv, machine=machine,
                             shard=opts.shard)
        if show_table:
            recs = store.measurements(suite=SUITE, setting=plan.setting)
            tables.print_tables(SUITE, [Source(f"your runs ({store.path})", recs, committed=False)],
                                console=console)
    counts = ", ".join(f"{v} {k}" for k, v in sorted(result.counts().items())) or "nothing new"
    console.print(f"run {(result.run_id or '-')[:12]}: {counts}"
                  + (" — [yellow]interrupted[/]" if result.interrupted else ""))
    return result


# ------------------------------------------------------------------------------------------------------ smoke
SMOKE_TIMING = {"warmup_ms": 1.0, "rep_ms": 1.0, "min_reps": 1, "max_reps": 1}


def smoke_plan(plan: ScalingPlan) -> ScalingPlan:
    """Each point kind of ``plan`` (attention spec x mode x causal x dtype) once, at the plan's smallest length,
    with one timed repetition: the same child process, correctness gate, first call, FLOP and memory counts."""
    n0 = min(p.seq_len for p in plan.points)
    seen, points = set(), []
    for p in plan.points:
        key = (p.spec, p.mode, p.causal, p.dtype)
        if key not in seen:
            seen.add(key)
            points.append(dataclasses.replace(p, seq_len=n0))
    timing = dataclasses.replace(plan.preset.timing, **SMOKE_TIMING)
    pre = dataclasses.replace(plan.preset, timing=timing)
    return dataclasses.replace(plan, preset=pre, setting=plan.setting + "-smoke", points=points)


def flop_exponent(p: Point, plan: ScalingPlan) -> float:
    """How a point's FLOPs grow with N (2 for N x N attention, 1 for linear forms), from ``torch.utils.flop_counter``
    at the correctness gate's length and twice it (in this process, float32, batch 1)."""
    import math

    import torch

    counts = []
    n = max(plan.preset.check.seq_len, 16)
    for length in (n, 2 * n):
        module = Spec.make(p.attention, p.options).build(seq_len=length, heads=plan.preset.heads,
                                                         head_dim=plan.preset.head_dim, causal=p.causal)
        grad = p.mode == "fwd+bwd"
        shape = (1, plan.preset.heads, length, plan.preset.head_dim)
        q, k, v = (torch.randn(shape).requires_grad_(grad) for _ in range(3))
        counts.append(count_flops(make_step(module, q, k, v, torch.randn(shape) if grad else None)))
    return math.log2(counts[1] / counts[0]) if counts[0] > 0 and counts[1] > 0 else 1.0


def estimate_point_s(p: Point, plan: ScalingPlan, smoke: Measurement, exponent: float) -> float:
    """Wall seconds of a full-sweep point from the smoke's point of the same kind: the call's time scaled by FLOPs
    (``(N / N0) ** exponent``), the calls ``measure_point`` makes (first call, counted call, warm-up, the timed
    repetitions the preset's timing asks for) and the child's fixed cost, capped by the time budget."""
    m = smoke.metrics
    t0 = float(m.get("time_median_s") or m.get("first_call_s") or 0.0)
    n0 = int(smoke.params.get("seq_len") or p.seq_len)
    fixed = max(float(m.get("wall_s") or 0.0) - 3 * t0, 0.0)
    t = t0 * (p.seq_len / n0) ** exponent
    tm = plan.preset.timing
    reps = max(tm.min_reps, min(tm.max_reps, int(tm.rep_ms / 1000 / t))) if t > 0 else tm.min_reps
    est = fixed + 2 * t + max(tm.warmup_ms / 1000, t) + reps * t
    return min(est, plan.preset.time_budget) if plan.preset.time_budget else est


def run_smoke(plan: ScalingPlan, *, db: str | None = None, console=None) -> int:
    """``attnbench run scaling --smoke``: :func:`smoke_plan`'s points through the real sweep (child processes,
    memory budget, gate) into a temporary store (or ``db``), then the full sweep's size and estimated time on this
    machine. Returns the exit code (0 ok, 1 a point did not end ok)."""
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    small = smoke_plan(plan)
    with smoke_dirs(None, db, "scaling") as d, Store(d.db) as store:
        console.print(f"[bold]{escape(plan.setting)} smoke[/]: {len(small.points)} point kind(s) at N = "
                      f"{small.points[0].seq_len} (each in its child process, gate, memory, FLOPs, one timed "
                      f"call); store {d.db}")
        result = run_scaling(small, store, force=True, console=console, progress=False,
                             argv=["attnbench", "run", "scaling", "--smoke"])
        bad = [r for r in result.records if r.status not in ("ok", "unsupported")]
        if bad or result.exit_code or len(result.records) != len(small.points):
            r = bad[0] if bad else None
            why = (r.error or "").strip().splitlines() if r is not None else []
            what = (f"{r.attention} {r.task} N={r.params.get('seq_len')}: {r.status}" + (f": {why[-1]}" if why else "")
                    if r is not None else f"{len(result.records)} of {len(small.points)} points recorded")
            console.print(f"[bold red]smoke failed:[/] {escape(what)}")
            return 1
        by_kind = {(spec_label(r.attention, r.options), r.task, r.dtype): r for r in result.records}
        exps = {k: flop_exponent(p, plan) for k, p in (((p.spec, p.task, p.dtype), p) for p in small.points)
                if by_kind[k].status == "ok"}
        total = sum(estimate_point_s(p, plan, by_kind[k], exps[k]) for p in plan.points
                    for k in [(p.spec, p.task, p.dtype)] if by_kind[k].status == "ok")

    lengths = sorted({p.seq_len for p in plan.points})
    console.print(f"full sweep: {len(plan.points)} points ({len(plan.attentions)} attention(s), N "
                  f"{lengths[0]}..{lengths[-1]}); about {fmt_duration(total)} on this machine (each point's call time "
                  f"scaled by its FLOPs from the smoke, plus the timing loop and the child's fixed cost; time "
                  f"budget {plan.preset.time_budget:g} s per point)")
    return 0
