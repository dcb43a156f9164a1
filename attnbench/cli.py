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
    console.print(f"[bold red]error:[/] {message}")
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
              dtype: str = typer.Option("float64", help="float64 or float32")) -> None:
    """Every impl of every mechanism against its reference at odd shapes, forward and backward."""
    from .checks import check_all, render_checks

    try:
        rows = check_all(split_names(attn) or None, dtype=dtype)
    except AttnbenchError as e:
        fail(str(e))
    console.print(render_checks(rows))
    bad = [r for r in rows if not r.ok]
    if bad:
        console.print(f"[bold red]{len(bad)} of {len(rows)} checks disagree with their reference[/]")
        raise typer.Exit(code=1)
    console.print(f"[green]all {len(rows)} checks agree with their references[/]")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
