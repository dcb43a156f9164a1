"""Leaderboards, plots and exports: views over the results store (and the committed reference results).

Sources. A view reads :class:`Source` objects: the user's store (``--db`` / ``ATTNBENCH_DB`` /
``results/attnbench.db``) and the committed reference results, text exports under ``results/<suite>/*.jsonl``
found at the project root (see :func:`attnbench.results.paths.project_root`) and beside the attnbench sources. The
committed ones are labelled as such, with their device and date; records of a run that is part of a committed
file are shown once, as committed.

Views. ``table <suite>`` renders the suite's view: the :class:`View` its :class:`attnbench.api.suites.Suite`
carries (:func:`view_of`). This module names no suite: it holds the machinery (sources, latest record per point,
:func:`fit_exponent`, formatting, markdown tables, exports) and the generic view that suites without their own
get: per attention and task, the best ``metrics["score"]`` with its spread over seeds.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

from attnbench.api import suites as suite_registry
from attnbench.core.errors import AttnbenchError, UnknownNameError
from attnbench.results import provenance
from attnbench.results.paths import project_root, resolve_db
from attnbench.results.records import FINISHED, Measurement, read_jsonl, write_jsonl
from attnbench.results.stats import seed_stats
from attnbench.results.store import open_existing

PACKAGE_ROOT = Path(__file__).resolve().parents[2]
BASELINE = "softmax"   # the row every view compares against (a mechanism, not a suite)


@dataclasses.dataclass
class Source:
    label: str
    records: list[Measurement]
    committed: bool = False
    path: Path | None = None


# --- finding records -------------------------------------------------------------------------------------------
def results_dirs() -> list[Path]:
    """``results/`` at the project root and beside the attnbench sources (editable install), if they exist."""
    out: list[Path] = []
    for d in (project_root() / "results", PACKAGE_ROOT / "results"):
        if d.is_dir() and d.resolve() not in [o.resolve() for o in out]:
            out.append(d)
    return out


def reference_files(suite: str) -> list[Path]:
    """Committed reference exports of ``suite``: ``results/<suite>/*.jsonl``."""
    files = []
    for d in results_dirs():
        files.extend(sorted((d / suite).glob("*.jsonl")))
    return files


def committed_records(suite: str, setting: str | None = None) -> list[Measurement]:
    """The committed reference records of ``suite`` (``results/<suite>/*.jsonl``), optionally of one setting."""
    return [r for f in reference_files(suite) for r in read_jsonl(f)
            if r.suite == suite and (setting is None or r.setting == setting)]


def describe_records(records: list[Measurement]) -> str:
    devices = sorted({r.device_name or r.device for r in records if r})
    dates = sorted({(r.ended_at or r.started_at or "")[:10] for r in records} - {""})
    date = dates[0] if len(dates) == 1 else (f"{dates[0]}..{dates[-1]}" if dates else "undated")
    return f"{'; '.join(devices) or 'unknown device'}, {date}"


def load_sources(suite: str, *, db: str | None = None, include_committed: bool = True,
                 include_store: bool = True, setting: str | None = None) -> list[Source]:
    """The committed reference results of ``suite`` (if any) and the user's store (if it exists)."""
    sources: list[Source] = []
    committed_runs: set[str] = set()
    if include_committed:  # one source over the suite's files: a row's seeds may come from several of them
        recs, files = [], []
        for f in reference_files(suite):
            mine = [r for r in read_jsonl(f) if r.suite == suite and (setting is None or r.setting == setting)]
            if mine:
                recs += mine
                files.append(f)
        if recs:
            committed_runs |= {r.run_id for r in recs if r.run_id}
            rel = ", ".join(_relative(f) for f in files)
            sources.append(Source(f"committed reference results ({rel}; {describe_records(recs)})", recs,
                                  committed=True, path=files[0]))
    if include_store:
        store = open_existing(db)
        if store is not None:
            with store:
                recs = [r for r in store.measurements(suite=suite, setting=setting) if r.run_id not in committed_runs]
            if recs:
                sources.append(Source(f"your runs ({_relative(store.path)})", recs, path=store.path))
    return sorted(sources, key=lambda src: src.committed)  # the user's own runs first, committed ones below


def _relative(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def latest(records: Iterable[Measurement], preferred: Iterable[str] = FINISHED) -> list[Measurement]:
    """One record per point (config hash): the latest with a ``preferred`` status (default: any finished one),
    else the latest of any status."""
    preferred = tuple(preferred)
    best: dict[str, Measurement] = {}
    for r in records:
        cur = best.get(r.config_hash)
        if cur is None:
            best[r.config_hash] = r
            continue
        rank = lambda m: (m.status in preferred, m.ended_at or "", m.id or 0)  # noqa: E731
        if rank(r) >= rank(cur):
            best[r.config_hash] = r
    return list(best.values())


# --- numbers -----------------------------------------------------------------------------------------------------
def fit_exponent(ns: Iterable[float], costs: Iterable[float]) -> float | None:
    """Least-squares slope of log(cost) against log(N); None with fewer than two usable (positive) points."""
    pts = [(math.log(n), math.log(c)) for n, c in zip(ns, costs) if n and c and n > 0 and c > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sxx


def fmt_time(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "-"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if s >= f:
            return f"{s / f:.3g} {unit}"
    return f"{s / 1e-9:.3g} ns"


def fmt_bytes(b: float | None) -> str:
    if b is None or not math.isfinite(b):
        return "-"
    sign = "-" if b < 0 else ""
    b = abs(b)
    for unit, f in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if b >= f:
            return f"{sign}{b / f:.3g} {unit}"
    return f"{sign}{b:.0f} B"


def fmt_n(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def label_of(r: Measurement) -> str:
    """``name`` or ``name:key=value:...`` (the ``--attn`` spelling of the spec): one table row per attention and
    options."""
    return ":".join([r.attention, *(f"{k}={v}" for k, v in sorted(r.options.items()))])


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table (``|`` escaped; columns after the names right-aligned)."""
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(esc(h) for h in header) + " |",
             "|" + "|".join("---" if i == 0 or h in ("attention", "impl") else "---:"
                            for i, h in enumerate(header)) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def slug(s: str) -> str:
    """``s`` as a file-name part."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", s).strip("_")


# --- rows over seeds: the one aggregation every leaderboard uses ------------------------------------------------
#: The mark of a row whose seeds disagree more than the test set's noise explains (:attr:`attnbench.results.stats.SeedStats.
#: disagree`).
SEED_MARK = "!"
SEED_CAPTION = ("Several seeds: mean over seeds ± the test-set interval of the mean, then (seeds ± h, n=k): the "
                "half-width h of the 95% Student t interval of the mean over the k seeds (k − 1 degrees of freedom). "
                f"{SEED_MARK} the seeds disagree more than the test set's noise explains: χ² test of homogeneity of "
                "the k seeds' accuracies, each a proportion of the same n test items, X² = Σ n (p_i − p̄)² / "
                "(p̄ (1 − p̄)) on k − 1 degrees of freedom, p < 0.05 (training variance beyond binomial sampling).")


def seed_rows(records: Iterable[Measurement], key: Callable[[Measurement], Any] | None = None,
              vary: Iterable[str] = ("seed",)) -> dict[tuple, list[Measurement]]:
    """Leaderboard rows over seeds: the latest record of each point (config hash; ``ok`` preferred), grouped by
    ``(setting, device, dtype, task, key(record))`` (``key``: the row's label, default :func:`label_of`). A group
    keeps the seeds of its latest configuration only (records whose params, ``vary`` left out, equal the newest
    record's: a preset edited since is not mixed in) and one record per seed (the latest), ordered by seed."""
    key = key or label_of
    vary = set(vary)
    groups: dict[tuple, list[Measurement]] = {}
    for r in latest(records, preferred=("ok",)):
        groups.setdefault((r.setting, r.device, r.dtype, r.task, key(r)), []).append(r)
    rank = lambda m: (m.status == "ok", m.ended_at or "", m.id or 0)  # noqa: E731
    for k, rs in groups.items():
        last = max(rs, key=rank)
        same = {a: b for a, b in last.params.items() if a not in vary}
        per_seed: dict[Any, Measurement] = {}
        for m in sorted(rs, key=rank):
            if {a: b for a, b in m.params.items() if a not in vary} == same:
                per_seed[m.seed] = m
        groups[k] = sorted(per_seed.values(), key=lambda m: (m.seed is None, m.seed or 0))
    return groups


def aggregate(records: Iterable[Measurement], metric: str = "score", *, scale: float = 100.0,
              proportion: bool = True):
    """:class:`attnbench.results.stats.SeedStats` of ``metric`` over the ``ok`` records of one row (one per seed, as
    :func:`seed_rows` gives them), or None when none has it. ``proportion``: the metric is a proportion (× ``scale``)
    of ``metrics["n_test"]`` test items (the smallest when they differ), which gives the test-set interval and the
    disagreement test."""

    ok = [r for r in records if r.status == "ok" and isinstance(r.metrics.get(metric), (int, float))]
    if not ok:
        return None
    ns = [int(r.metrics["n_test"]) for r in ok if isinstance(r.metrics.get("n_test"), (int, float))]
    n_test = min(ns) if proportion and len(ns) == len(ok) else None
    return seed_stats([r.metrics[metric] for r in ok], seeds=[r.seed for r in ok], n_test=n_test, scale=scale)


def fmt_seeds(st, digits: int = 2, test_digits: int = 1) -> str:
    """A row's figure over seeds: ``mean ± test-set half-width`` (one seed: as before seeds existed), then
    ``(seeds ± h, n=k)`` and :data:`SEED_MARK` for several seeds (see :data:`SEED_CAPTION`)."""
    if st is None:
        return "-"
    cell = f"{st.mean:.{digits}f}"
    if st.test_half is not None:
        cell += f" ± {st.test_half:.{test_digits}f}"
    if st.n > 1:
        cell += f" (seeds ± {st.half:.{digits}f}, n={st.n})" + (f" {SEED_MARK}" if st.disagree else "")
    return cell


SEED_CAPTION_VALUE = ("Several seeds: mean over seeds (seeds ± h, n=k): the half-width h of the 95% Student t "
                      "interval of the mean over the k seeds (k − 1 degrees of freedom). No test-set interval (the "
                      "figure is not a proportion of test items), so no disagreement mark.")


def seed_note(stats: Iterable[Any], proportion: bool = True) -> str:
    """The caption's seed sentence (:data:`SEED_CAPTION`; :data:`SEED_CAPTION_VALUE` for a figure that is not a
    proportion) when any of ``stats`` has several seeds, else ``""``."""
    if not any(s is not None and s.n > 1 for s in stats):
        return ""
    return f" {SEED_CAPTION if proportion else SEED_CAPTION_VALUE}"


# --- the generic view (suites without their own) -----------------------------------------------------------------
def _generic_tables(source: Source) -> list[tuple[str, list[str], list[list[str]], str]]:
    groups: dict[tuple, list[Measurement]] = {}
    for r in source.records:
        groups.setdefault((r.setting, r.dtype, r.device), []).append(r)
    out = []
    for (setting, dtype, device), recs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        rows_over_seeds = seed_rows(recs)
        tasks = sorted({r.task for r in recs})
        labels = sorted({label_of(r) for r in recs})
        rows, stats = [], []
        for lab in labels:
            row = [lab]
            for t in tasks:
                rs = [m for k, ms in rows_over_seeds.items() if k[3] == t and k[4] == lab for m in ms]
                score_key = next((k for k in ("score", "accuracy", "acc") if any(
                    isinstance(m.metrics.get(k), (int, float)) for m in rs)), None)
                st = aggregate(rs, score_key, proportion=False) if score_key else None
                stats.append(st)
                if st is not None:
                    row.append(fmt_seeds(st, digits=4) if st.n > 1 else f"{st.mean:.4g}")
                else:
                    row.append("/".join(sorted({r.status for r in rs})) or "·")
            rows.append(row)
        title = f"{setting} · {dtype} · {device} ({machine_of(recs)})"
        out.append((title, ["attention", *tasks], rows,
                    f"{source.label}. Score per attention and task (mean over seeds).{seed_note(stats, False)}"))
    return out


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


# --- printing a table: the one function every command uses -------------------------------------------------------
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
    import json

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


@dataclasses.dataclass
class View:
    """How ``attnbench table/plot/export --format markdown`` render a suite's records: a suite's
    :class:`attnbench.api.suites.Suite` carries one (``view=``); suites without one get :data:`GENERIC`.

    ``data(source)``: the leaderboard tables of one source as :data:`TableData` (what :func:`render_tables` prints
    in any format and at any width); ``extra_data()``: tables shown once by ``table`` after the sources' (e.g. a
    suite's published numbers, labelled as such); ``plot(source, out_dir, prefix)``: the PNGs written (None: the
    suite has no plots). ``rich`` / ``markdown`` / ``extra`` / ``extra_markdown`` are the same tables rendered
    (rich tables at their natural width, markdown text), derived from ``data`` when not given."""

    rich: Callable[[Source], list[Any]] | None = None
    markdown: Callable[[Source], str] | None = None
    plot: Callable[[Source, Path, str], list[Path]] | None = None
    extra: Callable[[], list[Any]] | None = None
    extra_markdown: Callable[[], str] | None = None
    data: Callable[[Source], list[TableData]] | None = None
    extra_data: Callable[[], list[TableData]] | None = None

    def __post_init__(self) -> None:
        if self.data is not None:
            data, extra = self.data, self.extra_data
            self.rich = self.rich or (lambda src: rich_tables(data(src), "cyan" if src.committed else "green"))
            self.markdown = self.markdown or (lambda src: markdown_tables(data(src)))
            if extra is not None:
                self.extra = self.extra or (lambda: rich_tables(extra(), "yellow"))
                self.extra_markdown = self.extra_markdown or (lambda: markdown_tables(extra()))


GENERIC = View(data=lambda src: _generic_tables(src))


def table_view(tables: Callable[[list[Measurement], str], list[TableData]], *,
               extra: Callable[[], list[TableData]] | None = None,
               plot: Callable[[Source, Path, str], list[Path]] | None = None) -> View:
    """A suite's :class:`View` from ``tables(records, label)``, the function that builds its leaderboard tables
    from one source, and ``extra()`` (e.g. a paper's reported numbers)."""
    return View(data=lambda src: tables(src.records, src.label), extra_data=extra, plot=plot)


def _machines(records: Iterable[Measurement]) -> dict[str, str]:
    """Each machine (device name) of ``records`` with the fp32 matmul GFLOP/s measured when its runs started
    (``metrics["matmul_fp32_gflops"]``; a range over its runs), or "" where none was recorded."""
    flops: dict[str, list[float]] = {}
    for r in records:
        if r.device_name:
            seen = flops.setdefault(r.device_name, [])
            g = r.metrics.get("matmul_fp32_gflops")
            if isinstance(g, (int, float)):
                seen.append(float(g))
    out = {}
    for name, gs in sorted(flops.items()):
        lo, hi = (f"{min(gs):.0f}", f"{max(gs):.0f}") if gs else ("", "")
        out[name] = "" if not gs else f"fp32 matmul {lo if lo == hi else f'{lo}–{hi}'} GFLOP/s"
    return out


def machine_of(records: Iterable[Measurement]) -> str:
    """The machines that measured ``records``: each device name (CPU or GPU model) with, where recorded, the fp32
    matmul GFLOP/s measured when it ran; several machines each with their own figure."""
    machines = _machines(records)
    if not machines:
        return "machine not recorded"
    if len(machines) == 1:
        ((name, flops),) = machines.items()
        return f"{name}, {flops}" if flops else name
    return "; ".join(f"{name} ({flops or 'matmul GFLOP/s not recorded'})" for name, flops in machines.items())


def boards(records: Iterable[Measurement],
           preferred: Iterable[str] = ("ok",)) -> list[tuple[tuple[str, str], list[Measurement]]]:
    """The latest record of each point (:func:`latest`), grouped into one leaderboard per (setting, device), in
    order: results of different settings never share a table."""
    groups: dict[tuple[str, str], list[Measurement]] = {}
    for r in latest(records, preferred=preferred):
        groups.setdefault((r.setting, r.device), []).append(r)
    return sorted(groups.items())


def board_title(what: str, setting: str, device: str, records: Iterable[Measurement]) -> str:
    """A leaderboard's title: what it shows, its setting and device, and the machines that measured it, each with
    its fp32 matmul GFLOP/s (:func:`machine_of`)."""
    return f"{what} — {setting} · {device} ({machine_of(records)})"


def commits_of(records: Iterable[Measurement]) -> list[str]:
    """The commits (10 hex digits, ``-dirty`` for a tree with uncommitted changes) that measured ``records``."""
    return sorted({(r.git_commit or "?")[:10] + ("-dirty" if r.git_dirty else "") for r in records})


#: The mark of a timing taken while other attnbench processes ran on the same host (see attnbench.engine.sweep).
CONTENDED = "‡"


def timing_mark(r: Measurement) -> str:
    """`` ‡`` when ``r``'s timing overlapped another attnbench process on its host, else ``""``."""
    return f" {CONTENDED}" if r.metrics.get("concurrent_attnbench") else ""


def unfinished_caption(source_label: str, records: Iterable[Measurement]) -> str:
    """The caption of a table none of whose cells finished ok (an interrupted or failed run): what happened and
    what to do, instead of a caption of unknowns."""
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    what = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
    return (f"{source_label}. No cell of this table has finished ok yet ({what}): rerun the same command to resume "
            f"(finished cells are kept; the trainer resumes from its last checkpoint).")


def source_tables(view: View, src: Source) -> list[TableData]:
    """The view's tables of ``src``, each title naming the machines that measured it (unless the view's title
    already names those of its own records, :func:`board_title`) and whether the numbers are the committed
    reference results or the user's own runs."""
    machine, names = machine_of(src.records), list(_machines(src.records))
    tag = "committed results" if src.committed else "your runs"
    out = []
    for title, header, rows, cap in view.data(src):
        if not any(n in title for n in names) and machine not in title:  # board_title named its table's machines
            title += f" ({machine})"
        if any(CONTENDED in str(c) for row in rows for c in row):
            cap += (f" {CONTENDED} timed while other attnbench processes ran on the same machine (listed in the "
                    f"record's metrics.concurrent_attnbench): a slower figure, not comparable.")
        out.append((f"{title} · {tag}", header, rows, cap))
    return out


def _registered(suite: str):
    try:
        return suite_registry.get_suite(suite)
    except UnknownNameError:
        return None


def view_of(suite: str) -> View:
    """The view of the registered suite ``suite`` (``suite_registry.get_suite(suite).view``); the generic view when it
    has none, or for records of a suite that is not registered (e.g. ingested ``pytest-benchmark`` records)."""
    registered = _registered(suite)
    view = registered.view if registered is not None else None
    return view or GENERIC


def print_tables(suite: str, sources: list[Source], console=None, fmt: str = "auto") -> int:
    """Render every source's leaderboard tables for ``suite`` (:func:`render_tables`); returns how many tables
    were printed."""
    view = view_of(suite)
    n = 0
    for src in sources:
        if view.data is None:  # a view that renders itself (no TableData): natural width
            for t in view.rich(src):
                (console or default_console()).print(t)
                n += 1
            continue
        n += len(render_tables(source_tables(view, src), console=console, fmt=fmt,
                               style="cyan" if src.committed else "green"))
    return n


def default_console():
    """The terminal every view prints to when not given one, and the CLI's: soft-wrapped when output is not a
    terminal, so piped tables keep their lines whole."""
    from rich.console import Console

    return Console(soft_wrap=not sys.stdout.isatty())


def table(suite: str, *, db: str | None = None, setting: str | None = None, committed: bool = True,
          console=None, fmt: str = "auto", reported: bool = False) -> int:
    """``attnbench table <suite>``: the user's store, then the committed reference results (labelled), then the
    suite's extra tables (the papers' reported numbers): one line each, or whole with ``reported``; ``fmt`` as
    :func:`render_tables` (auto: rich tables fitted to a terminal, markdown when piped). A ``db`` given
    explicitly (``--db``) that does not exist is an error."""
    console = console or default_console()
    fmt = table_format(fmt, console)
    if db is not None and not resolve_db(db).exists():
        raise AttnbenchError(f"--db {db}: no such results store (nothing was run with it yet; check the path)")
    sources = load_sources(suite, db=db, include_committed=committed, setting=setting)
    if not sources and _registered(suite) is None:
        suite_registry.get_suite(suite)  # nothing of that name anywhere: the did-you-mean error of the registry
    if not sources:
        have = reference_files(suite)
        where = (f"committed results/{suite}/ has none" + (f" of setting {setting}" if setting else "")
                 if have else f"no committed results/{suite}/*.jsonl")
        console.print(f"no {suite} results: nothing in {resolve_db(db)} and {where}; run `attnbench run {suite}` "
                      f"first")
    n = print_tables(suite, sources, console=console, fmt=fmt)
    view = view_of(suite)
    if view.extra_data is not None and not reported:
        extra = view.extra_data() if fmt in ("table", "md") else []  # json / tsv stay machine-readable
        if extra:
            console.print(f"{len(extra)} reported table(s), published numbers not measured here "
                          f"(`attnbench table {suite} --reported` prints them whole):", highlight=False)
            for title, _, rows, _ in extra:
                console.print(f"  {title.split(' — ')[0]}: {len(rows)} rows", highlight=False)
    elif view.extra_data is not None:
        n += len(render_tables(view.extra_data(), console=console, fmt=fmt, style="yellow"))
    elif view.extra is not None:
        for t in view.extra():
            console.print(t)
            n += 1
    return n


# --- plots -------------------------------------------------------------------------------------------------------
def plot(suite: str, *, out: str | Path | None = None, db: str | None = None, source: str = "auto") -> list[Path]:
    """``attnbench plot <suite>``: PNGs of the store's records (``source='store'``), of the committed ones
    (``'committed'``), or of the store if it has any, else the committed ones (``'auto'``)."""
    view = view_of(suite)
    if view.plot is None:
        if _registered(suite) is None:
            suite_registry.get_suite(suite)  # an unknown name: did-you-mean
        raise AttnbenchError(f"suite {suite!r} has no plot")
    if source not in ("auto", "store", "committed", "all"):
        raise ValueError(f"source must be auto, store, committed or all, got {source!r}")
    sources = load_sources(suite, db=db, include_committed=source in ("auto", "committed", "all"),
                           include_store=source in ("auto", "store", "all"))
    if source == "auto" and any(not s.committed for s in sources):
        sources = [s for s in sources if not s.committed]
    out_dir = Path(out) if out else project_root() / "results" / "plots"
    written = []
    for s in sources:
        prefix = s.path.stem if s.committed and s.path else suite
        written += view.plot(s, out_dir, prefix)
    return written


# --- exports -----------------------------------------------------------------------------------------------------
FORMATS = ("csv", "jsonl", "markdown")


def environment_markdown(records: list[Measurement]) -> str:
    """The environment block of an export: devices, commits, packages, dates."""
    if not records:
        return ""
    lines = ["| | |", "|---|---|"]
    devices = sorted({f"{r.device} ({r.device_name})" if r.device_name else r.device for r in records})
    commits = sorted({(r.git_commit or "?") + (" (dirty tree)" if r.git_dirty else "") for r in records})
    pk: dict[str, set] = {}
    for r in records:
        for k, v in (r.packages or {}).items():
            pk.setdefault(k, set()).add(v)
    threads = sorted({str(r.params.get("threads")) for r in records if r.params.get("threads") is not None})
    lines.append(f"| device | {'; '.join(devices)} |")
    if threads:
        lines.append(f"| threads | {', '.join(threads)} |")
    lines.append(f"| date | {describe_records(records).rsplit(', ', 1)[-1]} |")
    lines.append(f"| commit | {'; '.join(commits)} |")
    lines.append("| packages | " + ", ".join(f"{k} {'/'.join(sorted(v))}" for k, v in sorted(pk.items())) + " |")
    counts: dict[str, int] = {}
    for r in records:
        counts[r.status] = counts.get(r.status, 0) + 1
    lines.append("| points | " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) + " |")
    return "\n".join(lines) + "\n"


def _check_committable(records: list[Measurement], out: Path) -> None:
    """Records written into this repository's ``results/`` are what gets committed: each must come from a clean
    tree at a commit of this repository's history, so that its commit holds the code that made it."""
    committed = PACKAGE_ROOT / "results"
    if not out.resolve().is_relative_to(committed.resolve()):
        return
    foreign = {c for c in {r.git_commit for r in records} if not provenance.in_history(c)}  # one git call a commit
    bad = sorted({f"{(r.git_commit or 'no commit')[:10]}{' (dirty)' if r.git_dirty is not False else ''}"
                  for r in records if r.git_dirty is not False or r.git_commit in foreign})
    if bad:
        raise AttnbenchError(f"{out}: records made from a tree with uncommitted changes or at a commit not in this "
                             f"repository's history ({', '.join(bad[:5])}); results are committed only from a clean "
                             f"tree: commit the code, run again, then export")


def export(records: list[Measurement], fmt: str, out: str | Path | None = None, *, suite: str | None = None,
           label: str = "exported results", committed: bool = False) -> str:
    """Render ``records`` as csv (flat rows), jsonl (full records) or markdown (the suite's leaderboard and the
    environment; ``committed``: titled as the committed reference results, else as the user's runs). Writes
    ``out`` if given (atomically), returns the text. Paths in the records are made machine-free
    (:func:`attnbench.results.provenance.portable`): an export is what gets committed and shared, and a jsonl
    export into this repository's ``results/`` takes only records of a clean tree at a commit of its history."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")
    root = project_root()
    records = [dataclasses.replace(r, metrics=provenance.portable(r.metrics, root),
                                   params=provenance.portable(r.params, root)) for r in records]
    if fmt == "jsonl":
        if out:
            _check_committable(records, Path(out))
            write_jsonl(records, out)
            return Path(out).read_text()
        import json

        return "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in records)
    if fmt == "csv":
        rows = [r.flat() for r in records]
        cols: list[str] = []
        for row in rows:
            cols += [c for c in row if c not in cols]
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
        text = buf.getvalue()
    else:
        parts = []
        by_suite: dict[str, list[Measurement]] = {}
        for r in records:
            by_suite.setdefault(r.suite, []).append(r)
        for s, recs in sorted(by_suite.items()):
            src, view = Source(label, recs, committed=committed), view_of(s)
            # as `table` shows them: titles with their machines, the notes of the marks the rows carry
            board = markdown_tables(source_tables(view, src)) if view.data is not None else view.markdown(src)
            parts.append(f"### {s}: {label}\n\n{environment_markdown(recs)}\n{board}")
        text = "\n".join(parts)
    if out:
        p = Path(out)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(p)
    return text


def select(*, db: str | None = None, suite: str | None = None, setting: str | None = None,
           run: str | None = None) -> list[Measurement]:
    """Records of the store for an export: every filter optional; ``run`` is a run id (or a unique prefix of
    one) or ``latest`` (the most recent run of ``suite``)."""
    store = open_existing(db)
    if store is None:
        raise FileNotFoundError(f"no results store at {resolve_db(db)}")
    with store:
        run_id = None
        if run:
            runs = store.runs(suite)
            if run == "latest":
                if not runs:
                    raise ValueError(f"no runs{' of ' + suite if suite else ''} in {store.path}")
                run_id = runs[-1]["run_id"]
            else:
                match = [r["run_id"] for r in runs if r["run_id"].startswith(run)]
                if len(match) != 1:
                    raise ValueError(f"run {run!r} matches {len(match)} runs in {store.path}")
                run_id = match[0]
        return store.measurements(suite=suite, setting=setting, run_id=run_id)
