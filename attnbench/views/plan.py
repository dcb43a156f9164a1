"""``attnbench plan SUITE``: from the records already run (a pilot), the seeds each mechanism needs for the pairs of
its leaderboard that more seeds can separate within a budget, the pairs that cannot be, what the run costs, and the
``attnbench run`` line that does it.

The pairs are those the suite's own leaderboard tests (:func:`attnbench.views.compare.recorded_separations` records
them while the view renders; no rows are rebuilt here), each with the means and standard deviations of its seeds.
For each pair, the seeds a row that Welch's t needs to pass at the Holm level the pair would face with power
:data:`attnbench.results.stats.DESIGN_POWER` (the pair ranked r-th by strength faces alpha / (m - r): the pairs ahead
of it are the stronger ones, which the plan separates first). A greedy choice then takes the pairs cheapest to reach
first, raising both rows to the seeds the pair needs, until the budget is spent (pairs the pilot already separates
are not targeted; a suite whose run takes every row at once, without ``--attn``, gets the most seeds a row the budget
buys, the same for all). The plan's projected count is
:func:`attnbench.results.stats.expected_separated` at the planned seeds (every pair of the table, Holm over all).

Costs: at the pilot's own cell times (the machines that ran it, named), each row's mean cell time per seed in its
records (``wall_s`` of every record of that row and seed, e.g. both learning rates of a recall cell), summed over
the seeds to add; on a named GPU, the records' ``wall_s`` of that GPU where the store has them, else an estimate
from FLOPs (6 × parameters × tokens trained, or 3 × FLOPs per image × images trained) at
:data:`attnbench.engine.smoke.ASSUMED_MFU` of the GPU's bf16 peak; a tiny model leaves a GPU idle, so that estimate
is a floor, said so.

The design is fixed before the run: every planned seed runs, then the table tests once. Testing after each seed and
stopping at the first separation inflates false separations; no sequential option is offered.
"""

from __future__ import annotations

import dataclasses
import inspect
import shlex
from typing import Optional

from attnbench.api import suites as suite_registry
from attnbench.core.errors import AttnbenchError
from attnbench.engine.smoke import ASSUMED_MFU, GPU_PEAK_BF16
from attnbench.results.records import Measurement
from attnbench.results.stats import (DESIGN_POWER, FIRST_ESTIMATE_SEEDS, HOLM_ALPHA, PairSpread, expected_separated,
                                     one_seed_line, welch_power)
from attnbench.views.compare import Separation, recorded_separations
from attnbench.views.rows import label_of
from attnbench.views.sources import Source, load_sources, machine_of
from attnbench.views.tables import _registered, view_of

#: The most seeds a row the planner considers; a pair that needs more is called inseparable at this budget.
MAX_SEEDS = 64


@dataclasses.dataclass(frozen=True)
class PairNeed:
    a: str
    b: str
    spread: PairSpread
    level: float
    seeds: Optional[int]        # seeds a row for DESIGN_POWER at ``level``; None: more than the most considered


@dataclasses.dataclass
class BoardPlan:
    """One leaderboard's plan: rows with their seeds now and planned, and cell seconds a seed."""

    name: str
    seeds_now: dict[str, int]
    seeds_planned: dict[str, int]
    cell_s: dict[str, float]
    needs: list[PairNeed]
    chosen: list[PairNeed]
    expected_now: float
    expected_planned: float
    budget_s: float
    one_seed: int
    existing: dict[str, list]
    max_seeds: int = MAX_SEEDS

    @property
    def cost_s(self) -> float:
        return sum((self.seeds_planned[r] - self.seeds_now[r]) * self.cell_s[r] for r in self.seeds_now)


def pair_needs(labels: tuple[tuple[str, str], ...], spreads: tuple[PairSpread, ...], alpha: float = HOLM_ALPHA,
               power: float = DESIGN_POWER, max_seeds: int = MAX_SEEDS) -> list[PairNeed]:
    """Each pair's Holm level (by its rank in strength, every row at the same seeds) and the seeds a row it needs
    to pass it with ``power`` (both rows raised to at least their present seeds)."""
    m = len(spreads)
    order = sorted(range(m), key=lambda i: -spreads[i].at(2).strength)
    out: list[Optional[PairNeed]] = [None] * m
    for rank, i in enumerate(order):
        sp, level = spreads[i], alpha / (m - rank)
        out[i] = PairNeed(labels[i][0], labels[i][1], sp, level, _fewest_seeds(sp, level, power, max_seeds))
    return [p for p in out if p is not None]


