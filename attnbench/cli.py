"""The ``attnbench`` command: a thin typer layer over library functions (no logic lives here)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from . import registry
from .protocol import AttnbenchError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="attnbench: attention mechanisms behind one protocol, driven through the same suites.")
run_app = typer.Typer(no_args_is_help=True, help="Run a suite: scaling, lra.")
data_app = typer.Typer(no_args_is_help=True, help="Generate or check suite data.")
app.add_typer(run_app, name="run")
app.add_typer(data_app, name="data")
console = Console()


def split_names(csv: Optional[str]) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]``; each name is checked against the registry (did-you-mean on a typo)."""
    if not csv:
        return []
    out = [n.strip() for n in csv.split(",") if n.strip()]
    for n in out:
        registry.get_attention(n)
    return out


def fail(message: str) -> None:
    from rich.markup import escape

    console.print(f"[bold red]error:[/] {escape(message)}")  # messages name TOML tables like [train]
    raise typer.Exit(code=2)


@app.command("list")
def list_cmd() -> None:
    """Every registered attention: paper, forms, implementations, parameters."""
    table = Table(title="attnbench attentions")
    for col in ("name", "paper", "bidirectional", "causal", "impls", "options (defaults)"):
        table.add_column(col, overflow="fold")
    for name in registry.names():
        d = registry.describe(name)
        opts = ", ".join(f"{k}={v!r}" for k, v in d["options"].items()) or "-"
        table.add_row(name, d["paper"], "yes" if d["bidirectional"] else "no", "yes" if d["causal"] else "no",
                      ", ".join(d["impls"]), opts)
    console.print(table)


@app.command("check")
def check_cmd(attn: Optional[str] = typer.Option(None, "--attn", help="comma-separated names (default: all)"),
              dtype: str = typer.Option("float64", help="float64 or float32"),
              interpret: bool = typer.Option(False, "--interpret", help="run the Triton kernels on the CPU "
                                             "under Triton's interpreter (slow; no GPU needed)")) -> None:
    """Every impl of every mechanism (and of the delta-rule op) against its reference at odd shapes, forward and
    backward."""
    if interpret:  # must be set before triton is imported (kernels are imported lazily, on first use)
        import os

        os.environ["TRITON_INTERPRET"] = "1"
    from .checks import check_all, render_checks

    names = [n.strip() for n in (attn or "").split(",") if n.strip()]  # check_all knows the ops too
    try:
        rows = check_all(names or None, dtype=dtype)
    except AttnbenchError as e:
        fail(str(e))
    console.print(render_checks(rows))
    bad = [r for r in rows if not r.ok]
    if bad:
        console.print(f"[bold red]{len(bad)} of {len(rows)} checks disagree with their reference[/]")
        raise typer.Exit(code=1)
    console.print(f"[green]all {len(rows)} checks agree with their references[/]")


# --- results: the scaling suite, the store, tables, plots, exports (suites/scaling, store.py, report.py) ---------
DB_HELP = "results store (default: $ATTNBENCH_DB, else results/attnbench.db at the project root)"


@run_app.command("scaling")
def run_scaling_cmd(
    attn: Optional[str] = typer.Option(None, "--attn", help="comma-separated attentions (default: the preset's)"),
    seq: Optional[str] = typer.Option(None, "--seq", help="sequence lengths, e.g. 1k,4k,16k,64k"),
    mode: Optional[str] = typer.Option(None, "--mode", help="fwd, fwd+bwd, or both comma-separated"),
    causal: Optional[bool] = typer.Option(None, "--causal/--bidirectional", help="force every point causal / "
                                          "bidirectional (default: the preset's)"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="comma-separated: fp32, bf16, fp16, fp64"),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda"),
    heads: Optional[int] = typer.Option(None, "--heads"),
    head_dim: Optional[int] = typer.Option(None, "--head-dim"),
    batch: Optional[int] = typer.Option(None, "--batch"),
    threads: Optional[int] = typer.Option(None, "--threads", help="torch threads per point (0: all cores)"),
    preset: str = typer.Option("cpu-default", "--preset", help="embedded preset name or a .toml path"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", help="seconds per point before it is "
                                                "killed and recorded as timeout"),
    mem_budget: Optional[float] = typer.Option(None, "--mem-budget", help="GiB of address space per point "
                                               "(past it: oom)"),
    force: bool = typer.Option(False, "--force", help="re-measure points already finished in the store"),
) -> None:
    """Time, peak memory and FLOPs of each attention as N grows, gated on correctness; resumable."""
    import sys

    from .suites.scaling import run_cli

    try:
        result = run_cli(attn=split_names(attn) or None, seq=seq, mode=mode, causal=causal, dtype=dtype,
                         device=device, heads=heads, head_dim=head_dim, batch=batch, threads=threads,
                         preset=preset, db=db, time_budget=time_budget, mem_budget_gb=mem_budget, force=force,
                         console=console, argv=sys.argv)
    except (AttnbenchError, ValueError) as e:
        fail(str(e))
    if result.interrupted:
        raise typer.Exit(code=130)


@app.command("table")
def table_cmd(suite: str = typer.Argument(..., help="scaling, lra, ..."),
              db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
              setting: Optional[str] = typer.Option(None, "--setting", help="only this setting"),
              committed: bool = typer.Option(True, "--committed/--no-committed",
                                             help="show the committed reference results (results/<suite>/)")) -> None:
    """Leaderboard of a suite from the store, beside the committed reference results."""
    from . import report

    try:
        report.table(suite, db=db, setting=setting, committed=committed, console=console)
    except (AttnbenchError, ValueError) as e:
        fail(str(e))


