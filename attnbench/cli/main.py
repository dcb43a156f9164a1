"""The ``attnbench`` command: a thin typer layer over library functions (no logic lives here)."""

from __future__ import annotations

from typing import Optional

import typer

from attnbench.api import catalog, plugins, registry
from attnbench.api import suites as suite_registry
from attnbench.cli import kit as clikit
from attnbench.cli.kit import DB_HELP, PLUGIN_HELP, console, fail
from attnbench.core.errors import AttnbenchError
from attnbench.results import provenance
from attnbench.results.ingest import ingest
from attnbench.results.store import Store
from attnbench.views import compare, tables
from attnbench.views import report as reportpage
from attnbench.views.export import export, select
from attnbench.views.render import render_tables, table_format
from attnbench.views.show import describe
from attnbench.views.sources import committed_records

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="attnbench: attention mechanisms behind one protocol, driven through the same suites.")
run_app = typer.Typer(no_args_is_help=True, help="Run a suite (each registered suite adds its command).")
data_app = typer.Typer(no_args_is_help=True, help="Generate or check suite data.")
eval_app = typer.Typer(no_args_is_help=True, help="Evaluate a trained artifact of a suite (e.g. an LM checkpoint "
                       "by lm-eval).")
app.add_typer(run_app, name="run")
app.add_typer(eval_app, name="eval")
app.add_typer(data_app, name="data")


def _add_suite_commands() -> None:
    """``attnbench run <suite>`` (``attnbench <suite>`` for a top-level one), ``attnbench eval <suite>`` and
    ``attnbench data <command>`` of every registered suite."""
    for name in suite_registry.suite_names():
        suite = suite_registry.get_suite(name)
        if suite.run is not None:
            (app if suite.top_level else run_app).command(name, help=suite.help)(suite.run)
        if suite.evaluate is not None:
            eval_app.command(name)(suite.evaluate)
        for command, fn in suite.data.items():
            data_app.command(command)(fn)




def _activate_plugins(sources: Optional[list[str]]) -> list:
    """Load the plug-ins (``--plugin``, ``ATTNBENCH_PLUGINS``, entry points); a bad one is a one-line error."""
    try:
        return plugins.activate(sources or [])
    except AttnbenchError as e:
        fail(str(e))


@app.command("list")
def list_cmd(fmt: str = typer.Option("auto", "--format", help="table, md, tsv or json (auto: table on a terminal, "
                                     "tsv when piped, so `attnbench list | grep NAME` finds whole lines)"),
             live: bool = clikit.flag(False, "--live", help="read the live registry (imports torch and every "
                                      "mechanism, including plug-ins) instead of reading the built-ins' source text"),
             plugin: Optional[list[str]] = typer.Option(None, "--plugin", help=PLUGIN_HELP)) -> None:
    """Every registered attention: paper, forms, implementations, parameters (and the plug-ins' sources)."""
    import json

    if plugin or plugins.configured():
        _activate_plugins(plugin)
    rows = catalog.live() if live else catalog.builtins() + catalog.live(plugins_only=True)
    fmt = ("table" if console.is_terminal else "tsv") if fmt == "auto" else fmt
    if fmt == "json":
        typer.echo(json.dumps(rows, indent=1, ensure_ascii=False))
        return
    if fmt not in ("table", "tsv", "md"):
        fail(f"--format must be table, tsv, md or json, got {fmt!r}")
    cells = [[d["name"], d["paper"], "yes" if d["bidirectional"] else "no", "yes" if d["causal"] else "no",
              ", ".join(d["impls"]), ", ".join(f"{k}={v}" for k, v in d["options"].items()) or "-"] for d in rows]
    header = ["name", "paper", "bidirectional", "causal", "impls", "options (defaults)"]
    if fmt == "tsv":  # no title line: `attnbench list | grep NAME` gives whole rows
        for line in [header, *cells]:
            typer.echo("\t".join(line))
        return
    sources = sorted({d["plugin"] for d in rows if d.get("plugin")})
    note = "; plug-ins: " + ", ".join(sources) if sources else ""
    render_tables([("attnbench attentions", header, cells, f"{len(cells)} attentions{note}; `attnbench list "
                           f"--format json` gives every field.")], console=console, fmt=fmt)