def _fewest_seeds(sp: PairSpread, level: float, power: float, max_seeds: int) -> Optional[int]:
    """The fewest seeds a row (at least the pair's own) at which its test reaches ``power``; None if more than
    ``max_seeds``. Bisection: the power grows with the seeds."""
    reaches = lambda s: welch_power(sp.at(max(s, sp.n_a), max(s, sp.n_b)), level) >= power  # noqa: E731
    lo, hi = max(2, min(sp.n_a, sp.n_b)), max_seeds
    if lo > hi or not reaches(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid + 1, hi)
    return lo


def choose(needs: list[PairNeed], seeds_now: dict[str, int], cell_s: dict[str, float],
           budget_s: float) -> tuple[dict[str, int], list[PairNeed]]:
    """Greedy: the pair cheapest to reach from the seeds already planned first, while the budget lasts."""
    planned = dict(seeds_now)
    spent, chosen = 0.0, []
    todo = [p for p in needs if p.seeds is not None]

    def extra(p: PairNeed) -> float:
        return sum(max(0, p.seeds - planned[r]) * cell_s[r] for r in (p.a, p.b))

    while todo:
        best = min(todo, key=lambda p: (extra(p), p.seeds))
        todo.remove(best)
        if spent + extra(best) > budget_s:
            continue
        spent += extra(best)
        for r in (best.a, best.b):
            planned[r] = max(planned[r], best.seeds)
        chosen.append(best)
    return planned, chosen


def _row_records(row: list[Measurement], records: list[Measurement]) -> list[Measurement]:
    """Every finished record of a row's (setting, device, task, mechanism): all it runs a seed (e.g. each rate)."""
    r0 = row[0]
    return [r for r in records if r.status == "ok" and (r.setting, r.device, r.task, label_of(r)) ==
            (r0.setting, r0.device, r0.task, label_of(r0))]


def _cell_seconds(row: list[Measurement], records: list[Measurement]) -> Optional[float]:
    """A row's cell time a seed: the wall time of its records (:func:`_row_records`) over the seeds they have."""
    if not row:
        return None
    same = [r for r in _row_records(row, records) if isinstance(r.metrics.get("wall_s"), (int, float))]
    seeds = {r.seed for r in same}
    return sum(r.metrics["wall_s"] for r in same) / len(seeds) if seeds else None


def _flops(r: Measurement) -> Optional[float]:
    """A record's training FLOPs, estimated: 6 × parameters × tokens trained, or 3 × forward FLOPs an image ×
    images trained (measured rate × training time, else steps × batch); None: the record carries neither."""
    m, t = r.metrics, r.metrics.get("train_time_s")
    steps, batch = r.params.get("steps"), r.params.get("batch_size")
    counted = isinstance(steps, int) and isinstance(batch, int)
    if isinstance(m.get("flops_per_image"), (int, float)):
        if isinstance(t, (int, float)) and isinstance(m.get("train_images_per_s"), (int, float)):
            return 3 * m["flops_per_image"] * m["train_images_per_s"] * t
        return 3 * m["flops_per_image"] * steps * batch if counted else None
    if isinstance(m.get("n_params"), (int, float)) and isinstance(t, (int, float)) and isinstance(
            m.get("train_tokens_per_s"), (int, float)):
        return 6 * m["n_params"] * m["train_tokens_per_s"] * t
    return None


def gpu_seconds(row: list[Measurement], records: list[Measurement], gpu: str) -> tuple[Optional[float], str]:
    """A row's cell time a seed on ``gpu``: measured (the store's records of that GPU) or estimated from FLOPs."""
    r0 = row[0]
    key = (r0.setting, r0.task, label_of(r0))
    on_gpu = [r for r in records if r.status == "ok" and r.device != "cpu"
              and gpu.lower() in (r.device_name or "").lower() and (r.setting, r.task, label_of(r)) == key
              and isinstance(r.metrics.get("wall_s"), (int, float))]
    if on_gpu:
        return sum(r.metrics["wall_s"] for r in on_gpu) / len({r.seed for r in on_gpu}), "measured"
    same = _row_records(row, records)
    flops = [f for f in map(_flops, same) if f is not None]
    if not flops:
        return None, "none"
    return sum(flops) / len({r.seed for r in same}) / (GPU_PEAK_BF16[gpu] * ASSUMED_MFU), "flops"