@app.command("plot")
def plot_cmd(suite: str = typer.Argument(..., help="scaling"),
             out: Optional[str] = typer.Option(None, "--out", help="directory (default: results/plots)"),
             db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
             source: str = typer.Option("auto", "--source", help="store, committed, all, or auto (the store if "
                                        "it has results, else the committed ones)")) -> None:
    """Log-log PNGs of time and memory against N, one line per attention."""
    from . import report

    try:
        paths = report.plot(suite, out=out, db=db, source=source)
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
               db: Optional[str] = typer.Option(None, "--db", help=DB_HELP)) -> None:
    """Export measurements from the store (csv and jsonl: every record; markdown: the leaderboard)."""
    from . import report

    try:
        records = report.select(db=db, suite=suite, setting=setting, run=run)
        text = report.export(records, fmt, out, suite=suite, label=label)
    except (AttnbenchError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    if out:
        console.print(f"wrote {len(records)} record(s) to {out}")
    else:
        typer.echo(text, nl=False)


@app.command("ingest")
def ingest_cmd(file: str = typer.Argument(..., help="a pytest-benchmark JSON (--benchmark-json or .benchmarks/), "
                                           "or a .jsonl export of another store"),
               db: Optional[str] = typer.Option(None, "--db", help=DB_HELP)) -> None:
    """Bring a pytest-benchmark JSON (or another store's jsonl export) into the store."""
    from .store import Store, ingest

    try:
        with Store(db) as store:
            message = ingest(file, store)
    except (ValueError, OSError) as e:
        fail(str(e))
    console.print(message)


@run_app.command("lra")
def run_lra_cmd(
    attn: str = typer.Option(..., "--attn", help="comma-separated attentions, e.g. nala,mirrorla,polaformer"),
    tasks: Optional[str] = typer.Option(None, "--tasks", help="comma-separated of listops, text, retrieval, image, "
                                        "pathfinder (default: the preset's; tasks without data are skipped)"),
    preset: Optional[str] = typer.Option(None, "--preset", help="tiny, skyformer or a .toml path (default: tiny "
                                         "without --data-dir, skyformer with it)"),
    data_dir: Optional[str] = typer.Option(None, "--data-dir", help="directory holding the real data (LRA release, "
                                           "aclImdb/, cifar-10-batches-py/)"),
    seed: int = typer.Option(0, "--seed", help="model init, data order and dropout"),
    force: bool = typer.Option(False, "--force", help="rerun cells already finished in the store (from scratch)"),
    nproc: int = typer.Option(1, "--nproc", help="data-parallel processes under torchrun (DDP; gloo on CPU)"),
    db: Optional[str] = typer.Option(None, "--db", help=DB_HELP),
    out: Optional[str] = typer.Option(None, "--out", help="work directory: checkpoints and generated data "
                                      "(default: results/runs/lra)"),
) -> None:
    """Train and evaluate attentions on the Long Range Arena; resumable; prints the leaderboard."""
    import sys

    from .suites.lra.train import run_cli as run_lra_cli

    try:
        rc = run_lra_cli(attentions=split_names(attn), tasks=[t.strip() for t in tasks.split(",") if t.strip()]
                         if tasks else None, preset=preset, data_dir=data_dir, seed=seed, force=force, nproc=nproc,
                         db=db, out=out, console=console, argv=sys.argv)
    except (AttnbenchError, ValueError) as e:
        fail(str(e))
    if rc:
        raise typer.Exit(code=rc)


# --- suite data: generators that write the official LRA layouts (suites/lra/generate.py) ----------------------
@data_app.command("listops")
def data_listops_cmd(out: str = typer.Option(..., "--out", help="directory; writes listops-1000/basic_*.tsv"),
                     n_train: int = typer.Option(96000, "--n-train"), n_val: int = typer.Option(2000, "--n-val"),
                     n_test: int = typer.Option(2000, "--n-test"), seed: int = typer.Option(0, "--seed"),
                     max_depth: int = typer.Option(10, "--max-depth"), max_args: int = typer.Option(10, "--max-args"),
                     min_length: int = typer.Option(500, "--min-length"),
                     max_length: int = typer.Option(2000, "--max-length")) -> None:
    """Generate ListOps with the LRA algorithm (defaults: the release's sizes and length bounds)."""
    from .suites.lra.generate import generate_listops

    try:
        paths = generate_listops(out, n_train=n_train, n_val=n_val, n_test=n_test, seed=seed, max_depth=max_depth,
                                 max_args=max_args, min_length=min_length, max_length=max_length)
    except (ValueError, RuntimeError, OSError) as e:
        fail(str(e))
    for split, path in paths.items():
        console.print(f"{split}: {path}")


@data_app.command("pathfinder")
def data_pathfinder_cmd(out: str = typer.Option(..., "--out", help="directory; writes pathfinder<size>/curv_*/"),
                        n: int = typer.Option(2000, "--n", help="number of images (labels balanced)"),
                        seed: int = typer.Option(0, "--seed"),
                        contour_length: int = typer.Option(14, "--contour-length", help="6 (baseline), 9 or 14"),
                        size: int = typer.Option(32, "--size", help="image side: 32, 64 or 128")) -> None:
    """Generate Pathfinder images (two markers, paddle contours, distractors) in the release's layout."""
    from .suites.lra.generate import generate_pathfinder

    try:
        path = generate_pathfinder(out, n=n, seed=seed, contour_length=contour_length, size=size)
    except (ValueError, RuntimeError, OSError) as e:
        fail(str(e))
    console.print(f"wrote {n} images under {path}")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
