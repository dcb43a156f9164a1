"""``attnbench run claims --smoke``: every selected check through the runner on its smallest inputs.

Each check runs with :data:`SMOKE_SETTINGS` over its defaults (fewer tokens, draws, sizes, steps), through the
same cells, sweep, figures and store records as a full run, into a temporary directory and store (or ``--db`` /
``--out``). Verdicts on inputs this small mean nothing; the smoke shows that every check measures, decides and
draws. Real-input cells need the vision suite's trained softmax ViT, as in a full run: without one they are
skipped with the command that trains one, and the smoke says so.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from attnbench.core.errors import AttnbenchError
from attnbench.engine.smoke import first_failure, smoke_dirs
from attnbench.engine.sweep import run_sweep

from .inputs import find_teacher, no_teacher_reason
from .runner import SETTING, SUITE, _line, plan_cells, run_cell, select_checks

#: The smallest inputs of each check (keys are the check's own settings; a check missing here is an error).
SMOKE_SETTINGS: dict[str, dict] = {
    "nala-entropy": {"batch": 1, "tokens": 64},
    "nala-nonneg": {"batch": 1, "tokens": 64},
    "mirrorla-isometry": {"batch": 1, "tokens": 64},
    "mirrorla-truncation": {"batch": 1, "tokens": 64, "steps": 3},
    "laplacian-distance": {"batch": 1, "tokens": 64, "pairs": 500},
    "laplacian-ns": {"batch": 1, "tokens": 32, "clusters": 2, "curve": 2},
    "laplacian-ns-vs-cg": {"batch": 1, "tokens": 32, "clusters": 2, "curve": 2},
    "laplacian-nystrom": {"batch": 1, "tokens": 64, "clusters": 4},
    "stella-variance": {"sizes": [64, 256], "draws": 2},
    "memory": {"sizes": [256, 1024], "softmax_cap_bytes": 2 * 1024 * 1024 * 4},
    "adala-depth": {"train_images": 32, "test_images": 16, "steps": 2, "batch": 8},
}


def smallest(checks: Sequence) -> list:
    """The checks with their smoke settings; a check without an entry in :data:`SMOKE_SETTINGS` is an error."""
    out = []
    for c in checks:
        if c.name not in SMOKE_SETTINGS:
            raise AttnbenchError(f"claims smoke: check {c.name!r} has no smallest inputs in suites/claims/smoke.py "
                                 f"SMOKE_SETTINGS; add them")
        unknown = sorted(set(SMOKE_SETTINGS[c.name]) - set(c.settings))
        if unknown:
            raise AttnbenchError(f"claims smoke: {c.name}: unknown setting(s) {unknown} (known: {sorted(c.settings)})")
        out.append(dataclasses.replace(c, settings={**c.settings, **SMOKE_SETTINGS[c.name]}))
    return out


def run_smoke(*, attentions=None, only: Optional[str] = None, skip: Optional[str] = None, seed: int = 0,
              db: Optional[str] = None, out: Optional[str] = None, console=None) -> int:
    """Run the smoke (see the module docstring); returns the exit code (0 ok, 1 a cell failed)."""
    from pathlib import Path

    import torch
    from rich.console import Console
    from rich.markup import escape

    console = console or Console()
    checks = select_checks(only, skip)
    small = smallest(checks)
    teacher = find_teacher(db, seed)
    reason = no_teacher_reason(db)
    full_cells = plan_cells(checks, attentions, seed=seed, teacher=teacher)
    cells = plan_cells(small, attentions, seed=seed, teacher=teacher)
    with smoke_dirs(out, db, "claims") as d:
        figures = Path(d.work) / "figures"
        console.print(f"[bold]{SETTING} smoke[/]: {len(cells)} cell(s) of {len(small)} check(s) on their smallest "
                      f"inputs; real inputs: {teacher.describe() if teacher else 'none (' + reason + ')'}; "
                      f"figures {figures}; store {d.db}")
        torch.manual_seed(seed)
        summary = run_sweep(cells, lambda c, ctx: run_cell(c, ctx, out=figures, teacher=teacher, no_teacher=reason),
                            suite=SUITE, setting=f"{SETTING}-smoke", db=d.db, device="cpu",
                            threads=torch.get_num_threads(), force=True, console=console, progress=False,
                            argv=["attnbench", "run", "claims", "--smoke"], describe=_line)
        no_teacher = [o for o in summary.outcomes if o.result.status == "skipped" and not o.skipped
                      and o.cell.payload[2] == "real" and teacher is None]
        bad = first_failure([o for o in summary.outcomes if o not in no_teacher])
    if bad is not None:
        console.print(f"[bold red]smoke failed:[/] {escape(bad)}")
        return 1
    if no_teacher:
        console.print(f"[yellow]{len(no_teacher)} real-input cell(s) skipped: {escape(reason)}[/]")
    console.print(f"full run: {len(full_cells)} cell(s) of {len(checks)} check(s) at their full inputs "
                  f"(`attnbench run claims`)")
    return 0