def _board_records(sep: Separation) -> list[Measurement]:
    return [r for rs in sep.rows.values() for r in rs]


def _board_name(sep: Separation) -> str:
    r0 = next(r for rs in sep.rows.values() for r in rs)
    return f"{r0.setting} · {r0.task} · {sep.metric.label if sep.metric else 'score'}"


def choose_together(needs: list[PairNeed], seeds_now: dict[str, int], cell_s: dict[str, float],
                    budget_s: float, max_seeds: int) -> tuple[dict[str, int], list[PairNeed]]:
    """For a suite whose run takes every row at once (no ``--attn``): the most seeds every row can reach within
    the budget, and the pairs that reach their need there."""
    cost = lambda s: sum(max(0, s - n) * cell_s[r] for r, n in seeds_now.items())  # noqa: E731
    top = max(seeds_now.values())
    while top < max_seeds and cost(top + 1) <= budget_s:
        top += 1
    if top == max(seeds_now.values()) and cost(top) > budget_s:
        return dict(seeds_now), []
    chosen = [p for p in needs if p.seeds is not None and p.seeds <= top]
    return ({r: max(n, top) for r, n in seeds_now.items()} if chosen else dict(seeds_now)), chosen


def plan_board(sep: Separation, records: list[Measurement], budget_s: Optional[float], budget_cells: Optional[int],
               max_seeds: int = MAX_SEEDS, together: bool = False) -> BoardPlan:
    """The plan of one leaderboard (its separation as the view computed it) within a budget of cell seconds or of
    cells (a cell: one row at one seed, whatever a seed of that row runs); ``together``: the suite's run takes
    every row at once, so every row gets the same seeds."""
    rows = {lab: [r for r in rs if r.status == "ok"] for lab, rs in sep.rows.items()}
    seeds_now = {lab: len(rs) for lab, rs in rows.items()}
    cell_s = {lab: _cell_seconds(rs, records) or 0.0 for lab, rs in rows.items()}
    if budget_cells is not None:  # a budget of cells: every cell costs one
        costs, budget = {lab: 1.0 for lab in rows}, float(budget_cells)
    else:
        costs, budget = cell_s, float(budget_s)
    needs = pair_needs(sep.labels, sep.spreads, max_seeds=max_seeds)
    # the pairs the pilot already separates are not what more seeds are for: the plan targets the others
    targets = [n for n in needs if (n.a, n.b) not in sep.apart]
    planned, chosen = (choose_together(targets, seeds_now, costs, budget, max_seeds) if together
                       else choose(targets, seeds_now, costs, budget))
    at = lambda n: [p.spread.at(max(n[p.a], p.spread.n_a), max(n[p.b], p.spread.n_b)) for p in needs]  # noqa: E731
    return BoardPlan(_board_name(sep), seeds_now, planned, cell_s, needs, chosen,
                     expected_separated([p.spread for p in needs]), expected_separated(at(planned)),
                     budget, sep.one_seed, {lab: sorted(r.seed for r in rs) for lab, rs in rows.items()}, max_seeds)


def _hours(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 60:.0f} min" if s >= 60 else (f"{s:.0f} s" if s >= 1 or s == 0 else "under 1 s")


def _takes(suite: str, option: str) -> Optional[bool]:
    """Whether ``attnbench run SUITE`` takes ``--OPTION``; None: the suite has no run command."""
    registered = _registered(suite)
    if registered is None or registered.run is None:
        return None
    return option in inspect.signature(registered.run).parameters


def _takes_attn(suite: str) -> Optional[bool]:
    """Whether ``attnbench run SUITE`` takes ``--attn`` (rows run one by one); None: the suite has no run command."""
    return _takes(suite, "attn")