@app.command("check")
def check_cmd(attn: Optional[str] = typer.Option(None, "--attn", help="comma-separated names (default: all)"),
              dtype: str = typer.Option("float64", help="float64, float32, float16 or bfloat16"),
              interpret: bool = clikit.flag(False, "--interpret", help="run the Triton kernels on the CPU "
                                             "under Triton's interpreter (slow; no GPU needed)"),
              fmt: str = typer.Option("auto", "--format", help="table, md, tsv or json (auto: table on a "
                                      "terminal, md when piped)"),
              aot: bool = clikit.flag(False, "--aot", help="instead: compile every Triton kernel configuration "
                                      "(and FLA's chunk kernels) for a GPU, without one: compiles, fits, spills"),
              arch: str = typer.Option("90", "--arch", help="--aot: compute capabilities, comma-separated "
                                       "(90 = H100, 80 = A100)"),
              quick: bool = clikit.flag(False, "--quick", help="--aot: one shape per kernel and dtype"),
              plugin: Optional[list[str]] = typer.Option(None, "--plugin", help=PLUGIN_HELP)) -> None:
    """Every impl of every mechanism (and of the delta-rule op) against its reference at odd shapes, forward and
    backward; with --aot, the ahead-of-time GPU compile check instead. ``--plugin my_attn.py --attn mine`` runs the
    same contract on a user's mechanism (attnbench.checks.contract.check_attention is the same in pytest)."""
    if aot:
        _check_aot(arch, quick, interpret)
        return
    _activate_plugins(plugin)

    try:
        fmt = table_format(fmt, console)  # a bad --format fails before any work
    except ValueError as e:
        fail(str(e))
    if interpret:  # must be set before triton is imported (kernels are imported lazily, on first use)
        import os

        os.environ["TRITON_INTERPRET"] = "1"
    from attnbench.checks.verify import DELTA_OPS, check_table, summarize, verify_all

    names = [n.strip() for n in (attn or "").split(",") if n.strip()]  # verify_all knows the ops too
    # a plug-in's mechanism gets the whole contract of the registry-wide tests (attnbench.checks.contract)
    contract_names = [n for n in (names or registry.names()) if plugins.plugin_for("attention", n)]
    builtin_names = [n for n in (names or registry.names() + list(DELTA_OPS)) if n not in contract_names]
    rows, broken = [], []
    try:
        if builtin_names:
            rows = verify_all(builtin_names, dtype=dtype)
        if contract_names:
            from attnbench.checks import contract as testing

            for name in contract_names:  # a plug-in's feature map: its own clauses, then its attention's
                if plugins.plugin_for("feature map", name):
                    broken += testing.feature_map_contract(name, verdicts=rows)
                else:
                    broken += testing.contract(name, verdicts=rows)
    except AttnbenchError as e:
        fail(str(e))
    render_tables([check_table(rows)], console=console, fmt=fmt)
    line, bad = summarize(rows)  # agreed, skipped (why), disagreed and errored, counted apart
    if contract_names:
        line += f"; contract of {', '.join(contract_names)}: {len(broken)} clause(s) broken"
    bad = bad or bool(broken)
    for f in broken:  # one line per failure: what and where
        typer.echo(f"FAIL {f.line()}", err=fmt == "json")
    if fmt == "json":  # stdout stays one JSON document: the summary goes to stderr
        typer.echo(line, err=True)
    else:
        console.print(f"[bold red]{line}[/]" if bad else f"[green]{line}[/]")
    if bad:
        raise typer.Exit(code=1)


def _check_aot(arch: str, quick: bool, interpret: bool) -> None:
    """``check --aot``: attnbench.checks.aot for each arch, after a line naming the machine and one naming the
    compilers and the date; exit 1 on any failing configuration, 2 on bad options."""
    import datetime
    import os
    import sys
    import time

    from rich.markup import escape

    if interpret:
        fail("--aot compiles for a real GPU; it cannot run under --interpret (drop one of them)")
    os.environ.pop("TRITON_INTERPRET", None)  # the real compiler (triton is not imported yet)
    from attnbench.checks import aot as kaot
    from attnbench.kernels import HAS_TRITON

    try:
        archs = kaot.parse_archs(arch)
    except ValueError as e:
        fail(str(e))
    if not HAS_TRITON:
        fail("--aot needs triton (pip install 'attnbench[gpu]')")

    console.print(escape(provenance.machine_line(provenance.machine())))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    console.print(escape(f"compilers: {kaot.toolchain()} · {now} · check --aot --arch "
                         f"{','.join(map(str, archs))}{' --quick' if quick else ''}"))
    failed = 0
    for a in archs:
        t0 = time.perf_counter()
        try:
            results = kaot.check(a, quick=quick, progress=kaot.log_progress)
        except RuntimeError as e:  # e.g. the kernels were imported under the interpreter in this process
            fail(str(e))
        failed += kaot.print_table(results, a, file=sys.stdout)
        console.print(f"sm_{a}: {len(results)} compiles in {time.perf_counter() - t0:.0f} s")
    if failed:
        raise typer.Exit(code=1)


