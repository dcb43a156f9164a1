"""``attnbench run claims``: one sweep cell per (check, mechanism, input), each one record in the store with the
statistic, the criterion stated before measuring, the verdict and the figure (see :mod:`.checks`).

A real-input cell needs the vision suite's trained softmax ViT (:func:`.inputs.find_teacher`); without one it is
recorded as ``skipped`` with the reason, and its identity names no teacher, so the same command finds and measures
it once a teacher exists. A cell's identity holds the check, mechanism spec, input, the check's settings and
:data:`VERSION`, so changed measurement code is a new point rather than a stale finished one.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Optional, Sequence

from attnbench.api.spec import AttentionSpec, parse_spec
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunContext, RunOptions, run_options
from attnbench.engine.sweep import Cell, CellContext, CellError, CellResult, Outcome, SweepSummary, default_line
from attnbench.results.paths import project_root
from attnbench.results.records import point_hash
from attnbench.views.rows import slug

from .checks import Skip, checks
from .figures import COLORS
from .inputs import find_teacher, no_teacher_reason
from .leaderboard import st_short

SUITE = "claims"
SETTING = "claims/cpu"
VERSION = 1  # of the measurements: bump when a check's code changes what it measures
COMMITTED_OUT = Path("results") / "claims"          # the committed figures: written only with --update-committed


def select_checks(only: Optional[str], skip: Optional[str]) -> list:
    """The checks named by ``--only`` (all when None) minus those named by ``--skip``; unknown names are an
    error with the closest names."""

    known = checks()

    def names(text: Optional[str], flag: str) -> list[str]:
        out = [t.strip() for t in (text or "").split(",") if t.strip()]
        for n in out:
            if n not in known:
                close = difflib.get_close_matches(n, list(known), n=2, cutoff=0.5)
                hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
                raise AttnbenchError(f"{flag}: unknown check {n!r}{hint} (checks: {', '.join(known)})")
        return out

    chosen = names(only, "--only") or list(known)
    dropped = set(names(skip, "--skip"))
    selected = [known[n] for n in known if n in chosen and n not in dropped]
    if not selected:
        raise AttnbenchError("--only / --skip leave no check to run")
    return selected


def plan_cells(checks: Sequence, specs: Optional[Sequence[AttentionSpec]], *, seed: int, teacher) -> list[Cell]:
    """One cell per (check, mechanism, input). ``specs`` (``--attn``) replaces each check's default mechanisms by
    those it accepts; a check that accepts none of them is left out."""
    cells = []
    for check in checks:
        order = 0
        mechs = [parse_spec(m) for m in check.defaults] if specs is None else [s for s in specs if check.accepts(s)]
        for spec in mechs:
            for inp in check.inputs:
                params = {"check": check.name, "input": inp, "settings": check.settings, "version": VERSION,
                          "teacher": (teacher.ident if teacher is not None else None) if inp == "real" else None}
                h = point_hash(suite=SUITE, setting=SETTING, task=check.name, attention=spec.name,
                               options=dict(spec.options), params=params, dtype=None, device="cpu")
                cells.append(Cell(task=check.name, attention=spec.name, config_hash=h, options=dict(spec.options),
                                  params=params, seed=seed, payload=(check, spec, inp, order),
                                  name=f"{check.name} · {spec.label} · {inp}"))
                order += 1
    return cells


def figure_path(out: Path, cell: Cell) -> Path:
    check, spec, inp, _ = cell.payload
    return out / f"{check.name}--{slug(spec.label)}--{inp}.png"


def _display(path: Path) -> str:
    """A figure's path as recorded: relative to the project root when under it (committed results stay valid)."""
    try:
        return str(path.resolve().relative_to(project_root().resolve()))
    except ValueError:
        return str(path)


def run_cell(cell: Cell, ctx: CellContext, *, out: Path, teacher, no_teacher: str) -> CellResult:
    check, spec, inp, order = cell.payload
    if inp == "real" and teacher is None:
        raise CellError(no_teacher, status="skipped", metrics={"verdict": "skipped", "reason": no_teacher,
                                                               "order": order})
    fig = figure_path(out, cell)
    try:
        res = check.run(check.context(spec, inp, seed=cell.seed or 0, teacher=teacher, figure=fig))
    except Skip as e:
        raise CellError(str(e), status="skipped", metrics={"verdict": "skipped", "reason": str(e),
                                                           "order": order}) from None
    metrics = res.metrics()
    if res.figure:
        metrics["figure"] = _display(Path(res.figure))
    metrics.update(paper_ref=check.paper, claim=check.claim, order=order)
    return CellResult("ok", metrics=metrics)


def _line(o: Outcome) -> str:
    from rich.markup import escape

    m = o.metrics
    if o.status == "ok" and "verdict" in m:
        v = m["verdict"]
        st = m["statistic"]
        return (f"  {escape(o.cell.label)}  [{COLORS.get(v, 'white').replace('tab:', '')}]{v}[/]  "
                f"{escape(st_short(st))}")
    if o.status == "skipped" and not o.skipped:
        return f"  {escape(o.cell.label)}  [yellow]skipped[/]  {escape(o.error or '')}"

    return default_line(o)


def run_claims(*, attentions: Optional[Sequence[AttentionSpec]] = None, only: Optional[str] = None,
               skip: Optional[str] = None, opts: Optional[RunOptions] = None, console=None, progress: bool = True,
               update_committed: bool = False, **fields) -> SweepSummary:
    """Plan and run the claims cells (see the module docstring). ``opts``: the shared run options (or single
    ``fields`` of them, e.g. ``db=``, ``out=``, ``seed=``). Figures go to ``out``, else ``results/runs/claims``
    (gitignored); ``update_committed`` writes them over the committed ``results/claims``."""
    import torch

    opts = run_options(opts, **fields)
    seed, db, out = opts.only_seed(), opts.db, opts.out
    run = RunContext(opts, suite=SUITE, console=console, progress=progress)
    checks = select_checks(only, skip)
    teacher = find_teacher(db, seed)
    cells = plan_cells(checks, attentions, seed=seed, teacher=teacher)
    if not cells:
        raise AttnbenchError(f"--attn {', '.join(s.label for s in attentions or [])}: no selected check measures "
                             f"these mechanisms (checks and their mechanisms: "
                             + "; ".join(f"{c.name}: {', '.join(c.defaults)}" for c in checks) + ")")
    if out and update_committed:
        raise AttnbenchError("--out and --update-committed: give one (--update-committed writes the figures to "
                             f"{COMMITTED_OUT})")
    out_dir = project_root() / COMMITTED_OUT if update_committed else run.work  # a user's figures: gitignored
    reason = no_teacher_reason(db)
    if console is not None:
        console.print(f"[bold]{SETTING}[/]: {len(cells)} cell(s) of {len(checks)} check(s); real inputs: "
                      + (teacher.describe() if teacher else f"none ({reason})") + f"; figures in {_display(out_dir)}")
    config = {"checks": [c.name for c in checks], "attentions": [s.label for s in attentions] if attentions else None,
              "seed": seed, "teacher": teacher.ident if teacher else None, "version": VERSION}
    torch.manual_seed(seed)
    # every check measures on the CPU in this one process (no process group)
    return run.sweep(cells, lambda c, ctx: run_cell(c, ctx, out=out_dir, teacher=teacher, no_teacher=reason),
                     setting=SETTING, config=config, device="cpu", dist=None, describe=_line)