def run_lines(suite: str, plan: BoardPlan, records: list[Measurement], db: Optional[str] = None,
              specs: Optional[dict[str, str]] = None) -> list[str]:
    """The ``attnbench run`` lines of a plan: one per group of rows that add the same seeds; every row if the suite's
    run takes no ``--attn`` (it runs all its rows at once); ``records``: the board's (its preset, threads and, where
    the run takes ``--point``, its point: a sweep's board runs alone, not the preset's default point); ``specs``:
    each row's ``--attn`` spelling where its label is not one (a table may add the preset's options to a label).
    None: the suite has no run command (e.g. ingested records)."""
    specs = specs or {}
    takes_attn = _takes_attn(suite)
    if takes_attn is None:
        return None
    r0 = next(r for r in records if r.suite == suite)
    preset = r0.params.get("preset")
    threads = r0.params.get("threads", r0.metrics.get("threads"))
    point = r0.task if _takes(suite, "point") else None
    groups: dict[tuple, list[str]] = {}
    for lab, n in plan.seeds_planned.items():
        if n > plan.seeds_now[lab]:
            have = plan.existing[lab]
            start = (max(have) + 1) if have else 0
            groups.setdefault(tuple(range(start, start + n - plan.seeds_now[lab])), []).append(lab)
    if not takes_attn and groups:
        seeds = sorted({s for k in groups for s in k})
        groups = {tuple(seeds): []}
    lines = []
    for seeds, labs in sorted(groups.items()):
        parts = ["attnbench run", suite]
        if preset:
            parts.append(f"--preset {preset}")
        if point:
            parts.append(f"--point {shlex.quote(point)}")
        if takes_attn and labs:
            parts.append(f"--attn {','.join(sorted(specs.get(lab, lab) for lab in labs))}")
        parts.append(f"--seeds {','.join(map(str, seeds))}")
        if threads:
            parts.append(f"--threads {threads}")
        if db:
            parts.append(f"--db {db}")
        lines.append(" ".join(parts))
    return lines


def plan(suite: str, *, db: Optional[str] = None, setting: Optional[str] = None, cells: Optional[int] = None,
         hours: Optional[float] = None, gpu: str = "H100", max_seeds: int = MAX_SEEDS) -> list[str]:
    """``attnbench plan SUITE``: the plan's lines (see the module docstring). Bad input: :class:`AttnbenchError`."""
    if (cells is None) == (hours is None):
        raise AttnbenchError("give a budget: --cells N (more seeds of a row, each one cell) or --hours H (cell time "
                             "at the pilot's measured cell times), one of them")
    if (cells is not None and cells <= 0) or (hours is not None and not hours > 0):
        given = f"--cells {cells}" if cells is not None else f"--hours {hours}"
        raise AttnbenchError(f"the budget must be positive, got {given}")
    if gpu not in GPU_PEAK_BF16:
        raise AttnbenchError(f"--gpu {gpu!r}: expected one of {', '.join(GPU_PEAK_BF16)}")
    if max_seeds < 2:
        raise AttnbenchError(f"--max-seeds must be at least 2, got {max_seeds}")
    sources = load_sources(suite, db=db, include_committed=True, setting=setting)
    records = [r for s in sources for r in s.records]
    if not records and _registered(suite) is None:
        suite_registry.get_suite(suite)  # nothing of that name anywhere: the did-you-mean error of the registry
    if not any(r.status == "ok" for r in records):
        registered = _registered(suite)
        command = f"attnbench {suite}" if registered is not None and registered.top_level else f"attnbench run {suite}"
        raise AttnbenchError(f"no finished {suite} records in the store or results/{suite}/"
                             + (f" (setting {setting})" if setting else "")
                             + f": run a pilot first, e.g. `{command} --seeds 0,1,2`")
    view = view_of(suite)
    with recorded_separations() as seps:
        if view.data is not None:  # the leaderboards as `table` builds them; their separations are recorded
            view.data(Source(f"{suite} pilot", records))
    seps = [s for s in seps if s.metric is not None and s.metric.kind in ("proportion", "value")
            and (s.spreads or s.one_seed)]
    if not seps:
        raise AttnbenchError(f"the {suite} leaderboards test no pairs of rows over seeds: nothing to plan")
    budget_s = hours * 3600 if hours is not None else None
    budget_text = f"{cells} cells" if cells is not None else f"{hours:g} h of cell time at the pilot's cell times"
    out = [f"Plan for {suite} from its pilot ({len(records)} records; each board below may spend the whole budget: "
           f"{budget_text}). A fixed "
           f"design chosen now: run every planned seed, then read the table once; testing after each seed and stopping "
           f"at the first separation inflates false separations, so no sequential stop is offered. Projections take "
           f"the pilot's means and spreads as the truth (Welch's t, Holm over the board's pairs at {HOLM_ALPHA}, "
           f"power {DESIGN_POWER:.0%} a planned pair)."]
    for sep in seps:
        r0 = next(r for rs in sep.rows.values() for r in rs)
        if not sep.spreads:
            out += ["", f"{r0.setting} · {r0.task}: {one_seed_line()} Run seeds "
                    f"{','.join(map(str, range(1, FIRST_ESTIMATE_SEEDS)))} first, then plan."]
            continue
        p = plan_board(sep, records, budget_s, cells, max_seeds, together=_takes_attn(suite) is False)
        out += _board_lines(suite, p, sep, records, gpu, db)
    return out


