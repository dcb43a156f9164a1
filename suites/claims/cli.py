"""``attnbench run claims``: a typer command over :mod:`.runner`. Torch-free at import."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench.api.spec import parse_specs
from attnbench.cli import kit as clikit
from attnbench.cli.kit import console, fail
from attnbench.core.errors import AttnbenchError
from attnbench.engine.context import RunOptions

from .leaderboard import ORDER


@clikit.run_command(suite="claims", one_process="the claims measure each mechanism in this one process; "
                    "split the checks over processes or jobs with --shard or --launcher instead",
                    no_training="the claims time and check mechanisms; they train no model to compile")
def run_command(
    attn: Optional[str] = typer.Option(None, "--attn", help="the mechanisms each check includes (of those it can "
                                       "measure; default: each check's own list). " + clikit.ATTN_HELP),
    only: Optional[str] = typer.Option(None, "--only", help="comma-separated check names to run (default: all): "
                                       + ", ".join(ORDER)),
    skip: Optional[str] = typer.Option(None, "--skip", help="comma-separated check names to leave out"),
    update_committed: bool = clikit.flag(False, "--update-committed", help="write the figures over the committed "
                                         "ones in results/claims (refreshing the reference results; then export "
                                         "the records as results/claims/README.md says)"),
    smoke: bool = clikit.flag(False, "--smoke", help="every selected check through the runner on its smallest "
                              "inputs (figures, records, verdicts), into a temporary store and folder unless "
                              "--db / --out"),
    *, opts: RunOptions,
) -> None:
    """Each paper's mechanism-level argument measured on attnbench's implementations: one statistic per (check,
    mechanism, input), a criterion stated before measuring, a verdict (holds / fails / inconclusive) and a figure."""
    from .runner import SETTING, run_claims, select_checks
    from .smoke import run_smoke

    try:
        specs = parse_specs(attn) if attn is not None else None

        select_checks(only, skip)  # unknown names fail here, before any work
        if opts.out and update_committed:
            raise AttnbenchError("--out and --update-committed: give one (--update-committed writes the figures to "
                                 "results/claims)")
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))
    if smoke:
        clikit.exit_with(lambda: run_smoke(attentions=specs, only=only, skip=skip, seed=opts.only_seed(), db=opts.db,
                                           out=opts.out, console=console), opts)

    def run():
        return run_claims(attentions=specs, only=only, skip=skip, opts=opts, console=console,
                          update_committed=update_committed)

    clikit.finish(run, suite="claims", setting=SETTING, opts=opts)