# --- install on a machine with no network -------------------------------------------------


@app.command("bundle")
def bundle_cmd(out: str = typer.Option(..., "--out", help="the folder to write (new or empty): the wheels and "
                                       "manifest.json"),
               python: Optional[str] = typer.Option(None, "--python", help="the node's Python, e.g. 3.12 (default: "
                                                    "this one)"),
               platform: Optional[str] = typer.Option(None, "--platform", help="the node's wheel platform tag, e.g. "
                                                      "manylinux_2_28_x86_64 (default: this machine's)"),
               extras: Optional[str] = typer.Option(None, "--extras", help="comma-separated extras of attnbench, "
                                                    "e.g. gpu,lm,slurm"),
               torch: Optional[str] = typer.Option(None, "--torch", help="the node's torch version, e.g. 2.11: "
                                                   "only dependencies that accept it are chosen"),
               have: Optional[str] = typer.Option(None, "--have", help="the node's `python -m pip list "
                                                  "--format=freeze`: what it has at an accepted version is left "
                                                  "out"),
               max_mib: float = typer.Option(60.0, "--max-mib", help="fail when the wheels total more (MiB)")) -> None:
    """Wheels that install attnbench with no network, on a GPU node whose image has torch and Triton.

    attnbench's own wheel and every dependency of it and of --extras that such an image lacks (torch, triton,
    nvidia-* and what only they need are left out), resolved by pip for --python and --platform; prints the one
    install command for the node."""
    import shlex
    import sys

    from attnbench.engine import bundle  # only this command needs it (packaging, pip in subprocesses)

    command = shlex.join(["attnbench", *sys.argv[1:]])
    try:
        made = bundle.build(out, python=python, platform=platform, extras_text=extras, torch=torch,
                            have_file=have, limit_mib=max_mib, command=command,
                            progress=lambda line: typer.echo(line, err=True))
    except bundle.BuildError as e:  # pip or the size limit, after the options were fine
        fail(str(e), code=1)
    except AttnbenchError as e:
        fail(str(e))
    for line in made.lines():
        typer.echo(line)


# --- results: the store, tables, plots, exports (each suite registers its view) -----------


@app.command("table")
def table_cmd(suite: str = typer.Argument(..., help="a registered suite: " + ", ".join(suite_registry.suite_names())),
              db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
              setting: Optional[str] = typer.Option(None, "--setting", help="only this setting"),
              committed: bool = clikit.flag(True, "--committed/--no-committed",
                                             help="show the committed reference results (results/<suite>/)"),
              fmt: str = typer.Option("auto", "--format", help="table, md, tsv, json, or auto: tables fitted to "
                                      "the terminal, md when piped (numbers never fold)"),
              reported: bool = clikit.flag(False, "--reported", help="print the papers' reported tables whole "
                                           "(else one line each)")) -> None:
    """Leaderboard of a suite from the store, beside the committed reference results and a line per reported
    table."""
    try:
        tables.table(suite, db=db, setting=setting, committed=committed, console=console, fmt=fmt,
                     reported=reported)
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))