def _board_lines(suite: str, p: BoardPlan, sep: Separation, records: list[Measurement], gpu: str,
                 db: Optional[str]) -> list[str]:
    chosen = {(c.a, c.b) for c in p.chosen}
    never = [n for n in p.needs if n.seeds is None and (n.a, n.b) not in sep.apart]
    dear = [n for n in p.needs if n.seeds is not None and (n.a, n.b) not in chosen | sep.apart]
    out = ["", f"{p.name}: {len(p.needs)} pairs with seeds on both rows, {len(sep.apart)} separated by the pilot "
           f"(not targeted); projected at the seeds run, about {round(p.expected_now)} separated, about "
           f"{round(p.expected_planned)} with the plan."
           + (f" {p.one_seed} pairs with a row of one seed are left out (unmeasured spread)." if p.one_seed else "")]
    out.append("  seeds a row (now -> planned; a seed's cell time as the pilot measured it):")
    for lab in sorted(p.seeds_now, key=lambda l: (-(p.seeds_planned[l] - p.seeds_now[l]), l)):
        out.append(f"    {lab}: {p.seeds_now[lab]} -> {p.seeds_planned[lab]}  ({_hours(p.cell_s[lab])} a seed)")
    out.append(f"  pairs not yet separated that the plan targets, with the seeds a row each needs "
               f"({len(p.chosen)}): " + ("; ".join(
        f"{c.a} vs {c.b} at {c.seeds}" for c in sorted(p.chosen, key=lambda c: (c.seeds, c.a, c.b))) or "none"))
    if dear:
        out.append(f"  separable, beyond this budget ({len(dear)}): " + "; ".join(
            f"{c.a} vs {c.b} needs {c.seeds}" for c in sorted(dear, key=lambda c: (c.seeds, c.a, c.b))))
    if never:
        out.append(f"  not separable by {p.max_seeds} seeds a row ({len(never)}; their gap is small against their "
                   f"seed noise): "
                   + "; ".join(f"{c.a} vs {c.b} (Δ {c.spread.diff:+.2f})" for c in never))
    cost, n_cells = p.cost_s, sum(p.seeds_planned[r] - p.seeds_now[r] for r in p.seeds_now)
    out.append(f"  cost at the pilot's cell times ({machine_of(_board_records(sep))}): {n_cells} cells, "
               f"{_hours(cost)} of cell time (one cell a core: "
               f"{_hours(cost / 2)} on two cores)")
    gpu_s, kinds = 0.0, set()
    for lab in p.seeds_now:
        extra = p.seeds_planned[lab] - p.seeds_now[lab]
        if extra:
            s, kind = gpu_seconds(sep.rows[lab], records, gpu)
            kinds.add(kind)
            gpu_s += extra * (s or 0.0)
    if n_cells and "none" in kinds:
        out.append(f"  on one {gpu}: no estimate (the records carry neither GPU timings nor FLOP counts)")
    elif n_cells:
        how = ("measured on it (the store's records of that GPU)" if kinds == {"measured"} else
               f"a FLOP estimate, not a measurement: 6 × parameters × tokens (or 3 × FLOPs × images) at "
               f"{ASSUMED_MFU:.0%} of its {GPU_PEAK_BF16[gpu] / 1e12:.0f} TFLOP/s; a model this small leaves the GPU "
               f"idle, so a floor")
        out.append(f"  on one {gpu}: {_hours(gpu_s)} ({how})")
    lines = run_lines(suite, p, _board_records(sep), db, specs={lab: rs[0].attention for lab, rs in sep.rows.items()
                                                                 if rs})
    if lines is None:
        out.append(f"  no `attnbench run {suite}` command to print (the records were ingested); run the planned seeds "
                   f"as the pilot ran")
        return out
    out.append("  the run (then `attnbench table " + suite + "` once it has finished):" if lines else
               "  nothing to run within this budget.")
    out += [f"    {line}" for line in lines]
    return out
