"""Printing a table, the one way every command does: rich tables fitted to the console (a number never
folds; columns that do not fit are dropped and named), markdown, tsv or json."""

from __future__ import annotations

import json
import sys
from typing import Any, Iterable


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table (``|`` escaped; columns after the names right-aligned)."""
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(h) for h in header) + " |",
             "|" + "|".join("---" if i == 0 or h in ("attention", "impl") else "---:"
                            for i, h in enumerate(header)) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


#: A rendered leaderboard table: (title, header, rows, caption). Views build these; the two functions below render
#: them, so every suite prints and exports the same way.
TableData = tuple[str, list[str], list[list[str]], str]


def rich_tables(tables: Iterable[TableData], style: str | None = None) -> list[Any]:
    """rich ``Table`` s of ``tables`` at their natural width (names left-aligned, numbers right-aligned, no cell
    ever folded); :func:`render_tables` fits them to the console instead."""
    return [_rich_table(t, list(range(len(t[1]))), style, fit=False) for t in tables]


def markdown_tables(tables: Iterable[TableData]) -> str:
    return "\n".join(f"#### {title}\n\n{md_table(h, [[_one_line(c) for c in row] for row in rows])}\n\n{cap}\n"
                     for title, h, rows, cap in tables)


#: Columns whose cells are prose: they may wrap between words (never inside one); every other column is kept on one
#: line per cell, so a number is never split.
TEXT_COLUMNS = ("criterion", "paper", "options", "status", "impls", "the paper prints", "detail", "note", "stage losses",
                "quadratic layers", "why", "claim", "reason")


#: Which columns go first when a table is too wide for the console (matched by header prefix, in this order); then
#: the rightmost remaining ones. The first column (the row's name) is never dropped.
DROP_FIRST = ("worst", "ref err", "bound", "wall", "params", "top-5", "FLOPs", "infer mem", "train mem", "peak mem",
              "infer img/s", "after 1 / 2", "stage losses", "quadratic layers", "the paper prints", "impls",
              "bidirectional", "exponent", "GFLOP/s", "criterion", "statistic", "bwd err", "dtype", "causal",
              "impl", "form", "input")  # what tells rows apart (form, impl, input) goes last of these


#: Columns dropped last (a row's outcome).
KEEP_LAST = ("verdict", "status", "top-1", "avg", "score")


TABLE_FORMATS = ("auto", "table", "rich", "md", "markdown", "tsv", "json")


def table_format(fmt: str, console=None) -> str:
    """``--format`` of a command that prints tables: ``table`` (rich; also spelled ``rich``), ``md``/``markdown``,
    ``tsv``, ``json``, or ``auto``: rich tables on a terminal, markdown when piped or redirected."""
    f = (fmt or "auto").lower()
    if f not in TABLE_FORMATS:
        raise ValueError(f"--format must be one of table, md, tsv, json (or auto), got {fmt!r}")
    if f == "auto":
        return "table" if (console or default_console()).is_terminal else "md"
    return {"rich": "table", "markdown": "md"}.get(f, f)


def _one_line(cell: Any) -> str:
    return " · ".join(str(cell).splitlines())


def _is_text(header: str) -> bool:
    return header.startswith(TEXT_COLUMNS)


def _drop_order(header: list[str]) -> list[int]:
    """Column indices in the order they are dropped when the table does not fit (never 0)."""
    rest = list(range(1, len(header)))
    first = [i for p in DROP_FIRST for i in rest if header[i].startswith(p)]
    first = list(dict.fromkeys(first))
    last = [i for i in rest if header[i].startswith(KEEP_LAST) and i not in first]
    middle = [i for i in reversed(rest) if i not in first and i not in last]
    return first + middle + list(reversed(last))


def _widths(header: list[str], rows: list[list[Any]], i: int) -> tuple[int, int]:
    """(minimum, natural) width of column ``i``: a prose column may wrap between words; any other keeps each
    cell line whole (its header may wrap between words)."""
    from rich.cells import cell_len

    lines = [ln for row in rows for ln in str(row[i]).splitlines() or [""]]
    head_word = max((cell_len(w) for w in header[i].split()), default=1)
    natural = max([cell_len(ln) for ln in lines] + [cell_len(header[i])])
    if _is_text(header[i]):
        word = max((cell_len(w) for ln in lines for w in ln.split()), default=1)
        return max(word, head_word), natural
    return max([cell_len(ln) for ln in lines] + [head_word]), natural


def _text_widths(header: list[str], rows: list[list[Any]], cols: list[int], width: int | None) -> dict[int, int]:
    """Explicit widths of the prose columns among ``cols`` so that the table is at most ``width`` cells wide: each
    at its natural width if all fit, else its longest word plus a share of what is left in proportion to how much
    it would wrap (rich, left to itself, may overshoot and crop the table's right edge)."""
    text = [i for i in cols if _is_text(header[i])]
    if not text or width is None:
        return {}
    fixed = sum(_widths(header, rows, i)[0] for i in cols if i not in text)
    room = width - fixed - 3 * len(cols) - 1  # one space each side and a rule per column, the last rule
    lo = {i: _widths(header, rows, i)[0] for i in text}
    natural = {i: _widths(header, rows, i)[1] for i in text}
    if sum(natural.values()) <= room:
        return natural
    spare, want = max(0, room - sum(lo.values())), sum(natural[i] - lo[i] for i in text) or 1
    return {i: lo[i] + (spare * (natural[i] - lo[i])) // want for i in text}


def _rich_table(t: TableData, cols: list[int], style: str | None, *, fit: bool = True,
                dropped: list[str] | None = None, width: int | None = None):
    from rich.table import Table
    from rich.text import Text

    title, header, rows, caption = t
    if dropped:
        caption += (f" Not shown at this width: {', '.join(dropped)} (widen the terminal, or --format md shows "
                    f"every column).")
    table = Table(title=Text(title, style=f"bold {style}" if style else "bold"), caption=Text(caption),
                  caption_justify="left")
    prose = _text_widths(header, rows, cols, width if fit else None)
    for i in cols:
        name = header[i].startswith(("attention", "method", "impl", "name", "variant", "check"))
        lo, _ = _widths(header, rows, i)
        text = _is_text(header[i])
        # a fixed width for a column of numbers (rich never narrows it); its header wraps between words
        table.add_column(Text(header[i]), justify="left" if name or text else "right", min_width=lo,
                         width=prose.get(i) if text else (lo if fit else None))
    for row in rows:
        cells = []
        for i in cols:
            c = row[i].copy() if isinstance(row[i], Text) else Text(str(row[i]))
            if not _is_text(header[i]):
                c.no_wrap = True   # a number is never folded (the column is as wide as its widest cell)
                c.justify = c.justify or ("left" if i == 0 or header[i].startswith(("attention", "impl")) else
                                          "right")
            cells.append(c)
        table.add_row(*cells)
    return table


def fit_columns(t: TableData, width: int) -> list[int]:
    """The columns of ``t`` that fit in ``width`` cells (see :data:`DROP_FIRST`); at least the name column."""
    header, rows = t[1], t[2]
    cols = list(range(len(header)))
    need = lambda cs: sum(_widths(header, rows, i)[0] + 3 for i in cs) + 1  # noqa: E731 - padding and rules
    for i in _drop_order(header):
        if need(cols) <= width:
            break
        cols.remove(i)
    return cols


def render_tables(tables: Iterable[TableData], *, console=None, fmt: str = "auto",
                  style: str | None = None) -> list[list[str]]:
    """Print ``tables`` on ``console`` (default: the CLI's): every command's tables go through here.

    ``fmt`` (see :func:`table_format`): ``table`` fits each table to the console's width, a cell never folds
    (prose columns wrap between words), and columns that do not fit are dropped (:data:`DROP_FIRST`), the caption
    names them; ``md`` prints markdown (one line per row, whatever the width: for pipes and files); ``tsv`` one
    line per row, a ``# title`` line before each table; ``json`` a list of ``{title, caption, rows: [{column:
    cell}]}``. Returns the headers shown of each table."""
    console = console or default_console()
    fmt = table_format(fmt, console)
    tables = list(tables)
    shown: list[list[str]] = []
    if fmt == "json":
        data = [{"title": t[0], "caption": t[3], "rows": [dict(zip(t[1], map(str, r))) for r in t[2]]} for t in tables]
        console.out(json.dumps(data, indent=1, ensure_ascii=False), highlight=False)
        return [list(t[1]) for t in tables]
    if fmt == "md":
        for t in tables:
            console.out(markdown_tables([t]), highlight=False)  # plain text: no markup, no folding
        return [list(t[1]) for t in tables]
    if fmt == "tsv":
        for t in tables:
            lines = [f"# {t[0]}", "\t".join(t[1]), *("\t".join(_one_line(c) for c in r) for r in t[2])]
            console.file.write("\n".join(lines) + "\n")  # raw: rich would expand the tabs
        return [list(t[1]) for t in tables]
    for t in tables:
        cols = fit_columns(t, console.width)
        if len(cols) == 1 and len(t[1]) > 1 and _widths(t[1], t[2], 0)[0] + 4 > console.width:
            _print_records(t, console)  # not even the names fit: one block per row
            shown.append(list(t[1]))
            continue
        dropped = [t[1][i] for i in range(len(t[1])) if i not in cols]
        console.print(_rich_table(t, cols, style, dropped=dropped, width=console.width), soft_wrap=False)
        console.print()
        shown.append([t[1][i] for i in cols])
    return shown


def _print_records(t: TableData, console) -> None:
    """A table too wide for any column layout: each row as a block of ``column: cell`` lines."""
    from rich.text import Text

    console.print(Text(t[0], style="bold"))
    for row in t[2]:
        console.print(Text(_one_line(row[0]), style="bold"))
        for h, c in zip(t[1][1:], row[1:]):
            console.print(Text(f"  {h}: {_one_line(c)}"))
    console.print(Text(t[3]))
    console.print()


def default_console():
    """The terminal every view prints to when not given one, and the CLI's: soft-wrapped when output is not a
    terminal, so piped tables keep their lines whole."""
    from rich.console import Console

    return Console(soft_wrap=not sys.stdout.isatty())