@app.command("plan")
def plan_cmd(suite: str = typer.Argument(..., help="a registered suite with records of a pilot run (any seeds)"),
             cells: Optional[int] = typer.Option(None, "--cells", help="budget: N more cells (a cell: one row of the "
                                                 "table at one seed, everything a seed of it runs)"),
             hours: Optional[float] = typer.Option(None, "--hours", help="budget: H hours of cell time, at the "
                                                   "pilot's measured cell times (a 2-core day: 48)"),
             gpu: str = typer.Option("H100", "--gpu", help="the GPU to cost the run on: H100 or A100"),
             max_seeds: int = typer.Option(64, "--max-seeds", help="the most seeds a row considered"),
             db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
             setting: Optional[str] = typer.Option(None, "--setting", help="only this setting")) -> None:
    """Size a run from a pilot: the seeds each row needs to separate the pairs that can be separated within a
    budget, the pairs that cannot, its cost here and on a GPU, and the `attnbench run` line (a fixed design)."""
    from attnbench.views.plan import plan

    try:
        lines = plan(suite, db=db, setting=setting, cells=cells, hours=hours, gpu=gpu, max_seeds=max_seeds)
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


@app.command("plot")
def plot_cmd(suite: str = typer.Argument(..., help="a registered suite with plots"),
             out: Optional[str] = typer.Option(None, "--out", help="directory (default: results/plots)"),
             db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
             source: str = typer.Option("auto", "--source", help="store, committed, all, or auto (the store if "
                                        "it has results, else the committed ones)")) -> None:
    """The suite's plots (PNGs), e.g. log-log time and memory against N, one line per attention."""
    try:
        paths = tables.plot(suite, out=out, db=db, source=source)
    except (AttnbenchError, ValueError) as e:
        fail(str(e))
    if not paths:
        fail(f"nothing to plot for {suite!r}: run `attnbench run {suite}` first")
    for p in paths:
        console.print(f"wrote {p}")


@app.command("export")
def export_cmd(fmt: str = typer.Option(..., "--format", help="csv, jsonl or markdown"),
               suite: Optional[str] = typer.Option(None, "--suite"),
               setting: Optional[str] = typer.Option(None, "--setting"),
               run: Optional[str] = typer.Option(None, "--run", help="a run id (prefix) or 'latest'"),
               out: Optional[str] = typer.Option(None, "--out", help="file (default: stdout)"),
               label: str = typer.Option("exported results", "--label", help="markdown: what these results are"),
               db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
               committed: bool = clikit.flag(False, "--committed", help="the suite's committed reference results "
                                             "(results/<suite>/*.jsonl) instead of the store, titled as such "
                                             "(how results/<suite>/*.md are made)")) -> None:
    """Export measurements from the store (csv and jsonl: every record; markdown: the leaderboard)."""
    try:
        if committed:
            if not suite:
                raise AttnbenchError("--committed needs --suite (whose results/<suite>/*.jsonl to export)")
            records = committed_records(suite, setting)
            label = "committed reference results" if label == "exported results" else label
        else:
            records = select(db=db, suite=suite, setting=setting, run=run)
        text = export(records, fmt, out, suite=suite, label=label, committed=committed)
    except (AttnbenchError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    if out:
        console.print(f"wrote {len(records)} record(s) to {out}")
    else:
        typer.echo(text, nl=False)


@app.command("ingest")
def ingest_cmd(file: str = typer.Argument(..., help="a .jsonl export of another store, another store file (.db, "
                                           "e.g. of a --shard job: merged run by run), or a format a suite reads "
                                           "(e.g. a pytest-benchmark JSON)"),
               db: Optional[str] = typer.Option(None, "--db", help=DB_HELP)) -> None:
    """Bring results into the store: another store (.db) or its .jsonl export, or a suite's format; idempotent."""
    try:
        with Store(db) as store:
            message = ingest(file, store)
    except (ValueError, OSError) as e:
        fail(str(e))
    console.print(message)


@app.command("report")
def report_cmd(out: str = typer.Option(..., "--out", help="the page to write, e.g. report.html (or report.md)"),
               db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
               suite: Optional[list[str]] = typer.Option(None, "--suite", help="only these suites (repeatable or "
                                                         "comma-separated; default: every registered suite)"),
               fmt: str = typer.Option("auto", "--format", help="html (one self-contained file: figures inline, "
                                       "opens with no network) or md (markdown, figures as PNG files in "
                                       "<name>_files/); auto: md for a .md --out, else html"),
               store: bool = clikit.flag(True, "--store/--no-store", help="include your store's results"),
               committed: bool = clikit.flag(True, "--committed/--no-committed",
                                             help="include the committed reference results (results/<suite>/)")) -> None:
    """One page of every suite's results to share: leaderboards with their provenance, the papers' reported
    tables, plots and figures."""

    try:
        written = reportpage.write_report(out, fmt=fmt, suites=suite, db=db, include_store=store,
                                          include_committed=committed)
    except AttnbenchError as e:
        fail(str(e))
    console.print(written.line())


@app.command("show")
def show_cmd(suite: str = typer.Argument(..., help="a registered suite: " + ", ".join(suite_registry.suite_names())),
             row: str = typer.Argument(..., help="the row as `attnbench table SUITE` shows it: the text of its first "
                                       "column (e.g. nala, laplacian:landmarks=16, mixa), or a config hash (prefix) "
                                       "of one of its cells"),
             task: Optional[str] = typer.Option(None, "--task", help="only the row of this task (e.g. listops)"),
             setting: Optional[str] = typer.Option(None, "--setting", help="only this setting (e.g. lra/tiny)"),
             db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
             committed: bool = clikit.flag(True, "--committed/--no-committed",
                                            help="look in the committed reference results too")) -> None:
    """How a leaderboard row was made: per seed its cell identity, preset identity and commit, and the exact
    command (git checkout COMMIT; attnbench run ...) that makes it again; run again, it finds the cell done."""

    try:
        lines = describe(suite, row, options=_run_options(suite), db=db, setting=setting, task=task,
                         committed=committed)
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))
    for line in lines:
        typer.echo(line)


def _run_options(suite: str) -> set[str]:
    """The option names (``--attn``, ...) of ``attnbench run SUITE``."""
    group = typer.main.get_command(run_app)
    cmd = group.commands.get(suite) if hasattr(group, "commands") else None
    return {o for p in cmd.params for o in getattr(p, "opts", [])} if cmd is not None else set()


@app.command("compare")
def compare_cmd(a: str = typer.Argument(..., help="side A (the baseline): a results store (.db) or a .jsonl export"),
                b: Optional[str] = typer.Argument(None, help="side B (the change), as A; omit it with --commits or "
                                                  "--machines"),
                commits: Optional[str] = typer.Option(None, "--commits", help="X,Y: compare the records of commit X "
                                                      "(A) and commit Y (B) inside store A (hashes or prefixes)"),
                machines: Optional[str] = typer.Option(None, "--machines", help="M1,M2: compare the records of two "
                                                       "machines (recorded device names, or a unique part of one) "
                                                       "inside store A"),
                suite: Optional[str] = typer.Option(None, "--suite", help="only this suite"),
                threshold: Optional[float] = typer.Option(None, "--threshold", help="PCT: exit 1 when any cell is "
                                                          "significantly worse on B (p < 0.05) by more than PCT "
                                                          "percent of A's value: slower, lower accuracy, higher "
                                                          "perplexity; names the cells"),
                fmt: str = typer.Option("auto", "--format", help="table, md, tsv, json, or auto (tables on a "
                                        "terminal, md when piped)")) -> None:
    """Two sets of results cell by cell (same identity minus provenance and seed): each difference with its
    significance (accuracy: two-proportion test or seed interval; speed: ratio against the repeat noise), largest
    first; --threshold makes a significant regression fail the command (for CI)."""

    try:
        fmt = table_format(fmt, console)
        if threshold is not None and threshold < 0:
            raise AttnbenchError(f"--threshold must be a percentage >= 0, got {threshold:g}")
        side_a, side_b = compare.sides(a, b, commits=commits, machines=machines)
        result = compare.compare(side_a, side_b, suite=suite)
    except (AttnbenchError, ValueError, OSError) as e:
        fail(str(e))
    if not result.differences:
        fail(f"no cell in common between A ({side_a.label}: {len(side_a.records)} records) and B ({side_b.label}: "
             f"{len(side_b.records)} records)" + (f" in suite {suite}" if suite else ""), code=1)
    render_tables(compare.tables(result, threshold), console=console, fmt=fmt)
    if threshold is not None:
        bad = result.regressions(threshold)
        for d in bad:
            msg = (f"regression beyond {threshold:g}%: {d.cell} · {d.metric.label}: {100 * d.change:+.1f}% "
                   f"(p = {d.p:.2g})")
            typer.echo(msg, err=fmt == "json")  # stdout stays one JSON document with --format json
        if bad:
            raise typer.Exit(code=1)


_add_suite_commands()


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
